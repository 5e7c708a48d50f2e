"""TrainJobSensor: wait for an existing TrainJob (e.g. created outside Airflow) to finish."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from trainflow.airflow import _config
from trainflow.airflow.arguments import connection_overrides
from trainflow.airflow.compat_sdk import (
    AirflowException,
    AirflowFailException,
    AirflowSkipException,
    BaseSensorOperator,
)
from trainflow.airflow.hooks import TrainJobHook
from trainflow.airflow.provider_info import DEFAULT_CONN_ID

if TYPE_CHECKING:
    from trainflow.airflow.compat_sdk import Context


class TrainJobSensor(BaseSensorOperator):
    """Succeeds when the TrainJob is Complete, fails when it is Failed (skips instead with ``soft_fail``).

    Works in ``poke``/``reschedule`` mode and deferrably (default: ``[trainflow] default_deferrable`` if set,
    else Airflow's ``[operators] default_deferrable``).
    A TrainJob that does not exist yet is waited for (``wait_for_creation``, default True).
    Returns the TrainJobResult dict.
    """

    template_fields: Sequence[str] = ("job_name", "namespace")
    ui_color = "#e6f0ff"

    def __init__(
        self,
        *,
        job_name: str,
        namespace: str | None = None,
        conn_id: str | None = DEFAULT_CONN_ID,
        backend: str | None = None,
        kubeconfig: str | None = None,
        cluster_context: str | None = None,
        in_cluster: bool | None = None,
        local_home: str | None = None,
        wait_for_creation: bool = True,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job_name = job_name
        self.namespace = namespace
        self.conn_id = conn_id
        self.backend = backend
        self.kubeconfig = kubeconfig
        self.cluster_context = cluster_context
        self.in_cluster = in_cluster
        self.local_home = local_home
        self.wait_for_creation = wait_for_creation
        if deferrable is None:  # an explicit mode="reschedule" wins over the deferrable default
            deferrable = _config.default_deferrable() and self.mode == "poke"
        self.deferrable = deferrable

    @property
    def hook_params(self) -> dict[str, Any]:
        """Overrides of the connection (``namespace`` as rendered); shipped to the triggerer."""
        return connection_overrides(self)

    def _hook(self) -> TrainJobHook:
        return TrainJobHook(self.conn_id, **self.hook_params)

    def _check(self) -> tuple[bool, dict[str, Any] | None]:
        """(done, result) from the job's current state; raises AirflowFailException on Failed."""
        from trainflow.core.errors import TrainJobNotFound
        from trainflow.core.result import JobRef

        backend = self._hook().get_conn()
        ref = JobRef(name=self.job_name, namespace=self.namespace or backend.namespace)
        try:
            result = backend.get(ref)
        except TrainJobNotFound:
            if not self.wait_for_creation:
                raise AirflowFailException(f"TrainJob {ref} does not exist") from None
            self.log.info("TrainJob %s does not exist yet", ref)
            return False, None
        self.log.info("TrainJob %s: %s", ref, result.state.value)
        if result.state.value == "Failed":
            raise AirflowFailException(
                f"TrainJob {ref} failed: reason={result.reason}, message={result.message}"
            )
        return result.succeeded, result.to_dict()

    def poke(self, context: Context) -> Any:
        from trainflow.airflow.compat_sdk import PokeReturnValue

        done, result = self._check()
        return PokeReturnValue(is_done=done, xcom_value=result)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        try:
            done, result = self._check()
        except AirflowFailException as exc:
            if self.soft_fail:
                raise AirflowSkipException(f"Skipping due to soft_fail: {exc}") from exc
            raise
        if done:
            return result
        from trainflow.airflow.triggers import TrainJobTrigger

        backend = self._hook().get_conn()
        deadline = time.time() + float(self.timeout) if self.timeout else None
        self.defer(
            trigger=TrainJobTrigger(
                name=self.job_name,
                namespace=self.namespace or backend.namespace,
                conn_id=self.conn_id,
                hook_params=self.hook_params,
                deadline=deadline,
                on_kill_action="keep",  # a sensor never owns the job it watches
                wait_for_creation=self.wait_for_creation,
                poll_interval=float(self.poke_interval),
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=float(self.timeout) + 60) if self.timeout else None,
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """Resume after the trigger fired: its event is the wait's ending."""
        from trainflow.core.ending import Ending, EndKind

        ending = Ending.from_event(event)
        ref = f"{ending.namespace}/{ending.name}"
        if ending.kind is EndKind.COMPLETE and ending.result is not None:
            self.log.info("TrainJob %s is Complete", ref)
            return ending.result.to_dict()
        if ending.kind is EndKind.TIMED_OUT:
            from trainflow.airflow.compat_sdk import AirflowSensorTimeout

            raise AirflowSensorTimeout(ending.message or f"TrainJob {ref} did not finish in time")
        raise AirflowException(ending.message or f"TrainJob {ref}: {ending.kind.value}")
