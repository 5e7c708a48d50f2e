"""KubernetesBackend: TrainJobs on a cluster running Kubeflow Trainer v2 (``trainer.kubeflow.org/v1alpha1``).

Pure logic over ``KubeApi`` (sync) and the shared watch's ``AsyncKubeApi`` (event loops): the API boundary
retries and translates errors, ``lifecycle`` decides what to create, ``observe`` decides what each version of
a TrainJob means, and the reads that explain an ending (metrics, diagnostics) are plans run on either API.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from trainflow.core.errors import (
    AlreadyExists,
    Diagnostics,
    NotFound,
    PermissionDenied,
    RuntimeNotFound,
    TrainJobFailed,
    TrainJobNotFound,
    WaitTimeout,
)
from trainflow.core.kube import diagnostics, retry
from trainflow.core.kube.client import KubeApi
from trainflow.core.kube.config import load_cluster_config
from trainflow.core.kube.logs import LogReader, step_target
from trainflow.core.kube.plan import Plan, arun, run
from trainflow.core.kube.reportlog import last_report
from trainflow.core.kube.shared_watch import registry
from trainflow.core.kube.transport import open_transport
from trainflow.core.kube.watch import WATCH_WINDOW, WatchStats, watch_until
from trainflow.core.observe import POD_CHECK_SECONDS, UpdateCallback, Waiter, observe, resolve_deadline
from trainflow.core.reporting import return_value
from trainflow.core.result import RETURNS_ANNOTATION, JobRef, JobState, TrainJobResult, result_from_trainjob

if TYPE_CHECKING:
    from trainflow.core.request import TrainJobRequest
    from trainflow.core.runtimes import Runtime

RUNTIME_TTL = 300.0  # the Trainer reads a runtime when it creates a job; a read this old is still used


def _selector(labels: Mapping[str, str] | None) -> str | None:
    return ",".join(f"{k}={v}" for k, v in labels.items()) if labels else None


def finish(
    obj: Mapping[str, Any], raise_on_failure: bool, log_tail_lines: int, captured: Diagnostics | None = None
) -> Plan[TrainJobResult]:
    """A terminal TrainJob -> its result: metrics from rank 0's log only when trainerStatus has none (and a function
    trainer's return value from the same read); raise
    TrainJobFailed with diagnostics on Failed (with what the pods showed while they existed: ``captured``)."""
    result = result_from_trainjob(obj)
    returns = RETURNS_ANNOTATION in ((obj.get("metadata") or {}).get("annotations") or {})
    if result.state is JobState.COMPLETE and (returns or not result.metrics):
        lines = yield from diagnostics.rank0_log_tail(result.namespace, result.name, log_tail_lines)
        metrics, progress = last_report(lines) if not result.metrics else ({}, None)
        if metrics or progress is not None:
            update = {"metrics": metrics, "progress": progress if progress is not None else result.progress}
            result = result.replace(**update)
        if returns:
            result = result.replace(return_value=return_value(lines))
    if result.state is JobState.FAILED and raise_on_failure:
        # on a real cluster the Job deletes its pods before the TrainJob turns Failed: name what was captured
        diag = diagnostics.with_first_crash(
            (yield from diagnostics.collect(result.namespace, result.name)), captured
        )
        raise TrainJobFailed(result, diag)
    return result


def check_pods(
    waiter: Waiter, stuck_after: float, captured: list[Diagnostics]
) -> Plan[TrainJobFailed | None]:
    """Pods not ready: a TrainJobFailed when one is stuck (unschedulable, image or config it cannot get) for
    ``stuck_after`` seconds - the Trainer never fails such a job; else keep a crash's diagnostics in ``captured``."""
    assert waiter.result is not None
    result = waiter.result
    stuck, diag = yield from diagnostics.inspect_pods(result.namespace, result.name, time.time(), stuck_after)
    if stuck is not None:
        reason, detail = stuck
        message = f"{detail} (for over {stuck_after:.0f}s; the TrainJob was left as it is)"
        failed = result.replace(state=JobState.FAILED, reason=reason, message=message)
        return TrainJobFailed(failed, diag)
    diagnostics.keep_first_crash(captured, diag)
    return None


def timed_out(ref: JobRef, waiter: Waiter, waited: float, diag: Diagnostics | None) -> Plan[WaitTimeout]:
    """The WaitTimeout for a wait that ended early; a job never started gets its creation-failure events."""
    state = waiter.result.state if waiter.result is not None else None
    if diag is None and state in (JobState.CREATED, JobState.QUEUED):
        diag = yield from diagnostics.creation_failure(ref.namespace, ref.name)
    return WaitTimeout(ref.namespace, ref.name, state.value if state else "unknown", waited, diagnostics=diag)


