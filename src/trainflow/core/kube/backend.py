"""KubernetesBackend: submit, wait (watch-based, sync and shared-async), logs, cancel TrainJobs on a cluster."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterator, Mapping
from typing import Any

from trainflow.core.backend import UpdateCallback, as_ref, resolve_deadline
from trainflow.core.errors import (
    BackendError,
    Diagnostics,
    RuntimeNotFound,
    TrainJobConflict,
    TrainJobFailed,
    TrainJobNotFound,
    WaitTimeout,
)
from trainflow.core.kube import diagnostics, retry
from trainflow.core.kube.apierrors import reraise
from trainflow.core.kube.client import KubeApi, iter_lines
from trainflow.core.kube.config import async_configuration, load_cluster_config, new_api_client
from trainflow.core.kube.logs import LogReader, newest_pod, step_target
from trainflow.core.kube.reportlog import last_report
from trainflow.core.kube.shared_watch import registry
from trainflow.core.kube.watch import WatchStats, watch_until
from trainflow.core.manifest import build_trainjob
from trainflow.core.naming import KEY_LABEL, MANAGED_BY_LABEL
from trainflow.core.request import TrainJobRequest
from trainflow.core.result import JobRef, JobState, TrainJobResult, result_from_trainjob
from trainflow.core.runtimes import Runtime
from trainflow.core.validation import immutable_differences, parse_request

log = logging.getLogger(__name__)

IDENTITY_LABELS = (KEY_LABEL, MANAGED_BY_LABEL)
CREATE_ATTEMPTS = 3
POD_CHECK_SECONDS = 5.0  # how often pods are looked at while some are not ready (crash exit codes, log tails)


def _selector(labels: Mapping[str, str] | None) -> str | None:
    return ",".join(f"{k}={v}" for k, v in labels.items()) if labels else None


class KubernetesBackend:
    """TrainJobs on a Kubernetes cluster running Kubeflow Trainer v2 (``trainer.kubeflow.org/v1alpha1``).

    Config: ``kubeconfig``, ``context``, ``in_cluster``, ``config_dict`` (inline kubeconfig), ``namespace``;
    ``submit_timeout``: how long a job may stay without JobSet/pods before creation-failure events are
    reported; ``pod_stuck_timeout``: how long a pod may stay unschedulable or unable to start its containers
    (image pull failure, missing config) before ``wait`` raises TrainJobFailed (the TrainJob is left as it
    is); ``log_tail_lines``: how much of rank 0's log is scanned for metrics at completion.
    """

    name = "kubernetes"

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        in_cluster: bool | None = None,
        config_dict: Mapping[str, Any] | None = None,
        namespace: str | None = None,
        submit_timeout: float = 300.0,
        pod_stuck_timeout: float = 120.0,
        log_tail_lines: int = 200,
        retry_policy: retry.RetryPolicy = retry.DEFAULT_POLICY,
    ) -> None:
        self.cluster = load_cluster_config(
            kubeconfig=kubeconfig,
            context=context,
            in_cluster=in_cluster,
            config_dict=config_dict,
            namespace=namespace,
        )
        self.namespace = self.cluster.namespace
        self.api_client = new_api_client(self.cluster)
        self.api = KubeApi(self.api_client, retry_policy)
        self.submit_timeout = submit_timeout
        self.pod_stuck_timeout = pod_stuck_timeout
        self.log_tail_lines = log_tail_lines
        self.last_wait_stats: WatchStats | None = None

    # --- lifecycle ------------------------------------------------------------------------------------
    def close(self) -> None:
        self.api_client.close()

    def __enter__(self) -> KubernetesBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KubernetesBackend(server={self.cluster.server!r}, namespace={self.namespace!r})"

    def _ref(self, ref: JobRef | str) -> JobRef:
        return as_ref(ref, self.namespace)

    # --- runtimes -------------------------------------------------------------------------------------
    def runtimes(self) -> list[Runtime]:
        try:
            objs = self.api.list_cluster_runtimes()
        except Exception as exc:
            raise reraise(exc, "list", "clustertrainingruntimes", self.namespace) from exc
        try:
            objs += self.api.list_runtimes(self.namespace)
        except Exception as exc:
            if retry.status_of(exc) not in (403, 404):  # no permission / CRD absent: cluster runtimes only
                raise reraise(exc, "list", "trainingruntimes", self.namespace) from exc
        return [Runtime.from_object(o) for o in objs]

    def get_runtime(
        self, name: str, kind: str = "ClusterTrainingRuntime", namespace: str | None = None
    ) -> Runtime:
        ns = namespace or self.namespace
        try:
            return Runtime.from_object(self.api.get_runtime(name, kind, ns))
        except Exception as exc:
            if retry.status_of(exc) == 404:
                try:
                    available = [r.name for r in self.runtimes() if r.kind == kind]
                except Exception:
                    available = []
                raise RuntimeNotFound(name, kind, available) from exc
            plural = "trainingruntimes" if kind == "TrainingRuntime" else "clustertrainingruntimes"
            raise reraise(exc, "get", plural, ns, name) from exc

    def render(self, request: TrainJobRequest | dict[str, Any], *, attempt: int = 1) -> dict[str, Any]:
        req = parse_request(request)
        runtime = self.get_runtime(req.runtime, req.runtime_kind, req.namespace or self.namespace)
        return build_trainjob(req, runtime, namespace=self.namespace, attempt=attempt)

    # --- submit ---------------------------------------------------------------------------------------
    def validate_remote(
        self, request: TrainJobRequest | dict[str, Any], *, attempt: int = 1
    ) -> dict[str, Any]:
        """Server-side dry-run create (CRD schema, CEL, admission webhooks); returns the defaulted object."""
        return self._dry_run(self.render(request, attempt=attempt))

    def _dry_run(self, manifest: dict[str, Any]) -> dict[str, Any]:
        ns = str(manifest["metadata"].get("namespace") or self.namespace)
        try:
            return self.api.create_trainjob(ns, manifest, dry_run=True)
        except Exception as exc:
            if retry.status_of(exc) == 409:
                return manifest  # exists already: the create itself will adopt or refuse it
            raise reraise(exc, "create", "trainjobs", ns, manifest["metadata"]["name"]) from exc

    def submit(
        self, request: TrainJobRequest | dict[str, Any], *, dry_run: bool = False, attempt: int = 1
    ) -> JobRef:
        """Create the TrainJob (after a server-side dry-run when ``dry_run``); adopt our own on AlreadyExists."""
        manifest = self.render(request, attempt=attempt)
        ns = str(manifest["metadata"].get("namespace") or self.namespace)
        name = str(manifest["metadata"]["name"])
        if dry_run:
            self._dry_run(manifest)  # the manifest just rendered: no second runtime read
        obj = self.create_or_adopt(ns, manifest)
        meta = obj.get("metadata") or {}
        return JobRef(name=name, namespace=ns, uid=meta.get("uid"))

    def create_or_adopt(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        """POST once; after AlreadyExists or a lost answer, look at what exists before doing anything else."""
        name = str(manifest["metadata"]["name"])
        throttled = 0
        attempt = 0
        while attempt < CREATE_ATTEMPTS:
            attempt += 1
            try:
                return self.api.create_trainjob(namespace, manifest)
            except Exception as exc:
                status = retry.status_of(exc)
                if status == 409:
                    existing = self._get_raw(namespace, name)
                    if existing is None:
                        continue  # deleted between our POST and GET: try again
                    return self.adopt(existing, manifest)
                if status == 429 and throttled < self.api.policy.attempts:
                    # refused before it was processed (priority and fairness): POST again after Retry-After
                    throttled += 1
                    attempt -= 1
                    time.sleep(retry.wait_seconds(exc, throttled, self.api.policy))
                    continue
                if status is None and retry.is_connection_error(exc):
                    # the POST may or may not have happened: the deterministic name tells us
                    log.warning(
                        "create of TrainJob %s/%s lost its answer (%r); checking", namespace, name, exc
                    )
                    existing = self._get_raw(namespace, name)
                    if existing is not None:
                        return self.adopt(existing, manifest)
                    if attempt < CREATE_ATTEMPTS:
                        time.sleep(retry.backoff(attempt))
                        continue
                raise reraise(exc, "create", "trainjobs", namespace, name) from exc
        raise BackendError(f"could not create TrainJob {namespace}/{name} after {CREATE_ATTEMPTS} attempts")

    def adopt(self, existing: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
        """Return ``existing`` if it is the TrainJob this manifest describes, else raise TrainJobConflict."""
        meta = existing.get("metadata") or {}
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        have = meta.get("labels") or {}
        want = (manifest.get("metadata") or {}).get("labels") or {}
        label_diffs = [k for k in IDENTITY_LABELS if k in want and have.get(k) != want[k]]
        field_diffs = immutable_differences(existing, manifest)
        if meta.get("deletionTimestamp"):
            raise TrainJobConflict(f"TrainJob {name} exists but is being deleted; retry once it is gone")
        if label_diffs or field_diffs:
            parts = []
            if label_diffs:
                parts.append(
                    "identity labels differ: "
                    + ", ".join(f"{k}={have.get(k)!r} (wanted {want[k]!r})" for k in label_diffs)
                )
            if field_diffs:
                parts.append("immutable fields differ: " + ", ".join(field_diffs))
            raise TrainJobConflict(
                f"TrainJob {name} already exists and is not this request's ({'; '.join(parts)}); "
                "use another name or idempotency_key, or delete the existing TrainJob"
            )
        log.info("adopted existing TrainJob %s", name)
        return existing

    # --- reads ----------------------------------------------------------------------------------------
    def _get_raw(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.api.get_trainjob(namespace, name)
        except Exception as exc:
            if retry.status_of(exc) == 404:
                return None
            raise reraise(exc, "get", "trainjobs", namespace, name) from exc

    def get(self, ref: JobRef | str) -> TrainJobResult:
        r = self._ref(ref)
        obj = self._get_raw(r.namespace, r.name)
        if obj is None:
            raise TrainJobNotFound(r.namespace, r.name)
        return result_from_trainjob(obj)

    # --- wait -----------------------------------------------------------------------------------------
    def _tracker(self, on_update: UpdateCallback | None) -> Any:
        last: list[tuple[Any, ...]] = []

        def observe(obj: dict[str, Any]) -> TrainJobResult:
            result = result_from_trainjob(obj)
            if result.state is JobState.CREATED and last and last[0][0] is JobState.RUNNING:
                # Trainer briefly publishes all-zero jobsStatus between a pod failing and Failed: a job
                # that ran is not reported as back to Created.
                result = result.model_copy(update={"state": JobState.RUNNING})
            key = (result.state, result.reason, result.progress, tuple(sorted(result.metrics.items())))
            if on_update is not None and (not last or last[0] != key):
                on_update(result)
            last[:] = [key]
            return result

        return observe

    def _creation_check_due(self, obj: dict[str, Any], checked: list[float]) -> bool:
        """Cheap, no I/O: is the job still without JobSet progress after ``submit_timeout``, unchecked for 30 s?"""
        result = result_from_trainjob(obj)
        status = obj.get("status") or {}
        if result.state is not JobState.CREATED or status.get("jobsStatus"):
            return False
        created = result.created_at.timestamp() if result.created_at else time.time()
        now = time.time()
        if now - created < self.submit_timeout or (checked and now - checked[0] < 30):
            return False
        checked[:] = [now]
        return True

    def _creation_stuck(self, obj: dict[str, Any], checked: list[float]) -> Diagnostics | None:
        """After ``submit_timeout`` without JobSet progress: creation-failure events, if any (checked rarely)."""
        if not self._creation_check_due(obj, checked):
            return None
        meta = obj.get("metadata") or {}
        return self._creation_diagnostics(str(meta.get("namespace", "")), str(meta.get("name", "")))

    def _creation_diagnostics(self, namespace: str, name: str) -> Diagnostics | None:
        try:
            events = diagnostics.trainjob_events(self.api, namespace, name)
        except Exception:
            return None
        if not diagnostics.has_creation_failure(events):
            return None
        return Diagnostics(events=diagnostics.event_lines(events, {name}))

    @staticmethod
    def _pods_not_ready(obj: dict[str, Any] | None) -> bool:
        """A Created/Running job with a pod not ready (pending, pulling, crashed): no I/O."""
        if obj is None or result_from_trainjob(obj).state not in (JobState.CREATED, JobState.RUNNING):
            return False
        jobs = (obj.get("status") or {}).get("jobsStatus") or []
        return any(int(j.get("active") or 0) > int(j.get("ready") or 0) for j in jobs)

    def _pods_check_due(self, obj: dict[str, Any], checked: list[float]) -> bool:
        """Cheap, no I/O: pods not ready, unchecked for a second? A crash shows as a drop of the Trainer's ready
        count (an event); the watch window shrinks to ``POD_CHECK_SECONDS`` while pods are not ready, since a
        pod crash-looping before it was ever ready changes no TrainJob status."""
        if not self._pods_not_ready(obj):
            return False
        now = time.time()
        if checked and now - checked[0] < 1.0:
            return False
        checked[:] = [now]
        return True

    def _inspect_pods(self, obj: dict[str, Any], captured: list[Diagnostics]) -> TrainJobFailed | None:
        """One pod list: TrainJobFailed when a pod has been unschedulable or unable to start its containers for
        ``pod_stuck_timeout``; a crashed container's exit code and log tail are kept in ``captured`` now, while
        the log exists (the Job deletes its pods before the TrainJob turns Failed)."""
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        try:
            pods = self.api.list_pods(ns, f"{diagnostics.JOBSET_NAME_LABEL}={name}")
        except Exception:
            return None
        stuck = diagnostics.stuck_reason(pods, time.time(), self.pod_stuck_timeout)
        if stuck is not None:
            reason, detail = stuck
            message = f"{detail} (for over {self.pod_stuck_timeout:.0f}s; the TrainJob was left as it is)"
            failed = result_from_trainjob(obj).model_copy(
                update={"state": JobState.FAILED, "reason": reason, "message": message}
            )
            return TrainJobFailed(failed, diagnostics.collect(self.api, ns, name))
        if diagnostics.pod_problems(pods)[1] and not (captured and captured[0].log_tail):
            captured[:] = [diagnostics.collect(self.api, ns, name)]
        return None

    def _window(self) -> float:
        return max(5.0, min(300.0, min(self.submit_timeout, self.pod_stuck_timeout) / 4))

    def _timeout(
        self, ref: JobRef, obj: dict[str, Any] | None, waited: float, diag: Diagnostics | None
    ) -> WaitTimeout:
        state = result_from_trainjob(obj).state.value if obj else "unknown"
        if diag is None and obj is not None and state in (JobState.CREATED.value, JobState.QUEUED.value):
            diag = self._creation_diagnostics(ref.namespace, ref.name)
        return WaitTimeout(ref.namespace, ref.name, state, waited, diagnostics=diag)

    def wait(
        self,
        ref: JobRef | str,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        raise_on_failure: bool = True,
        on_update: UpdateCallback | None = None,
        resource_version: str | None = None,
    ) -> TrainJobResult:
        """Watch until Complete/Failed or the absolute deadline (WaitTimeout; the job keeps running)."""
        r = self._ref(ref)
        started = time.time()
        dl = resolve_deadline(timeout, deadline)
        observe = self._tracker(on_update)
        checked: list[float] = []
        pods_checked: list[float] = []
        stuck: list[Diagnostics] = []
        stuck_pods: list[TrainJobFailed] = []
        captured: list[Diagnostics] = []
        last: list[dict[str, Any]] = []  # the newest version seen, for the watch window

        def done(obj: dict[str, Any]) -> bool:
            last[:] = [obj]
            if observe(obj).state.terminal:
                return True
            diag = self._creation_stuck(obj, checked)
            if diag is not None:
                stuck.append(diag)
                return True
            if self._pods_check_due(obj, pods_checked):
                failure = self._inspect_pods(obj, captured)
                if failure is not None:
                    stuck_pods.append(failure)
                    return True
            return False

        stats = WatchStats()
        self.last_wait_stats = stats

        def window() -> float:
            return POD_CHECK_SECONDS if self._pods_not_ready(last[0] if last else None) else self._window()

        try:
            obj, finished = watch_until(
                self.api,
                r.namespace,
                r.name,
                deadline=dl,
                done=done,
                window=window,
                resource_version=resource_version,
                stats=stats,
            )
        except (TrainJobNotFound, BackendError):
            raise
        except Exception as exc:
            raise reraise(exc, "watch", "trainjobs", r.namespace, r.name) from exc
        if stuck_pods:
            if raise_on_failure:
                raise stuck_pods[0]
            return stuck_pods[0].result  # type: ignore[no-any-return]
        if stuck or not finished:
            raise self._timeout(r, obj, time.time() - started, stuck[0] if stuck else None)
        assert obj is not None
        return self.finish(obj, raise_on_failure=raise_on_failure, captured=captured)

    def finish(
        self,
        obj: dict[str, Any],
        *,
        raise_on_failure: bool = True,
        captured: list[Diagnostics] | None = None,
    ) -> TrainJobResult:
        """Terminal object -> result (metrics from rank 0's log if status has none); raise on Failed."""
        result = result_from_trainjob(obj)
        if result.state is JobState.COMPLETE and not result.metrics:
            metrics, progress = self.metrics_from_log(obj)
            if metrics or progress is not None:
                result = result.model_copy(
                    update={
                        "metrics": metrics,
                        "progress": progress if progress is not None else result.progress,
                    }
                )
        if result.state is JobState.FAILED:
            diag = diagnostics.collect(self.api, result.namespace, result.name)
            if captured:  # what the pods showed while they existed
                diag.failed_ranks = diag.failed_ranks or captured[0].failed_ranks
                diag.log_tail = diag.log_tail or captured[0].log_tail
            if raise_on_failure:
                raise TrainJobFailed(result, diag)
        return result

    def metrics_from_log(self, obj: dict[str, Any]) -> tuple[dict[str, float | str], int | None]:
        """Best effort: the last TRAINFLOW_REPORT line in the tail of rank 0's log (two API calls)."""
        meta = obj.get("metadata") or {}
        name, ns = str(meta.get("name")), str(meta.get("namespace") or self.namespace)
        selector = (
            f"{diagnostics.JOBSET_NAME_LABEL}={name},{diagnostics.REPLICATED_JOB_LABEL} in (launcher,node),"
            f"{diagnostics.COMPLETION_INDEX_LABEL}=0"
        )
        try:
            pods = self.api.list_pods(ns, selector, limit=10)
            launcher = [
                p for p in pods if diagnostics.pod_label(p, diagnostics.REPLICATED_JOB_LABEL) == "launcher"
            ]
            pod = newest_pod(launcher or pods)  # MPI: rank 0 is the launcher
            if pod is None:
                return {}, None
            resp = self.api.pod_log(
                ns, str(pod["metadata"]["name"]), "node", tail_lines=self.log_tail_lines, limit_bytes=1 << 20
            )
            try:
                lines = [raw.decode("utf-8", "replace") for raw in iter_lines(resp)]
            finally:
                resp.release_conn()
            return last_report(lines)
        except Exception as exc:
            log.debug("no metrics from the log of %s/%s: %r", ns, name, exc)
            return {}, None

    def _runtime_of(self, obj: Mapping[str, Any]) -> Runtime | None:
        ref = (obj.get("spec") or {}).get("runtimeRef") or {}
        ns = (obj.get("metadata") or {}).get("namespace") or self.namespace
        try:
            return self.get_runtime(
                str(ref.get("name")), str(ref.get("kind") or "ClusterTrainingRuntime"), ns
            )
        except Exception:
            return None

    async def wait_async(
        self,
        ref: JobRef | str,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        raise_on_failure: bool = True,
        on_update: UpdateCallback | None = None,
    ) -> TrainJobResult:
        """``wait`` for event loops: every waiter of this loop shares one watch per (server, namespace)."""
        r = self._ref(ref)
        started = time.time()
        dl = resolve_deadline(timeout, deadline)
        observe = self._tracker(on_update)
        reg = registry()
        key = (self.cluster.server, r.namespace)
        checked: list[float] = []
        pods_checked: list[float] = []
        captured: list[Diagnostics] = []
        obj: dict[str, Any] | None = None
        async with reg.subscribe(key, lambda: async_configuration(self.cluster), r.name) as box:
            while True:
                remaining = None if dl is None else dl - time.time()
                if remaining is not None and remaining <= 0:
                    break
                # jittered, so waiters started together (triggerer restart, fan-out) do not wake together
                window = POD_CHECK_SECONDS if self._pods_not_ready(obj) else self._window()
                window *= random.uniform(0.8, 1.2)
                update = await reg.next_update(
                    key, box, window if remaining is None else min(window, remaining)
                )
                if update is not None:
                    new_obj, deleted = update
                    if new_obj is not None:
                        obj = new_obj
                        if observe(obj).state.terminal:
                            break
                    if deleted:
                        raise TrainJobNotFound(r.namespace, r.name)
                if obj is not None and self._creation_check_due(obj, checked):
                    meta = obj.get("metadata") or {}
                    diag = await asyncio.to_thread(
                        self._creation_diagnostics, str(meta.get("namespace", "")), str(meta.get("name", ""))
                    )
                    if diag is not None:
                        raise self._timeout(r, obj, time.time() - started, diag)
                if obj is not None and self._pods_check_due(obj, pods_checked):
                    failure = await asyncio.to_thread(self._inspect_pods, obj, captured)
                    if failure is not None:
                        if raise_on_failure:
                            raise failure
                        return failure.result  # type: ignore[no-any-return]
        if obj is None or not result_from_trainjob(obj).state.terminal:
            raise await asyncio.to_thread(self._timeout, r, obj, time.time() - started, None)
        return await asyncio.to_thread(self.finish, obj, raise_on_failure=raise_on_failure, captured=captured)

    # --- logs, cancel, suspend ------------------------------------------------------------------------
    def logs(
        self,
        ref: JobRef | str,
        *,
        follow: bool = False,
        step: str = "node-0",
        tail_lines: int | None = None,
        pod_wait: float = 120.0,
    ) -> Iterator[str]:
        r = self._ref(ref)
        obj = self._get_raw(r.namespace, r.name)
        if obj is None:
            raise TrainJobNotFound(r.namespace, r.name)
        reader = LogReader(
            self.api, r.namespace, step_target(r.name, step, self._runtime_of(obj)), pod_wait=pod_wait
        )
        lines = reader.follow(tail_lines) if follow else reader.read(tail_lines)
        return self._translated(lines, r)

    def _translated(self, lines: Iterator[str], ref: JobRef) -> Iterator[str]:
        """API errors while reading a log become trainflow errors (403 names the verb and resource)."""
        try:
            yield from lines
        except Exception as exc:
            if retry.status_of(exc) is None:
                raise
            raise reraise(exc, "get", "pods/log", ref.namespace, ref.name) from exc

    def cancel(self, ref: JobRef | str) -> bool:
        """Delete the TrainJob; the garbage collector then removes its JobSet, Jobs and pods. False when it
        was already gone.

        Background propagation, as kubectl and the Kubeflow SDK delete: measured on the testbed, Foreground kept
        the TrainJob 33-41 s and its pods 50 s (the JobSet/Job chain kept reconciling while it was being
        deleted), Background removed the TrainJob at once and the pods in 5.8-29.8 s.
        """
        r = self._ref(ref)
        try:
            self.api.delete_trainjob(r.namespace, r.name, "Background")
        except Exception as exc:
            if retry.status_of(exc) == 404:
                return False
            raise reraise(exc, "delete", "trainjobs", r.namespace, r.name) from exc
        return True

    def _set_suspend(self, ref: JobRef | str, value: bool) -> TrainJobResult:
        r = self._ref(ref)
        try:
            obj = self.api.patch_trainjob(r.namespace, r.name, {"spec": {"suspend": value}})
        except Exception as exc:
            raise reraise(exc, "patch", "trainjobs", r.namespace, r.name) from exc
        return result_from_trainjob(obj)

    def suspend(self, ref: JobRef | str) -> TrainJobResult:
        return self._set_suspend(ref, True)

    def resume(self, ref: JobRef | str) -> TrainJobResult:
        return self._set_suspend(ref, False)

    # last, so that ``list`` in the annotations above is the builtin
    def list(self, labels: Mapping[str, str] | None = None) -> list[TrainJobResult]:
        """TrainJobs in this backend's namespace, optionally filtered by labels."""
        try:
            listed = self.api.list_trainjobs(self.namespace, label_selector=_selector(labels))
        except Exception as exc:
            raise reraise(exc, "list", "trainjobs", self.namespace) from exc
        return [result_from_trainjob(o) for o in listed.get("items") or []]
