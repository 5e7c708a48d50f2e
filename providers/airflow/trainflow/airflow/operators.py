"""Operators that run and manage Kubeflow Trainer TrainJobs; all TrainJob knowledge stays in trainflow.core.

Nothing heavy is imported here: the core (pydantic models, kubernetes, torch) loads when a task runs,
so importing this module costs a DAG file almost nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException
from trainflow.airflow import _config
from trainflow.airflow.hooks import TrainJobHook
from trainflow.airflow.links import XCOM_KEY, extra_links
from trainflow.airflow.provider_info import DEFAULT_CONN_ID

if TYPE_CHECKING:
    from airflow.sdk import Context
    from trainflow.core.backend import Backend
    from trainflow.core.request import TrainJobRequest
    from trainflow.core.result import JobRef, TrainJobResult

OnKillAction = Literal["delete", "keep"]
OnFinishAction = Literal["keep", "delete", "delete_succeeded"]

STATE_STORE_KEY = "trainflow_trainjob"
LABEL_PREFIX = "airflow.apache.org/"
ON_KILL_WAIT_SECONDS = 60.0  # the delete usually takes well under a second; a worker SIGKILLs sooner
DEFER_TIMEOUT_PADDING = 60.0  # the trigger's own deadline fires first, so it can report and clean up

# Operator argument -> TrainJobRequest field, where the names differ (BaseOperator owns
# ``queue`` and ``resources``; ``name`` reads badly on an operator).
_RENAMED = {"job_name": "name", "resources_per_node": "resources", "kueue_queue": "queue"}
_REQUEST_ARGS = (
    "runtime",
    "runtime_kind",
    "job_name",
    "namespace",
    "image",
    "command",
    "args",
    "function",
    "function_kwargs",
    "num_nodes",
    "proc_per_node",
    "resources_per_node",
    "env",
    "secret_env",
    "allow_plain_credentials",
    "dataset_uri",
    "dataset_secret",
    "model_uri",
    "model_secret",
    "output_uri",
    "labels",
    "annotations",
    "node_selector",
    "tolerations",
    "service_account",
    "volumes",
    "image_pull_secrets",
    "runtime_patches",
    "kueue_queue",
    "suspend",
    "deadline_seconds",
)


def idempotency_key(dag_id: str, task_id: str, run_id: str, map_index: int | None) -> str:
    """The identity of one task instance's TrainJob: the same on every try and every worker."""
    index = -1 if map_index is None else int(map_index)
    return f"{dag_id}/{task_id}/{run_id}/{index}"


def airflow_labels(dag_id: str, task_id: str, run_id: str, map_index: int | None) -> dict[str, str]:
    """Identity labels (valid label values, no try_number) so a TrainJob can be traced to its task."""
    from trainflow.core.naming import label_value

    labels = {
        f"{LABEL_PREFIX}dag-id": label_value(dag_id),
        f"{LABEL_PREFIX}task-id": label_value(task_id),
        f"{LABEL_PREFIX}run-id": label_value(run_id),
    }
    if map_index is not None and int(map_index) >= 0:
        labels[f"{LABEL_PREFIX}map-index"] = str(int(map_index))
    return labels


def _ti_identity(context: Context) -> tuple[str, str, str, int | None]:
    ti = context["ti"]
    return ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", None)


