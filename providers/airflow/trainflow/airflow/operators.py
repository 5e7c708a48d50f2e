"""TrainJobOperator: run one TrainJob as a task; all TrainJob knowledge stays in trainflow.core.

Nothing heavy is imported here: the core (pydantic models, kubernetes, torch) loads when a task runs, so
importing this module costs a DAG file almost nothing. What to create, reattach to or reuse is decided by
``trainflow.core.lifecycle.launch``, the same rule the KFP step and the CLI follow.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from airflow.sdk.exceptions import AirflowException
from trainflow.airflow import _config, arg_check
from trainflow.airflow.actions import DeleteTrainJobOperator, ResumeTrainJobOperator, SuspendTrainJobOperator
from trainflow.airflow.base import TrainJobBaseOperator, fail_without_retry
from trainflow.airflow.identity import airflow_labels, idempotency_key, ti_identity
from trainflow.airflow.links import XCOM_KEY, extra_links
from trainflow.airflow.request_args import REQUEST_ARGS, TEMPLATED_ARGS, to_request

if TYPE_CHECKING:
    from airflow.sdk import Context
    from trainflow.core.backend import Backend
    from trainflow.core.request import TrainJobRequest
    from trainflow.core.result import JobRef, TrainJobResult

__all__ = [
    "DeleteTrainJobOperator",
    "ResumeTrainJobOperator",
    "SuspendTrainJobOperator",
    "TrainJobOperator",
    "airflow_labels",
    "idempotency_key",
]

OnKillAction = Literal["delete", "keep"]
OnFinishAction = Literal["keep", "delete", "delete_succeeded"]

STATE_STORE_KEY = "trainflow_trainjob"
ON_KILL_WAIT_SECONDS = 60.0  # the delete usually takes well under a second; a worker SIGKILLs sooner
DEFER_TIMEOUT_PADDING = 60.0  # the trigger's own deadline fires first, so it can report and clean up


class TrainJobOperator(TrainJobBaseOperator):
    """Run one TrainJob and return its ``TrainJobResult`` (as a dict) through XCom.

    Every request argument maps onto ``trainflow.core.TrainJobRequest`` (``request`` takes any other
    field as a dict). The TrainJob name comes from (dag_id, task_id, run_id, map_index), never the try
    number: a retry or a restarted worker reattaches to a running job, returns a completed job's result
    without resubmitting, and submits a new attempt only when the previous one failed or was deleted.

    :param deferrable: wait in the triggerer (default ``[trainflow] default_deferrable``, True).
    :param on_kill_action: ``delete`` (default) or ``keep`` the TrainJob when the task is killed,
        times out, or is cancelled while deferred.
    :param on_finish_action: ``keep`` (default), ``delete`` or ``delete_succeeded`` once it ended.
    :param stream_logs: copy rank 0's log into the task log as it is written (bounded by
        ``max_log_lines``, default ``[trainflow] max_log_lines``).
    """

    template_fields: Sequence[str] = (*TEMPLATED_ARGS, "request", "conn_id")
    template_fields_renderers = {
        "function_kwargs": "json",
        "env": "json",
        "request": "json",
        "labels": "json",
        "runtime_patches": "json",
    }
    ui_color = "#d6e6ff"

    def __init__(
        self,
        *,
        runtime: str | None = None,
        runtime_kind: str | None = None,
        job_name: str | None = None,
        image: str | None = None,
        command: list[str] | None = None,
        args: list[str] | None = None,
        function: str | Callable[..., Any] | None = None,
        function_kwargs: dict[str, Any] | None = None,
        packages_to_install: list[str] | None = None,
        pip_index_urls: list[str] | None = None,
        num_nodes: int | str | None = None,
        proc_per_node: int | str | None = None,
        resources_per_node: dict[str, Any] | None = None,
        env: dict[str, Any] | None = None,
        secret_env: dict[str, Any] | None = None,
        allow_plain_credentials: bool | None = None,
        dataset_uri: str | None = None,
        dataset_secret: str | None = None,
        dataset_options: dict[str, Any] | None = None,
        dataset_secret_env: dict[str, Any] | None = None,
        model_uri: str | None = None,
        model_secret: str | None = None,
        model_options: dict[str, Any] | None = None,
        model_secret_env: dict[str, Any] | None = None,
        output_uri: str | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        node_selector: dict[str, str] | None = None,
        tolerations: list[dict[str, Any]] | None = None,
        service_account: str | None = None,
        volumes: list[dict[str, Any]] | None = None,
        image_pull_secrets: list[str] | None = None,
        runtime_patches: list[dict[str, Any]] | None = None,
        kueue_queue: str | None = None,
        suspend: bool | None = None,
        deadline_seconds: int | str | None = None,
        request: dict[str, Any] | None = None,
        deferrable: bool | None = None,
        on_kill_action: OnKillAction = "delete",
        on_finish_action: OnFinishAction = "keep",
        stream_logs: bool = False,
        max_log_lines: int | None = None,
        durable: bool = True,
        **kwargs: Any,
    ) -> None:
        request_args = {arg: value for arg, value in locals().items() if arg in REQUEST_ARGS}
        super().__init__(**kwargs)
        for arg, value in request_args.items():
            setattr(self, arg, value)
        self.request = request
        self.deferrable = _config.get_bool("default_deferrable") if deferrable is None else deferrable
        if on_kill_action not in ("delete", "keep"):
            raise ValueError(f"on_kill_action={on_kill_action!r}: use 'delete' or 'keep'")
        if on_finish_action not in ("keep", "delete", "delete_succeeded"):
            raise ValueError(
                f"on_finish_action={on_finish_action!r}: use 'keep', 'delete' or 'delete_succeeded'"
            )
        self.on_kill_action = on_kill_action
        self.on_finish_action = on_finish_action
        self.stream_logs = stream_logs
        self.max_log_lines = max_log_lines
        self.durable = durable
        self._trainjob_ref: dict[str, Any] | None = None
        arg_check.check(self.request_fields() if isinstance(request, dict | None) else {}, self.task_id)

    @property
    def operator_extra_links(self) -> tuple[Any, ...]:  # type: ignore[override]
        return extra_links()

    # -- request ---------------------------------------------------------------------------------

    def request_fields(self) -> dict[str, Any]:
        """The operator's arguments as TrainJobRequest fields (``request`` first, arguments win)."""
        return {**dict(self.request or {}), **to_request({a: getattr(self, a) for a in REQUEST_ARGS})}

    def build_request(self, context: Context) -> TrainJobRequest:
        """The validated TrainJobRequest for this task instance, with its identity key and labels."""
        from trainflow.core.validation import parse_request

        dag_id, task_id, run_id, map_index = ti_identity(context)
        fields = self.request_fields()
        fields.setdefault("idempotency_key", idempotency_key(dag_id, task_id, run_id, map_index))
        fields["labels"] = {
            **dict(fields.get("labels") or {}),
            **airflow_labels(dag_id, task_id, run_id, map_index),
        }
        return parse_request(fields)

    # -- execution -------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        with fail_without_retry():
            return self._execute(context)

    def _execute(self, context: Context) -> Any:
        from trainflow.core.lifecycle import launch

        backend = self.get_backend()
        request = self.build_request(context)
        for earlier in self._earlier(context):
            self.log.info("Earlier try recorded TrainJob %s", earlier)
        launched = launch(backend, request)
        for line in launched.history():
            self.log.info("%s", line)
        self.log.info("%s", launched.summary)
        self._publish(context, launched.ref, launched.attempt)
        self._record(context, launched.ref, launched.attempt)
        if launched.reused:
            return self._finish(backend, backend.get(launched.ref))
        deadline = self._deadline(context)
        if self.deferrable and not backend.get(launched.ref).state.terminal:
            self._defer(launched.ref, deadline)
        return self._wait_sync(backend, launched.ref, deadline)

    def _defer(self, ref: JobRef, deadline: float | None) -> None:
        from trainflow.airflow.triggers import TrainJobTrigger

        timeout = None
        if deadline is not None:
            timeout = timedelta(seconds=max(deadline - time.time(), 0.0) + DEFER_TIMEOUT_PADDING)
        self.defer(
            trigger=TrainJobTrigger(
                name=ref.name,
                namespace=ref.namespace,
                uid=ref.uid,
                conn_id=self.conn_id,
                hook_params=self.hook_params,
                deadline=deadline,
                on_kill_action=self.on_kill_action,
                stream_logs=self.stream_logs,
                max_log_lines=self._max_log_lines,
            ),
            method_name="execute_complete",
            timeout=timeout,
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """Resume after the trigger fired: one event says how the TrainJob ended."""
        from trainflow.core.result import TrainJobResult

        status = event.get("status")
        name, namespace = event.get("name", ""), event.get("namespace", "")
        self._trainjob_ref = {"name": name, "namespace": namespace}
        if status == "success":
            result = TrainJobResult.from_dict(event["result"])
            return self._finish(self.get_backend(), result)
        if status == "failed":
            if event.get("result"):
                self._after_end(self.get_backend(), TrainJobResult.from_dict(event["result"]))
            raise AirflowException(event.get("message") or f"TrainJob {namespace}/{name} failed")
        if status == "timeout":
            self._on_timeout(self._ref(name, namespace))
            from airflow.sdk.exceptions import AirflowTaskTimeout

            raise AirflowTaskTimeout(event.get("message") or f"TrainJob {namespace}/{name} timed out")
        if status == "not_found":
            raise AirflowException(
                f"TrainJob {namespace}/{name} was deleted while the task waited for it; "
                "a retry submits a new attempt"
            )
        raise AirflowException(f"Waiting for TrainJob {namespace}/{name} failed: {event.get('message')}")

    def _wait_sync(self, backend: Backend, ref: JobRef, deadline: float | None) -> Any:
        from trainflow.core.errors import TrainJobFailed, WaitTimeout

        stop = threading.Event()
        pump = None
        if self.stream_logs:
            from trainflow.airflow.triggers import pump_logs

            pump = threading.Thread(
                target=pump_logs,
                args=(backend, ref, self.log.info),
                kwargs={"max_lines": self._max_log_lines, "stop": stop},
                name=f"trainjob-logs-{ref.name}",
                daemon=True,
            )
            pump.start()
        last: list[tuple[str, int | None]] = []

        def on_update(result: TrainJobResult) -> None:
            seen = (result.state.value, result.progress)
            if not last or last[-1] != seen:
                last.append(seen)
                progress = f", progress {result.progress}%" if result.progress is not None else ""
                self.log.info("TrainJob %s: %s%s", ref, result.state.value, progress)

        try:
            result = backend.wait(ref, deadline=deadline, raise_on_failure=True, on_update=on_update)
        except TrainJobFailed as exc:
            self._after_end(backend, exc.result)
            raise AirflowException(str(exc)) from None
        except WaitTimeout as exc:
            self._on_timeout(ref)
            from airflow.sdk.exceptions import AirflowTaskTimeout

            raise AirflowTaskTimeout(str(exc)) from None
        finally:
            if pump is not None:
                pump.join(timeout=5.0)
            stop.set()
        return self._finish(backend, result)

    @property
    def _max_log_lines(self) -> int:
        return self.max_log_lines if self.max_log_lines is not None else _config.get_int("max_log_lines")

    # -- identity record -------------------------------------------------------------------------

    def _state_store(self, context: Context) -> Any:
        """Airflow >= 3.3 task state store (durable execution), when this Airflow has one."""
        if not self.durable:
            return None
        try:
            return context.get("task_state_store")
        except Exception:
            return None

    def _earlier(self, context: Context) -> list[str]:
        """What an earlier try recorded (for the task log only: ``launch`` decides from the cluster)."""
        store = self._state_store(context)
        try:
            value = store.get(STATE_STORE_KEY) if store is not None else None
        except Exception as exc:
            self.log.warning("Could not read the task state store: %s", exc)
            return []
        if not isinstance(value, dict) or not value.get("name"):
            return []
        return [f"{value.get('namespace')}/{value['name']} (attempt {value.get('attempt')})"]

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
        }
        ti = context["ti"]
        ti.xcom_push(key="job_name", value=ref.name)
        ti.xcom_push(key="job_namespace", value=ref.namespace)
        ti.xcom_push(key=XCOM_KEY, value={k: v for k, v in self._trainjob_ref.items() if v is not None})

    def _deadline(self, context: Context) -> float | None:
        """``execution_timeout`` as an absolute time, so it also holds while the task is deferred."""
        if not self.execution_timeout:
            return None
        start = getattr(context["ti"], "start_date", None)
        started = start.timestamp() if start is not None else time.time()
        return started + self.execution_timeout.total_seconds()

    # -- endings -------------------------------------------------------------------------------

    def _after_end(self, backend: Backend, result: TrainJobResult) -> None:
        action = self.on_finish_action
        if action == "delete" or (action == "delete_succeeded" and result.succeeded):
            deleted = backend.cancel(result.ref)
            self.log.info("on_finish_action=%s: deleted TrainJob %s: %s", action, result.ref, deleted)

    def _finish(self, backend: Backend, result: TrainJobResult) -> dict[str, Any]:
        self._after_end(backend, result)
        metrics = ", ".join(f"{k}={v}" for k, v in result.metrics.items()) or "none"
        self.log.info(
            "TrainJob %s %s in %ss; metrics: %s; output: %s",
            result.ref,
            result.state.value,
            result.duration_seconds,
            metrics,
            result.output_uri,
        )
        return result.to_dict()

    def _on_timeout(self, ref: JobRef) -> None:
        if self.on_kill_action == "delete":
            deleted = self.get_backend().cancel(ref)
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

        def delete() -> None:
            try:
                deleted = self.get_backend().cancel(self._ref(ref["name"], ref.get("namespace")))
            except Exception:
                deleted_or_failed.set()
                self.log.exception("Task killed: could not delete TrainJob %s", ref["name"])
                return
            deleted_or_failed.set()
            self.log.info(
                "Task killed: deleted TrainJob %s/%s: %s", ref.get("namespace"), ref["name"], deleted
            )

        threading.Thread(target=delete, name=f"trainjob-on-kill-{ref['name']}", daemon=False).start()
        deleted_or_failed.wait(ON_KILL_WAIT_SECONDS)
