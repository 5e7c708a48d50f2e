"""The user intents both clients build: the Kubeflow SDK 0.5.0 call and the trainflow request for each.

``rows`` names the docs/fidelity.md rows whose differences the intent's pods show; an intent without
rows must give identical pods. The SDK side is a function of the ``kubeflow.trainer`` namespace, so
this module imports without the SDK (the docs-table test runs in the fast suite).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from diff_functions import train, train_noted

IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
INDEXES = ["https://pypi.org/simple", "https://download.pytorch.org/whl/cpu"]
LORA_MODULES = ["q_proj", "v_proj", "output_proj"]
LORA_ARG = "model.lora_attn_modules=[q_proj,v_proj,output_proj]"


@dataclass(frozen=True)
class Intent:
    id: str
    name: str  # the TrainJob name, the same in both namespaces
    runtime: str
    sdk: Callable[[SimpleNamespace], dict[str, Any]]  # kwargs of TrainerClient.train but runtime and Name
    tf: dict[str, Any]  # the trainflow request but runtime and name
    rows: tuple[str, ...] = ()
    recipe: tuple[str, str] | None = None  # TorchTune: the recipe and config the Trainer must pick
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)  # Secret name -> data, for both sides


def _container(command: list[str], **kw: Any) -> Callable[[SimpleNamespace], dict[str, Any]]:
    def sdk(t: SimpleNamespace) -> dict[str, Any]:
        options = [t.TrainerCommand(command=command)]
        if "args" in kw:
            options.append(t.TrainerArgs(args=kw["args"]))
        trainer = t.CustomTrainerContainer(
            image=kw.get("image", IMAGE),
            num_nodes=kw.get("num_nodes"),
            resources_per_node=kw.get("resources"),
            env=kw.get("env"),
        )
        return {"trainer": trainer, "options": options + kw.get("options", [])}

    return sdk


def _container_request(command: list[str], **kw: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"image": kw.get("image", IMAGE), "command": command}
    request.update(
        {key: kw[key] for key in ("args", "num_nodes", "env", "resources") if kw.get(key) is not None}
    )
    return request


def _function(
    fn: Any, kwargs: dict[str, Any] | None, **kw: Any
) -> Callable[[SimpleNamespace], dict[str, Any]]:
    def sdk(t: SimpleNamespace) -> dict[str, Any]:
        extra = {"pip_index_urls": kw["indexes"]} if kw.get("indexes") else {}
        trainer = t.CustomTrainer(
            func=fn,
            func_args=kwargs,
            num_nodes=kw.get("num_nodes"),
            packages_to_install=kw.get("packages"),
            env=kw.get("env"),
            **extra,
        )
        return {"trainer": trainer}

    return sdk


def _tune(**config: Any) -> Callable[[SimpleNamespace], dict[str, Any]]:
    def sdk(t: SimpleNamespace) -> dict[str, Any]:
        peft = config.get("peft")
        cfg = t.TorchTuneConfig(
            epochs=config.get("epochs"),
            batch_size=config.get("batch_size"),
            dtype=t.DataType.BF16 if config.get("bf16") else None,
            num_nodes=config.get("num_nodes"),
            resources_per_node=config.get("resources"),
            peft_config=t.LoraConfig(**peft) if peft is not None else None,
        )
        out: dict[str, Any] = {"trainer": t.BuiltinTrainer(config=cfg)}
        if config.get("initializer"):
            out["initializer"] = config["initializer"](t)
        return out

    return sdk


def _deadline(t: SimpleNamespace) -> dict[str, Any]:
    return _container(["torchrun", "/app/train.py"], num_nodes=2)(t) | {
        "options": [t.TrainerCommand(command=["torchrun", "/app/train.py"]), t.ActiveDeadlineSeconds(3600)]
    }


def _labels(t: SimpleNamespace) -> dict[str, Any]:
    return {
        "trainer": t.CustomTrainerContainer(image=IMAGE),
        "options": [
            t.TrainerCommand(command=["torchrun", "/app/train.py"]),
            t.Labels(labels={"team": "ml", "cost-center": "r-d"}),
            t.Annotations(annotations={"example.com/owner": "alice"}),
        ],
    }


def _sdk_node_patch(t: SimpleNamespace, pod: Any) -> Any:
    """An SDK RuntimePatch of the ``node`` replicated job's pod spec."""
    job = t.ReplicatedJobPatch(
        name="node", template=t.JobTemplatePatch(spec=t.JobSpecPatch(template=t.PodTemplatePatch(spec=pod)))
    )
    spec = t.JobSetSpecPatch(replicated_jobs=[job])
    return t.RuntimePatch(
        training_runtime_spec=t.TrainingRuntimeSpecPatch(template=t.JobSetTemplatePatch(spec=spec))
    )


