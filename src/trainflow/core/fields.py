"""Which request field a TrainJob manifest path comes from: the one map for every error that names a path.

The CRD schema check, the API server's 422 causes and the admission webhooks' denials all name places in the
manifest trainflow built (``spec.trainer.env[2].value``); the user wrote a request. Given the manifest that was
checked or sent, a path resolves to the field as the user wrote it (``secret_env.HF_TOKEN``, ``output_uri``,
``runtime_patches[0].trainingRuntimeSpec``); given only the path, to the field as far as the path tells. The request itself, where known, separates
TorchTune's args (the runtime's dataset overrides, the dataset location, the user's).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trainflow.core.artifact import JOB_ENV
from trainflow.core.naming import (
    ATTEMPT_LABEL,
    KEY_LABEL,
    MANAGED_BY_LABEL,
    MAX_QUEUE_ANNOTATION,
    OUTPUT_URI_ANNOTATION,
    PATCH_MANAGER,
    PRIORITY_CLASS_LABEL,
    QUEUE_LABEL,
    RETURNS_ANNOTATION,
)
from trainflow.core.reporting import OUTPUT_ENV

if TYPE_CHECKING:
    from trainflow.core.request import TrainJobRequest

_TRAINER = {
    "image": "image",
    "command": "command",
    "args": "args",
    "env": "env",
    "numNodes": "num_nodes",
    "numProcPerNode": "proc_per_node",
    "resourcesPerNode": "resources",
}
_POD = {
    "nodeSelector": "node_selector",
    "tolerations": "tolerations",
    "imagePullSecrets": "image_pull_secrets",
    "serviceAccountName": "service_account",
    "volumes": "volumes",
}
_SPEC = {"activeDeadlineSeconds": "deadline_seconds", "suspend": "suspend", "runtimeRef": "runtime"}
_LABELS = {
    QUEUE_LABEL: "queue",
    PRIORITY_CLASS_LABEL: "priority_class",
    KEY_LABEL: "idempotency_key",
    ATTEMPT_LABEL: "idempotency_key",
}
_ANNOTATIONS = {
    OUTPUT_URI_ANNOTATION: "output_uri",
    RETURNS_ANNOTATION: "function",
    MAX_QUEUE_ANNOTATION: "max_queue_seconds",
}

_PATCH = re.compile(r"^spec\.runtimePatches\[(?P<index>\d+)\](?P<rest>.*)$")
_INITIALIZER = re.compile(r"^spec\.initializer\.(?P<kind>dataset|model)(?P<rest>.*)$")
_INDEXED = re.compile(r"^\[(\d+)\](.*)$")
_OWN_POD = re.compile(
    r"^\.trainingRuntimeSpec\.template\.spec\.replicatedJobs\[\d+\]\.template\.spec\.template(?P<rest>.*)$"
)
_HEAD = re.compile(r"[.\[]")


def request_field(
    path: str, manifest: Mapping[str, Any] | None = None, request: TrainJobRequest | None = None
) -> str:
    """The request field behind ``path`` of ``manifest`` (the one checked or sent; None: the path alone)."""
    path = path.strip()
    if not path.startswith(("spec.", "metadata.")) or path == "spec.runtimeRef.apiGroup":
        return "request"  # the object's frame (apiVersion, kind, the schema check's "(root)"), not a field
    if (
        request is not None
        and path.startswith("spec.")
        and _patched(path.removeprefix("spec."), request.spec_patch)
    ):
        return f"spec_patch.{path.removeprefix('spec.')}"
    if match := _PATCH.match(path):
        return _patch_field(int(match["index"]), match["rest"], manifest)
    if path.startswith(("spec.trainer.", "spec.trainer[")):
        return _trainer_field(path.removeprefix("spec.trainer").removeprefix("."), manifest, request)
    if match := _INITIALIZER.match(path):
        return _initializer_field(match["kind"], match["rest"], manifest)
    if path.startswith("metadata."):
        return _meta_field(path.removeprefix("metadata.")) or path
    rest = path.removeprefix("spec.")
    if rest.startswith("runtimeRef.kind"):
        return "runtime_kind"
    # a spec field trainflow never renders can only have come from the raw spec patch
    return _SPEC.get(_head(rest), f"spec_patch.{rest}")


def _patched(rest: str, patch: Mapping[str, Any]) -> bool:
    """Whether ``spec_patch`` set the spec path ``rest`` (or a parent of it)."""
    node: Any = patch
    for part in re.split(r"\.|\[\d+\]", rest):
        if not part:
            continue
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
        if not isinstance(node, Mapping):
            return True
    return node is not patch


def request_fields(path: str, manifest: Mapping[str, Any] | None, text: str) -> list[str]:
    """The fields behind a path an error names with its message: the whole trainer env (as the Trainer's
    reserved-env denial names it) is the entries whose names the message quotes."""
    field = request_field(path, manifest)
    if field != "env" or manifest is None:
        return [field]
    env = _items(manifest, "spec", "trainer", "env")
    quoted = [
        request_field(f"spec.trainer.env[{i}]", manifest)
        for i, item in enumerate(env)
        if isinstance(item, Mapping)
        and re.search(rf"(?<![A-Za-z0-9_]){re.escape(str(item.get('name')))}(?![A-Za-z0-9_])", text)
    ]
    return quoted or [field]


def _head(rest: str) -> str:
    return _HEAD.split(rest, maxsplit=1)[0]


def _key(rest: str) -> str:
    """A map key after its map's name: ``.a.b/c`` (the schema check's form) or ``[a.b/c]`` (the server's)."""
    if rest.startswith("[") and rest.endswith("]"):
        return rest[1:-1].strip("'\"")
    return rest.removeprefix(".")


def _meta_field(rest: str) -> str | None:
    """A path under ``metadata`` (of the TrainJob, or of the pods trainflow's runtime patch labels)."""
    head = _head(rest)
    key = _key(rest[len(head) :])
    if key == MANAGED_BY_LABEL:
        return "request"  # trainflow's own mark on everything it makes
    if head in ("name", "generateName"):
        return "name"
    if head == "namespace":
        return "namespace"
    if head == "labels":
        return _LABELS.get(key) or (f"labels.{key}" if key else "labels")
    if head == "annotations":
        return _ANNOTATIONS.get(key) or (f"annotations.{key}" if key else "annotations")
    return None


def _items(manifest: Mapping[str, Any] | None, *keys: str) -> list[Any]:
    node: Any = manifest or {}
    for key in keys:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, list) else []


