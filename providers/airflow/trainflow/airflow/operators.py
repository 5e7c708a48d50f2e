"""TrainJobOperator: run one TrainJob as a task; all TrainJob knowledge stays in trainflow.core.

Nothing heavy is imported here: the core (pydantic models, kubernetes, torch) loads when a task runs, so
importing this module costs a DAG file almost nothing. What to create, reattach to or reuse is decided by
``trainflow.core.lifecycle.launch``, the same rule the KFP step and the CLI follow.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from airflow.sdk.exceptions import AirflowException
from trainflow.airflow import _config, arg_check, arguments, lineage
from trainflow.airflow.actions import DeleteTrainJobOperator, ResumeTrainJobOperator, SuspendTrainJobOperator
from trainflow.airflow.base import TrainJobBaseOperator, fail_without_retry
from trainflow.airflow.identity import airflow_labels, idempotency_key, is_new_run, ti_identity
from trainflow.airflow.links import extra_links
from trainflow.airflow.logstream import (
    LogPumps,
    StatusLines,
    check_log_nodes,
    log_steps,
    node_count,
)
from trainflow.airflow.outcomes import TrainJobOutcomes
from trainflow.airflow.request_args import REQUEST_ARGS, TEMPLATED_ARGS, to_request
from trainflow.airflow.request_file import RequestFileTemplates, check_request_file, parse_request_file

if TYPE_CHECKING:
    from airflow.sdk import Context
    from trainflow.core.backend import Backend
    from trainflow.core.lifecycle import Launch
    from trainflow.core.request import TrainJobRequest

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

DEFER_TIMEOUT_PADDING = 60.0  # the trigger's own deadline fires first, so it can report and clean up


class TrainJobOperator(RequestFileTemplates, TrainJobOutcomes, TrainJobBaseOperator):
    """Run one TrainJob and return its ``TrainJobResult`` (as a dict) through XCom.

    Every request argument maps onto ``trainflow.core.TrainJobRequest``; ``request`` (a dict) and
    ``request_file`` (a YAML/JSON file) give any field too, and arguments win over both. The TrainJob name
    comes from (dag_id, task_id, run_id, map_index), never the try number: a retry or a restarted worker
    reattaches to a running job, returns a completed job's result without resubmitting, and submits a new
    attempt only when the previous one failed or was deleted; a clear trains again (``rerun_on_clear``).

    :param request: any TrainJobRequest fields, as a dict (arguments win).
    :param request_file: a YAML or JSON file of TrainJobRequest fields, relative to the DAG's folder or
        ``template_searchpath``, rendered with Jinja (``request`` and arguments win).
    :param deferrable: wait in the triggerer. Default: ``[trainflow] default_deferrable`` if set, else
        Airflow's ``[operators] default_deferrable`` (False unless the deployment turns it on).
    :param on_kill_action: ``delete`` or ``keep`` the TrainJob when the task is killed, times out, or is
        cancelled while deferred.
    :param on_finish_action: ``keep``, ``delete`` or ``delete_succeeded`` the TrainJob once it ended.
    :param stream_logs: copy the training output of ``log_nodes`` into the task log as it is written.
    :param log_nodes: whose output ``stream_logs`` copies: a node index (0 = rank 0), a list of them, or
        ``"all"``; each line is prefixed ``[node-N]``.
    :param max_log_lines: most lines copied per node (default ``[trainflow] max_log_lines``).
    :param rerun_on_clear: a task instance cleared after its TrainJob completed trains again (a new
        attempt); False returns the completed job's result instead. Retries always reuse it.
    :param durable: record the TrainJob in Airflow's task state store (Airflow >= 3.3), shown to the next try.
    """

    template_fields: Sequence[str] = (*TEMPLATED_ARGS, "request", "request_file", "conn_id")
    template_fields_renderers = {
        "function_kwargs": "json",
        "env": "json",
        "request": "json",
        "request_file": "yaml",
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
        request_file: str | None = None,
        deferrable: bool | None = None,
        on_kill_action: OnKillAction = "delete",
        on_finish_action: OnFinishAction = "keep",
        stream_logs: bool = True,
        log_nodes: int | Sequence[int] | Literal["all"] = 0,
        max_log_lines: int | None = None,
        rerun_on_clear: bool = True,
        durable: bool = True,
        **kwargs: Any,
    ) -> None:
        request_args = {arg: value for arg, value in locals().items() if arg in REQUEST_ARGS}
        arguments.check_resources(kwargs.get("resources"))
        if warning := arguments.queue_warning(kwargs.get("queue"), kueue_queue):
            warnings.warn(warning, arguments.KueueQueueWarning, stacklevel=2)
        if on_kill_action not in ("delete", "keep"):
            raise ValueError(f"on_kill_action={on_kill_action!r}: use 'delete' or 'keep'")
        if on_finish_action not in ("keep", "delete", "delete_succeeded"):
            raise ValueError(
                f"on_finish_action={on_finish_action!r}: use 'keep', 'delete' or 'delete_succeeded'"
            )
        check_log_nodes(log_nodes)
        check_request_file(request_file)
        super().__init__(**kwargs)
        for arg, value in request_args.items():
            setattr(self, arg, value)
        self.request = request
        self.request_file = request_file
        self.deferrable = _config.default_deferrable() if deferrable is None else deferrable
        self.on_kill_action = on_kill_action
        self.on_finish_action = on_finish_action
        self.stream_logs = stream_logs
        self.log_nodes = log_nodes
        self.max_log_lines = max_log_lines
        self.rerun_on_clear = rerun_on_clear
        self.durable = durable
        self._trainjob_ref: dict[str, Any] | None = None
        # at parse time: the arguments and ``request`` (``request_file`` is still a template to render then)
        given = to_request({a: getattr(self, a) for a in REQUEST_ARGS})
        arg_check.check(
            {**dict(request or {}), **given} if isinstance(request, dict | None) else {}, self.task_id
        )
        self.inlets, self.outlets = lineage.declare(self.inlets, self.outlets, dataset_uri, output_uri)

    @property
    def operator_extra_links(self) -> tuple[Any, ...]:  # type: ignore[override]
        return extra_links()

    # -- request ---------------------------------------------------------------------------------

    def request_fields(self) -> dict[str, Any]:
        """The TrainJobRequest fields: ``request_file``, then ``request``, then the arguments (each wins)."""
        given = to_request({a: getattr(self, a) for a in REQUEST_ARGS})
        return {**parse_request_file(self.request_file), **dict(self.request or {}), **given}

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
        rerun = self.rerun_on_clear and is_new_run(context, self.retries or 0)
        launched = launch(backend, request, reuse_completed=not rerun)
        if rerun and not launched.adopted and any(r.succeeded for r in launched.previous):
            self.log.info("Task instance cleared after its TrainJob completed: training again")
        for line in launched.history():
            self.log.info("%s", line)
        self.log.info("%s", launched.summary)
        self._publish(context, launched.ref, launched.attempt)
        self._record(context, launched.ref, launched.attempt)
        if launched.reused:  # a Complete job: the wait returns at once, with what a wait reads at the end
            return self._finish(context, backend.wait(launched.ref), backend)
        deadline = self._deadline(context)
        if self.deferrable and not backend.get(launched.ref).state.terminal:
            self._defer(launched, deadline)
        return self._wait_sync(context, backend, launched, deadline)

    def _log_steps(self, launched: Launch) -> list[str]:
        policy = launched.runtime.ml_policy if launched.runtime is not None else None
        return log_steps(self.log_nodes, node_count(launched.manifest, policy))

    def _defer(self, launched: Launch, deadline: float | None) -> None:
        from trainflow.airflow.triggers import TrainJobTrigger

        timeout = None
        if deadline is not None:
            timeout = timedelta(seconds=max(deadline - time.time(), 0.0) + DEFER_TIMEOUT_PADDING)
        ref = launched.ref
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
                log_steps=self._log_steps(launched),
                max_log_lines=self._max_log_lines,
            ),
            method_name="execute_complete",
            timeout=timeout,
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """Resume after the trigger fired: one event says how the TrainJob ended (no backend needed)."""
        from trainflow.core.result import TrainJobResult

        status = event.get("status")
        name, namespace = event.get("name", ""), event.get("namespace", "")
        self._trainjob_ref = {"name": name, "namespace": namespace}
        if status == "success":
            return self._finish(context, TrainJobResult.from_dict(event["result"]))
        if status == "failed":
            if event.get("result"):
                self._after_end(TrainJobResult.from_dict(event["result"]))
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

    def _wait_sync(self, context: Context, backend: Backend, launched: Launch, deadline: float | None) -> Any:
        from trainflow.core.errors import TrainJobFailed, WaitTimeout

        ref = launched.ref
        pumps = None
        if self.stream_logs:
            steps = self._log_steps(launched)
            pumps = LogPumps(backend, ref, steps, self.log.info, self._max_log_lines).start()
        try:
            result = backend.wait(
                ref, deadline=deadline, raise_on_failure=True, on_update=StatusLines(str(ref), self.log.info)
            )
        except TrainJobFailed as exc:
            self._after_end(exc.result, backend)
            raise AirflowException(str(exc)) from None
        except WaitTimeout as exc:
            self._on_timeout(ref, backend)
            from airflow.sdk.exceptions import AirflowTaskTimeout

            raise AirflowTaskTimeout(str(exc)) from None
        finally:
            if pumps is not None:
                pumps.join()
        return self._finish(context, result, backend)

    @property
    def _max_log_lines(self) -> int:
        return self.max_log_lines if self.max_log_lines is not None else _config.get_int("max_log_lines")

    def _deadline(self, context: Context) -> float | None:
        """``execution_timeout`` as an absolute time, so it also holds while the task is deferred."""
        if not self.execution_timeout:
            return None
        start = getattr(context["ti"], "start_date", None)
        started = start.timestamp() if start is not None else time.time()
        return started + self.execution_timeout.total_seconds()

    # -- lineage ---------------------------------------------------------------------------------

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the dataset and base model read, the output written (OpenLineage provider only)."""
        fields = self.request_fields()
        inputs = [str(fields[f]) for f in ("dataset_uri", "model_uri") if fields.get(f)]
        outputs = [str(fields["output_uri"])] if fields.get("output_uri") else []
        return lineage.operator_lineage(inputs, outputs)
