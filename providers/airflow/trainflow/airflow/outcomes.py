"""What a TrainJob task leaves behind: the identity record and XComs, and how each ending is handled.

The base of ``TrainJobOperator`` (its settings are that operator's parameters). The backend is built only when an
ending needs one (a delete): resuming after
the trigger fired carries the result in the event, and building a kubernetes backend only to return it cost
2-3 CPU-seconds per resumed task.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainflow.airflow import lineage
from trainflow.airflow.base import TrainJobBaseOperator
from trainflow.airflow.compat_sdk import AirflowException
from trainflow.airflow.links import XCOM_KEY

if TYPE_CHECKING:
    from trainflow.airflow.compat_sdk import Context
    from trainflow.core.backend import Backend
    from trainflow.core.ending import Ending
    from trainflow.core.result import JobRef, TrainJobResult

STATE_STORE_KEY = "trainflow_trainjob"
ON_KILL_WAIT_SECONDS = 60.0  # the delete usually takes well under a second; a worker SIGKILLs sooner


class TrainJobOutcomes(TrainJobBaseOperator):
    """Identity record, XComs and endings (finish, timeout, kill) of a TrainJob task."""

    durable: bool | None
    on_kill_action: str
    on_finish_action: str
    on_result_callback: Any
    callback_timeout: float
    _trainjob_ref: dict[str, Any] | None
    _result: TrainJobResult | None
    _lineage: lineage.Lineage

    # -- identity record -------------------------------------------------------------------------

    def _state_store(self, context: Context) -> Any:
        """Airflow >= 3.3 task state store (durable execution), when this Airflow has one."""
        if self.durable is False:
            return None
        try:
            return context.get("task_state_store")
        except Exception:
            return None

    def _earlier(self, context: Context) -> JobRef | None:
        """The TrainJob an earlier try recorded in the task state store: ``launch`` looks at it first."""
        from trainflow.core.result import JobRef

        store = self._state_store(context)
        try:
            value = store.get(STATE_STORE_KEY) if store is not None else None
        except Exception as exc:
            self.log.warning("Could not read the task state store: %s", exc)
            return None
        if not isinstance(value, dict) or not value.get("name") or not value.get("namespace"):
            return None
        self.log.info(
            "Earlier try recorded TrainJob %s/%s (attempt %s) in the task state store",
            value["namespace"],
            value["name"],
            value.get("attempt"),
        )
        return JobRef(name=str(value["name"]), namespace=str(value["namespace"]), uid=value.get("uid"))

    def _record(self, context: Context, ref: JobRef, attempt: int) -> None:
        store = self._state_store(context)
        if store is None:
            return
        value = {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid, "attempt": attempt}
        try:
            store.set(STATE_STORE_KEY, {k: v for k, v in value.items() if v is not None})
        except Exception as exc:
            self.log.warning("Could not record the TrainJob in the task state store: %s", exc)

    def _publish(self, context: Context, ref: JobRef, attempt: int) -> None:
        """Job name and namespace to XCom (before any deferral), for sensors, links and humans."""
        self._trainjob_ref = {
            "name": ref.name,
            "namespace": ref.namespace,
            "uid": ref.uid,
            "attempt": attempt,
            "conn_id": self.conn_id,  # for readers; the TrainJob page takes it from the definition (task_job)
        }
        ti = context["ti"]
        ti.xcom_push(key="job_name", value=ref.name)
        ti.xcom_push(key="job_namespace", value=ref.namespace)
        ti.xcom_push(key=XCOM_KEY, value={k: v for k, v in self._trainjob_ref.items() if v is not None})

    # -- endings ---------------------------------------------------------------------------------

    def _end(self, context: Context, ending: Ending, backend: Backend | None = None) -> Any:
        """The task's answer to how its wait ended: the one mapping of the worker and the deferred path."""
        from trainflow.core.ending import EndKind

        ref, kind = self._ref(ending.name, ending.namespace), ending.kind
        if kind is EndKind.COMPLETE and ending.result is not None:
            return self._finish(context, ending.result, backend)
        if kind is EndKind.FAILED:
            if ending.result is not None:
                self._after_end(ending.result, backend)
            raise AirflowException(ending.message or f"TrainJob {ref} failed")
        if kind is EndKind.QUEUE_BUDGET:
            raise AirflowException(self._on_queue_budget(ref, ending.message, backend))
        if kind is EndKind.TIMED_OUT:
            from trainflow.airflow.compat_sdk import AirflowTaskTimeout

            self._on_timeout(ref, backend)
            raise AirflowTaskTimeout(ending.message or f"TrainJob {ref} timed out")
        if kind is EndKind.NOT_FOUND:
            raise AirflowException(
                f"TrainJob {ref} was deleted while the task waited for it; a retry submits a new attempt"
            )
        if kind is EndKind.STATE_UNKNOWN:  # left as it is: a retry reattaches to it or adopts what it became
            raise AirflowException(ending.message)
        raise AirflowException(f"Waiting for TrainJob {ref} failed: {ending.message or kind.value}")

    def _after_end(self, result: TrainJobResult, backend: Backend | None = None) -> None:
        """Every ending with a result (Complete or Failed): the result callback once, then on_finish_action."""
        from trainflow.airflow.callbacks import call_once

        call_once(self.on_result_callback, result, self.log, self.callback_timeout)
        action = self.on_finish_action
        if action == "delete" or (action == "delete_succeeded" and result.succeeded):
            deleted = (backend or self.get_backend()).cancel(result.ref)
            self.log.info("on_finish_action=%s: deleted TrainJob %s: %s", action, result.ref, deleted)

    def _finish(self, context: Context, result: TrainJobResult, backend: Backend | None = None) -> Any:
        """A Complete TrainJob: log it, clean up as asked, record the output asset; the task's return value."""
        self._after_end(result, backend)
        metrics = ", ".join(f"{k}={v}" for k, v in result.metrics.items()) or "none"
        self.log.info(
            "TrainJob %s %s in %ss; metrics: %s; output: %s",
            result.ref,
            result.state.value,
            result.duration_seconds,
            metrics,
            result.output_uri,
        )
        self._result = result  # what downstream reads: XCom, the output asset, OpenLineage
        lineage.record_output(context, self.outlets, self._lineage.outputs(result))
        return self._task_return(context, result)

    def _task_return(self, context: Context, result: TrainJobResult) -> Any:
        """What the task returns (XCom ``return_value``): the TrainJobResult as a dict."""
        return result.to_dict()

    def _on_queue_budget(self, ref: JobRef, message: str, backend: Backend | None = None) -> str:
        """Not admitted within its queue budget: the task gave up on the job, as at ``execution_timeout``
        (``on_kill_action``: delete it, or keep it queued for a retry to reattach). The task's error text."""
        if self.on_kill_action == "delete":
            deleted = (backend or self.get_backend()).cancel(ref)
            return f"{message}; deleted TrainJob {ref} (on_kill_action=delete): {deleted}"
        return f"{message}; TrainJob {ref} kept queued (on_kill_action=keep): a retry reattaches to it"

    def _on_timeout(self, ref: JobRef, backend: Backend | None = None) -> None:
        if self.on_kill_action == "delete":
            deleted = (backend or self.get_backend()).cancel(ref)
            self.log.warning("execution_timeout reached: deleted TrainJob %s: %s", ref, deleted)
        else:
            self.log.warning("execution_timeout reached: TrainJob %s kept (on_kill_action=keep)", ref)

    def on_kill(self) -> None:
        """Task killed while running on a worker: delete the TrainJob unless ``on_kill_action='keep'``.

        Airflow calls this from its SIGTERM handler, on the thread the signal interrupted, which may hold a
        lock this work needs (the task logger's write lock, a connection pool's): taking it here would hang
        the task forever. So the delete and its log line run on their own thread and this handler only waits,
        bounded, for the delete itself; the thread is not a daemon, so its log line is written before exit.
        """
        ref = self._trainjob_ref
        if not ref or self.on_kill_action != "delete":
            return
        deleted_or_failed = threading.Event()
        delete: Callable[[], None] = lambda: self._delete_on_kill(ref, deleted_or_failed)  # noqa: E731
        threading.Thread(target=delete, name=f"trainjob-on-kill-{ref['name']}", daemon=False).start()
        deleted_or_failed.wait(ON_KILL_WAIT_SECONDS)

    def _delete_on_kill(self, ref: dict[str, Any], done: threading.Event) -> None:
        try:
            deleted = self.get_backend().cancel(self._ref(ref["name"], ref.get("namespace")))
        except Exception:
            done.set()
            self.log.exception("Task killed: could not delete TrainJob %s", ref["name"])
            return
        done.set()
        self.log.info("Task killed: deleted TrainJob %s/%s: %s", ref.get("namespace"), ref["name"], deleted)
