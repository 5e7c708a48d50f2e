"""What the KFP train_job step does at run time: parameters -> TrainJobRequest -> submit/wait -> artifacts.

The KFP component bodies are thin shims that import this module inside the container, so the logic is
plain Python (unit-testable, one place) and the compiled component YAML stays small and stable.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

OnCancel = str  # "delete" | "keep"
EXIT_FAILED = 1
EXIT_CANCELLED = 143  # 128 + SIGTERM, what a shell reports for a terminated step
CANCEL_WAIT_SECONDS = (
    60.0  # a delete takes well under a second; KFP/Kubernetes SIGKILL after the grace period
)
MAX_ATTEMPTS = 20
WORKSPACE_MOUNT = "/kfp-workspace"
AFFINITY_MANAGER = "trainflow.dev/kfp-task-config"
_UNRESOLVED = "{{$"


class ArtifactLike(Protocol):
    """The parts of a KFP artifact the runner uses (dsl.Model / dsl.Metrics / dsl.Dataset)."""

    uri: str
    metadata: dict[str, Any]

    @property
    def path(self) -> str: ...


def log(message: str) -> None:
    print(f"[trainflow] {message}", flush=True)


def _clean(value: Any) -> Any:
    """KFP passes unset optional parameters as None, sometimes as empty text/collections: treat them alike."""
    if value is None:
        return None
    if isinstance(value, str) and (not value.strip() or value.startswith(_UNRESOLVED)):
        return None
    if isinstance(value, dict | list) and not value:
        return None
    return value


def _resolved(value: str | None) -> str | None:
    """A KFP placeholder that the backend did not substitute arrives verbatim: treat it as missing."""
    cleaned = _clean(value)
    return str(cleaned) if cleaned is not None else None


def identity_key(
    *,
    idempotency_key: str | None,
    run_id: str | None,
    task_name: str | None,
    params: Mapping[str, Any],
) -> str | None:
    """Stable identity of this step's TrainJob: explicit key, or KFP run id + task name + parameter digest.

    The digest separates ParallelFor iterations (same task name, different arguments) while a retry of the
    same step (same run, task and arguments) gets the same key and therefore reattaches.
    """
    explicit = _resolved(idempotency_key)
    if explicit:
        return explicit
    run = _resolved(run_id) or _resolved(os.environ.get("KFP_RUN_ID"))
    task = _resolved(task_name) or _resolved(os.environ.get("KFP_TASK_NAME"))
    if not run or not task:
        return None
    digest = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{task}/{run}/{digest}"


# ---------------------------------------------------------------------------------------------- TaskConfig


def _env_from_task_config(entries: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, str]]:
    """Pod env entries -> (plain env, secret env 'secret/key'); other valueFrom sources are skipped."""
    env: dict[str, str] = {}
    secret_env: dict[str, str] = {}
    for item in entries or []:
        name = item.get("name")
        if not name:
            continue
        if "value" in item:
            env[name] = str(item["value"])
            continue
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        if ref and ref.get("name") and ref.get("key"):
            secret_env[name] = f"{ref['name']}/{ref['key']}"
        else:
            log(f"TaskConfig env {name!r}: only value and secretKeyRef are forwarded; skipped")
    return env, secret_env


def _volumes_from_task_config(
    volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Split TaskConfig volumes into PVC mounts (request.volumes) and other volumes (runtime patch)."""
    by_name = {v.get("name"): v for v in volumes or []}
    pvcs: list[dict[str, Any]] = []
    other_volumes: list[dict[str, Any]] = []
    other_mounts: list[dict[str, Any]] = []
    for mount in mounts or []:
        vol = by_name.get(mount.get("name"))
        if vol is None:
            continue
        claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            pvcs.append(
                {
                    "claim_name": claim,
                    "mount_path": mount["mountPath"],
                    "name": vol["name"],
                    "read_only": bool(mount.get("readOnly") or vol["persistentVolumeClaim"].get("readOnly")),
                    "sub_path": mount.get("subPath"),
                }
            )
        else:
            if vol not in other_volumes:
                other_volumes.append(vol)
            other_mounts.append(dict(mount))
    return pvcs, other_volumes, other_mounts


