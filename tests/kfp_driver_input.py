"""The executor input the KFP backend's driver writes for trainflow's compiled ``train_job`` step, and that
component's container command with it filled in: what the KFP launcher runs in the step's pod.

Output URIs follow the driver's layout, ``<root>/<pipeline>/<run id>/<task>/<uuid of this execution>/<name>``;
a retried pod gets the same executor input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

COMPONENT = Path(__file__).resolve().parents[1] / "components" / "yaml" / "train_job.yaml"
TASK_ROOT = (
    "minio://mlpipeline/v2/artifacts/train/6f1c2a0e-0b7d-4f0e-9d55-0d6c3f7c2b11/train-job/"
    "0a1b2c3d-1111-4222-8333-944455556666"
)
ARTIFACTS = {"model": "system.Model", "metrics": "system.Metrics", "summary": "system.Markdown"}
PARAMETERS = ("job_name", "namespace", "state")
OUTPUT_FILE = "/tmp/kfp_outputs/output_metadata.json"


def executor_input(parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "inputs": {"parameterValues": parameters},
        "outputs": {
            "artifacts": {
                name: {
                    "artifacts": [
                        {"name": name, "type": {"schemaTitle": title}, "uri": f"{TASK_ROOT}/{name}"}
                    ]
                }
                for name, title in ARTIFACTS.items()
            },
            "parameters": {p: {"outputFile": f"/tmp/kfp/outputs/{p}"} for p in PARAMETERS},
            "outputFile": OUTPUT_FILE,
        },
    }


def step_container(parameters: dict[str, Any]) -> tuple[str, list[str], list[str]]:
    """(image, command, args) of the compiled train_job component, ``{{$}}`` replaced by the executor input."""
    (executor,) = yaml.safe_load(COMPONENT.read_text())["deploymentSpec"]["executors"].values()
    container = executor["container"]
    filled = json.dumps(executor_input(parameters))
    command, args = ([a.replace("{{$}}", filled) for a in container[k]] for k in ("command", "args"))
    return container["image"], command, args
