"""What the KFP steps do at run time: parameters -> TrainJobRequest -> launch/wait -> artifacts.

The KFP component bodies are thin shims that import this module inside the container, so the logic is plain
Python (unit-testable, one place) and the compiled component YAML stays small and stable. What to create,
reattach to or reuse is ``trainflow.core.lifecycle.launch``, the rule Airflow and the CLI follow too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from trainflow.kfp import summary as step_summary
from trainflow.kfp.artifacts import ArtifactLike, dataset_field, log_metrics, publish, result_metadata
from trainflow.kfp.cancellation import cancel_on_sigterm
from trainflow.kfp.identity import step_identity
from trainflow.kfp.params import build_request_fields, clean, invalid, resolved
from trainflow.kfp.steplog import fail, log
from trainflow.kfp.task_config import WORKSPACE_MOUNT, apply_task_config, workspace_volume

if TYPE_CHECKING:
    from trainflow.core.ending import Ending
    from trainflow.core.result import TrainJobResult

# not part of the identity: how the step waits and reports, not what the TrainJob is
STEP_ONLY = (
    "run_id",
    "task_name",
    "timeout",
    "on_cancel",
    "stream_logs",
    "log_steps",
    "dashboard_url_template",
)
STEP_NAME = re.compile(r"node-\d+|dataset-initializer|model-initializer")


def _backend(backend: str, namespace: str | None, backend_config: Mapping[str, Any] | None) -> Any:
    """The step's backend and namespace over its ``backend_config`` (get_backend's keywords), by the core's
    one rule (``trainflow.core.connection``)."""
    from trainflow.core import get_backend
    from trainflow.core.connection import connection_config

    name, config = connection_config(
        {"backend": backend, "namespace": namespace},
        backend_config,
        connection_names="arguments",
        connection_subject="backend_config",
    )
    return get_backend(name, **config)


def _on_update_printer() -> Callable[[Any], None]:
    last: dict[str, Any] = {}

    def on_update(result: Any) -> None:
        seen = (result.status_text, result.progress)  # a queued job's Kueue reason is news too
        if last.get("seen") != seen:
            last["seen"] = seen
            progress = f" progress={result.progress}%" if result.progress is not None else ""
            log(f"TrainJob {result.namespace}/{result.name}: {result.status_text}{progress}")

    return on_update


def step_log_sink(steps: Any = None) -> Any:
    """The output of ``steps`` (rank 0 when None: ``node-N``, ``dataset-initializer``, ``model-initializer``)
    into the step log, as the wait follows it (best effort: never blocks the outcome)."""
    from trainflow.core.logsink import LogSink

    chosen = list(steps) if steps else ["node-0"]
    for step in chosen:
        if not isinstance(step, str) or not STEP_NAME.fullmatch(step):
            raise invalid(
                "log_steps", f"{step!r} is not a step", "use node-N, dataset-initializer, model-initializer"
            )
    return LogSink(lambda step, line: print(f"[{step}] {line}", flush=True), chosen, max_lines=1_000_000)


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


def request_fields(
    params: Mapping[str, Any],
    dataset: ArtifactLike | None,
    task_config: Any | None,
    artifact_uri: str | None = None,
) -> dict[str, Any]:
    """Every input of the step as request fields, with the retry-stable identity; InvalidRequest if none.

    ``artifact_uri`` is one of the step's output artifact URIs: its folder is part of the identity unless an
    ``idempotency_key`` is given (``identity.step_identity``).
    """
    fields = build_request_fields(params)
    if task_config is not None and params.get("forward_task_config", True):
        fields = apply_task_config(fields, task_config)
    fields = dataset_field(fields, dataset)
    pvc = (
        workspace_volume(task_config, resolved(params.get("workspace_path")))
        if params.get("mount_workspace")
        else None
    )
    if pvc is not None and not any(
        v.get("claim_name") == pvc["claim_name"] for v in fields.get("volumes") or []
    ):
        fields["volumes"] = [*(fields.get("volumes") or []), pvc]
    identity = step_identity(
        idempotency_key=params.get("idempotency_key"),
        run_id=params.get("run_id"),
        task_name=params.get("task_name"),
        params={k: v for k, v in params.items() if k not in STEP_ONLY},
        artifact_uri=artifact_uri,
    )
    key = identity.key
    if identity.warning and not fields.get("name"):
        log(f"WARNING: {identity.warning}")
    if key and not fields.get("name"):
        fields["idempotency_key"] = key
    if not key and not fields.get("name"):
        raise invalid(
            "run_id",
            "no identity for the TrainJob: a retried step would start a second job",
            "run it as a KFP step (its output artifacts identify it), or pass idempotency_key or name (or "
            "run_id and task_name) naming this step",
        )
    if pvc is not None and not fields.get("output_uri"):
        ws = resolved(params.get("workspace_path")) or WORKSPACE_MOUNT
        fields["output_uri"] = (
            f"{ws.rstrip('/')}/trainflow/{hashlib.sha256((key or '').encode()).hexdigest()[:12]}"
        )
    return fields


def run_train_job(
    params: Mapping[str, Any],
    *,
    model: ArtifactLike | None = None,
    metrics: Any | None = None,
    dataset: ArtifactLike | None = None,
    task_config: Any | None = None,
    summary: ArtifactLike | None = None,
    report: ArtifactLike | None = None,
) -> tuple[str, str, str, str]:
    """Run (or reattach to) one TrainJob and fill the Model/Metrics/summary/report artifacts; returns (name,
    namespace, state, result JSON with the metrics, the history and a function's return value). Bad input fails
    the step (naming the field) before anything is submitted; a Failed job exits 1.
    """
    from trainflow.core import InvalidRequest

    try:
        return _run_train_job(
            params,
            model=model,
            metrics=metrics,
            dataset=dataset,
            task_config=task_config,
            summary=summary,
            report=report,
        )
    except InvalidRequest as exc:
        raise fail(f"{exc}; nothing was submitted") from None


def _run_train_job(
    params: Mapping[str, Any],
    *,
    model: ArtifactLike | None,
    metrics: Any | None,
    dataset: ArtifactLike | None,
    task_config: Any | None,
    summary: ArtifactLike | None,
    report: ArtifactLike | None = None,
) -> tuple[str, str, str, str]:
    from trainflow.core import parse_request
    from trainflow.core.lifecycle import launch

    started = time.monotonic()
    on_cancel = clean(params.get("on_cancel")) or "delete"
    if on_cancel not in ("delete", "keep"):
        raise invalid("on_cancel", f"{on_cancel!r} is not supported", "use 'delete' or 'keep'")
    timeout = clean(params.get("timeout"))
    if timeout is not None and timeout <= 0:
        raise invalid("timeout", f"{timeout} is not positive", "give seconds > 0, or leave it unset")
    sink = step_log_sink(clean(params.get("log_steps"))) if params.get("stream_logs", True) else None
    request = parse_request(
        request_fields(
            params, dataset, task_config, getattr(model, "uri", None) or getattr(metrics, "uri", None)
        )
    )
    be = _backend(
        clean(params.get("backend")) or "kubernetes",
        clean(params.get("namespace")),
        params.get("backend_config"),
    )
    if (
        params.get("mount_workspace")
        and workspace_volume(task_config, resolved(params.get("workspace_path"))) is None
    ):
        if not be.is_local:  # the local engine shares this filesystem: nothing to mount
            raise invalid(
                "mount_workspace",
                "no workspace PVC in the TaskConfig",
                "build the component with the KUBERNETES_VOLUMES passthrough and give the pipeline "
                "a workspace (dsl.PipelineConfig(workspace=...))",
            )
        log("mount_workspace: the local engine shares the filesystem; nothing to mount")
    target: list[Any] = []

    def cancel() -> None:
        if not target:
            return
        if on_cancel == "keep":
            log(f"on_cancel=keep: TrainJob {target[0]} keeps running")
            return
        deleted = be.cancel(target[0])
        with contextlib.suppress(Exception):
            log(f"TrainJob {target[0]} {'deleted' if deleted else 'was already gone'}")

    with cancel_on_sigterm(cancel):
        launched = launch(be, request, before_create=target.append)
        ref = launched.ref
        target[:] = [ref]
        for line in launched.history():
            log(line)
        log(
            f"{launched.summary} (runtime {request.runtime}, backend {be.name}, key {request.idempotency_key or '-'})"
        )
        # a reused (completed) job is waited on too: the wait reads what a fresh run's wait reads (metrics from
        # trainerStatus or rank 0's log, the function's return value); a plain read would miss them
        logs = None if launched.reused else sink
        ending = be.wait_ending(ref, timeout=timeout, on_update=_on_update_printer(), logs=logs)
        shown = None if logs is not None else lambda: _print_logs(be, ref)  # a log it did not follow
        result = _answer(ending, timeout, cancel, shown)
    log(f"TrainJob {ref} Complete; metrics={json.dumps(result.metrics, sort_keys=True)}")
    publish(result, launched.runtime, result.output_uri or request.output_uri, model, metrics)
    link = _summarize(
        summary,
        result,
        template=params.get("dashboard_url_template"),
        launched=launched.summary,
        framework=result_metadata(result, launched.runtime).get("framework"),
        model=model.metadata if model is not None else None,
        report=report,
    )
    log(f"step done in {time.monotonic() - started:.1f}s" + (f"; TrainJob page: {link}" if link else ""))
    return result.name, result.namespace, result.state.value, json.dumps(result.to_dict(), sort_keys=True)


def _answer(
    ending: Ending, timeout: float | None, give_up: Callable[[], None], show_logs: Callable[[], None] | None
) -> TrainJobResult:
    """The step's answer to how its wait ended: the Complete job's result; any other ending fails the step
    (never green for a job that did not complete), giving up a job never admitted in time as ``on_cancel``
    says, with the log of a failed job it did not follow."""
    from trainflow.core.ending import EndKind

    kind = ending.kind
    if kind is EndKind.COMPLETE and ending.result is not None:
        return ending.result
    if kind is EndKind.QUEUE_BUDGET:
        give_up()
    elif kind is EndKind.FAILED and show_logs is not None:
        show_logs()
    if kind is EndKind.TIMED_OUT:
        raise fail(f"{ending.message} (timeout={timeout}s); raise 'timeout' or check the job")
    raise fail(ending.message or f"TrainJob {ending.ref} ended {kind.value}")


def _summarize(
    summary: ArtifactLike | None,
    result: Any,
    *,
    template: str | None,
    report: ArtifactLike | None = None,
    **details: Any,
) -> str:
    """Write the Markdown summary and the HTML report artifacts; returns the dashboard link ("" without a
    template)."""
    from trainflow.core.links import dashboard_url

    link = dashboard_url(step_summary.dashboard_template(template), result.name, result.namespace, result.uid)
    step_summary.write(summary, step_summary.render(result, link=link, **details))
    if report is not None:
        from trainflow.core import job_page

        notes = [n for n in (details.get("launched"), link and f"TrainJob page: {link}") if n]
        step_summary.write(report, job_page.render(result, notes=notes))
        log(f"HTML report: {len(result.history)} history points of {result.history.seen} reports")
    return link


def wait_for_train_job(
    job_name: str,
    *,
    namespace: str | None,
    backend: str,
    backend_config: Mapping[str, Any] | None,
    timeout: float | None,
    on_cancel: str,
    metrics: Any | None = None,
    summary: ArtifactLike | None = None,
    dashboard_url_template: str | None = None,
) -> tuple[str, str]:
    """Wait on a TrainJob created elsewhere; fail the step when it fails. Returns (state, result JSON)."""
    from trainflow.core import InvalidRequest

    try:
        if not clean(job_name):
            raise invalid("job_name", "is empty", "give the TrainJob name (or namespace/name)")
        if on_cancel not in ("delete", "keep"):
            raise invalid("on_cancel", f"{on_cancel!r} is not supported", "use 'delete' or 'keep'")
        be = _backend(backend, clean(namespace), backend_config)
    except InvalidRequest as exc:
        raise fail(str(exc)) from None

    def cancel() -> None:
        if on_cancel == "delete":
            log(f"TrainJob {job_name} {'deleted' if be.cancel(job_name) else 'was already gone'}")

    with cancel_on_sigterm(cancel):
        ending = be.wait_ending(job_name, timeout=clean(timeout), on_update=_on_update_printer())
        # not this step's job: one never admitted in time is left to its owner
        result = _answer(ending, clean(timeout), lambda: None, lambda: _print_logs(be, job_name))
    log_metrics(metrics, result.metrics)
    _summarize(summary, result, template=dashboard_url_template)
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
        if not clean(job_name):
            raise invalid("job_name", "is empty", "give the TrainJob name (or namespace/name)")
        result = _backend(backend, clean(namespace), backend_config).get(job_name)
    except (TrainJobNotFound, InvalidRequest) as exc:
        raise fail(str(exc)) from None
    log(f"TrainJob {result.namespace}/{result.name}: {result.state.value} {result.reason or ''}".rstrip())
    return result.state.value, json.dumps(result.to_dict(), sort_keys=True)