def _item(items: list[Any], index: int) -> Any:
    return items[index] if 0 <= index < len(items) else None


def _trainer_field(rest: str, manifest: Mapping[str, Any] | None, request: TrainJobRequest | None) -> str:
    head = _head(rest)
    tail = rest[len(head) :]
    field = _TRAINER.get(head)
    if field is None:
        return f"spec.trainer.{rest}"
    indexed = _INDEXED.match(tail)
    if head == "env":
        item = _item(_items(manifest, "spec", "trainer", "env"), int(indexed[1])) if indexed else None
        if not isinstance(item, Mapping):
            return "env"
        name = str(item.get("name"))
        if name == OUTPUT_ENV or name in JOB_ENV.values():
            return "output_uri"
        return f"{'secret_env' if 'valueFrom' in item else 'env'}.{name}"
    if head == "command" and indexed:
        from trainflow.core.function_trainer import argv_field

        command = [str(a) for a in _items(manifest, "spec", "trainer", "command")]
        return argv_field(command, int(indexed[1])) or field + tail
    if head == "args" and indexed and request is not None:
        return _args_field(int(indexed[1]), indexed[2], manifest, request)
    return field + tail


def _args_field(index: int, tail: str, manifest: Mapping[str, Any] | None, request: TrainJobRequest) -> str:
    """TorchTune mode's args: the runtime's dataset overrides kept, the dataset location, then the user's."""
    from trainflow.core import torchtune

    args = _items(manifest, "spec", "trainer", "args")
    if _items(manifest, "spec", "trainer", "command") != torchtune.ENTRYPOINT:
        return f"args[{index}]{tail}"
    first_own = len(args) - len(request.args or [])
    if index >= first_own:
        return f"args[{index - first_own}]{tail}"
    location = torchtune.dataset_location(request.dataset_uri)
    return "dataset_uri" if location and index == first_own - 1 and args[index] == location else "runtime"


def _initializer_field(kind: str, rest: str, manifest: Mapping[str, Any] | None) -> str:
    rest = rest.removeprefix(".")
    head = _head(rest)
    if head == "secretRef":
        return f"{kind}_secret"
    if head == "env":
        indexed = _INDEXED.match(rest[len(head) :])
        env = _items(manifest, "spec", "initializer", kind, "env")
        item = _item(env, int(indexed[1])) if indexed else None
        if isinstance(item, Mapping) and "valueFrom" in item:
            return f"{kind}_secret_env"
        return f"{kind}_options"
    return f"{kind}_uri"


def _patch_field(index: int, rest: str, manifest: Mapping[str, Any] | None) -> str:
    """A runtime patch: trainflow's own (labels, annotations, pod settings) or the user's ``runtime_patches``."""
    patches = _items(manifest, "spec", "runtimePatches")
    if manifest is not None:
        own = [isinstance(p, Mapping) and p.get("manager") == PATCH_MANAGER for p in patches]
        if index < len(own) and not own[index]:
            return f"runtime_patches[{index - sum(own[:index])}]{rest}"
        if index < len(own):
            return _own_patch_field(rest) or "request"  # its frame: manager, replicated job names
    return _own_patch_field(rest) or "runtime_patches"


def _own_patch_field(rest: str) -> str | None:
    pod = _OWN_POD.match(rest)
    inner = pod["rest"] if pod else rest.removeprefix(".trainingRuntimeSpec.template")
    if inner.startswith(".metadata."):
        return _meta_field(inner.removeprefix(".metadata."))
    inner = inner.removeprefix(".spec.")
    if inner.startswith("containers"):
        mount = re.search(r"volumeMounts\[(\d+)\](.*)$", inner)
        return f"volumes[{mount[1]}]" if mount else "volumes"
    head = _head(inner)
    return _POD[head] + inner[len(head) :] if head in _POD else None