def _pod_patch(pod_spec: dict[str, Any], runtime_job: str = "node") -> dict[str, Any]:
    return {
        "manager": AFFINITY_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {"name": runtime_job, "template": {"spec": {"template": {"spec": pod_spec}}}}
                    ]
                }
            }
        },
    }


def apply_task_config(fields: dict[str, Any], task_config: Any) -> dict[str, Any]:
    """Forward a kfp ``dsl.TaskConfig`` into request fields; explicit step parameters win per key.

    resources -> resources (requests/limits); env -> env/secret_env; tolerations; node_selector;
    PVC volumes -> volumes; affinity and non-PVC volumes -> one runtime patch on the trainer pods.
    """
    if task_config is None:
        return fields
    out = dict(fields)
    resources = getattr(task_config, "resources", None)
    if resources and not out.get("resources"):
        out["resources"] = {k: v for k, v in resources.items() if k in ("requests", "limits", "claims") and v}
    env, secret_env = _env_from_task_config(getattr(task_config, "env", None) or [])
    if env:
        out["env"] = {**env, **(out.get("env") or {})}
    if secret_env:
        out["secret_env"] = {**secret_env, **(out.get("secret_env") or {})}
    tolerations = getattr(task_config, "tolerations", None)
    if tolerations:
        out["tolerations"] = [*(out.get("tolerations") or []), *tolerations]
    node_selector = getattr(task_config, "node_selector", None)
    if node_selector:
        out["node_selector"] = {**node_selector, **(out.get("node_selector") or {})}
    pvcs, other_volumes, other_mounts = _volumes_from_task_config(
        getattr(task_config, "volumes", None) or [], getattr(task_config, "volume_mounts", None) or []
    )
    if pvcs:
        known = {v.get("claim_name") for v in out.get("volumes") or []}
        out["volumes"] = [*(out.get("volumes") or []), *(p for p in pvcs if p["claim_name"] not in known)]
    pod_spec: dict[str, Any] = {}
    affinity = getattr(task_config, "affinity", None)
    if affinity:
        pod_spec["affinity"] = affinity
    if other_volumes:
        pod_spec["volumes"] = other_volumes
        pod_spec["containers"] = [{"name": "node", "volumeMounts": other_mounts}]
    if pod_spec:
        out["runtime_patches"] = [*(out.get("runtime_patches") or []), _pod_patch(pod_spec)]
    return out


def workspace_volume(task_config: Any, workspace_path: str | None) -> dict[str, Any] | None:
    """The pipeline workspace PVC (from TaskConfig volumes passthrough) as a request volume, or None."""
    if task_config is None:
        return None
    wanted = {_resolved(workspace_path) or WORKSPACE_MOUNT, WORKSPACE_MOUNT}
    pvcs, _, _ = _volumes_from_task_config(
        getattr(task_config, "volumes", None) or [], getattr(task_config, "volume_mounts", None) or []
    )
    for pvc in pvcs:
        if pvc["mount_path"].rstrip("/") in wanted:
            return pvc
    return None


# ------------------------------------------------------------------------------------------------ request


