"""KubernetesBackend: TrainJobs on a cluster running Kubeflow Trainer v2 (``trainer.kubeflow.org/v1alpha1``).

Launch primitives, reads, logs and cancel over ``KubeApi`` (the calls of kube/calls.py, retried and translated
at that boundary); ``lifecycle`` decides what to create; every wait, sync or async, is kube/wait.py's loop.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from trainflow.core.backend import WaitsByEnding
from trainflow.core.ending import Ending
from trainflow.core.errors import AlreadyExists, NotFound, PermissionDenied, RuntimeNotFound, TrainJobNotFound
from trainflow.core.kube import calls, kueue_reads, retry
from trainflow.core.kube.auth import identity
from trainflow.core.kube.client import KubeApi
from trainflow.core.kube.config import load_cluster_config
from trainflow.core.kube.listwatch import WatchStats
from trainflow.core.kube.logs import LogReader, StepTarget, step_target
from trainflow.core.kube.plan import run
from trainflow.core.kube.shared_watch import WatchKey
from trainflow.core.kube.wait import WaitSettings, run_blocking, wait_for
from trainflow.core.logsink import LogSink
from trainflow.core.observe import UpdateCallback, resolve_deadline
from trainflow.core.report_lines import TAIL_LINES
from trainflow.core.result import JobRef, TrainJobResult, result_from_trainjob

if TYPE_CHECKING:
    from trainflow.core.request import TrainJobRequest
    from trainflow.core.runtimes import Runtime
    from trainflow.core.schema import Picture as SchemaPicture

RUNTIME_TTL = 300.0  # the Trainer reads a runtime when it creates a job; a read this old is still used


def _items(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(answer.get("items") or [])


def _selector(labels: Mapping[str, str] | None) -> str | None:
    return ",".join(f"{k}={v}" for k, v in labels.items()) if labels else None


class KubernetesBackend(WaitsByEnding):
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
        log_tail_lines: int = TAIL_LINES,
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
        self._schema: tuple[float, SchemaPicture | None] | None = None
        self._queues = kueue_reads.SchedulingChecks(RUNTIME_TTL)

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

        objs = [
            dict(i, kind="ClusterTrainingRuntime")
            for i in _items(self.api.run(calls.list_cluster_runtimes()))
        ]
        # no permission, or no namespaced-runtime CRD: cluster runtimes only
        with contextlib.suppress(PermissionDenied, NotFound):
            objs += [
                dict(i, kind="TrainingRuntime")
                for i in _items(self.api.run(calls.list_runtimes(self.namespace)))
            ]
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
            runtime = Runtime.from_object(
                dict(self.api.run(calls.get_runtime(name, kind, key[2])), kind=kind)
            )
        except NotFound:
            try:
                available = [r.name for r in self.runtimes() if r.kind == kind]
            except Exception:
                available = []
            raise RuntimeNotFound(name, kind, available) from None
        self._runtimes[key] = (time.monotonic(), runtime)
        return runtime

    def schema_picture(self) -> SchemaPicture | None:
        """The TrainJob CRD schema the cluster serves, read once per ``RUNTIME_TTL`` seconds; None (the vendored
        schema applies, and refusals say so) when this user may not read CRDs."""
        from trainflow.core import schema

        if self._schema is not None and time.monotonic() - self._schema[0] < RUNTIME_TTL:
            return self._schema[1]
        try:
            picture: SchemaPicture | None = schema.served(self.api.run(calls.get_trainjob_crd()))
        except (PermissionDenied, NotFound, ValueError):
            picture = None
        self._schema = (time.monotonic(), picture)
        return picture

    # --- launch primitives ----------------------------------------------------------------------------
    def find(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        return _items(self.api.run(calls.list_trainjobs(namespace, label_selector=_selector(labels))))

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.api.run(calls.get_trainjob(namespace, name))
            return found
        except TrainJobNotFound:
            return None

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self._queues.check(self.api, self._namespace_of(manifest), manifest)  # its LocalQueue exists
        created: dict[str, Any] = self.api.run(calls.create_trainjob(self._namespace_of(manifest), manifest))
        return created

    def adopt(self, obj: Mapping[str, Any]) -> None:
        """Nothing to do on a cluster: the controllers run what exists."""

    def dry_run(self, manifest: dict[str, Any]) -> None:
        """Server-side dry-run create: CRD schema, CEL rules and admission webhooks; nothing is stored."""
        self._queues.check(self.api, self._namespace_of(manifest), manifest)
        # AlreadyExists: the name is taken; launch would adopt or refuse it, so the request itself is valid
        with contextlib.suppress(AlreadyExists):
            self.api.run(calls.create_trainjob(self._namespace_of(manifest), manifest, dry_run=True))

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
        """The job's state; a job Kueue manages also says what Kueue says (one more read)."""
        r = self._ref(ref)
        obj = self.api.run(calls.get_trainjob(r.namespace, r.name))
        return run(kueue_reads.with_kueue(obj, result_from_trainjob(obj)), self.api)

    # --- wait -----------------------------------------------------------------------------------------
    def wait_settings(self) -> WaitSettings:
        """What this connection's waits need of it (they never hold the backend)."""

        def seen(stats: WatchStats) -> None:
            self.last_wait_stats = stats

        return WaitSettings(
            cluster=self.cluster,
            submit_timeout=self.submit_timeout,
            pod_stuck_timeout=self.pod_stuck_timeout,
            log_tail_lines=self.log_tail_lines,
            known_runtime=self.cached_runtime,
            on_stats=seen,
        )

    def watch_key(self, namespace: str | None = None, job: str | None = None) -> WatchKey:
        """The key of the watch that waiters of this connection share (``job``: a sync waiter's own)."""
        return (identity(self.cluster), namespace or self.namespace, job)

    def wait_ending(
        self,
        ref: JobRef | str,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        diagnose: bool = True,
        on_update: UpdateCallback | None = None,
        logs: LogSink | None = None,
    ) -> Ending:
        """Watch until the job ends or the deadline passes (the job keeps running): ``wait_ending_async`` on a
        private event loop, watching this job and its pods only."""
        r, until = self._ref(ref), resolve_deadline(timeout, deadline)
        return run_blocking(
            wait_for(
                self.wait_settings(),
                r,
                deadline=until,
                diagnose=diagnose,
                on_update=on_update,
                logs=logs,
                scope_job=True,
            )
        )

    async def wait_ending_async(
        self,
        ref: JobRef | str,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        diagnose: bool = True,
        on_update: UpdateCallback | None = None,
        logs: LogSink | None = None,
    ) -> Ending:
        """``wait_ending`` for event loops: every waiter of this loop shares one watch per (connection,
        namespace)."""
        r, until = self._ref(ref), resolve_deadline(timeout, deadline)
        return await wait_for(
            self.wait_settings(),
            r,
            deadline=until,
            diagnose=diagnose,
            on_update=on_update,
            logs=logs,
            scope_job=False,
        )

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
        obj = self.api.run(calls.get_trainjob(r.namespace, r.name))
        reader = LogReader(
            self.api, r.namespace, step_target(r.name, step, self._runtime_of(obj)), pod_wait=pod_wait
        )
        return reader.follow(tail_lines) if follow else reader.read(tail_lines)

    def cached_runtime(self, name: str, kind: str, namespace: str) -> Runtime | None:
        """The runtime this backend read recently (its launch did), without a request; None if not read."""
        cached = self._runtimes.get((name, kind, namespace))
        return cached[1] if cached is not None and time.monotonic() - cached[0] < RUNTIME_TTL else None

    def step_target(self, obj: Mapping[str, Any], step: str) -> StepTarget:
        """Which pods and container hold ``step``'s log for this TrainJob (its runtime decides rank 0)."""
        return step_target(str(obj["metadata"]["name"]), step, self._runtime_of(obj))

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
            self.api.run(calls.delete_trainjob(r.namespace, r.name, "Background"))
        except TrainJobNotFound:
            return False
        return True

    async def cancel_async(self, ref: JobRef | str) -> bool:
        """``cancel`` on the event loop's client (a deferred task killed in the triggerer)."""
        from trainflow.core.kube.aio import AsyncKubeApi
        from trainflow.core.kube.http import open_transport

        r = self._ref(ref)
        async with open_transport(self.cluster) as transport:
            try:
                await AsyncKubeApi(transport).run(calls.delete_trainjob(r.namespace, r.name, "Background"))
            except TrainJobNotFound:
                return False
        return True

    def _set_suspend(self, ref: JobRef | str, value: bool) -> TrainJobResult:
        r = self._ref(ref)
        return result_from_trainjob(
            self.api.run(calls.patch_trainjob(r.namespace, r.name, {"spec": {"suspend": value}}))
        )

    def suspend(self, ref: JobRef | str) -> TrainJobResult:
        return self._set_suspend(ref, True)

    def resume(self, ref: JobRef | str) -> TrainJobResult:
        return self._set_suspend(ref, False)

    # last, so that ``list`` in the annotations above is the builtin

    def list(self, labels: Mapping[str, str] | None = None) -> list[TrainJobResult]:
        return [result_from_trainjob(o) for o in self.find(self.namespace, labels or {})]
