"""build_trainjob: a validated request plus its runtime become the TrainJob manifest (a plain dict)."""

from __future__ import annotations

import re
from typing import Any

from trainflow.core import initializers, torchtune
from trainflow.core.errors import FieldIssue, InvalidRequest
from trainflow.core.function_trainer import encode_kwargs, function_command
from trainflow.core.naming import (
    API_VERSION,
    ATTEMPT_LABEL,
    GROUP,
    KEY_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    PATCH_MANAGER,
    TRAINER_CONTAINER,
    derive_name,
    key_label,
    random_name,
)
from trainflow.core.request import TrainJobRequest
from trainflow.core.result import OUTPUT_URI_ANNOTATION, RETURNS_ANNOTATION
from trainflow.core.runtimes import Runtime
from trainflow.core.schema import schema_errors
from trainflow.core.validation import OUTPUT_ENV, max_name_length, parse_request, validate_request

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
_PATCH_PATH = re.compile(r"^spec\.runtimePatches\[(?P<index>\d+)\](?P<rest>.*)$")


def job_name(request: TrainJobRequest, runtime: Runtime, attempt: int = 1) -> str:
    """The TrainJob name: given, derived from the idempotency key (stable), or random."""
    if request.name:
        return request.name
    if request.idempotency_key:
        nodes = request.num_nodes or runtime.default_num_nodes
        return derive_name(request.idempotency_key, attempt, min(40, max_name_length(runtime, nodes)))
    return random_name()


def identity_labels(request: TrainJobRequest, attempt: int = 1) -> dict[str, str]:
    """Labels that let any process find the TrainJobs made for one request identity."""
    labels = {MANAGED_BY_LABEL: MANAGED_BY_VALUE}
    if request.idempotency_key:
        labels[KEY_LABEL] = key_label(request.idempotency_key)
        labels[ATTEMPT_LABEL] = str(attempt)
    return labels


def _trainer(request: TrainJobRequest, runtime: Runtime) -> dict[str, Any]:
    trainer: dict[str, Any] = {}
    if request.image:
        trainer["image"] = request.image
    if runtime.is_torchtune:
        trainer.update(torchtune.trainer_fields(request, runtime))
    elif request.function is not None:
        trainer["command"] = function_command(
            request.function,
            request.function_kwargs,
            runtime.policy,
            request.packages_to_install,
            request.pip_index_urls,
        )
    elif request.command is not None:
        trainer["command"] = list(request.command)
    if request.args is not None and not runtime.is_torchtune:
        trainer["args"] = list(request.args)
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in request.env.items()]
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
        for k, ref in request.secret_env.items()
    ]
    if request.output_uri:
        env.append({"name": OUTPUT_ENV, "value": request.output_uri})
    if env:
        trainer["env"] = env
    if request.num_nodes is not None:
        trainer["numNodes"] = request.num_nodes
    if isinstance(request.proc_per_node, int):
        trainer["numProcPerNode"] = request.proc_per_node
    resources = request.resources.requirements() if request.resources else None
    if resources:
        trainer["resourcesPerNode"] = resources
    return trainer


def _pod_patch(
    request: TrainJobRequest, runtime: Runtime, job: str, labels: dict[str, str]
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if request.service_account:
        spec["serviceAccountName"] = request.service_account
    if request.node_selector:
        spec["nodeSelector"] = dict(request.node_selector)
    if request.tolerations:
        spec["tolerations"] = [dict(t) for t in request.tolerations]
    if request.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in request.image_pull_secrets]
    if request.volumes and TRAINER_CONTAINER in runtime.container_names(job):
        spec["volumes"] = [
            {
                "name": v.name or f"pvc-{i}",
                "persistentVolumeClaim": {"claimName": v.claim_name, "readOnly": v.read_only},
            }
            for i, v in enumerate(request.volumes)
        ]
        mounts = []
        for i, v in enumerate(request.volumes):
            mount: dict[str, Any] = {"name": v.name or f"pvc-{i}", "mountPath": v.mount_path}
            if v.read_only:
                mount["readOnly"] = True
            if v.sub_path:
                mount["subPath"] = v.sub_path
            mounts.append(mount)
        spec["containers"] = [{"name": TRAINER_CONTAINER, "volumeMounts": mounts}]
    template: dict[str, Any] = {}
    meta = _meta(labels, request.annotations)
    if meta:
        template["metadata"] = meta
    if spec:
        template["spec"] = spec
    return template