class KubernetesBackend:
    """TrainJobs on a Kubernetes cluster.

    Config: ``kubeconfig`` (one file, or several joined by ``:``), ``context``, ``in_cluster``,
    ``config_dict`` (inline kubeconfig), ``namespace``, ``verify_ssl`` (False: the server's certificate is not
    checked); ``submit_timeout``: how long a job may stay without JobSet progress before creation-failure
    events are looked for; ``pod_stuck_timeout``: how long a pod may
    stay unschedulable or unable to start its containers (image pull, missing config) before ``wait`` raises
    TrainJobFailed (the TrainJob is left as it is); ``log_tail_lines``: how much of rank 0's log is scanned
    for metrics when trainerStatus carries none.
    """

    name = "kubernetes"
    is_local = False

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        in_cluster: bool | None = None,
        config_dict: Mapping[str, Any] | None = None,
        namespace: str | None = None,
        verify_ssl: bool = True,
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
            verify_ssl=verify_ssl,
        )
        self.namespace = self.cluster.namespace
        self.api = KubeApi(self.cluster, retry_policy)
        self.submit_timeout = submit_timeout
        self.pod_stuck_timeout = pod_stuck_timeout
        self.log_tail_lines = log_tail_lines
        self.last_wait_stats: WatchStats | None = None
        self._runtimes: dict[tuple[str, str, str], tuple[float, Runtime]] = {}

    def close(self) -> None:
        self.api.close()

    def __enter__(self) -> KubernetesBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KubernetesBackend(server={self.cluster.server!r}, namespace={self.namespace!r})"

    def _ref(self, ref: JobRef | str) -> JobRef:
        return JobRef.parse(ref, self.namespace)

    # --- runtimes -------------------------------------------------------------------------------------
    def runtimes(self) -> list[Runtime]:
        from trainflow.core.runtimes import Runtime

        objs = self.api.list_cluster_runtimes()
        # no permission, or no namespaced-runtime CRD: cluster runtimes only
        with contextlib.suppress(PermissionDenied, NotFound):
            objs += self.api.list_runtimes(self.namespace)
        return [Runtime.from_object(o) for o in objs]

    def get_runtime(
        self, name: str, kind: str = "ClusterTrainingRuntime", namespace: str | None = None
    ) -> Runtime:
        """One runtime; read once per ``RUNTIME_TTL`` seconds (a launch and its log follower share the read)."""
        from trainflow.core.runtimes import Runtime

        key = (name, kind, namespace or self.namespace)
        cached = self._runtimes.get(key)
        if cached is not None and time.monotonic() - cached[0] < RUNTIME_TTL:
            return cached[1]
        try:
            runtime = Runtime.from_object(self.api.get_runtime(name, kind, key[2]))
        except NotFound:
            try:
                available = [r.name for r in self.runtimes() if r.kind == kind]
            except Exception:
                available = []
            raise RuntimeNotFound(name, kind, available) from None
        self._runtimes[key] = (time.monotonic(), runtime)
        return runtime

    # --- launch primitives ----------------------------------------------------------------------------
    def find(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        return list(self.api.list_trainjobs(namespace, label_selector=_selector(labels)).get("items") or [])

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.api.get_trainjob(namespace, name)
        except TrainJobNotFound:
            return None

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self.api.create_trainjob(self._namespace_of(manifest), manifest)

    def adopt(self, obj: Mapping[str, Any]) -> None:
        """Nothing to do on a cluster: the controllers run what exists."""

    def dry_run(self, manifest: dict[str, Any]) -> None:
        """Server-side dry-run create: CRD schema, CEL rules and admission webhooks; nothing is stored."""
        # AlreadyExists: the name is taken; launch would adopt or refuse it, so the request itself is valid
        with contextlib.suppress(AlreadyExists):
            self.api.create_trainjob(self._namespace_of(manifest), manifest, dry_run=True)

    def _namespace_of(self, manifest: Mapping[str, Any]) -> str:
        return str((manifest.get("metadata") or {}).get("namespace") or self.namespace)

    def submit(self, request: TrainJobRequest | Mapping[str, Any], *, dry_run: bool = False) -> JobRef:
        from trainflow.core import lifecycle  # the request side loads on first submit, not for a waiter

        return lifecycle.launch(self, request, dry_run=dry_run).ref

    def render(self, request: TrainJobRequest | Mapping[str, Any], *, attempt: int = 1) -> dict[str, Any]:
        from trainflow.core import lifecycle

        return lifecycle.render(self, request, attempt=attempt)

    # --- reads ----------------------------------------------------------------------------------------
    def get(self, ref: JobRef | str) -> TrainJobResult:
        r = self._ref(ref)
        return result_from_trainjob(self.api.get_trainjob(r.namespace, r.name))

    # --- wait -----------------------------------------------------------------------------------------
    def _waiter(self, timeout: float | None, deadline: float | None, *, own: bool) -> Waiter:
        """``own``: one waiter per process (sync), which can afford a pod LIST every POD_CHECK_SECONDS."""
        every, until = POD_CHECK_SECONDS if own else None, resolve_deadline(timeout, deadline)
        return Waiter(
            deadline=until, submit_timeout=self.submit_timeout, pod_checks=True, pod_check_every=every
        )

    def _window(self) -> float:
        return max(5.0, min(WATCH_WINDOW, self.submit_timeout / 4))

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
        """Watch until Complete/Failed or the deadline (WaitTimeout; the job keeps running)."""
        r = self._ref(ref)
        started = time.time()
        waiter = self._waiter(timeout, deadline, own=True)
        stuck: list[Diagnostics] = []
        captured: list[Diagnostics] = []
        failures: list[TrainJobFailed] = []

        def feed(obj: dict[str, Any] | None) -> bool:
            out = observe(waiter, obj, time.time())
            if out.changed and on_update is not None and out.result is not None:
                on_update(out.result)
            if out.check_creation:
                diag = run(diagnostics.creation_failure(r.namespace, r.name), self.api)
                if diag is not None:
                    stuck.append(diag)
            if out.check_pods and not out.done:
                failure = run(check_pods(waiter, self.pod_stuck_timeout, captured), self.api)
                if failure is not None:
                    failures.append(failure)
            return out.done or out.timed_out or bool(stuck) or bool(failures)

        self.last_wait_stats = stats = WatchStats()
        window = self._window()
        watch_until(
            self.api,
            r.namespace,
            r.name,
            feed=feed,
            window=lambda: waiter.next_check(time.time(), window),
            resource_version=resource_version,
            stats=stats,
        )
        if failures:
            if raise_on_failure:
                raise failures[0]
            return failures[0].result  # type: ignore[no-any-return]
        if waiter.obj is None or waiter.result is None or not waiter.result.state.terminal:
            raise run(timed_out(r, waiter, time.time() - started, stuck[0] if stuck else None), self.api)
        tail = captured[0] if captured else None
        return run(finish(waiter.obj, raise_on_failure, self.log_tail_lines, tail), self.api)

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
        waiter = self._waiter(timeout, deadline, own=False)
        captured: list[Diagnostics] = []
        reg = registry()
        key = (self.cluster.server, r.namespace)
        async with reg.subscribe(key, functools.partial(open_transport, self.cluster), r.name) as box:
            while True:
                # jittered, so waiters started together (triggerer restart, fan-out) do not wake together
                window = self._window() * random.uniform(0.8, 1.2)
                update = await reg.next_update(key, box, waiter.next_check(time.time(), window))
                obj, crashed = None, False
                if update is not None:
                    obj, deleted, crashed = update
                    if deleted:
                        raise TrainJobNotFound(r.namespace, r.name)
                out = observe(waiter, obj, time.time())
                if out.changed and on_update is not None and out.result is not None:
                    on_update(out.result)
                failure = None  # on a crash, look at once: the Job deletes the pod soon
                if (out.check_pods or crashed) and waiter.result is not None:
                    failure = await arun(check_pods(waiter, self.pod_stuck_timeout, captured), reg.api(key))
                if out.done:
                    assert waiter.obj is not None
                    tail = captured[0] if captured else None
                    return await arun(
                        finish(waiter.obj, raise_on_failure, self.log_tail_lines, tail), reg.api(key)
                    )
                if failure is not None:
                    if raise_on_failure:
                        raise failure
                    return failure.result  # type: ignore[no-any-return]
                diag = None
                if out.check_creation:
                    diag = await arun(diagnostics.creation_failure(r.namespace, r.name), reg.api(key))
                if out.timed_out or diag is not None:
                    raise await arun(timed_out(r, waiter, time.time() - started, diag), reg.api(key))

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
        obj = self.api.get_trainjob(r.namespace, r.name)
        reader = LogReader(
            self.api, r.namespace, step_target(r.name, step, self._runtime_of(obj)), pod_wait=pod_wait
        )
        return reader.follow(tail_lines) if follow else reader.read(tail_lines)

    def _runtime_of(self, obj: Mapping[str, Any]) -> Runtime | None:
        ref = (obj.get("spec") or {}).get("runtimeRef") or {}
        ns = (obj.get("metadata") or {}).get("namespace") or self.namespace
        try:
            return self.get_runtime(
                str(ref.get("name")), str(ref.get("kind") or "ClusterTrainingRuntime"), ns
            )
        except Exception:
            return None

    def cancel(self, ref: JobRef | str) -> bool:
        """Delete the TrainJob with Background propagation, as kubectl and the Kubeflow SDK do (see
        docs/reliability.md); the garbage collector then removes its JobSet, Jobs and pods. False when it
        was already gone."""
        r = self._ref(ref)
        try:
            self.api.delete_trainjob(r.namespace, r.name, "Background")
        except TrainJobNotFound:
            return False
        return True

    def _set_suspend(self, ref: JobRef | str, value: bool) -> TrainJobResult:
        r = self._ref(ref)
        return result_from_trainjob(
            self.api.patch_trainjob(r.namespace, r.name, {"spec": {"suspend": value}})
        )

    def suspend(self, ref: JobRef | str) -> TrainJobResult:
        return self._set_suspend(ref, True)

    def resume(self, ref: JobRef | str) -> TrainJobResult:
        return self._set_suspend(ref, False)

    # last, so that ``list`` in the annotations above is the builtin

    def list(self, labels: Mapping[str, str] | None = None) -> list[TrainJobResult]:
        return [result_from_trainjob(o) for o in self.find(self.namespace, labels or {})]
