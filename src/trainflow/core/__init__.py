"""trainflow core: pipeline parameters -> validated, runtime-backed Kubeflow Trainer TrainJobs.

Public API: TrainJobRequest, build_trainjob, get_backend, launch, TrainJobResult, Ending, JobRef, JobState, report,
and the errors InvalidRequest, TrainJobFailed, TrainJobNotFound, WaitTimeout. Names load on first use
(PEP 562), so importing a submodule (the local supervisor, an Airflow DAG file) costs nothing extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Backend": "backend",
    "get_backend": "connection",
    "EndKind": "ending",
    "Ending": "ending",
    "Diagnostics": "errors",
    "FieldIssue": "errors",
    "InvalidRequest": "errors",
    "QueueBudgetExceeded": "errors",
    "RuntimeNotFound": "errors",
    "TrainflowError": "errors",
    "TrainJobConflict": "errors",
    "TrainJobFailed": "errors",
    "TrainJobNotFound": "errors",
    "WaitTimeout": "errors",
    "History": "history",
    "HistoryPoint": "history",
    "Launch": "lifecycle",
    "launch": "lifecycle",
    "render": "lifecycle",
    "build_trainjob": "manifest",
    "identity_labels": "manifest",
    "job_name": "manifest",
    "PvcVolume": "request",
    "Resources": "request",
    "SecretKeyRef": "request",
    "TrainJobRequest": "request",
    "JobRef": "result",
    "JobState": "result",
    "TrainJobResult": "result",
    "result_from_trainjob": "result",
    "Runtime": "runtimes",
    "local_catalog": "runtimes",
    "parse_request": "validation",
    "report": "reporting",
    "output_dir": "reporting",
    "publish_output": "publish",
    "download": "storage",
    "StorageError": "storage",
}
__all__ = [
    "Backend",
    "Diagnostics",
    "EndKind",
    "Ending",
    "FieldIssue",
    "History",
    "HistoryPoint",
    "InvalidRequest",
    "JobRef",
    "JobState",
    "Launch",
    "PvcVolume",
    "QueueBudgetExceeded",
    "Resources",
    "Runtime",
    "RuntimeNotFound",
    "SecretKeyRef",
    "StorageError",
    "TrainJobConflict",
    "TrainJobFailed",
    "TrainJobNotFound",
    "TrainJobRequest",
    "TrainJobResult",
    "TrainflowError",
    "WaitTimeout",
    "build_trainjob",
    "download",
    "get_backend",
    "identity_labels",
    "job_name",
    "launch",
    "local_catalog",
    "output_dir",
    "parse_request",
    "publish_output",
    "render",
    "report",
    "result_from_trainjob",
]

if TYPE_CHECKING:
    from trainflow.core.backend import Backend
    from trainflow.core.connection import get_backend
    from trainflow.core.ending import Ending, EndKind
    from trainflow.core.errors import (
        Diagnostics,
        FieldIssue,
        InvalidRequest,
        QueueBudgetExceeded,
        RuntimeNotFound,
        TrainflowError,
        TrainJobConflict,
        TrainJobFailed,
        TrainJobNotFound,
        WaitTimeout,
    )
    from trainflow.core.history import History, HistoryPoint
    from trainflow.core.lifecycle import Launch, launch, render
    from trainflow.core.manifest import build_trainjob, identity_labels, job_name
    from trainflow.core.publish import publish_output
    from trainflow.core.reporting import output_dir, report
    from trainflow.core.request import PvcVolume, Resources, SecretKeyRef, TrainJobRequest
    from trainflow.core.result import JobRef, JobState, TrainJobResult, result_from_trainjob
    from trainflow.core.runtimes import Runtime, local_catalog
    from trainflow.core.storage import StorageError, download
    from trainflow.core.validation import parse_request


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trainflow.core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"trainflow.core.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