def _meta(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def _runtime_patch(
    request: TrainJobRequest, runtime: Runtime, labels: dict[str, str]
) -> dict[str, Any] | None:
    jobs = []
    for job in runtime.replicated_job_names:
        pod = _pod_patch(request, runtime, job, labels)
        if pod:
            jobs.append({"name": job, "template": {"spec": {"template": pod}}})
    template: dict[str, Any] = {}
    meta = _meta(labels, request.annotations)
    if meta:
        template["metadata"] = meta
    if jobs:
        template["spec"] = {"replicatedJobs": jobs}
    if not template:
        return None
    return {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": template}}


def build_trainjob(
    request: TrainJobRequest | dict[str, Any],
    runtime: Runtime,
    *,
    namespace: str | None = None,
    attempt: int = 1,
    local: bool = False,
) -> dict[str, Any]:
    """Validate the request against the runtime and return the TrainJob manifest, ready for the API.

    Raises InvalidRequest naming each bad field; nothing is submitted here. ``local``: for the local engine
    (``file://`` dataset and model URIs allowed).
    """
    req = parse_request(request)
    validate_request(req, runtime, local=local)
    labels = {**req.labels, **identity_labels(req, attempt)}
    metadata: dict[str, Any] = {"name": job_name(req, runtime, attempt)}
    ns = req.namespace or namespace
    if ns:
        metadata["namespace"] = ns
    job_labels = dict(labels)
    if req.queue:
        job_labels[QUEUE_LABEL] = req.queue
    metadata["labels"] = job_labels
    annotations = dict(req.annotations)
    if req.output_uri:
        annotations[OUTPUT_URI_ANNOTATION] = req.output_uri
    if req.function is not None:
        annotations[RETURNS_ANNOTATION] = "json"
    if annotations:
        metadata["annotations"] = annotations

    spec: dict[str, Any] = {
        "runtimeRef": {"name": runtime.name, "apiGroup": GROUP, "kind": runtime.kind},
    }
    trainer = _trainer(req, runtime)
    if trainer:
        spec["trainer"] = trainer
    initializer = initializers.render(req)
    if initializer:
        spec["initializer"] = initializer
    patches = []
    own = _runtime_patch(req, runtime, labels)
    if own:
        patches.append(own)
    patches += [dict(p) for p in req.runtime_patches]
    if patches:
        spec["runtimePatches"] = patches
    if req.suspend:
        spec["suspend"] = True
    if req.deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = req.deadline_seconds
    manifest = {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": metadata, "spec": spec}
    _check_schema(manifest, req, own_patches=1 if own else 0)
    return manifest


def _check_schema(manifest: dict[str, Any], req: TrainJobRequest, own_patches: int) -> None:
    """Hold the manifest to the CRD schema; each error names the request field it came from."""
    issues = []
    for path, message in schema_errors(manifest):
        issues.append(
            FieldIssue(
                request_field(path, manifest, req, own_patches),
                message,
                "compare with the TrainJob CRD (trainer.kubeflow.org/v1alpha1)",
            )
        )
    if issues:
        raise InvalidRequest(issues)


_TRAINER_FIELDS = {
    "image": "image",
    "numNodes": "num_nodes",
    "numProcPerNode": "proc_per_node",
    "resourcesPerNode": "resources",
}
_POD_FIELDS = {
    "nodeSelector": "node_selector",
    "tolerations": "tolerations",
    "imagePullSecrets": "image_pull_secrets",
    "serviceAccountName": "service_account",
    "volumes": "volumes",
}
_SPEC_FIELDS = {"activeDeadlineSeconds": "deadline_seconds", "suspend": "suspend", "runtimeRef": "runtime"}
_INDEXED = re.compile(r"^\[(\d+)\](.*)$")
_OWN_POD = re.compile(
    r"^\.trainingRuntimeSpec\.template\.spec\.replicatedJobs\[\d+\]\.template\.spec\.template(?P<rest>.*)$"
)


def request_field(path: str, manifest: dict[str, Any], req: TrainJobRequest, own_patches: int) -> str:
    """The request field (as the user wrote it) behind a manifest path such as ``spec.trainer.env[2].value``."""
    if match := _PATCH_PATH.match(path):
        index, rest = int(match["index"]), match["rest"]
        if index >= own_patches:
            return f"runtime_patches[{index - own_patches}]{rest}"
        return _own_patch_field(rest)
    if path.startswith("spec.trainer."):
        return _trainer_field(path.removeprefix("spec.trainer."), manifest, req)
    if path.startswith("spec.initializer."):
        kind, _, rest = path.removeprefix("spec.initializer.").partition(".")
        return f"{kind}_uri" if rest.startswith("storageUri") else f"{kind}_options"
    head = path.removeprefix("spec.").split(".")[0].split("[")[0]
    return _SPEC_FIELDS.get(head, path)


def _own_patch_field(rest: str) -> str:
    """A path inside the runtime patch trainflow writes for labels, annotations and pod settings."""
    pod = _OWN_POD.match(rest)
    inner = pod["rest"] if pod else rest.removeprefix(".trainingRuntimeSpec.template")
    if inner.startswith(".metadata."):
        return inner.removeprefix(".metadata.")
    inner = inner.removeprefix(".spec.")
    if inner.startswith("containers"):
        mount = re.search(r"volumeMounts\[(\d+)\](.*)$", inner)
        return f"volumes[{mount[1]}]" if mount else "volumes"
    for key, field in _POD_FIELDS.items():
        if inner.startswith(key):
            return field + inner[len(key) :]
    return "request"


def _trainer_field(rest: str, manifest: dict[str, Any], req: TrainJobRequest) -> str:
    trainer = (manifest.get("spec") or {}).get("trainer") or {}
    head = re.split(r"[.\[]", rest, maxsplit=1)[0]
    tail = rest[len(head) :]
    if head in _TRAINER_FIELDS:
        return _TRAINER_FIELDS[head] + tail
    indexed = _INDEXED.match(tail)
    if head == "env" and indexed:
        item = (trainer.get("env") or [])[int(indexed[1])]
        name = str(item.get("name"))
        if name == OUTPUT_ENV:
            return "output_uri"
        return f"{'secret_env' if 'valueFrom' in item else 'env'}.{name}"
    if head == "command" and req.function is not None:
        item = (trainer.get("command") or [])[int(indexed[1])] if indexed else None
        return "function_kwargs" if item == encode_kwargs(req.function_kwargs) else "function"
    if head in ("command", "args"):
        return head + tail
    return head or "request"
