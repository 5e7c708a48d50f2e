"""What the KFP backend's driver gives trainflow's compiled ``train_job`` step, per KFP backend version.

Read from kubeflow/pipelines at the tags named (docs/kfp.md cites the files):

* output URIs (``backend/src/v2/driver``, ``provisionOutputs``; the run's root from ``backend/src/v2/metadata/
  client.go``, ``GetPipeline``): ``<root>/<pipeline>/<run id>/<task>/<artifact>`` up to 2.3;
  ``<root>/<pipeline>/<run id>/<task>/<uuid>/<artifact>`` from 2.4, the uuid drawn once per task execution
  (``uuid.NewString()`` in the container driver). ``<task>`` is the task's ``taskInfo.name`` (its display name
  when one is set) up to 2.5, its key in its DAG from 2.14 (``opts.TaskName``).
* placeholders (``backend/src/v2/driver/resolve.go``; ``driver.go`` in 2.5): not resolved before 2.5 (the text
  arrives verbatim); ``{{$.pipeline_job_uuid}}`` is the run id and ``{{$.pipeline_task_name}}`` the
  ``taskInfo.name`` in 2.5, the task key from 2.14.
* the step container's environment (``backend/src/v2/compiler/argocompiler/common.go``): ``KFP_POD_NAME`` and
  ``KFP_POD_UID`` from the pod's metadata, since 2.0.
* a retried pod (Argo ``retryStrategy`` on the executor template) and a retried run (``backend/src/common/util/
  workflow.go``, ``GenerateRetryExecution``: succeeded driver nodes are kept) run with the executor input the
  driver wrote: the same URIs, in a new pod.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

COMPONENT = Path(__file__).resolve().parents[1] / "components" / "yaml" / "train_job.yaml"
PIPELINE_ROOT = "minio://mlpipeline/v2/artifacts"  # the KFP default pipeline root
TASK_ROOT = f"{PIPELINE_ROOT}/train/6f1c2a0e-0b7d-4f0e-9d55-0d6c3f7c2b11/train-job/0a1b2c3d-1111-4222-8333-944455556666"
ARTIFACTS = {"model": "system.Model", "metrics": "system.Metrics", "summary": "system.Markdown"}
PARAMETERS = ("job_name", "namespace", "state", "result")
OUTPUT_FILE = "/tmp/kfp_outputs/output_metadata.json"
JOB_ID_PLACEHOLDER = "{{$.pipeline_job_uuid}}"  # dsl.PIPELINE_JOB_ID_PLACEHOLDER
TASK_NAME_PLACEHOLDER = "{{$.pipeline_task_name}}"  # dsl.PIPELINE_TASK_NAME_PLACEHOLDER


def executor_input(parameters: dict[str, Any], task_root: str = TASK_ROOT) -> dict[str, Any]:
    return {
        "inputs": {"parameterValues": parameters},
        "outputs": {
            "artifacts": {
                name: {
                    "artifacts": [
                        {"name": name, "type": {"schemaTitle": title}, "uri": f"{task_root}/{name}"}
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


@dataclass(frozen=True)
class StepView:
    """One try of a step as the backend runs it: an output URI, the identity placeholders' values, its env."""

    model_uri: str
    run_id: str  # what run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER arrives as
    task_name: str  # what task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER arrives as
    env: dict[str, str]


def driver_view(
    version: tuple[int, int],
    *,
    run_id: str,
    task_key: str,
    execution: str,
    pod: str,
    display_name: str | None = None,
    pipeline: str = "train",
) -> StepView:
    """What KFP ``version``'s driver and compiler give one try of a task: ``execution`` seeds the driver's uuid
    (the same for a retried pod or run of that execution), ``pod`` names the try's pod."""
    salt = str(uuid.uuid5(uuid.NAMESPACE_URL, execution))
    info_name = display_name or task_key  # taskInfo.name
    folder_task = info_name if version < (2, 14) else task_key
    folder = f"{PIPELINE_ROOT}/{pipeline}/{run_id}/{folder_task}"
    if version >= (2, 4):
        folder += f"/{salt}"
    if version < (2, 5):
        run, task = JOB_ID_PLACEHOLDER, TASK_NAME_PLACEHOLDER
    else:
        run, task = run_id, (info_name if version < (2, 14) else task_key)
    env = {"KFP_POD_NAME": pod, "KFP_POD_UID": str(uuid.uuid5(uuid.NAMESPACE_DNS, pod))}
    return StepView(f"{folder}/model", run, task, env)
