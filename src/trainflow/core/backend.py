"""One interface over where TrainJobs run: a Kubernetes cluster, or the embedded local engine."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

from trainflow.core.request import TrainJobRequest
from trainflow.core.result import JobRef, TrainJobResult
from trainflow.core.runtimes import Runtime

BackendName = Literal["kubernetes", "local"]
UpdateCallback = Callable[[TrainJobResult], None]


@runtime_checkable
class Backend(Protocol):
    """What every backend does. A failed job makes ``wait`` raise ``TrainJobFailed``."""

    name: str
    namespace: str

    def runtimes(self) -> list[Runtime]:
        """Training runtimes this backend can run TrainJobs on."""

    def get_runtime(self, name: str, kind: str = "ClusterTrainingRuntime") -> Runtime:
        """One runtime by name; ``RuntimeNotFound`` when it does not exist."""

    def render(self, request: TrainJobRequest, *, attempt: int = 1) -> dict[str, Any]:
        """The TrainJob manifest this backend would submit, validated; submits nothing."""

    def submit(self, request: TrainJobRequest, *, dry_run: bool = False, attempt: int = 1) -> JobRef:
        """Validate and create the TrainJob; adopt an existing one with the same identity.

        ``attempt`` > 1 derives a new name from the idempotency key (``<slug>-<hash>-<attempt>``) and labels
        it, so a retry after a failed or deleted job starts fresh instead of re-reading the failure.
        """

    def get(self, ref: JobRef | str) -> TrainJobResult:
        """Current state of one TrainJob; ``TrainJobNotFound`` if it does not exist."""

    def wait(
        self,
        ref: JobRef | str,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        raise_on_failure: bool = True,
        on_update: UpdateCallback | None = None,
    ) -> TrainJobResult:
        """Block until Complete or Failed, or until the absolute ``deadline`` (epoch seconds)."""

    async def wait_async(
        self,
        ref: JobRef | str,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        raise_on_failure: bool = True,
        on_update: UpdateCallback | None = None,
    ) -> TrainJobResult:
        """``wait`` for event loops (the Airflow triggerer); waiters share one watch per namespace."""

    def logs(
        self,
        ref: JobRef | str,
        *,
        follow: bool = False,
        step: str = "node-0",
        tail_lines: int | None = None,
    ) -> Iterator[str]:
        """Log lines of one step (``node-0`` = rank 0, ``dataset-initializer``, ``model-initializer``)."""

    def cancel(self, ref: JobRef | str) -> bool:
        """Stop and delete the TrainJob; True if something was deleted. Idempotent."""

    def list(self, labels: Mapping[str, str] | None = None) -> list[TrainJobResult]:
        """TrainJobs in this backend's namespace, optionally filtered by labels."""

    def suspend(self, ref: JobRef | str) -> TrainJobResult:
        """Set spec.suspend (Kueue-style); running pods stop, the job stays."""

    def resume(self, ref: JobRef | str) -> TrainJobResult:
        """Clear spec.suspend."""


def resolve_deadline(timeout: float | None, deadline: float | None) -> float | None:
    """Turn a relative timeout and/or an absolute deadline into one absolute deadline."""
    candidates = [d for d in (deadline, time.time() + timeout if timeout is not None else None) if d]
    return min(candidates) if candidates else None


def as_ref(ref: JobRef | str, namespace: str) -> JobRef:
    """Accept ``name``, ``namespace/name`` or a JobRef."""
    if isinstance(ref, JobRef):
        return ref
    if "/" in ref:
        ns, _, name = ref.partition("/")
        return JobRef(name=name, namespace=ns)
    return JobRef(name=ref, namespace=namespace)


def get_backend(name: BackendName | str = "local", **config: Any) -> Backend:
    """Make a backend: ``"local"`` (embedded engine, no cluster) or ``"kubernetes"``.

    kubernetes config: ``kubeconfig``, ``context``, ``namespace``, ``in_cluster``, ``config_dict``.
    local config: ``home`` (state directory; default ``$TRAINFLOW_HOME`` or the user data dir), ``namespace``.
    """
    if name == "local":
        from trainflow.core.local.engine import LocalBackend

        return LocalBackend(**config)
    if name in ("kubernetes", "k8s"):
        from trainflow.core.kube.backend import KubernetesBackend

        return KubernetesBackend(**config)
    from trainflow.core.errors import InvalidRequest

    raise InvalidRequest.one("backend", f"unknown backend {name!r}", "use 'local' or 'kubernetes'")