def integral_numbers(value: Any) -> Any:
    """KFP dict/list parameters travel as protobuf Struct, where every number is a double: 60 arrives as 60.0.

    Turn integral floats back into ints so ``range(epochs)`` in the trainer works as written.
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: integral_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral_numbers(v) for v in value]
    return value


def build_request_fields(params: Mapping[str, Any]) -> dict[str, Any]:
    """Step parameters -> TrainJobRequest fields (unset parameters dropped so runtime defaults apply)."""
    mapping = (
        "runtime",
        "runtime_kind",
        "image",
        "command",
        "args",
        "function",
        "function_kwargs",
        "num_nodes",
        "proc_per_node",
        "resources",
        "env",
        "secret_env",
        "dataset_uri",
        "model_uri",
        "output_uri",
        "labels",
        "name",
        "namespace",
        "deadline_seconds",
        "volumes",
        "tolerations",
        "node_selector",
        "runtime_patches",
    )
    fields: dict[str, Any] = {}
    for key in mapping:
        value = _clean(params.get(key))
        if value is not None:
            fields[key] = value
    for key in ("function_kwargs", "env", "resources", "extra"):
        if fields.get(key) is not None:
            fields[key] = integral_numbers(fields[key])
    for key in ("num_nodes", "proc_per_node", "deadline_seconds"):
        if fields.get(key) == 0 and not isinstance(fields.get(key), bool):  # KFP int inputs: 0 means unset
            fields.pop(key)
    for key, value in integral_numbers(params.get("extra") or {}).items():
        if key in fields:
            raise _invalid(f"extra.{key}", "is also given as a step parameter", "set it in one place")
        fields[key] = value
    return fields


def _invalid(field: str, problem: str, fix: str = "") -> Exception:
    from trainflow.core import InvalidRequest

    return InvalidRequest.one(field, problem, fix)


def dataset_field(fields: dict[str, Any], dataset: ArtifactLike | None) -> dict[str, Any]:
    """An ``Input[Dataset]`` URI becomes dataset_uri (hf/s3/cache), else the trainer gets it as env."""
    if dataset is None:
        return fields
    uri = getattr(dataset, "uri", "") or ""
    if not uri:
        return fields
    if fields.get("dataset_uri"):
        raise _invalid("dataset", "both the dataset artifact and dataset_uri are given", "give one of them")
    out = dict(fields)
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if scheme in ("hf", "s3", "cache"):
        out["dataset_uri"] = uri
    else:
        # gs://, minio://, file paths: no Trainer initializer reads them; hand the location to the code.
        out["env"] = {**(out.get("env") or {}), "TRAINFLOW_DATASET_URI": uri}
        local = getattr(dataset, "path", None)
        if local and Path(local).exists():
            out["env"]["TRAINFLOW_DATASET_PATH"] = str(local)
    return out


# ------------------------------------------------------------------------------------------ cancellation


@contextlib.contextmanager
def cancel_on_sigterm(cancel: Callable[[], None]) -> Iterator[None]:
    """While inside, SIGTERM/SIGINT (pipeline run terminated) runs ``cancel`` and exits with 143."""

    def cancel_and_report() -> None:
        try:
            cancel()
        except Exception as exc:
            with contextlib.suppress(Exception):
                log(f"could not cancel the TrainJob: {exc}")

    def handler(signum: int, _frame: Any) -> None:
        # stdout may be a pipe whose reader died with us: never let a log write stop the cancel.
        with contextlib.suppress(Exception):
            log(f"received signal {signum}: pipeline step is being terminated")
        # The signal interrupted this thread wherever it was, maybe holding a lock the cancel needs (a
        # connection pool's, stdout's): cancel on a thread of its own and wait for it, bounded.
        worker = threading.Thread(target=cancel_and_report, name="trainjob-cancel", daemon=True)
        try:
            worker.start()
            worker.join(CANCEL_WAIT_SECONDS)
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(EXIT_CANCELLED)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# ------------------------------------------------------------------------------------------------ outputs


def local_dir(uri: str | None) -> Path | None:
    """A readable local directory for ``file://`` URIs and absolute paths (workspace PVC), else None."""
    if not uri:
        return None
    if uri.startswith("file://"):
        path = Path(unquote(urlparse(uri).path))
    elif uri.startswith("/"):
        path = Path(uri)
    else:
        return None
    return path if path.exists() else None


def copy_model(source: Path, destination: str) -> list[str]:
    """Copy the trainer's output directory into the Output[Model] path (a directory); return file names."""
    dest = Path(destination)
    if dest.exists() and dest.is_file():
        dest.unlink()
    if source.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest / source.name)
    else:
        shutil.copytree(source, dest, dirs_exist_ok=True)
    return sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            out[key] = float(value)
    return out


def result_metadata(result: Any, runtime: Any | None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job_name": result.name,
        "namespace": result.namespace,
        "state": result.state.value,
        "runtime": result.runtime or (runtime.name if runtime is not None else None),
        "framework": getattr(runtime, "framework", None) or getattr(runtime, "policy", None),
        "metrics": dict(result.metrics),
    }
    if result.duration_seconds is not None:
        data["duration_seconds"] = round(result.duration_seconds, 3)
    if result.output_uri:
        data["model_uri"] = result.output_uri
    return {k: v for k, v in data.items() if v is not None}


# ------------------------------------------------------------------------------------------------- steps


