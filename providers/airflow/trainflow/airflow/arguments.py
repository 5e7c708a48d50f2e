"""TrainJobOperator's arguments: collected, checked and converted here, once.

Every ``TrainJobRequest`` field is an operator argument of the same name, except where Airflow owns the name
(``queue`` and ``resources`` are BaseOperator's: the Kueue LocalQueue is ``kueue_queue``, a node's resources
``resources_per_node``), where it reads badly on an operator (``name`` is ``job_name``), and
``idempotency_key``, which the operator derives from the task instance.

At DAG parse (``check``), every plain value is read by ``TrainJobRequest`` itself and by the ranges validation
applies (``COUNT_RANGES``, the function reference), so a value the run would refuse fails the DAG file and one
it accepts (``"+2"``, ``"2_0"``, ``True``, ``"60.0"``, ``pkg.mod:Class.method``) never does. A value Airflow
fills in later (a template, an XComArg) is left for the run; the model loads on the first operator of a parse
(docs/airflow.md, DAG parse). At execute (``build``) the request is merged (``request_file``, then
``request``, then the arguments) and parsed once.
"""

from __future__ import annotations

import functools
import re
import typing
import warnings
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from trainflow.airflow import _config

if TYPE_CHECKING:
    from trainflow.core.errors import FieldIssue
    from trainflow.core.request import TrainJobRequest

# A copy of ``TrainJobRequest.model_fields`` (the operator's signature and template fields are built from it at
# import; tests/unit/test_structure.py keeps the two equal).
REQUEST_FIELDS = tuple(
    """runtime runtime_kind name idempotency_key namespace image command args function function_kwargs
    packages_to_install pip_index_urls num_nodes proc_per_node resources env secret_env allow_plain_credentials
    dataset_uri dataset_secret dataset_options dataset_secret_env model_uri model_secret model_options
    model_secret_env output_uri labels annotations node_selector tolerations service_account volumes
    image_pull_secrets runtime_patches spec_patch queue priority_class suspend max_queue_seconds deadline_seconds""".split()  # noqa: SIM905 (not 38 lines)
)
RENAMED = {"name": "job_name", "resources": "resources_per_node", "queue": "kueue_queue"}
OPERATOR_OWNED = ("idempotency_key",)  # derived from (dag_id, task_id, run_id, map_index)
NOT_TEMPLATED = ("function", "runtime_kind", "allow_plain_credentials", "suspend")
ON_KILL_ACTIONS = ("delete", "keep")
ON_FINISH_ACTIONS = ("keep", "delete", "delete_succeeded")
REQUEST_FILE_EXT = (".yaml", ".yml", ".json")


def operator_arg(field: str) -> str:
    return RENAMED.get(field, field)


REQUEST_ARGS = tuple(operator_arg(f) for f in REQUEST_FIELDS if f not in OPERATOR_OWNED)
TEMPLATED_ARGS = tuple(a for a in REQUEST_ARGS if a not in NOT_TEMPLATED)

# -- collect ---------------------------------------------------------------------------------------


def collect(operator: Any) -> dict[str, Any]:
    """The request fields an operator's arguments give (unset ones, None or False, are left out)."""
    out: dict[str, Any] = {}
    for field in REQUEST_FIELDS:
        if field not in OPERATOR_OWNED:
            value = getattr(operator, operator_arg(field), None)
            if value is not None and value is not False:
                out[field] = value
    return out


def merged(
    request_file: Mapping[str, Any], request: Mapping[str, Any] | None, args: Mapping[str, Any]
) -> dict[str, Any]:
    """The request fields of a task: ``request_file``, then ``request``, then the arguments (each wins)."""
    return {**request_file, **dict(request or {}), **args}


# the operator's and sensor's arguments that override the connection -> TrainJobHook's parameter
CONNECTION_ARGS = {
    "backend": "backend",
    "namespace": "namespace",
    "kubeconfig": "kubeconfig",
    "cluster_context": "context",
    "in_cluster": "in_cluster",
    "local_home": "local_home",
}


def connection_overrides(task: Any) -> dict[str, Any]:
    """A task's arguments that override the connection (those it set), as ``TrainJobHook`` takes them."""
    given = {param: getattr(task, arg, None) for arg, param in CONNECTION_ARGS.items()}
    return {k: v for k, v in given.items() if v is not None}