def node_patch(job: str, pod: dict[str, Any], manager: str = "example.com/platform") -> dict[str, Any]:
    """A raw ``runtime_patches`` entry patching one replicated job's pod spec."""
    spec = {"replicatedJobs": [{"name": job, "template": {"spec": {"template": {"spec": pod}}}}]}
    return {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": spec}}}


def _scheduling(t: SimpleNamespace) -> dict[str, Any]:
    pod = t.PodSpecPatch(
        service_account_name="trainer-sa",
        node_selector={"kubernetes.io/os": "linux"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    return {
        "trainer": t.CustomTrainerContainer(image=IMAGE),
        "options": [t.TrainerCommand(command=["torchrun", "/app/train.py"]), _sdk_node_patch(t, pod)],
    }


SCRATCH_MOUNT = {"name": "scratch", "mountPath": "/scratch"}


def _raw_patch(t: SimpleNamespace) -> dict[str, Any]:
    container = t.ContainerPatch(name="node", volume_mounts=[SCRATCH_MOUNT])
    pod = t.PodSpecPatch(volumes=[{"name": "scratch", "emptyDir": {}}], containers=[container])
    return {
        "trainer": t.CustomTrainerContainer(image=IMAGE),
        "options": [t.TrainerCommand(command=["torchrun", "/app/train.py"]), _sdk_node_patch(t, pod)],
    }


RAW_PATCH = node_patch(
    "node",
    {
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "containers": [{"name": "node", "volumeMounts": [SCRATCH_MOUNT]}],
    },
)
HF_TOKEN = "hf_differential_canary"
S3_KEYS = {"id": "AKIADIFFERENTIAL", "secret": "s3-secret-differential"}


def _hf_init(t: SimpleNamespace) -> Any:
    return t.Initializer(
        dataset=t.HuggingFaceDatasetInitializer(storage_uri="hf://tatsu-lab/alpaca"),
        model=t.HuggingFaceModelInitializer(
            storage_uri="hf://meta-llama/Llama-3.2-1B-Instruct", access_token=HF_TOKEN
        ),
    )


def _s3_init(t: SimpleNamespace) -> Any:
    common = {"endpoint": "http://minio.storage:9000", "region": "us-east-1"}
    keys = {"access_key_id": S3_KEYS["id"], "secret_access_key": S3_KEYS["secret"]}
    return t.Initializer(
        dataset=t.S3DatasetInitializer(
            storage_uri="s3://datasets/alpaca", ignore_patterns=["*.md"], **common, **keys
        ),
        model=t.S3ModelInitializer(storage_uri="s3://models/llama-3.2-1b", **common, **keys),
    )


def _hf_files_init(t: SimpleNamespace) -> Any:
    return t.Initializer(
        dataset=t.HuggingFaceDatasetInitializer(storage_uri="hf://tatsu-lab/alpaca/data/train.parquet")
    )


S3_OPTIONS = {"endpoint": "http://minio.storage:9000", "region": "us-east-1"}
S3_SECRET_ENV = {"access_key_id": "s3-keys/id", "secret_access_key": "s3-keys/secret"}

INTENTS: list[Intent] = [
    # container trainers, every runtime
    Intent("torch-container", "d-torch", "torch-distributed", _container(["torchrun", "/app/train.py"], num_nodes=2),
           _container_request(["torchrun", "/app/train.py"], num_nodes=2)),
    Intent("torch-args-env", "d-torch-env", "torch-distributed",
           _container(["torchrun"], args=["/app/train.py", "--epochs=3"], env={"LOG_LEVEL": "debug", "PYTHONUNBUFFERED": "1"}),
           _container_request(["torchrun"], args=["/app/train.py", "--epochs=3"], env={"LOG_LEVEL": "debug", "PYTHONUNBUFFERED": "1"})),
    Intent("torch-resources", "d-torch-res", "torch-distributed",
           _container(["torchrun", "/app/train.py"], resources={"cpu": 4, "memory": "16Gi", "gpu": 2}),
           _container_request(["torchrun", "/app/train.py"], resources={"cpu": 4, "memory": "16Gi", "gpu": 2})),
    Intent("deepspeed-container", "d-ds", "deepspeed-distributed",
           _container(["mpirun", "--hostfile", "/etc/mpi/hostfile", "python3", "/app/train.py"], num_nodes=2),
           _container_request(["mpirun", "--hostfile", "/etc/mpi/hostfile", "python3", "/app/train.py"], num_nodes=2)),
    Intent("deepspeed-ompi-env", "d-ds-env", "deepspeed-distributed",
           _container(["mpirun", "python3", "/app/train.py"], env={"OMPI_MCA_btl_tcp_if_include": "eth0"}),
           _container_request(["mpirun", "python3", "/app/train.py"], env={"OMPI_MCA_btl_tcp_if_include": "eth0"})),
    Intent("mlx-container", "d-mlx", "mlx-distributed",
           _container(["mpirun", "--hostfile", "/etc/mpi/hostfile", "python3", "/app/train.py"], num_nodes=3),
           _container_request(["mpirun", "--hostfile", "/etc/mpi/hostfile", "python3", "/app/train.py"], num_nodes=3)),
    Intent("jax-container", "d-jax", "jax-distributed", _container(["python3", "/app/train.py"], num_nodes=2),
           _container_request(["python3", "/app/train.py"], num_nodes=2)),
    Intent("xgboost-container", "d-xgb", "xgboost-distributed",
           _container(["python3", "/app/train.py"], num_nodes=2, env={"DMLC_WORKER_CONNECT_RETRY": "5"}),
           _container_request(["python3", "/app/train.py"], num_nodes=2, env={"DMLC_WORKER_CONNECT_RETRY": "5"})),
    # function trainers, every runtime that takes one
    Intent("torch-function", "d-torch-fn", "torch-distributed",
           _function(train, {"lr": 0.01, "epochs": 3, "layers": [64, 64]}, num_nodes=2, env={"LOG_LEVEL": "info"}),
           {"function": train, "function_kwargs": {"lr": 0.01, "epochs": 3, "layers": [64, 64]}, "num_nodes": 2,
            "env": {"LOG_LEVEL": "info"}}, rows=("F1",)),
    Intent("torch-function-packages", "d-torch-pkg", "torch-distributed",
           _function(train, {"name": "pkg"}, packages=["transformers==4.57.1", "datasets>=3"], indexes=INDEXES),
           {"function": train, "function_kwargs": {"name": "pkg"}, "packages_to_install": ["transformers==4.57.1", "datasets>=3"],
            "pip_index_urls": INDEXES}, rows=("F1", "F3")),
    Intent("torch-function-decorated", "d-torch-deco", "torch-distributed", _function(train_noted, {"steps": 2}),
           {"function": train_noted, "function_kwargs": {"steps": 2}}, rows=("F1", "F2")),
    Intent("deepspeed-function", "d-ds-fn", "deepspeed-distributed", _function(train, {"epochs": 2}, num_nodes=2),
           {"function": train, "function_kwargs": {"epochs": 2}, "num_nodes": 2}, rows=("F1",)),
    Intent("mlx-function", "d-mlx-fn", "mlx-distributed", _function(train, {"name": "mlx"}, packages=["mlx-lm"]),
           {"function": train, "function_kwargs": {"name": "mlx"}, "packages_to_install": ["mlx-lm"]}, rows=("F1", "F3")),
    Intent("jax-function", "d-jax-fn", "jax-distributed", _function(train, {"lr": 0.5}, num_nodes=2),
           {"function": train, "function_kwargs": {"lr": 0.5}, "num_nodes": 2}, rows=("F1",)),
    Intent("xgboost-function", "d-xgb-fn", "xgboost-distributed", _function(train, None, num_nodes=2),
           {"function": train, "num_nodes": 2}, rows=("F1",)),
    # TorchTune: full, LoRA, QLoRA on every vendored model
    Intent("llama1b-full", "d-l1-full", "torchtune-llama3.2-1b", _tune(epochs=1, batch_size=2),
           {"args": ["batch_size=2", "epochs=1"]}, rows=("T1",), recipe=("full_finetune_distributed", "llama3_2/1B_full")),
    Intent("llama1b-full-1gpu", "d-l1-1gpu", "torchtune-llama3.2-1b", _tune(epochs=1, bf16=True, resources={"gpu": 1}),
           {"args": ["dtype=bf16", "epochs=1"], "resources": {"gpu": 1}}, rows=("T1",), recipe=("full_finetune_single_device", "llama3_2/1B_full_single_device")),
    Intent("llama1b-lora", "d-l1-lora", "torchtune-llama3.2-1b", _tune(epochs=1, peft={"lora_rank": 8, "lora_alpha": 16}),
           {"args": ["epochs=1", "model.lora_rank=8", "model.lora_alpha=16", LORA_ARG]}, rows=("T1",), recipe=("lora_finetune_distributed", "llama3_2/1B_lora")),
    Intent("llama1b-qlora", "d-l1-qlora", "torchtune-llama3.2-1b",
           _tune(peft={"quantize_base": True}, resources={"gpu": 1}),
           {"args": ["model.quantize_base=True", LORA_ARG], "resources": {"gpu": 1}}, rows=("T1",), recipe=("lora_finetune_single_device", "llama3_2/1B_qlora_single_device")),
    Intent("llama3b-full", "d-l3-full", "torchtune-llama3.2-3b", _tune(epochs=2), {"args": ["epochs=2"]}, rows=("T1",), recipe=("full_finetune_distributed", "llama3_2/3B_full")),
    Intent("llama3b-lora-1gpu", "d-l3-lora", "torchtune-llama3.2-3b", _tune(peft={}, resources={"gpu": 1}),
           {"args": [LORA_ARG], "resources": {"gpu": 1}}, rows=("T1",), recipe=("lora_finetune_single_device", "llama3_2/3B_lora_single_device")),
    Intent("qwen-full", "d-qw-full", "torchtune-qwen2.5-1.5b", _tune(batch_size=4), {"args": ["batch_size=4"]}, rows=("T1",), recipe=("full_finetune_distributed", "qwen2_5/1.5B_full")),
    Intent("qwen-lora", "d-qw-lora", "torchtune-qwen2.5-1.5b", _tune(peft={"lora_dropout": 0.1}),
           {"args": ["model.lora_dropout=0.1", LORA_ARG]}, rows=("T1",), recipe=("lora_finetune_distributed", "qwen2_5/1.5B_lora")),
    # initializers
    Intent("hf-initializers", "d-hf-init", "torchtune-llama3.2-1b", _tune(epochs=1, initializer=_hf_init),
           {"args": ["epochs=1"], "dataset_uri": "hf://tatsu-lab/alpaca", "model_uri": "hf://meta-llama/Llama-3.2-1B-Instruct",
            "model_secret_env": {"access_token": "hf-token/token"}},
           rows=("T1", "T2", "S1"), recipe=("full_finetune_distributed", "llama3_2/1B_full"), secrets={"hf-token": {"token": HF_TOKEN}}),
    Intent("s3-initializers", "d-s3-init", "torchtune-llama3.2-1b", _tune(epochs=1, initializer=_s3_init),
           {"args": ["epochs=1"], "dataset_uri": "s3://datasets/alpaca", "dataset_options": {**S3_OPTIONS, "ignore_patterns": ["*.md"]},
            "dataset_secret_env": S3_SECRET_ENV, "model_uri": "s3://models/llama-3.2-1b", "model_options": S3_OPTIONS,
            "model_secret_env": S3_SECRET_ENV},
           rows=("T1", "S1"), recipe=("full_finetune_distributed", "llama3_2/1B_full"), secrets={"s3-keys": S3_KEYS}),
    Intent("hf-dataset-file", "d-hf-file", "torchtune-llama3.2-1b", _tune(initializer=_hf_files_init),
           {"dataset_uri": "hf://tatsu-lab/alpaca/data/train.parquet"}, rows=("T1",), recipe=("full_finetune_distributed", "llama3_2/1B_full")),
    # metadata, scheduling, raw runtime patches, names, deadline
    Intent("labels-annotations", "d-labels", "torch-distributed", _labels,
           {**_container_request(["torchrun", "/app/train.py"]), "labels": {"team": "ml", "cost-center": "r-d"},
            "annotations": {"example.com/owner": "alice"}}, rows=("L1",)),
    Intent("scheduling-patch", "d-sched", "torch-distributed", _scheduling,
           {**_container_request(["torchrun", "/app/train.py"]), "service_account": "trainer-sa",
            "node_selector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}),
    Intent("raw-runtime-patch", "d-patch", "torch-distributed", _raw_patch,
           {**_container_request(["torchrun", "/app/train.py"]), "runtime_patches": [RAW_PATCH]}),
    Intent("long-name-deadline", "d-a-rather-long-trainjob-name-40-chars", "torch-distributed", _deadline,
           {**_container_request(["torchrun", "/app/train.py"], num_nodes=2), "deadline_seconds": 3600}),
]  # fmt: skip


def sdk_namespace() -> SimpleNamespace:
    """The ``kubeflow.trainer`` types and options the intents use (imported on demand)."""
    import kubeflow.trainer as trainer
    import kubeflow.trainer.options as options

    return SimpleNamespace(**{**vars(trainer), **vars(options)})