def _backend(backend: str, namespace: str | None, backend_config: Mapping[str, Any] | None) -> Any:
    from trainflow.core import get_backend

    config = dict(backend_config or {})
    if namespace:
        config.setdefault("namespace", namespace)
    return get_backend(backend or "kubernetes", **config)


def _on_update_printer() -> Callable[[Any], None]:
    last: dict[str, Any] = {}

    def on_update(result: Any) -> None:
        seen = (result.state, result.progress)
        if last.get("seen") != seen:
            last["seen"] = seen
            progress = f" progress={result.progress}%" if result.progress is not None else ""
            log(f"TrainJob {result.namespace}/{result.name}: {result.state.value}{progress}")

    return on_update


def stream_logs(be: Any, ref: Any, step: str = "node-0") -> threading.Thread:
    """Follow the rank-0 log into the step log (best effort, daemon thread: never blocks the outcome)."""

    def follow() -> None:
        with contextlib.suppress(Exception):
            for line in be.logs(ref, follow=True, step=step):
                print(f"[{step}] {line.rstrip()}", flush=True)

    thread = threading.Thread(target=follow, name=f"trainflow-logs-{step}", daemon=True)
    thread.start()
    return thread


def _print_logs(be: Any, ref: Any, tail: int = 50) -> None:
    try:
        lines = list(be.logs(ref, tail_lines=tail))
    except Exception as exc:  # logs are best effort: the job outcome is what matters
        log(f"(no logs: {exc})")
        return
    if lines:
        log(f"--- last {len(lines)} log lines of {ref} node-0 ---")
        for line in lines:
            print(line.rstrip("\n"), flush=True)


