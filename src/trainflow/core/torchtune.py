"""TorchTune runtimes: render the Trainer's TorchTune mode and hold a request to its webhook rules.

The Trainer (v2.3.0) switches to TorchTune mode only when ``spec.trainer.command == ["tune", "run"]``:
it then appends the rendezvous endpoint (multi-node or multi-device), the recipe and config it picks
from nodes, processes, GPUs and the LoRA/QLoRA overrides, and the runtime's immutable paths. The
runtime's other command overrides (its dataset arguments) are dropped by that mode, so trainflow
passes them on as args, ahead of the user's overrides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from trainflow.core.errors import FieldIssue
from trainflow.core.quantity import quantity_value
from trainflow.core.request import TrainJobRequest
from trainflow.core.runtimes import Runtime, node_count

ENTRYPOINT = ["tune", "run"]
# Set by the runtime (extractOverridesFromRuntime); the webhook refuses them in spec.trainer.args.
IMMUTABLE_CONFIGS = frozenset(
    {"output_dir", "tokenizer.path", "checkpointer.checkpoint_dir", "tokenizer.merges_file"}
)
SUPPORTED_MODELS = frozenset({"llama3_2/1B", "llama3_2/3B", "llama3_3/70B", "qwen2_5/1.5B"})
MULTI_NODE_MODELS = frozenset({"llama3_3/70B"})
SMALL_LLAMA_MODELS = frozenset({"llama3_2/1B", "llama3_2/3B"})
QWEN_MODEL = "qwen2_5/1.5B"
LORA_MODULES = "model.lora_attn_modules"
QUANTIZE_BASE = "model.quantize_base"
USE_DORA = "model.use_dora"
DATASET_PATH = "/workspace/dataset"


def model_of(runtime_name: str) -> str:
    """The pretrained model the Trainer reads from a runtime name: torchtune-llama3.2-1b -> llama3_2/1B."""
    parts = runtime_name.split("-")
    if len(parts) != 3:
        return ""
    return f"{parts[1].replace('.', '_')}/{parts[2].upper()}"


def _key(arg: str) -> str:
    return arg.split("=", 1)[0]


def uses_lora(args: Iterable[str]) -> bool:
    return any(LORA_MODULES in arg for arg in args)


def _enabled(args: Iterable[str], item: str) -> bool:
    for arg in args:
        name, sep, value = arg.partition("=")
        if sep and item in name and value.strip().lower() == "true":
            return True
    return False


def uses_qlora(args: Iterable[str]) -> bool:
    """QLoRA as the Trainer reads it: model.quantize_base=True, unless DoRA is on."""
    args = list(args)
    return not _enabled(args, USE_DORA) and _enabled(args, QUANTIZE_BASE)


def recipe_and_config(
    model: str, num_nodes: int, proc_per_node: int | None, gpus: int, args: list[str]
) -> tuple[str, str]:
    """The recipe and config the Trainer's webhook reasons about (proc_per_node None means auto)."""
    single = num_nodes == 1 and (proc_per_node == 1 or gpus == 1)
    if single and uses_qlora(args):
        recipe, suffix = "lora_finetune_single_device", "_qlora_single_device"
    elif single and uses_lora(args):
        recipe, suffix = "lora_finetune_single_device", "_lora_single_device"
    elif single:
        recipe, suffix = "full_finetune_single_device", "_full_single_device"
    elif num_nodes == 1 and uses_qlora(args):
        recipe, suffix = "lora_finetune_distributed", "_qlora"
    elif num_nodes == 1 and uses_lora(args):
        recipe, suffix = "lora_finetune_distributed", "_lora"
    elif num_nodes > 1:
        recipe, suffix = "full_finetune_distributed", "_full_multinode"
    else:
        recipe, suffix = "full_finetune_distributed", "_full"
    return recipe, model + suffix


def gpus_per_node(request: TrainJobRequest, runtime: Runtime) -> int:
    """GPUs per node as the Trainer counts them: the TrainJob's resources, else the runtime's node container."""
    resources: Mapping[str, Any] | None = request.resources.requirements() if request.resources else None
    if resources is None:
        resources = runtime.trainer_container().get("resources") or {}
    for part in ("requests", "limits"):
        for name, value in (resources.get(part) or {}).items():
            if "gpu" in name.lower():
                count = quantity_value(value)
                if count:
                    return count
                break
    return 0


def runtime_overrides(runtime: Runtime) -> list[str]:
    """The runtime's own ``key=value`` overrides that TorchTune mode drops (all but the immutable paths)."""
    container = runtime.trainer_container()
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    return [a for a in argv if "=" in a and not a.startswith("-") and _key(a) not in IMMUTABLE_CONFIGS]


