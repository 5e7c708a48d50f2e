"""TrainJobOperator argument errors that need no cluster, raised when the DAG file is parsed.

A light pass over the plain (non-templated) values: unknown ``request`` keys, a string where a list belongs, a
non-mapping where a mapping belongs, counts below 1, a function reference that is not ``module:function``. The
full request validation (pydantic, ``trainflow.core``) still runs at execute; it is not imported at DAG parse.
"""

from __future__ import annotations

from typing import Any

from trainflow.airflow.request_args import REQUEST_FIELDS

LISTS = (
    "command",
    "args",
    "packages_to_install",
    "pip_index_urls",
    "image_pull_secrets",
    "tolerations",
    "volumes",
)
MAPPINGS = ("function_kwargs", "env", "secret_env", "labels", "annotations", "node_selector")
COUNTS = ("num_nodes", "deadline_seconds")


def _lazy(value: Any) -> bool:
    """A value Airflow fills in later (a template, an XComArg): not checked at parse."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    return not isinstance(value, int | float | bool | list | tuple | dict) and value is not None


def _count(value: Any) -> int | None:
    """A whole number as pydantic's lax mode reads it (2, 2.0, "2"), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _problem(field: str, value: Any) -> tuple[str, str] | None:
    if field in LISTS and isinstance(value, str):
        return "is a string, not a list", f"{field}=[...] with one item per argument"
    if field in MAPPINGS and not isinstance(value, dict):
        return f"is a {type(value).__name__}, not a mapping", f"{field}={{...}}"
    count = _count(value)
    if field in COUNTS and (count is None or count < 1):
        return f"{str(value)[:40]!r} is not a whole number of 1 or more", "use 1 or more"
    if field == "proc_per_node" and value != "auto" and (count is None or count < 1):
        return (
            f"{str(value)[:40]!r} is not 1 or more, nor 'auto'",
            "use a whole number of 1 or more, or 'auto'",
        )
    if field == "function" and isinstance(value, str) and not _is_ref(value):
        return f"{value!r:.80} is not 'module:function'", "give a callable, or 'package.module:function'"
    return None


def _is_ref(text: str) -> bool:
    module, sep, name = text.partition(":")
    return bool(sep) and all(p.isidentifier() for p in module.split(".")) and name.isidentifier()


def check(fields: dict[str, Any], task_id: str) -> None:
    """Raise InvalidRequest (naming the task and the fields) for what is wrong with the plain arguments."""
    issues: list[tuple[str, str, str]] = []
    for field, value in fields.items():
        if field not in REQUEST_FIELDS:
            issues.append((f"request.{field}", "is not a TrainJob request field", "see TrainJobRequest"))
        elif value is not None and not _lazy(value) and (problem := _problem(field, value)):
            issues.append((field, *problem))
    if issues:
        from trainflow.core.errors import FieldIssue, InvalidRequest  # only on the error path

        raise InvalidRequest([FieldIssue(*i) for i in issues], subject=f"TrainJobOperator {task_id!r}")