def next_attempt(be: Any, request: Any, manifest: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Reattach to this step's TrainJob unless it already Failed: then the retry gets a fresh attempt.

    A KFP retry (retry policy, or a retried run) after a failed TrainJob must train again, not re-read
    the old failure; attempt names are deterministic (core ``attempt``), so a restarted retry reattaches.
    """
    from trainflow.core import JobState, TrainJobNotFound

    for attempt in range(1, MAX_ATTEMPTS + 1):
        name = manifest["metadata"]["name"]
        namespace = manifest["metadata"].get("namespace") or be.namespace
        try:
            existing = be.get(f"{namespace}/{name}")
        except TrainJobNotFound:
            return attempt, manifest
        if existing.state is not JobState.FAILED:
            log(f"reattaching to TrainJob {namespace}/{name} ({existing.state.value}) from an earlier try")
            return attempt, manifest
        log(
            f"TrainJob {namespace}/{name} of an earlier try Failed ({existing.reason}); starting attempt {attempt + 1}"
        )
        manifest = be.render(request, attempt=attempt + 1)
    raise _invalid(
        "idempotency_key", f"{MAX_ATTEMPTS} attempts of this step already failed", "start a new run"
    )


def fail(message: str) -> SystemExit:
    """Print the reason where the KFP UI shows it and make the step fail (non-zero exit)."""
    print(f"[trainflow] ERROR: {message}", file=sys.stderr, flush=True)
    print(f"[trainflow] ERROR: {message}", flush=True)
    return SystemExit(EXIT_FAILED)


def run_train_job(
    params: Mapping[str, Any],
    *,
    model: ArtifactLike | None = None,
    metrics: Any | None = None,
    dataset: ArtifactLike | None = None,
    task_config: Any | None = None,
) -> tuple[str, str, str]:
    """Run (or reattach to) one TrainJob and fill the Model/Metrics artifacts; returns (name, namespace, state).

    Bad input fails the step (naming the field) before anything is submitted; a Failed job exits non-zero.
    """
    from trainflow.core import InvalidRequest

    try:
        return _run_train_job(params, model=model, metrics=metrics, dataset=dataset, task_config=task_config)
    except InvalidRequest as exc:
        raise fail(f"{exc}; nothing was submitted") from None


def _run_train_job(
    params: Mapping[str, Any],
    *,
    model: ArtifactLike | None,
    metrics: Any | None,
    dataset: ArtifactLike | None,
    task_config: Any | None,
) -> tuple[str, str, str]:
    from trainflow.core import TrainJobFailed, WaitTimeout

    started = time.monotonic()
    backend_name = _clean(params.get("backend")) or "kubernetes"
    on_cancel = _clean(params.get("on_cancel")) or "delete"
    if on_cancel not in ("delete", "keep"):
        raise _invalid("on_cancel", f"{on_cancel!r} is not supported", "use 'delete' or 'keep'")
    if backend_name not in ("kubernetes", "local", "k8s"):
        raise _invalid("backend", f"unknown backend {backend_name!r}", "use 'kubernetes' or 'local'")
    timeout = _clean(params.get("timeout"))
    if timeout is not None and timeout <= 0:
        raise _invalid("timeout", f"{timeout} is not positive", "give seconds > 0, or leave it unset")

    fields = build_request_fields(params)
    if task_config is not None and params.get("forward_task_config", True):
        fields = apply_task_config(fields, task_config)
    fields = dataset_field(fields, dataset)
    if params.get("mount_workspace"):
        pvc = workspace_volume(task_config, params.get("workspace_path"))
        if pvc is None:
            if backend_name == "local":
                log("mount_workspace: the local engine shares the filesystem; nothing to mount")
            else:
                raise _invalid(
                    "mount_workspace",
                    "no workspace PVC in the TaskConfig",
                    "build the component with the KUBERNETES_VOLUMES passthrough and give the pipeline "
                    "a workspace (dsl.PipelineConfig(workspace=...))",
                )
        else:
            if not any(v.get("claim_name") == pvc["claim_name"] for v in fields.get("volumes") or []):
                fields["volumes"] = [*(fields.get("volumes") or []), pvc]

    volatile = ("run_id", "task_name", "timeout", "on_cancel", "stream_logs")
    key_params = {k: v for k, v in params.items() if k not in volatile}
    key = identity_key(
        idempotency_key=params.get("idempotency_key"),
        run_id=params.get("run_id"),
        task_name=params.get("task_name"),
        params=key_params,
    )
    if key and not fields.get("name"):
        fields["idempotency_key"] = key
    if not key and not fields.get("name"):
        raise _invalid(
            "run_id",
            "no identity for the TrainJob: a retried step would start a second job",
            "pass run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER and task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER "
            "(or idempotency_key, or name)",
        )
    if (
        params.get("mount_workspace")
        and not fields.get("output_uri")
        and fields.get("volumes")
        and backend_name != "local"
    ):
        ws = _resolved(params.get("workspace_path")) or WORKSPACE_MOUNT
        fields["output_uri"] = (
            f"{ws.rstrip('/')}/trainflow/{hashlib.sha256((key or '').encode()).hexdigest()[:12]}"
        )

    from trainflow.core import parse_request

    request = parse_request(fields)
    be = _backend(backend_name, _clean(params.get("namespace")), params.get("backend_config"))
    runtime = be.get_runtime(request.runtime, request.runtime_kind)
    manifest = be.render(request)  # full validation; raises InvalidRequest naming the field, submits nothing
    attempt = 1
    if request.idempotency_key:
        attempt, manifest = next_attempt(be, request, manifest)
    name = manifest["metadata"]["name"]
    namespace = manifest["metadata"].get("namespace") or be.namespace
    log(f"TrainJob {namespace}/{name} (runtime {runtime.name}, backend {be.name}, key {key or '-'})")

    def cancel() -> None:
        if on_cancel == "keep":
            log(f"on_cancel=keep: TrainJob {namespace}/{name} keeps running")
            return
        deleted = be.cancel(f"{namespace}/{name}")
        with contextlib.suppress(Exception):
            log(f"TrainJob {namespace}/{name} {'deleted' if deleted else 'was already gone'}")

    with cancel_on_sigterm(cancel):
        ref = be.submit(request, attempt=attempt)
        log(f"submitted/attached TrainJob {ref}")
        follower = stream_logs(be, ref) if params.get("stream_logs", True) else None
        try:
            result = be.wait(ref, timeout=timeout, raise_on_failure=True, on_update=_on_update_printer())
        except TrainJobFailed as exc:
            if follower is None:
                _print_logs(be, ref)
            else:
                follower.join(timeout=5)
            raise fail(str(exc)) from None
        except WaitTimeout as exc:
            raise fail(f"{exc} (timeout={timeout}s); raise 'timeout' or check the job") from None
        if follower is not None:
            follower.join(timeout=5)  # let the last lines through
    if not result.succeeded:  # never green for a job that did not complete
        raise fail(f"TrainJob {ref} ended {result.state.value}: {result.reason or ''} {result.message or ''}")

    log(f"TrainJob {ref} Complete; metrics={json.dumps(result.metrics, sort_keys=True)}")
    meta = result_metadata(result, runtime)
    location = result.output_uri or request.output_uri
    if model is not None:
        model.metadata.update(meta)
        source = local_dir(location)
        if source is not None:
            files = copy_model(source, model.path)
            model.metadata["files"] = files
            log(f"copied {len(files)} model file(s) from {location} into the Model artifact: {files}")
        elif location:
            model.metadata["model_uri"] = location
            log(f"model stays at {location} (recorded in the Model artifact metadata)")
        else:
            log("the trainer reported no output location; the Model artifact holds metadata only")
    if metrics is not None:
        for metric, value in sorted(numeric_metrics(result.metrics).items()):
            metrics.log_metric(metric, value)
    log(f"step done in {time.monotonic() - started:.1f}s")
    return result.name, result.namespace, result.state.value


def wait_for_train_job(
    job_name: str,
    *,
    namespace: str | None,
    backend: str,
    backend_config: Mapping[str, Any] | None,
    timeout: float | None,
    on_cancel: str,
    metrics: Any | None = None,
) -> tuple[str, str]:
    """Wait on a TrainJob created elsewhere; fail the step when it fails. Returns (state, result JSON)."""
    from trainflow.core import InvalidRequest

    try:
        return _wait_for_train_job(
            job_name,
            namespace=namespace,
            backend=backend,
            backend_config=backend_config,
            timeout=timeout,
            on_cancel=on_cancel,
            metrics=metrics,
        )
    except InvalidRequest as exc:
        raise fail(str(exc)) from None


def _wait_for_train_job(
    job_name: str,
    *,
    namespace: str | None,
    backend: str,
    backend_config: Mapping[str, Any] | None,
    timeout: float | None,
    on_cancel: str,
    metrics: Any | None,
) -> tuple[str, str]:
    from trainflow.core import TrainJobFailed, TrainJobNotFound, WaitTimeout

    if not _clean(job_name):
        raise _invalid("job_name", "is empty", "give the TrainJob name (or namespace/name)")
    if on_cancel not in ("delete", "keep"):
        raise _invalid("on_cancel", f"{on_cancel!r} is not supported", "use 'delete' or 'keep'")
    be = _backend(backend, _clean(namespace), backend_config)

    def cancel() -> None:
        if on_cancel == "delete":
            log(f"TrainJob {job_name} {'deleted' if be.cancel(job_name) else 'was already gone'}")

    with cancel_on_sigterm(cancel):
        try:
            result = be.wait(job_name, timeout=_clean(timeout), on_update=_on_update_printer())
        except TrainJobNotFound as exc:
            raise fail(str(exc)) from None
        except TrainJobFailed as exc:
            _print_logs(be, job_name)
            raise fail(str(exc)) from None
        except WaitTimeout as exc:
            raise fail(str(exc)) from None
    if metrics is not None:
        for metric, value in sorted(numeric_metrics(result.metrics).items()):
            metrics.log_metric(metric, value)
    log(f"TrainJob {result.namespace}/{result.name} {result.state.value}")
    return result.state.value, json.dumps(result.to_dict(), sort_keys=True)


def get_train_job_state(
    job_name: str,
    *,
    namespace: str | None,
    backend: str,
    backend_config: Mapping[str, Any] | None,
) -> tuple[str, str]:
    """Read one TrainJob's state without waiting; a missing job fails the step."""
    from trainflow.core import InvalidRequest, TrainJobNotFound

    try:
        if not _clean(job_name):
            raise _invalid("job_name", "is empty", "give the TrainJob name (or namespace/name)")
        be = _backend(backend, _clean(namespace), backend_config)
        result = be.get(job_name)
    except (TrainJobNotFound, InvalidRequest) as exc:
        raise fail(str(exc)) from None
    log(f"TrainJob {result.namespace}/{result.name}: {result.state.value} {result.reason or ''}".rstrip())
    return result.state.value, json.dumps(result.to_dict(), sort_keys=True)