# -- check at DAG parse ----------------------------------------------------------------------------

_PLAIN = (str, int, float, bool, type(None), list, tuple, dict)


def deferred(value: Any) -> bool:
    """A value Airflow fills in when the task runs: a Jinja template, an XComArg, or holds one. Airflow renders a
    mapping's values, never its keys: ``{"{{": None}`` is that literal key at run time."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, dict):
        return any(deferred(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(deferred(v) for v in value)
    return not isinstance(value, _PLAIN) and not callable(value)


def _alternatives(field: str) -> list[str]:
    """The literal values a field also takes besides its type (``proc_per_node``: ``auto``)."""
    from trainflow.core.request import TrainJobRequest

    annotation = TrainJobRequest.model_fields[field].annotation
    found: list[str] = []
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is typing.Literal:
            found += [str(v) for v in typing.get_args(arg)]
    return found


def _count_problem(field: str, value: Any) -> tuple[str, str]:
    from trainflow.core.request import COUNT_RANGES

    low, high = COUNT_RANGES[field]
    span = f"of {low} or more" if high >= 2**31 - 1 else f"from {low} to {high}"
    others = "".join(f", nor {v!r}" for v in _alternatives(field))
    fix = f"use a whole number {span}" + "".join(f", or {v!r}" for v in _alternatives(field))
    return f"{str(value)[:40]!r} is not a whole number {span}{others}", fix


@functools.cache
def _is_list(field: str) -> bool:
    from trainflow.core.request import TrainJobRequest

    annotation = TrainJobRequest.model_fields[field].annotation
    return any(typing.get_origin(a) is list for a in (annotation, *typing.get_args(annotation)))


def _type_issue(name: str, field: str, value: Any, err: Mapping[str, Any]) -> tuple[str, str, str]:
    """A model error in words a DAG author acts on (never echoing a value that may be a secret)."""
    from trainflow.core.errors import field_path
    from trainflow.core.request import COUNT_RANGES

    path = field_path({name: value}, (name, *err["loc"][1:]))
    if path == name and isinstance(value, str) and _is_list(field):
        return name, "is a string, not a list", f"{name}=[...] with one item per argument"
    if path == name and err["type"] in ("dict_type", "model_type", "model_attributes_type"):
        return name, f"is a {type(value).__name__}, not a mapping", f"{name}={{...}}"
    if path == name and field in COUNT_RANGES:
        return (name, *_count_problem(field, value))
    return path, str(err["msg"]).removeprefix("Value error, "), ""


def _value_issue(name: str, field: str, value: Any, parsed: Any) -> tuple[str, str, str] | None:
    """What validation refuses in a value the model read, without a runtime: ranges, function references."""
    from trainflow.core.request import COUNT_RANGES

    if field in COUNT_RANGES and isinstance(parsed, int):
        low, high = COUNT_RANGES[field]
        return None if low <= parsed <= high else (name, *_count_problem(field, value))
    if field == "function" and isinstance(parsed, str):
        from trainflow.core.function_trainer import FUNCTION_REF

        if not FUNCTION_REF.match(parsed):
            return name, f"{parsed!r:.80} is not 'module:function'", "e.g. 'mypkg.train:main'"
    if field == "output_uri" and isinstance(parsed, str):
        from trainflow.core.output_uri import BadOutputURI, check

        try:
            check(parsed)
        except BadOutputURI as e:
            return name, e.problem, e.fix
    return None


def request_problems(
    fields: Mapping[str, Any],
    names: Mapping[str, str],
    *,
    whole: bool,
    literal: Collection[str] = (),
) -> list[FieldIssue]:
    """What ``TrainJobRequest`` and validation's value rules refuse among ``fields``' plain values.

    Each field is read by the model alone, so one bad value never hides another; ``names`` says how the user
    spelled each field (``num_nodes``, ``request.num_node``). ``whole``: the fields are the whole request (no
    ``request_file`` left to render), so the model's cross-field rules are applied to them too. ``literal``:
    fields Airflow does not render, whose values are final as given.
    """
    from pydantic import ValidationError

    from trainflow.core.errors import FieldIssue
    from trainflow.core.request import TrainJobRequest

    issues: list[tuple[str, str, str]] = []
    plain: dict[str, Any] = {}
    for field, value in fields.items():
        name, later = names.get(field, field), field not in literal
        if field not in TrainJobRequest.model_fields:
            issues.append((name, "is not a TrainJob request field", "see TrainJobRequest"))
            continue
        try:
            parsed = getattr(TrainJobRequest.model_validate({field: value}), field)
        except ValidationError as exc:
            errors = [e for e in exc.errors() if e["loc"]]  # without loc: a cross-field rule, judged below
            if not errors:
                parsed = value
            elif mine := [e for e in errors if not (later and _from_deferred(e))]:
                issues.append(_type_issue(name, field, value, mine[0]))
                continue
            else:
                continue
        if not (later and deferred(value)):
            plain[field] = value
            if found := _value_issue(name, field, value, parsed):
                issues.append(found)
    if whole and not issues and len(plain) == len(fields):
        try:
            TrainJobRequest.model_validate(plain)
        except ValidationError as exc:
            issues += [("request", str(e["msg"]).removeprefix("Value error, "), "") for e in exc.errors()]
    return [FieldIssue(*i) for i in issues]


def _from_deferred(err: Mapping[str, Any]) -> bool:
    """A model error caused by a value Airflow fills in later (not a missing key or an unknown field)."""
    return err["type"] not in ("missing", "extra_forbidden") and deferred(err.get("input"))


def _operator_issues(
    *,
    on_kill_action: Any,
    on_finish_action: Any,
    log_nodes: Any,
    request_file: Any,
    request: Any,
    durable: Any,
) -> list[tuple[str, str, str]]:
    """The operator's own arguments (not request fields), and what this Airflow line lacks of them."""
    from trainflow.airflow.version_compat import missing

    out: list[tuple[str, str, str]] = []
    if lacking := missing("durable", durable):
        out.append(lacking)
    if on_kill_action not in ON_KILL_ACTIONS:
        out.append(("on_kill_action", f"{on_kill_action!r:.40} is not an action", "use 'delete' or 'keep'"))
    if on_finish_action not in ON_FINISH_ACTIONS:
        out.append(
            (
                "on_finish_action",
                f"{on_finish_action!r:.40} is not an action",
                "use 'keep', 'delete' or 'delete_succeeded'",
            )
        )
    if not _log_nodes_ok(log_nodes):
        out.append(
            (
                "log_nodes",
                f"{log_nodes!r:.40} names no nodes",
                "a node index (0 = rank 0), 'all', 'dataset-initializer', 'model-initializer', or a list of these",
            )
        )
    if request_file is not None and (
        not isinstance(request_file, str)
        or not (request_file.endswith(REQUEST_FILE_EXT) or "\n" in request_file)
    ):
        out.append(
            (
                "request_file",
                f"{request_file!r:.80} is not a .yaml, .yml or .json file",
                "give its path, relative to the DAG's folder or template_searchpath (it is rendered with Jinja)",
            )
        )
    if request is not None and not isinstance(request, Mapping) and not deferred(request):
        out.append(("request", f"is a {type(request).__name__}, not a mapping", "request={...}"))
    return out


