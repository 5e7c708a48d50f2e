"""Airflow provider for Kubeflow Trainer TrainJobs (trainflow).

Kept light on purpose: DAG files import this at parse time, so the operators load on first use and
nothing from trainflow.core, kubernetes or torch is imported here.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DeleteTrainJobOperator",
    "ResumeTrainJobOperator",
    "SuspendTrainJobOperator",
    "TrainJobHook",
    "TrainJobOperator",
    "TrainJobSensor",
    "TrainJobTrigger",
    "trainjob_task",
]

_WHERE = {
    "TrainJobOperator": "operators",
    "DeleteTrainJobOperator": "actions",
    "SuspendTrainJobOperator": "actions",
    "ResumeTrainJobOperator": "actions",
    "TrainJobSensor": "sensors",
    "TrainJobHook": "hooks",
    "TrainJobTrigger": "triggers",
    "trainjob_task": "decorators",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'trainflow.airflow' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"trainflow.airflow.{module}"), name)
