"""Operator arguments <-> TrainJobRequest fields.

Every TrainJobRequest field is an operator argument of the same name, except where Airflow owns the name
(``queue`` and ``resources`` are BaseOperator's) or it reads badly on an operator (``name``), and except
``idempotency_key``, which the operator derives from the task instance.

``REQUEST_FIELDS`` copies ``TrainJobRequest.model_fields`` so that importing an operator in a DAG file does
not build the pydantic model at every parse (docs/benchmarks.md, DAG parse); tests/unit/test_structure.py fails
when the two differ, and checks the operator signature and template fields against it.
"""

from __future__ import annotations

from typing import Any

REQUEST_FIELDS = (
    "runtime",
    "runtime_kind",
    "name",
    "idempotency_key",
    "namespace",
    "image",
    "command",
    "args",
    "function",
    "function_kwargs",
    "packages_to_install",
    "pip_index_urls",
    "num_nodes",
    "proc_per_node",
    "resources",
    "env",
    "secret_env",
    "allow_plain_credentials",
    "dataset_uri",
    "dataset_secret",
    "dataset_options",
    "dataset_secret_env",
    "model_uri",
    "model_secret",
    "model_options",
    "model_secret_env",
    "output_uri",
    "labels",
    "annotations",
    "node_selector",
    "tolerations",
    "service_account",
    "volumes",
    "image_pull_secrets",
    "runtime_patches",
    "queue",
    "suspend",
    "deadline_seconds",
)
RENAMED = {"name": "job_name", "resources": "resources_per_node", "queue": "kueue_queue"}
OPERATOR_OWNED = ("idempotency_key",)  # derived from (dag_id, task_id, run_id, map_index)
NOT_TEMPLATED = ("function", "runtime_kind", "allow_plain_credentials", "suspend")


def operator_arg(field: str) -> str:
    return RENAMED.get(field, field)


REQUEST_ARGS = tuple(operator_arg(f) for f in REQUEST_FIELDS if f not in OPERATOR_OWNED)
TEMPLATED_ARGS = tuple(a for a in REQUEST_ARGS if a not in NOT_TEMPLATED)


def to_request(args: dict[str, Any]) -> dict[str, Any]:
    """Operator arguments (unset ones are None or False) -> request fields."""
    out: dict[str, Any] = {}
    for field in REQUEST_FIELDS:
        if field in OPERATOR_OWNED:
            continue
        value = args.get(operator_arg(field))
        if value is not None and value is not False:
            out[field] = value
    return out