class _TrainJobBase(BaseOperator):
    """Connection handling shared by every trainflow operator."""

    def __init__(
        self,
        *,
        conn_id: str | None = DEFAULT_CONN_ID,
        namespace: str | None = None,
        backend: str | None = None,
        kubeconfig: str | None = None,
        cluster_context: str | None = None,
        in_cluster: bool | None = None,
        local_home: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.namespace = namespace
        self.backend = backend
        self.kubeconfig = kubeconfig
        self.cluster_context = cluster_context
        self.in_cluster = in_cluster
        self.local_home = local_home

    @property
    def hook_params(self) -> dict[str, Any]:
        """Overrides of the connection; shipped to the triggerer (never the inline kubeconfig)."""
        params = {
            "backend": self.backend,
            "namespace": self.namespace,
            "kubeconfig": self.kubeconfig,
            "context": self.cluster_context,
            "in_cluster": self.in_cluster,
            "local_home": self.local_home,
        }
        return {k: v for k, v in params.items() if v is not None}

    @property
    def hook(self) -> TrainJobHook:
        cached = getattr(self, "_hook", None)
        if cached is None:
            cached = TrainJobHook(self.conn_id, **self.hook_params)
            self._hook = cached
        return cached

    def get_backend(self) -> Backend:
        return self.hook.get_conn()

    def _ref(self, name: str, namespace: str | None) -> JobRef:
        from trainflow.core.result import JobRef

        return JobRef(name=name, namespace=namespace or self.get_backend().namespace)


class TrainJobOperator(_TrainJobBase):
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

    template_fields: Sequence[str] = (
        "runtime",
        "job_name",
        "namespace",
        "image",
        "command",
        "args",
        "function_kwargs",
        "num_nodes",
        "proc_per_node",
        "resources_per_node",
        "env",
        "secret_env",
        "dataset_uri",
        "model_uri",
        "output_uri",
        "labels",
        "annotations",
        "node_selector",
        "kueue_queue",
        "deadline_seconds",
        "request",
    )
    template_fields_renderers = {
        "function_kwargs": "json",
        "env": "json",
        "request": "json",
        "labels": "json",
    }
    ui_color = "#d6e6ff"

    def __init__(
        self,
        *,
        runtime: str = "torch-distributed",
        runtime_kind: str = "ClusterTrainingRuntime",
        job_name: str | None = None,
        image: str | None = None,
        command: list[str] | None = None,
        args: list[str] | None = None,
        function: str | Callable[..., Any] | None = None,
        function_kwargs: dict[str, Any] | None = None,
        num_nodes: int | str | None = None,
        proc_per_node: int | str | None = None,
        resources_per_node: dict[str, Any] | None = None,
        env: dict[str, Any] | None = None,
        secret_env: dict[str, Any] | None = None,
        allow_plain_credentials: bool = False,
        dataset_uri: str | None = None,
        dataset_secret: str | None = None,
        model_uri: str | None = None,
        model_secret: str | None = None,
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
        suspend: bool = False,
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
        super().__init__(**kwargs)
        self.runtime = runtime
        self.runtime_kind = runtime_kind
        self.job_name = job_name
        self.image = image
        self.command = command
        self.args = args
        self.function = function
        self.function_kwargs = function_kwargs
        self.num_nodes = num_nodes
        self.proc_per_node = proc_per_node
        self.resources_per_node = resources_per_node
        self.env = env
        self.secret_env = secret_env
        self.allow_plain_credentials = allow_plain_credentials
        self.dataset_uri = dataset_uri
        self.dataset_secret = dataset_secret
        self.model_uri = model_uri
        self.model_secret = model_secret
        self.output_uri = output_uri
        self.labels = labels
        self.annotations = annotations
        self.node_selector = node_selector
        self.tolerations = tolerations
        self.service_account = service_account
        self.volumes = volumes
        self.image_pull_secrets = image_pull_secrets
        self.runtime_patches = runtime_patches
        self.kueue_queue = kueue_queue
        self.suspend = suspend
        self.deadline_seconds = deadline_seconds
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

    @property
    def operator_extra_links(self) -> tuple[Any, ...]:  # type: ignore[override]
        return extra_links()

    # -- request ---------------------------------------------------------------------------------

    def request_fields(self) -> dict[str, Any]:
        """The operator's arguments as TrainJobRequest fields (``request`` first, arguments win)."""
        fields: dict[str, Any] = dict(self.request or {})
        for arg in _REQUEST_ARGS:
            value = getattr(self, arg)
            if value is None or (arg in ("suspend", "allow_plain_credentials") and value is False):
                continue
            if arg == "runtime" and value == "torch-distributed" and "runtime" in fields:
                continue
            if arg == "runtime_kind" and value == "ClusterTrainingRuntime" and "runtime_kind" in fields:
                continue
            fields[_RENAMED.get(arg, arg)] = value
        return fields

    def build_request(self, context: Context) -> TrainJobRequest:
        """The validated TrainJobRequest for this task instance, with its identity key and labels."""
        from trainflow.core.validation import parse_request

        dag_id, task_id, run_id, map_index = _ti_identity(context)
        fields = self.request_fields()
        fields.setdefault("idempotency_key", idempotency_key(dag_id, task_id, run_id, map_index))
        fields["labels"] = {
            **dict(fields.get("labels") or {}),
            **airflow_labels(dag_id, task_id, run_id, map_index),
        }
        return parse_request(fields)

    # -- execution -------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        backend = self.get_backend()
        request = self.build_request(context)
        store = self._state_store(context)
        ref, existing, attempt = self._find_previous(backend, request, store)
        if existing is not None and existing.succeeded:
            self.log.info("TrainJob %s already completed: returning its result without resubmitting", ref)
            self._publish(context, existing.ref, attempt)
            return self._finish(backend, existing)
        if ref is None:
            ref = self._submit(backend, request, attempt)
            self.log.info("Submitted TrainJob %s (attempt %s)", ref, attempt)
        else:
            self.log.info("Reattaching to running TrainJob %s (attempt %s)", ref, attempt)
        self._publish(context, ref, attempt)
        self._store_identity(store, ref, attempt)

        deadline = self._deadline(context)
        if self.deferrable:
            current = backend.get(ref)
            if not current.state.terminal:
                self._defer(ref, deadline)
        return self._wait_sync(backend, ref, deadline)

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
            result = TrainJobResult.model_validate(event["result"])
            return self._finish(self.get_backend(), result)
        if status == "failed":
            if event.get("result"):
                self._after_end(self.get_backend(), TrainJobResult.model_validate(event["result"]))
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

    # -- identity, reattach and attempts --------------------------------------------------------

    def _state_store(self, context: Context) -> Any:
        """Airflow >= 3.3 task state store (durable execution), when this Airflow has one."""
        if not self.durable:
            return None
        try:
            return context.get("task_state_store")
        except Exception:
            return None

    def _stored_identity(self, store: Any) -> dict[str, Any] | None:
        if store is None:
            return None
        try:
            value = store.get(STATE_STORE_KEY)
        except Exception as exc:
            self.log.warning("Could not read the task state store (%s); using label search only", exc)
            return None
        return value if isinstance(value, dict) and value.get("name") else None

    def _store_identity(self, store: Any, ref: JobRef, attempt: int) -> None:
        if store is None:
            return
        value = {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid, "attempt": attempt}
        try:
            store.set(STATE_STORE_KEY, {k: v for k, v in value.items() if v is not None})
        except Exception as exc:
            self.log.warning("Could not record the TrainJob in the task state store: %s", exc)

    def _find_previous(
        self, backend: Backend, request: TrainJobRequest, store: Any
    ) -> tuple[JobRef | None, TrainJobResult | None, int]:
        """What earlier tries left behind: (job to reattach to, its state, attempt to use).

        Running -> reattach; Complete -> reuse; Failed or deleted -> next attempt.
        """
        from trainflow.core.errors import TrainJobNotFound
        from trainflow.core.naming import KEY_LABEL, key_label

        key = request.idempotency_key or ""
        namespace = request.namespace or backend.namespace
        found: dict[str, tuple[int, TrainJobResult]] = {}
        for result in backend.list(labels={KEY_LABEL: key_label(key)}):
            if result.namespace and result.namespace != namespace:
                continue
            attempt = result.attempt
            if request.name and result.name == request.name:
                attempt = attempt or 1
            if attempt is not None:
                found[result.name] = (attempt, result)
        last_attempt = 0
        stored = self._stored_identity(store)
        if stored:
            last_attempt = int(stored.get("attempt") or 0)
            if stored["name"] not in found and stored.get("namespace", namespace) == namespace:
                try:
                    result = backend.get(self._ref(stored["name"], namespace))
                    found[result.name] = (last_attempt or 1, result)
                except TrainJobNotFound:
                    self.log.info("TrainJob %s recorded by an earlier try is gone", stored["name"])
        if request.name and request.name not in found:
            try:
                result = backend.get(self._ref(request.name, namespace))
                found[result.name] = (1, result)
            except TrainJobNotFound:
                pass
        ordered = sorted(found.values(), key=lambda item: item[0])
        for attempt, result in reversed(ordered):
            if not result.state.terminal:
                return result.ref, result, attempt
        for attempt, result in reversed(ordered):
            if result.succeeded:
                return result.ref, result, attempt
        if ordered:
            failed = ", ".join(f"{r.name} ({r.state.value}: {r.reason or '-'})" for _, r in ordered)
            self.log.info("Earlier attempts did not succeed: %s", failed)
        last_attempt = max([last_attempt, *(a for a, _ in ordered)])
        return None, None, last_attempt + 1

    def _submit(self, backend: Backend, request: TrainJobRequest, attempt: int) -> JobRef:
        if attempt > 1 and request.name:
            # a fixed name cannot change per attempt: the failed job makes way for the new one
            backend.cancel(self._ref(request.name, request.namespace))
        return backend.submit(request, attempt=attempt)

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


class _TrainJobActionOperator(_TrainJobBase):
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
