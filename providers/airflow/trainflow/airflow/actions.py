"""Operators that act on an existing TrainJob named directly: delete, suspend, resume."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trainflow.airflow.base import TrainJobBaseOperator
from trainflow.airflow.compat_sdk import AirflowException

if TYPE_CHECKING:
    from trainflow.airflow.compat_sdk import Context


class _TrainJobActionOperator(TrainJobBaseOperator):
    """An operation on an existing TrainJob, named directly (templated, e.g. from XCom)."""

    template_fields: Sequence[str] = ("job_name", "namespace")

    def __init__(self, *, job_name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job_name = job_name


class DeleteTrainJobOperator(_TrainJobActionOperator):
    """Delete a TrainJob (and its pods); a missing job is fine unless ``fail_if_missing``."""

    def __init__(self, *, fail_if_missing: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail_if_missing = fail_if_missing

    def execute(self, context: Context) -> bool:
        ref = self._ref(self.job_name, self.namespace)
        deleted = self.get_backend().cancel(ref)
        if not deleted and self.fail_if_missing:
            raise AirflowException(f"TrainJob {ref} does not exist")
        self.log.info("TrainJob %s deleted: %s", ref, deleted)
        return bool(deleted)


class SuspendTrainJobOperator(_TrainJobActionOperator):
    """Suspend a TrainJob (spec.suspend, as Kueue does): its pods stop, the job stays."""

    def execute(self, context: Context) -> dict[str, Any]:
        result = self.get_backend().suspend(self._ref(self.job_name, self.namespace))
        self.log.info("TrainJob %s suspended: %s", result.ref, result.state.value)
        return result.to_dict()


class ResumeTrainJobOperator(_TrainJobActionOperator):
    """Resume a suspended TrainJob."""

    def execute(self, context: Context) -> dict[str, Any]:
        result = self.get_backend().resume(self._ref(self.job_name, self.namespace))
        self.log.info("TrainJob %s resumed: %s", result.ref, result.state.value)
        return result.to_dict()
