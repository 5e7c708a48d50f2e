"""Issue 22: a TorchTune LoRA fine-tune end to end on real pods, on the Trainer's own torchtune-llama3.2-1b
ClusterTrainingRuntime as v2.3.0 ships it.

The test makes a tiny Llama 3.2 checkpoint (random weights), its tokenizer and an instruct dataset
(tiny_llama.py) and puts them in the testbed's store. The runtime's model and dataset initializers (the
Trainer's own, built from its v2.3.0 sources) fetch them into the runtime's volume; its claim template is
served by a pre-bound hostPath PersistentVolume, as a platform's provisioner would. The Trainer renders
``tune run lora_finetune_single_device --config llama3_2/1B_lora_single_device`` for one CPU process, in
trainflow's TorchTune image (the upstream image's pins: torch 2.9.1, torchtune 0.6.1, torchao 0.15.0).
``trainflow.core.torchtune_logger.TrainflowLogger`` reports each step's loss to the Trainer's status server
(``trainerStatus``) and, when the recipe ends, publishes its output (the LoRA adapter) to the ``s3://``
output_uri. The store's secret key is found nowhere but in its Secret.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tiny_llama
from s3store import Store, everything, initializer_fields, trainer_store_fields

from conftest import TRAINER_GROUP, TRAINER_VERSION, record
from shared_volumes import delete_pv, hostpath_pv
from trainflow.core import TrainJobRequest, storage

pytestmark = pytest.mark.e2e

RUNTIME = "torchtune-llama3.2-1b"
IMAGE = "ghcr.io/trainflow/trainflow-torchtune:0.1.0"
JOB = "tune-lora"
# The runtime's claim template (volumeClaimPolicies) is "initializer"; JobSet names the claim
# <template>-<JobSet name>, and the JobSet is named after the TrainJob.
CLAIM = f"initializer-{JOB}"
BOUND_S = 600


@pytest.fixture
def runtime_volume(testbed: Any, k8s: Any, namespace: str) -> Iterator[Path]:
    """A hostPath PV pre-bound to the claim the runtime's template makes for this test's TrainJob (20Gi RWO)."""
    path, name = testbed.dir / "tune" / namespace, f"tune-{namespace}"
    hostpath_pv(k8s.core, name, path, "20Gi", "ReadWriteOnce", namespace, CLAIM)
    yield path
    delete_pv(k8s.core, name)


def test_torchtune_lora_fine_tune_reports_loss_and_publishes_its_adapter(
    backend: Any, k8s: Any, namespace: str, store: Store, runtime_volume: Path, tmp_path: Path
) -> None:
    model, data = store.uri(namespace, "llama-tiny"), store.uri(namespace, "instruct")
    store.seed(model, tiny_llama.model_files(), tmp_path / "model")
    store.seed(data, tiny_llama.dataset_files(), tmp_path / "data")
    output = store.uri(namespace, "adapters", "run-1")
    request = TrainJobRequest(
        name=JOB,
        runtime=RUNTIME,
        image=IMAGE,
        args=[
            *tiny_llama.RECIPE_ARGS,
            "metric_logger._component_=trainflow.core.torchtune_logger.TrainflowLogger",
        ],
        proc_per_node=1,
        # The runtime's node container asks for 2 GPUs and the Trainer merges resourcesPerNode into it: a zero
        # GPU limit is what runs it on CPU nodes (left out, the pod stays Unschedulable: Insufficient nvidia.com/gpu)
        # (small requests: it shares the two nodes with the rest of the suite)
        resources={
            "requests": {"cpu": "250m", "memory": "1Gi"},
            "limits": {"cpu": 2, "memory": "3Gi", "nvidia.com/gpu": 0},
        },
        output_uri=output,
        **initializer_fields(store, "dataset", data),
        **initializer_fields(store, "model", model),
        **trainer_store_fields(store),
    )
    t0 = time.monotonic()
    ref = backend.submit(request)
    tj = k8s.custom.get_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, namespace, "trainjobs", JOB)
    assert tj["spec"]["trainer"]["command"] == ["tune", "run"]  # the Trainer's TorchTune mode
    result = backend.wait(ref, timeout=BOUND_S)
    elapsed = time.monotonic() - t0
    assert result.state.value == "Complete", result

    # the Trainer chose the single-device LoRA recipe for one CPU process (its rendering, read off the pod)
    pods = k8s.core.list_namespaced_pod(
        namespace, label_selector="jobset.sigs.k8s.io/replicatedjob-name=node"
    )
    command = [*pods.items[0].spec.containers[0].command, *(pods.items[0].spec.containers[0].args or [])]
    at = command.index("lora_finetune_single_device")
    assert command[at + 1 : at + 3] == ["--config", "llama3_2/1B_lora_single_device"], command
    assert "checkpointer.checkpoint_dir=/workspace/model" in command, command

    # loss in trainerStatus, written by the Trainer's status server from TrainflowLogger's reports
    tj = k8s.custom.get_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, namespace, "trainjobs", JOB)
    status = tj["status"]["trainerStatus"]
    posted = {m["name"]: float(m["value"]) for m in status["metrics"]}
    assert 0 < posted["loss"] < 20, status  # cross-entropy over a 128,256-token vocabulary starts near 11.8
    assert status["progressPercentage"] == 100, status
    assert result.metrics["loss"] == pytest.approx(posted["loss"])

    # the adapter is in the store, under the output URI the result names
    assert result.output_uri == output
    got = storage.download(output, tmp_path / "out", store.host_env())
    assert "epoch_0/adapter_model.safetensors" in got and "epoch_0/adapter_config.json" in got, got
    config = json.loads((tmp_path / "out" / "epoch_0" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8, config
    assert store.secret_access_key not in everything(k8s, namespace)
    record("torchtune_lora", {"seconds_to_complete": round(elapsed, 1), "loss": posted["loss"]})
