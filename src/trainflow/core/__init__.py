"""trainflow core: pipeline parameters -> validated, runtime-backed Kubeflow Trainer TrainJobs.

Public API: TrainJobRequest, build_trainjob, get_backend, TrainJobResult, JobRef, JobState, report,
and the errors InvalidRequest, TrainJobFailed, TrainJobNotFound, WaitTimeout.
"""

from trainflow.core.backend import Backend, get_backend
from trainflow.core.errors import (
    Diagnostics,
    FieldIssue,
    InvalidRequest,
    RuntimeNotFound,
    TrainflowError,
    TrainJobConflict,
    TrainJobFailed,
    TrainJobNotFound,
    WaitTimeout,
)
from trainflow.core.manifest import build_trainjob, identity_labels, job_name
from trainflow.core.request import PvcVolume, Resources, SecretKeyRef, TrainJobRequest
from trainflow.core.result import JobRef, JobState, TrainJobResult, result_from_trainjob
from trainflow.core.runtimes import Runtime, local_catalog
from trainflow.core.validation import parse_request

__all__ = [
    "Backend",
    "Diagnostics",
    "FieldIssue",
    "InvalidRequest",
    "JobRef",
    "JobState",
    "PvcVolume",
    "Resources",
    "Runtime",
    "RuntimeNotFound",
    "SecretKeyRef",
    "TrainJobConflict",
    "TrainJobFailed",
    "TrainJobNotFound",
    "TrainJobRequest",
    "TrainJobResult",
    "TrainflowError",
    "WaitTimeout",
    "build_trainjob",
    "get_backend",
    "identity_labels",
    "job_name",
    "local_catalog",
    "parse_request",
    "result_from_trainjob",
]


def __getattr__(name: str) -> object:
    if name in ("report", "output_dir"):
        from trainflow.core import reporting

        return getattr(reporting, name)
    raise AttributeError(name)