def _log_nodes_ok(log_nodes: Any) -> bool:
    from trainflow.airflow.logstream import log_node_ok

    if log_node_ok(log_nodes):
        return True
    return isinstance(log_nodes, list | tuple) and bool(log_nodes) and all(log_node_ok(n) for n in log_nodes)


def check(
    task_id: str,
    args: Mapping[str, Any],
    *,
    request: Any,
    request_file: Any,
    on_kill_action: Any,
    on_finish_action: Any,
    log_nodes: Any,
    durable: Any = None,
) -> None:
    """At DAG parse: InvalidRequest naming the task and every argument the run (or this Airflow) would refuse."""
    issues = _operator_issues(
        durable=durable,
        on_kill_action=on_kill_action,
        on_finish_action=on_finish_action,
        log_nodes=log_nodes,
        request_file=request_file,
        request=request,
    )
    given = dict(request) if isinstance(request, Mapping) else {}
    names = {f: f"request.{f}" for f in given} | {f: operator_arg(f) for f in args}
    whole = request_file is None and (request is None or isinstance(request, Mapping))
    literal = [f for f in args if operator_arg(f) in NOT_TEMPLATED]
    found = request_problems({**given, **args}, names, whole=whole, literal=literal)
    if issues or found:
        from trainflow.core.errors import FieldIssue, InvalidRequest

        raise InvalidRequest(
            [*(FieldIssue(*i) for i in issues), *found], subject=f"TrainJobOperator {task_id!r}"
        )


