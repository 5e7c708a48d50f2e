"""trainflow.kfp: Kubeflow Pipelines components that run Kubeflow Trainer TrainJobs.

Import stays light: components (and kfp) load on first attribute access.
"""

from typing import Any

__all__ = [
    "get_train_job",
    "make_get_train_job_component",
    "make_train_job_component",
    "make_wait_train_job_component",
    "train_job",
    "wait_train_job",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from trainflow.kfp import components

        return getattr(components, name)
    raise AttributeError(name)
