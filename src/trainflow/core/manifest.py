"""build_trainjob: a validated request plus its runtime become the TrainJob manifest (a plain dict)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from trainflow.core import initializers, torchtune
from trainflow.core.artifact import JOB_ENV
from trainflow.core.errors import FieldIssue, InvalidRequest
from trainflow.core.fields import request_field
from trainflow.core.function_trainer import function_command
from trainflow.core.naming import (
    API_VERSION,
    ATTEMPT_LABEL,
    GROUP,
    JOBSET_NAME_LABEL,
    KEY_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    MAX_QUEUE_ANNOTATION,
    OUTPUT_URI_ANNOTATION,
    PATCH_MANAGER,
    PRIORITY_CLASS_LABEL,
    QUEUE_LABEL,
    RETURNS_ANNOTATION,
    TRAINER_CONTAINER,
    derive_name,
    key_label,
    random_name,
)
from trainflow.core.request import TrainJobRequest
from trainflow.core.runtimes import Runtime, node_count
from trainflow.core.schema import Picture, schema_errors, vendored
from trainflow.core.storage import is_object_uri
from trainflow.core.validation import OUTPUT_ENV, max_name_length, parse_request, validate_request


def job_name(request: TrainJobRequest, runtime: Runtime, attempt: int = 1) -> str:
    """The TrainJob name: given, derived from the idempotency key (stable), or random."""
    if request.name:
        return request.name
    if request.idempotency_key:
        nodes = node_count(request.num_nodes, runtime)
        return derive_name(request.idempotency_key, attempt, min(40, max_name_length(runtime, nodes)))
    return random_name()


def identity_labels(request: TrainJobRequest, attempt: int = 1) -> dict[str, str]:
    """Labels that let any process find the TrainJobs made for one request identity."""
    labels = {MANAGED_BY_LABEL: MANAGED_BY_VALUE}
    if request.idempotency_key:
        labels[KEY_LABEL] = key_label(request.idempotency_key)
        labels[ATTEMPT_LABEL] = str(attempt)
    return labels


# On Kubernetes a publishing trainer names its TrainJob in the artifact manifest, and the nodes of one run share a
# publish attempt, through the labels JobSet puts on every pod (docs/artifacts.md); the local engine sets these.
JOB_FIELD_REFS = {
    JOB_ENV["namespace"]: "metadata.namespace",
    JOB_ENV["name"]: f"metadata.labels['{JOBSET_NAME_LABEL}']",
    JOB_ENV["attempt"]: "metadata.labels['jobset.sigs.k8s.io/restart-attempt']",
}


def _trainer(request: TrainJobRequest, runtime: Runtime, local: bool = False) -> dict[str, Any]:
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
            [*request.env, *request.secret_env, *([OUTPUT_ENV] if request.output_uri else [])],
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
        if not local and is_object_uri(request.output_uri):
            env += [
                {"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in JOB_FIELD_REFS.items()
            ]
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
    picture: Picture | None = None,
) -> dict[str, Any]:
    """Validate the request against the runtime and return the TrainJob manifest, ready for the API.

    Raises InvalidRequest naming each bad field; nothing is submitted here. ``local``: for the local engine
    (``file://`` dataset and model URIs allowed). ``picture``: the TrainJob schema the cluster serves (default:
    the vendored one).
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
    if req.priority_class:
        job_labels[PRIORITY_CLASS_LABEL] = req.priority_class
    metadata["labels"] = job_labels
    annotations = dict(req.annotations)
    if req.output_uri:
        annotations[OUTPUT_URI_ANNOTATION] = req.output_uri
    if req.function is not None:
        annotations[RETURNS_ANNOTATION] = "json"
    if req.max_queue_seconds is not None:
        annotations[MAX_QUEUE_ANNOTATION] = str(req.max_queue_seconds)
    if annotations:
        metadata["annotations"] = annotations

    spec: dict[str, Any] = {
        "runtimeRef": {"name": runtime.name, "apiGroup": GROUP, "kind": runtime.kind},
    }
    trainer = _trainer(req, runtime, local)
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
    if req.spec_patch:
        spec = merge_patch(spec, req.spec_patch)
    manifest = {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": metadata, "spec": spec}
    _check_schema(manifest, req, picture)
    return manifest


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (``kubectl patch --type merge``): objects merge key by key, null deletes, any
    other value replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _check_schema(manifest: dict[str, Any], req: TrainJobRequest, picture: Picture | None) -> None:
    """Hold the manifest to the CRD schema (the cluster's when it was read, else the vendored one); each error
    names the request field it came from and the schema it was checked against."""
    picture = picture or vendored()
    issues = []
    for path, message in schema_errors(manifest, picture=picture):
        issues.append(
            FieldIssue(
                request_field(path, manifest, req),
                f"{message} (checked against {picture.source})",
                picture.fix,
            )
        )
    if issues:
        raise InvalidRequest(issues)