# -- the Airflow names the operator keeps ------------------------------------------------------------

AIRFLOW_RESOURCES = ("cpus", "ram", "disk", "gpus")  # airflow.sdk.definitions.resources.Resources
QUEUELESS_EXECUTORS = ("LocalExecutor", "SequentialExecutor", "DebugExecutor")  # they ignore `queue`
KUEUE_LIKE = re.compile(r"(queue|^lq-|-lq$|^kueue)", re.IGNORECASE)


class KueueQueueWarning(UserWarning):
    """``queue`` (Airflow's executor queue) was given where a Kueue LocalQueue may have been meant."""


def check_airflow_args(airflow_kwargs: Mapping[str, Any], kueue_queue: Any) -> None:
    """Before BaseOperator reads them: ``resources`` holding Kubernetes quantities is an error naming
    ``resources_per_node``; an executor ``queue`` that reads like a Kueue queue is a KueueQueueWarning."""
    resources = airflow_kwargs.get("resources")
    if isinstance(resources, Mapping) and (
        foreign := [str(k) for k in resources if k not in AIRFLOW_RESOURCES]
    ):
        from trainflow.core.errors import FieldIssue, InvalidRequest

        problem = (
            f"{dict(resources)!r}: {', '.join(foreign)} are not Airflow executor resources "
            f"({', '.join(AIRFLOW_RESOURCES)})"
        )
        fix = f"for what each TrainJob node gets, pass resources_per_node={dict(resources)!r}"
        task = f"TrainJobOperator {airflow_kwargs.get('task_id')!r}"
        raise InvalidRequest([FieldIssue("resources", problem, fix)], subject=task)
    if warning := queue_warning(airflow_kwargs.get("queue"), kueue_queue):
        warnings.warn(warning, KueueQueueWarning, stacklevel=3)


def _executors() -> list[str]:
    value = _config.airflow_option("core", "executor")
    return [e.split(":")[-1].strip().rsplit(".", 1)[-1] for e in value.split(",") if e.strip()]


def queue_warning(queue: Any, kueue_queue: Any) -> str | None:
    """The warning for an executor ``queue`` that may have meant a Kueue LocalQueue, or None.

    Airflow's meaning is kept. Without ``kueue_queue``, the user hears about it when the deployment's
    executors ignore queues, or when the name looks like a Kueue queue (``gpu-queue``, ``lq-a100``).
    """
    if not isinstance(queue, str) or kueue_queue is not None:
        return None
    if queue == _config.airflow_option("operators", "default_queue", "default"):
        return None
    executors = _executors()
    queueless = bool(executors) and all(e in QUEUELESS_EXECUTORS for e in executors)
    if not queueless and not KUEUE_LIKE.search(queue):
        return None
    ignored = f" ({', '.join(executors)} ignores executor queues)" if queueless else ""
    return (
        f"queue={queue!r} is this task's Airflow executor queue{ignored}. To queue the TrainJob in a Kueue "
        f"LocalQueue, pass kueue_queue={queue!r}. If you meant the executor queue, silence this with "
        "warnings.filterwarnings('ignore', category=trainflow.airflow.arguments.KueueQueueWarning)"
    )


# -- build at execute ------------------------------------------------------------------------------


def build(fields: Mapping[str, Any], identity: tuple[str, str, str, int | None]) -> TrainJobRequest:
    """The validated request of one task instance: its fields, its identity key and its Airflow labels."""
    from trainflow.airflow.identity import airflow_labels, idempotency_key
    from trainflow.core.validation import parse_request

    out = dict(fields)
    out.setdefault("idempotency_key", idempotency_key(*identity))
    labels = out.get("labels", {})
    if isinstance(labels, Mapping):  # anything else is the model's to refuse, naming the field
        out["labels"] = {**labels, **airflow_labels(*identity)}
    return parse_request(out)
