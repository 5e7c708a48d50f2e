"""Issue 11.2 and 11.7: TorchTune runtimes use the Trainer's TorchTune mode, and its webhook rules hold offline.

What the controller then runs (recipe, config, rendezvous) is checked against the real Trainer in
tests/differential; here: the TrainJob trainflow sends, and the refusals, each naming the field.
"""

from __future__ import annotations

from typing import Any

import pytest

from trainflow.core import InvalidRequest, build_trainjob, local_catalog
from trainflow.core.runtimes import Runtime, find_runtime
from trainflow.core.torchtune import model_of, runtime_overrides

TORCHTUNE = [r.name for r in local_catalog() if r.is_torchtune]
LORA = "model.lora_attn_modules=[q_proj,v_proj,output_proj]"
QLORA = "model.quantize_base=True"


def rt(name: str) -> Runtime:
    return find_runtime(local_catalog(), name)


def trainer(request: dict[str, Any], runtime: str = "torchtune-llama3.2-1b") -> dict[str, Any]:
    return dict(build_trainjob({"name": "tt", **request}, rt(runtime))["spec"]["trainer"])


def refused(request: dict[str, Any], runtime: str = "torchtune-llama3.2-1b") -> list[str]:
    with pytest.raises(InvalidRequest) as err:
        build_trainjob({"name": "tt", **request}, rt(runtime))
    return err.value.fields


def test_every_vendored_torchtune_runtime_is_covered() -> None:
    assert sorted(TORCHTUNE) == ["torchtune-llama3.2-1b", "torchtune-llama3.2-3b", "torchtune-qwen2.5-1.5b"]
    assert [model_of(n) for n in sorted(TORCHTUNE)] == ["llama3_2/1B", "llama3_2/3B", "qwen2_5/1.5B"]


@pytest.mark.parametrize("runtime", TORCHTUNE)
def test_command_enters_torchtune_mode_and_keeps_the_runtimes_dataset_args(runtime: str) -> None:
    """Only command == ["tune", "run"] enters the mode, which drops the runtime's dataset overrides."""
    kept = runtime_overrides(rt(runtime))
    assert {a.split("=")[0] for a in kept} == {"dataset", "dataset.source", "dataset.data_dir"}
    for request in ({}, {"args": ["epochs=1"]}):
        out = trainer(request, runtime)
        assert out["command"] == ["tune", "run"]
        assert out["args"] == kept + request.get("args", [])


def test_user_overrides_replace_the_runtimes() -> None:
    out = trainer({"args": ["dataset.source=json", "epochs=2"]})
    assert out["args"] == [
        "dataset=torchtune.datasets.instruct_dataset",
        "dataset.data_dir=/workspace/dataset/data",
        "dataset.source=json",
        "epochs=2",
    ]
    # another dataset builder takes none of the runtime's dataset options
    assert trainer({"args": ["dataset=torchtune.datasets.alpaca_dataset"]})["args"] == [
        "dataset=torchtune.datasets.alpaca_dataset"
    ]


def test_a_folder_or_file_inside_a_hf_dataset_is_pointed_at_as_the_sdk_does() -> None:
    out = trainer({"dataset_uri": "hf://org/data/train/part.json"})
    assert out["args"][-1] == "dataset.data_files=/workspace/dataset/train/part.json"
    assert "dataset.data_dir=/workspace/dataset/data" not in out["args"]
    out = trainer({"dataset_uri": "hf://org/data/train"})
    assert out["args"][-1] == "dataset.data_dir=/workspace/dataset/train"
    assert (
        "dataset.data_dir=/workspace/dataset/data"
        in trainer({"dataset_uri": "hf://tatsu-lab/alpaca"})["args"]
    )


@pytest.mark.parametrize(
    ("request_", "fields"),
    [
        # each of these the Trainer v2.3.0 webhook refuses (tests/differential checks the server agrees)
        ({"num_nodes": 2}, ["num_nodes"]),
        ({"args": ["output_dir=/tmp/out"]}, ["args[0]"]),
        ({"args": ["epochs=1", "tokenizer.path=/x"]}, ["args[1]"]),
        ({"args": [LORA, QLORA], "resources": {"gpu": 2}}, ["resources"]),
        ({"args": [LORA, QLORA]}, ["resources"]),  # the runtime's 2 GPUs
        (
            {"args": [LORA, QLORA], "proc_per_node": 2, "resources": {"gpu": 2}},
            ["proc_per_node", "resources"],
        ),
        ({"function": "pkg:train"}, ["function"]),
        ({"command": ["tune", "run", "lora_finetune_single_device"]}, ["command"]),
        ({"args": ["--config", "x"]}, ["args[0]", "args[1]"]),
    ],
)
def test_webhook_refusals_are_caught_offline(request_: dict[str, Any], fields: list[str]) -> None:
    assert refused(request_) == fields


def test_qlora_is_refused_for_qwen_and_accepted_on_one_gpu_for_llama() -> None:
    assert refused({"args": [LORA, QLORA], "resources": {"gpu": 1}}, "torchtune-qwen2.5-1.5b") == ["args[1]"]
    out = trainer({"args": [LORA, QLORA], "resources": {"gpu": 1}})
    assert out["args"][-2:] == [LORA, QLORA]
    # DoRA switches QLoRA off, as the Trainer reads it
    trainer({"args": [LORA, QLORA, "model.use_dora=True"], "resources": {"gpu": 2}})


def test_multi_node_rules_follow_the_model() -> None:
    big = Runtime.from_object(
        {
            "kind": "ClusterTrainingRuntime",
            "metadata": {
                "name": "torchtune-llama3.3-70b",
                "labels": {"trainer.kubeflow.org/framework": "torchtune"},
            },
            "spec": {
                "mlPolicy": {"numNodes": 1, "torch": {}},
                "template": rt("torchtune-llama3.2-1b").template,
            },
        }
    )
    build_trainjob({"name": "tt", "num_nodes": 2}, big)
    with pytest.raises(InvalidRequest) as err:
        build_trainjob({"name": "tt", "num_nodes": 2, "args": [LORA]}, big)
    assert err.value.fields == ["num_nodes"] and "LoRA" in str(err.value)
    odd = big.model_copy(update={"name": "torchtune-mistral"})
    with pytest.raises(InvalidRequest) as err:
        build_trainjob({"name": "tt"}, odd)
    assert err.value.fields == ["runtime"]
