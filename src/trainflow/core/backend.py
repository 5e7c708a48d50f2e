"""One interface over where TrainJobs run: a Kubernetes cluster, or the embedded local engine.

A backend does the I/O (``connection.get_backend`` makes one); the rules sit above it: ``lifecycle`` (identity, attempts, adoption) and ``observe``
(reading status while waiting). ``submit`` is ``lifecycle.launch(...).ref``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from trainflow.core.ending import Ending
from trainflow.core.logsink import LogSink
from trainflow.core.observe import UpdateCallback
from trainflow.core.request import TrainJobRequest
from trainflow.core.result import JobRef, TrainJobResult
from trainflow.core.runtimes import Runtime

if TYPE_CHECKING:
    from trainflow.core.schema import Picture as SchemaPicture

BackendName = Literal["kubernetes", "local"]


@runtime_checkable
class Backend(Protocol):
    """What every backend does. A failed job makes ``wait`` raise ``TrainJobFailed``."""

    name: str
    namespace: str
    is_local: bool

    # --- runtimes ------------------------------------------------------------------------------------
    def runtimes(self) -> list[Runtime]:
        """Training runtimes this backend can run TrainJobs on."""

    def get_runtime(
        self, name: str, kind: str = "ClusterTrainingRuntime", namespace: str | None = None
    ) -> Runtime:
        """One runtime by name; ``RuntimeNotFound`` when it does not exist."""

    def schema_picture(self) -> SchemaPicture | None:
        """The TrainJob schema this backend's API checks creates against, when it can be read; None: the
        vendored one applies."""

    # --- the primitives ``lifecycle.launch`` builds on -------------------------------------------------
    def find(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """TrainJob objects in ``namespace`` carrying all ``labels``."""

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One TrainJob object, or None when it does not exist."""

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create once; ``AlreadyExists`` when the name is taken, ``OutcomeUnknown`` when the answer was lost."""

    def adopt(self, obj: Mapping[str, Any]) -> None:
        """Take over an existing TrainJob of this request (the local engine starts one that never started)."""

    def dry_run(self, manifest: dict[str, Any]) -> None:
        """Validate the manifest as far as the backend can (server-side dry run); create nothing."""

    # --- jobs ----------------------------------------------------------------------------------------
    def submit(self, request: TrainJobRequest | Mapping[str, Any], *, dry_run: bool = False) -> JobRef:
        """``lifecycle.launch``: create, reattach to, or reuse this request's TrainJob."""

    def render(self, request: TrainJobRequest | Mapping[str, Any], *, attempt: int = 1) -> dict[str, Any]:
        """``lifecycle.render``: the validated TrainJob manifest this backend would create; creates nothing."""

    def get(self, ref: JobRef | str) -> TrainJobResult:
        """Current state of one TrainJob; ``TrainJobNotFound`` if it does not exist."""

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
        """Block until the job ends (Complete, Failed, given up for its queue budget, gone) or the absolute
        ``deadline`` (epoch seconds) passes; meanwhile copy the output of ``logs.steps`` as it is written.
        ``diagnose``: a Failed ending carries what the pods, events and logs say."""

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
        """``wait_ending`` for event loops (the Airflow triggerer); waiters share one watch per namespace."""

    def wait(
        self,
        ref: JobRef | str,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        raise_on_failure: bool = True,
        on_update: UpdateCallback | None = None,
        logs: LogSink | None = None,
    ) -> TrainJobResult:
        """``wait_ending``'s result, or the typed error of its ending (``Ending.outcome``)."""

    async def wait_async(
        self,
        ref: JobRef | str,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        raise_on_failure: bool = True,
        on_update: UpdateCallback | None = None,
        logs: LogSink | None = None,
    ) -> TrainJobResult:
        """``wait_ending_async``'s result, or the typed error of its ending."""

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

    async def cancel_async(self, ref: JobRef | str) -> bool:
        """``cancel`` for event loops (a deferred task killed in the triggerer)."""

    def list(self, labels: Mapping[str, str] | None = None) -> list[TrainJobResult]:
        """TrainJobs in this backend's namespace, optionally filtered by labels."""

    def suspend(self, ref: JobRef | str) -> TrainJobResult:
        """Set spec.suspend (Kueue-style); running pods stop, the job stays."""

    def resume(self, ref: JobRef | str) -> TrainJobResult:
        """Clear spec.suspend."""


class WaitsByEnding:
    """A backend's ``wait`` and ``wait_async`` from its ``wait_ending``: the result, or the typed error (one
    rule for both engines)."""

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
        raise NotImplementedError

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
        raise NotImplementedError

    def wait(
        self,
        ref: JobRef | str,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        raise_on_failure: bool = True,
        on_update: UpdateCallback | None = None,
        logs: LogSink | None = None,
    ) -> TrainJobResult:
        ending = self.wait_ending(
            ref, timeout, deadline=deadline, diagnose=raise_on_failure, on_update=on_update, logs=logs
        )
        return ending.outcome(raise_on_failure)

    async def wait_async(
        self,
        ref: JobRef | str,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        raise_on_failure: bool = True,
        on_update: UpdateCallback | None = None,
        logs: LogSink | None = None,
    ) -> TrainJobResult:
        ending = await self.wait_ending_async(
            ref, timeout, deadline=deadline, diagnose=raise_on_failure, on_update=on_update, logs=logs
        )
        return ending.outcome(raise_on_failure)
