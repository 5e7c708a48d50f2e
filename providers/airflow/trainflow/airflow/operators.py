"""TrainJobOperator: run one TrainJob as a task; all TrainJob knowledge stays in trainflow.core.

Nothing heavy is imported here: the core (pydantic models, kubernetes, torch) loads when a task runs, so
importing this module costs a DAG file almost nothing. What to create, reattach to or reuse is decided by
``trainflow.core.lifecycle.launch``, the same rule the KFP step and the CLI follow.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from trainflow.airflow import _config, arguments, lineage
from trainflow.airflow.actions import DeleteTrainJobOperator, ResumeTrainJobOperator, SuspendTrainJobOperator
from trainflow.airflow.arguments import TEMPLATED_ARGS
from trainflow.airflow.base import fail_without_retry
from trainflow.airflow.callbacks import DEFAULT_TIMEOUT, Callback, dotted_path, worker_updates
from trainflow.airflow.identity import airflow_labels, idempotency_key, is_first_try, is_new_run, ti_identity
from trainflow.airflow.links import extra_links
from trainflow.airflow.logstream import (
    StatusLines,
    both,
    initializer_steps,
    log_steps,
    node_count,
    task_log_sink,
)
from trainflow.airflow.outcomes import TrainJobOutcomes
from trainflow.airflow.request_file import RequestFileTemplates, parse_request_file

if TYPE_CHECKING:
    from trainflow.airflow.compat_sdk import Context
    from trainflow.core.backend import Backend
    from trainflow.core.lifecycle import Launch
    from trainflow.core.request import TrainJobRequest
    from trainflow.core.result import TrainJobResult

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


class TrainJobOperator(RequestFileTemplates, TrainJobOutcomes):
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
    :param log_nodes: whose output ``stream_logs`` copies: a node index (0 = rank 0), ``"all"`` nodes,
        ``"dataset-initializer"``, ``"model-initializer"``, or a list of these; each line is prefixed with its
        step (``[node-N]``, ``[dataset-initializer]``). An initializer the job does not run is left out.
    :param max_log_lines: most lines copied per node (default ``[trainflow] max_log_lines``).
    :param rerun_on_clear: a task instance cleared after its TrainJob completed trains again (a new
        attempt); False returns the completed job's result instead. Retries always reuse it.
    :param durable: record the TrainJob (namespace, name, uid, attempt) in Airflow's task state store; the next
        try reattaches to it first when it still runs, else adopts by the identity labels as without it. Default:
        where the Airflow line has one (3.3+); ``True`` on an earlier line fails the DAG file; ``False`` never
        records.
    :param on_update_callback: called with the ``TrainJobResult`` at each update of the wait (a state change,
        each new report of the training code), where the wait runs: in the triggerer when deferred (then it must
        be a module-level function importable there, or its dotted path), on the worker otherwise.
    :param on_result_callback: called once with the final ``TrainJobResult`` (Complete or Failed), on the
        worker, before the task ends. Neither callback can fail or hang the task: an exception is logged
        (docs/airflow.md, "Callbacks").
    :param callback_timeout: seconds one callback call may take before the wait (or the task) goes on
        without it.
    """

    template_fields: Sequence[str] = (*TEMPLATED_ARGS, "request", "request_file", "conn_id")
    template_fields_renderers = {
        "function_kwargs": "json",
        "env": "json",
        "request": "json",
        "request_file": "yaml",
        "labels": "json",
        "runtime_patches": "json",
        "spec_patch": "json",
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
        spec_patch: dict[str, Any] | None = None,
        kueue_queue: str | None = None,
        priority_class: str | None = None,
        suspend: bool | None = None,
        max_queue_seconds: int | str | None = None,
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
        durable: bool | None = None,
        on_update_callback: Callback | str | None = None,
        on_result_callback: Callback | str | None = None,
        callback_timeout: float = DEFAULT_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        given = {arg: value for arg, value in locals().items() if arg in arguments.REQUEST_ARGS}
        arguments.check_airflow_args(kwargs, kueue_queue)
        super().__init__(**kwargs)
        for arg, value in given.items():  # the request's arguments, as the template fields name them
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
        # a deferred task's update callback is imported by the triggerer: it needs a path (checked at parse)
        update_path = dotted_path(on_update_callback, "on_update_callback") if self.deferrable else None
        self.on_update_callback = update_path or on_update_callback
        self.on_result_callback = on_result_callback
        self.callback_timeout = callback_timeout
        self._trainjob_ref: dict[str, Any] | None = None
        self._result: TrainJobResult | None = None  # how the TrainJob ended, once it did
        self._lineage = lineage.Lineage()  # what the TrainJob reads, and whether it was asked for an output
        arguments.check(  # every argument the run would refuse, at DAG parse
            self.task_id,
            arguments.collect(self),
            request=request,
            request_file=request_file,
            on_kill_action=on_kill_action,
            on_finish_action=on_finish_action,
            log_nodes=log_nodes,
            durable=durable,
        )
        self.inlets, self.outlets = lineage.declare(self.inlets, self.outlets, dataset_uri, output_uri)

    @property
    def operator_extra_links(self) -> tuple[Any, ...]:  # type: ignore[override]
        return extra_links()

    # -- request ---------------------------------------------------------------------------------

    def request_fields(self) -> dict[str, Any]:
        """The TrainJobRequest fields: ``request_file``, then ``request``, then the arguments (each wins)."""
        return arguments.merged(parse_request_file(self.request_file), self.request, arguments.collect(self))

    def build_request(self, context: Context) -> TrainJobRequest:
        """The validated TrainJobRequest for this task instance, with its identity key and labels."""
        return arguments.build(self.request_fields(), ti_identity(context))

    # -- execution -------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        with fail_without_retry():
            return self._execute(context)

    def _execute(self, context: Context) -> Any:
        from trainflow.core.lifecycle import launch

        backend = self.get_backend()
        request = self.build_request(context)
        self._lineage = lineage.Lineage.of(request)
        rerun = self.rerun_on_clear and is_new_run(context, self.retries or 0)
        launched = launch(
            backend,
            request,
            reuse_completed=not rerun,
            first_try=is_first_try(context),
            recorded=self._earlier(context),
        )
        if rerun and not launched.adopted and any(r.succeeded for r in launched.previous):
            self.log.info("Task instance cleared after its TrainJob completed: training again")
        for line in launched.history():
            self.log.info("%s", line)
        self.log.info("%s", launched.summary)
        self._publish(context, launched.ref, launched.attempt)
        self._record(context, launched.ref, launched.attempt)
        if launched.reused:  # a Complete job: the wait returns at once, with what a wait reads at the end
            return self._end(context, backend.wait_ending(launched.ref), backend)
        deadline = self._deadline(context)
        if self.deferrable and not (launched.state and launched.state.terminal):  # as launch saw it
            self._defer(context, launched, deadline)
        return self._wait_sync(context, backend, launched, deadline)

    def _log_steps(self, launched: Launch) -> list[str]:
        nodes = node_count(launched.manifest, launched.runtime)
        return log_steps(self.log_nodes, nodes, initializer_steps(launched.manifest, launched.runtime))

    def _defer(self, context: Context, launched: Launch, deadline: float | None) -> None:
        from trainflow.airflow import log_position
        from trainflow.airflow.triggers import TrainJobTrigger

        timeout = None
        if deadline is not None:
            timeout = timedelta(seconds=max(deadline - time.time(), 0.0) + DEFER_TIMEOUT_PADDING)
        ref = launched.ref
        if self.stream_logs:  # the trigger's logs start here; a restarted trigger continues from its saves
            ti = context["ti"]
            ti.xcom_push(key=log_position.XCOM_KEY, value=log_position.start_of(ti, log_position.job_of(ref)))
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
                on_update_callback=dotted_path(self.on_update_callback, "on_update_callback"),
                callback_timeout=self.callback_timeout,
            ),
            method_name="execute_complete",
            kwargs={"trainjob_lineage": self._lineage.to_dict()},
            timeout=timeout,
        )

    def execute_complete(
        self, context: Context, event: dict[str, Any], trainjob_lineage: dict[str, Any] | None = None
    ) -> Any:
        """Resume after the trigger fired: its event is the wait's ending (no backend needed to read it)."""
        from trainflow.core.ending import Ending

        self._lineage = lineage.Lineage.from_dict(trainjob_lineage or {})
        ending = Ending.from_event(event)
        self._trainjob_ref = {"name": ending.name, "namespace": ending.namespace}
        return self._end(context, ending)

    def _wait_sync(self, context: Context, backend: Backend, launched: Launch, deadline: float | None) -> Any:
        ref = launched.ref
        sink = None
        if self.stream_logs:
            sink = task_log_sink(self.log.info, self._log_steps(launched), self._max_log_lines)
        status = StatusLines(str(ref), self.log.info)
        updates = worker_updates(self.on_update_callback, self.log, self.callback_timeout)
        try:
            ending = backend.wait_ending(
                ref,
                deadline=deadline,
                diagnose=True,
                on_update=status if updates is None else both(status, updates.submit),
                logs=sink,
            )
        finally:
            if updates is not None:
                updates.close()  # bounded: what is pending reaches the callback before the task ends
        return self._end(context, ending, backend)

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
        return lineage.operator_lineage(list(self._lineage.inputs), self._lineage.outputs(self._result))