def dataset_location(dataset_uri: str | None) -> str | None:
    """Where the dataset initializer puts a file or folder below the HF repo, as the Kubeflow SDK points at it."""
    if not dataset_uri or not dataset_uri.lower().startswith("hf://"):
        return None
    parts = dataset_uri[len("hf://") :].strip("/").split("/")
    relative = "/".join(parts[2:])
    if not relative:
        return None
    key = "dataset.data_files" if "." in relative else "dataset.data_dir"
    return f"{key}={DATASET_PATH}/{relative}"


def render_args(runtime: Runtime, user_args: list[str], dataset_uri: str | None) -> list[str]:
    """Args for TorchTune mode: the runtime's dataset overrides the user does not replace, then the user's."""
    location = dataset_location(dataset_uri)
    own = [*([location] if location else []), *user_args]
    keys = {_key(a) for a in own if "=" in a}
    kept = []
    for arg in runtime_overrides(runtime):
        key = _key(arg)
        if key in keys or ("dataset" in keys and key.startswith("dataset.")):
            continue  # the user's value wins; a new dataset builder takes none of the runtime's options
        if location and key in ("dataset.data_dir", "dataset.data_files"):
            continue
        kept.append(arg)
    return kept + own


def check(request: TrainJobRequest, runtime: Runtime) -> list[FieldIssue]:
    """Every rule the Trainer's webhook applies in TorchTune mode, plus the mode's own argv conventions."""
    issues: list[FieldIssue] = []
    if request.function is not None:
        issues.append(
            FieldIssue(
                "function",
                "TorchTune runtimes run a 'tune run' recipe, not a function",
                "use args overrides (key=value)",
            )
        )
    if request.command is not None and list(request.command) != ENTRYPOINT:
        issues.append(
            FieldIssue(
                "command",
                "on a TorchTune runtime the Trainer picks the recipe, config and rendezvous only for "
                "the command ['tune', 'run'] (trainflow sends it)",
                "omit 'command' and pass recipe overrides as 'args' (key=value)",
            )
        )
    args = list(request.args or [])
    for i, arg in enumerate(args):
        if "=" not in arg or arg.startswith("-"):
            issues.append(
                FieldIssue(
                    f"args[{i}]", f"{arg[:80]!r} is not a TorchTune override", "use key=value, e.g. epochs=1"
                )
            )
        elif _key(arg) in IMMUTABLE_CONFIGS:
            issues.append(
                FieldIssue(
                    f"args[{i}]",
                    f"{_key(arg)!r} is set by the runtime (the Trainer refuses it in args)",
                    "remove it; the output lands in the runtime's volume (/workspace/output)",
                )
            )
    model = model_of(runtime.name)
    if model not in SUPPORTED_MODELS:
        issues.append(
            FieldIssue(
                "runtime",
                f"the Trainer's TorchTune mode supports the models {sorted(SUPPORTED_MODELS)}; "
                f"runtime name {runtime.name!r} gives {model or 'none'}",
                "name the runtime torchtune-<model>-<size>, e.g. torchtune-llama3.2-1b",
            )
        )
    nodes = node_count(request.num_nodes, runtime)
    if nodes > 1 and model not in MULTI_NODE_MODELS:
        issues.append(
            FieldIssue(
                "num_nodes",
                f"must be 1 for the {model or runtime.name} model",
                "use num_nodes 1 (TorchTune runs multi-node only for llama3_3/70B)",
            )
        )
    if nodes > 1 and (uses_lora(args) or uses_qlora(args)):
        issues.append(
            FieldIssue(
                "num_nodes",
                "LoRA fine-tuning is not supported on several nodes in TorchTune",
                "use num_nodes 1, or drop the LoRA overrides",
            )
        )
    ppn = request.proc_per_node if isinstance(request.proc_per_node, int) else None
    gpus = gpus_per_node(request, runtime)
    _, config = recipe_and_config(model, nodes, ppn, gpus, args)
    if "_qlora" in config:
        at = next((i for i, a in enumerate(args) if QUANTIZE_BASE in _key(a)), 0)
        if model == QWEN_MODEL:
            issues.append(
                FieldIssue(
                    f"args[{at}]",
                    f"QLoRA is not supported for the {model} model",
                    "drop model.quantize_base, or use a Llama runtime",
                )
            )
        elif "_qlora_single_device" not in config and model in SMALL_LLAMA_MODELS:
            fix = "QLoRA runs on one device for this model: set resources {gpu: 1}"
            if ppn is not None:
                issues.append(
                    FieldIssue("proc_per_node", f"must be 1 for the {model} model with QLoRA", "use 1")
                )
            issues.append(
                FieldIssue("resources", f"{gpus} GPUs per node; the {model} model with QLoRA needs 1", fix)
            )
    return issues


def trainer_fields(request: TrainJobRequest, runtime: Runtime) -> dict[str, Any]:
    """The command and args of ``spec.trainer`` on a TorchTune runtime."""
    return {
        "command": list(ENTRYPOINT),
        "args": render_args(runtime, list(request.args or []), request.dataset_uri),
    }
