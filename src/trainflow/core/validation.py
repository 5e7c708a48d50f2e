"""Offline checks of a request against the TrainJob CRD, the Trainer webhooks and the chosen runtime.

Each check names the request field and the fix, so bad input fails before anything is submitted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from trainflow.core import credentials, initializers, output_uri, patches, torchtune
from trainflow.core.artifact import JOB_ENV
from trainflow.core.errors import FieldIssue, InvalidRequest, field_path
from trainflow.core.function_trainer import check_packages
from trainflow.core.naming import (
    DNS_SUBDOMAIN,
    GROUP,
    LABEL_VALUE_PATTERN,
    NAME_PATTERN,
    label_key_problem,
)
from trainflow.core.quantity import is_quantity
from trainflow.core.reporting import OUTPUT_ENV as OUTPUT_ENV
from trainflow.core.request import COUNT_RANGES, SecretKeyRef, TrainJobRequest
from trainflow.core.runtimes import Runtime, node_count
from trainflow.core.storage import is_object_uri

MAX_LIST = 128
MAX_ARG_CHARS = 1_048_576
MAX_REQUEST_CHARS = 1_572_864  # etcd's default object size limit (1.5 MiB): no bigger TrainJob can exist
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
DNS_LABEL = NAME_PATTERN
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
RESOURCE_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
TOLERATION_OPERATORS = {"Exists", "Equal"}
TOLERATION_EFFECTS = {"", "NoSchedule", "PreferNoSchedule", "NoExecute"}


def parse_request(data: Mapping[str, Any] | TrainJobRequest) -> TrainJobRequest:
    """Build a request from plain data; type errors become InvalidRequest naming each field."""
    if isinstance(data, TrainJobRequest):
        return data
    check_expanded_size(data)
    try:
        return TrainJobRequest.model_validate(dict(data))
    except ValidationError as exc:
        issues: list[FieldIssue] = []
        for err in exc.errors():
            field = field_path(data, err["loc"])
            fix = "remove it (unknown field)" if err["type"] == "extra_forbidden" else ""
            if not any(issue.field == field for issue in issues):
                issues.append(FieldIssue(field, err["msg"], fix))
        raise InvalidRequest(issues) from None


def check_expanded_size(data: Mapping[str, Any], limit: int = MAX_REQUEST_CHARS) -> None:
    """Refuse a request whose values, written out, exceed what one Kubernetes object can hold.

    Counted without expanding anything, and stopped at the limit: a YAML alias bomb (a few hundred bytes
    whose shared lists expand to gigabytes) is refused before pydantic or json.dumps copy it out.
    """
    budget = limit
    known = [f for f in data if f in TrainJobRequest.model_fields]  # name a field the user meant first
    for field in known + [f for f in data if f not in TrainJobRequest.model_fields]:
        stack: list[Any] = [field, data[field]]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                budget -= len(item) + 2
            elif isinstance(item, Mapping):
                budget -= 2
                for key, inner in item.items():
                    stack += [key, inner]
            elif isinstance(item, list | tuple):
                budget -= 2
                stack.extend(item)
            else:
                budget -= 8
            if budget < 0:
                raise InvalidRequest.one(
                    str(field),
                    f"expands to more than {limit // 1024} KiB of text (repeated YAML aliases?); "
                    "a TrainJob must fit in one Kubernetes object",
                    "write the value out without anchors and aliases, or pass large data as a file",
                )


def max_name_length(runtime: Runtime, num_nodes: int) -> int:
    """Longest TrainJob name whose pod names stay within 63 characters as JobSet's webhook checks them:
    ``<job>-<rjob>-<i>-<j>`` plus a 5-character random suffix (``-abcde``), for the longest replicated job
    (``dataset-initializer``: 33)."""
    digits = len(str(max(num_nodes - 1, 0)))
    longest = max((len(n) for n in runtime.replicated_job_names), default=4)
    return min(63, 63 - (1 + longest + 1 + 1 + 1 + digits + 6))


class _Checker:
    def __init__(self) -> None:
        self.issues: list[FieldIssue] = []

    def add(self, field: str, problem: str, fix: str = "") -> None:
        self.issues.append(FieldIssue(field, problem, fix))

    def label_map(self, field: str, values: Mapping[str, str], *, check_values: bool) -> None:
        for key, value in values.items():
            problem = label_key_problem(key)
            if problem:
                self.add(f"{field}.{key}", f"invalid key: {problem}", "use a valid Kubernetes label key")
            if check_values and (len(value) > 63 or not LABEL_VALUE_PATTERN.match(value)):
                self.add(
                    f"{field}.{key}",
                    f"invalid value {value[:80]!r}",
                    "at most 63 characters [A-Za-z0-9-_.], starting and ending alphanumeric",
                )

    def dns_subdomain(self, field: str, value: str | None) -> None:
        if value is not None and (len(value) > 253 or not DNS_SUBDOMAIN.match(value)):
            self.add(
                field, f"{value[:80]!r} is not a valid Kubernetes object name", "lowercase a-z, 0-9, '-', '.'"
            )

    def secret_name(self, field: str, value: str | None) -> None:
        """A Secret name; the value is never echoed (it may be a secret value given by mistake)."""
        if value is not None and (len(value) > 253 or not DNS_SUBDOMAIN.match(value)):
            self.add(
                field,
                "is not a valid Secret name (value not shown, it may be the secret itself)",
                "give the name of a Kubernetes Secret: lowercase a-z, 0-9, '-', '.'",
            )

    def secret_ref(self, field: str, ref: SecretKeyRef) -> None:
        self.secret_name(f"{field}.name", ref.name)
        if not SECRET_KEY.match(ref.key) or len(ref.key) > 253:
            self.add(
                f"{field}.key",
                "is not a valid Secret key (value not shown, it may be the secret itself)",
                "use [-._a-zA-Z0-9]+",
            )

    def int_range(self, field: str, value: int | None, low: int, high: int) -> None:
        if value is not None and not low <= value <= high:
            shown = str(value) if len(str(value)) <= 24 else f"a {len(str(value))}-digit number"
            self.add(field, f"{shown} is out of range", f"use a whole number from {low} to {high}")


def _check_trainer(c: _Checker, req: TrainJobRequest, runtime: Runtime) -> None:
    if req.image is not None and (not req.image.strip() or len(req.image) > 500 or "\0" in req.image):
        c.add("image", "must be a non-empty image reference of at most 500 characters, without NUL")
    for field in ("command", "args"):
        argv = getattr(req, field)
        if argv is None:
            continue
        if len(argv) > MAX_LIST:
            c.add(
                field,
                f"{len(argv)} items; the TrainJob allows at most {MAX_LIST}",
                "pass a script file instead",
            )
        for i, arg in enumerate(argv):
            if len(arg) > MAX_ARG_CHARS:
                c.add(f"{field}[{i}]", f"{len(arg)} characters; at most {MAX_ARG_CHARS}")
            if "\0" in arg:
                c.add(f"{field}[{i}]", "contains a NUL character, which no process argument can hold")
    if req.command is not None and not req.command:
        c.add("command", "is empty", "omit it to use the runtime's command, or give argv")
    elif req.command and not req.command[0].strip():
        c.add("command[0]", "is empty: it must name the program to run", "e.g. python3")
    if req.function is not None and isinstance(req.function, str):
        from trainflow.core.function_trainer import FUNCTION_REF

        if not FUNCTION_REF.match(req.function):
            c.add("function", f"{req.function!r} is not 'module:function'", "e.g. 'mypkg.train:main'")
    no_command = req.function is None and req.command is None and req.args is None
    if no_command and not runtime.trainer_container().get("command") and not runtime.is_torchtune:
        c.add(
            "command",
            f"runtime {runtime.name!r} has no default command",
            "give 'command' (argv) or 'function'",
        )
    if runtime.is_torchtune:
        c.issues += torchtune.check(req, runtime)

    c.issues += check_packages(req)
    c.int_range("num_nodes", req.num_nodes, *COUNT_RANGES["num_nodes"])
    ppn = req.proc_per_node
    if isinstance(ppn, int):
        c.int_range("proc_per_node", ppn, *COUNT_RANGES["proc_per_node"])
    if runtime.policy == "mpi" and ppn == "auto":
        c.add("proc_per_node", "MPI runtimes need a number of slots per node", "give an integer >= 1")
    if runtime.policy == "xgboost" and ppn is not None:
        c.add(
            "proc_per_node", "XGBoost runtimes run one worker per GPU (or per node)", "remove proc_per_node"
        )


def _check_resources(c: _Checker, req: TrainJobRequest) -> None:
    res = req.resources
    if res is None:
        return
    if res.cpu is not None and not is_quantity(res.cpu):
        c.add("resources.cpu", f"{res.cpu!r} is not a quantity", "e.g. 2, 500m")
    if res.memory is not None and not is_quantity(res.memory):
        c.add("resources.memory", f"{res.memory!r} is not a quantity", "e.g. 4Gi, 512Mi")
    if not RESOURCE_NAME.match(res.gpu_resource):
        c.add("resources.gpu_resource", f"{res.gpu_resource!r} is not a resource name", "e.g. nvidia.com/gpu")
    for part in ("requests", "limits"):
        for name, value in (getattr(res, part) or {}).items():
            if not RESOURCE_NAME.match(name):
                c.add(f"resources.{part}.{name}", "is not a resource name")
            if not is_quantity(value):
                c.add(f"resources.{part}.{name}", f"{value!r} is not a quantity", "e.g. 2, 500m, 4Gi")


def _check_env(c: _Checker, req: TrainJobRequest, runtime: Runtime) -> None:
    reserved = runtime.reserved_env()
    total = len(req.env) + len(req.secret_env) + (1 if req.output_uri else 0)
    if req.output_uri and is_object_uri(req.output_uri):
        total += len(
            JOB_ENV
        )  # at most: the job's identity for the artifact manifest (manifest.JOB_FIELD_REFS)
    if total > MAX_LIST:
        c.add("env", f"{total} variables; the TrainJob allows at most {MAX_LIST}")
    for field, names in (("env", list(req.env)), ("secret_env", list(req.secret_env))):
        for name in names:
            if not ENV_NAME.match(name):
                c.add(
                    f"{field}.{name}",
                    "is not a valid environment variable name",
                    "use [A-Za-z_][A-Za-z0-9_]*",
                )
            if name in reserved:
                c.add(
                    f"{field}.{name}",
                    f"is set by the Trainer for {runtime.policy} runtimes",
                    "remove it; use num_nodes / proc_per_node instead",
                )
            if name == OUTPUT_ENV or name in JOB_ENV.values():
                c.add(f"{field}.{name}", "is set by trainflow from output_uri", "set output_uri instead")
    for name, value in req.env.items():
        if "\0" in value:
            c.add(f"env.{name}", "value contains a NUL character, which no environment variable can hold")
    for name in set(req.env) & set(req.secret_env):
        c.add(f"env.{name}", "is also in secret_env", "keep it in one of them")
    c.issues += credentials.check(req)
    for name, ref in req.secret_env.items():
        c.secret_ref(f"secret_env.{name}", ref)


def _check_initializers(c: _Checker, req: TrainJobRequest, runtime: Runtime, local: bool) -> None:
    c.issues += initializers.check(req, runtime, local=local)
    c.secret_name("dataset_secret", req.dataset_secret)
    c.secret_name("model_secret", req.model_secret)
    for kind in ("dataset", "model"):
        for name, ref in getattr(req, f"{kind}_secret_env").items():
            c.secret_ref(f"{kind}_secret_env.{name}", ref)
    if req.output_uri is not None:
        try:
            output_uri.check(req.output_uri)
        except output_uri.BadOutputURI as e:
            c.add("output_uri", e.problem, e.fix)


def _check_patches(c: _Checker, req: TrainJobRequest, runtime: Runtime) -> None:
    c.label_map("labels", req.labels, check_values=True)
    c.label_map("annotations", req.annotations, check_values=False)
    if sum(len(k) + len(v) for k, v in req.annotations.items()) > 256 * 1024:
        c.add("annotations", "total size exceeds 256 KiB")
    c.label_map("node_selector", req.node_selector, check_values=True)
    if len(req.tolerations) > MAX_LIST:
        c.add("tolerations", f"{len(req.tolerations)} items; at most {MAX_LIST}")
    for i, tol in enumerate(req.tolerations):
        unknown = set(tol) - TOLERATION_KEYS
        if unknown:
            c.add(f"tolerations[{i}]", f"unknown keys {sorted(unknown)}", f"use {sorted(TOLERATION_KEYS)}")
        if tol.get("operator", "Equal") not in TOLERATION_OPERATORS:
            c.add(f"tolerations[{i}].operator", f"{tol.get('operator')!r}", "use Exists or Equal")
        if tol.get("effect", "") not in TOLERATION_EFFECTS:
            c.add(
                f"tolerations[{i}].effect",
                f"{tol.get('effect')!r}",
                "use NoSchedule, PreferNoSchedule or NoExecute",
            )
    c.dns_subdomain("service_account", req.service_account)
    if len(req.volumes) > MAX_LIST:
        c.add("volumes", f"{len(req.volumes)} items; at most {MAX_LIST}")
    seen: set[str] = set()
    for i, vol in enumerate(req.volumes):
        c.dns_subdomain(f"volumes[{i}].claim_name", vol.claim_name)
        if not vol.mount_path.startswith("/"):
            c.add(f"volumes[{i}].mount_path", f"{vol.mount_path!r} is not absolute", "start it with /")
        vname = vol.name or f"pvc-{i}"
        if not DNS_LABEL.match(vname) or len(vname) > 63:
            c.add(f"volumes[{i}].name", f"{vname!r} is not a DNS label", "lowercase a-z, 0-9, '-'")
        if vname in seen:
            c.add(f"volumes[{i}].name", f"{vname!r} is used twice", "give each volume its own name")
        seen.add(vname)
    if len(req.image_pull_secrets) > 64:
        c.add("image_pull_secrets", "more than 64 items")
    for i, secret in enumerate(req.image_pull_secrets):
        c.dns_subdomain(f"image_pull_secrets[{i}]", secret)
        if secret in req.image_pull_secrets[:i]:
            c.add(f"image_pull_secrets[{i}]", f"{secret!r} is listed twice", "list each Secret once")
    for fname, kind in (("queue", "LocalQueue"), ("priority_class", "WorkloadPriorityClass")):
        value = getattr(req, fname)  # Kueue's webhook holds both labels to DNS-subdomain object names
        if value is not None and (len(value) > 63 or not DNS_SUBDOMAIN.match(value)):
            c.add(fname, f"{value[:80]!r} is not a valid {kind} name", "lowercase a-z, 0-9, '-', '.'; <= 63")
    c.int_range("max_queue_seconds", req.max_queue_seconds, *COUNT_RANGES["max_queue_seconds"])
    c.int_range("deadline_seconds", req.deadline_seconds, *COUNT_RANGES["deadline_seconds"])


def check_identity(c: _Checker, req: TrainJobRequest, runtime: Runtime) -> None:
    nodes = node_count(req.num_nodes, runtime)
    limit = max_name_length(runtime, max(nodes, 1))
    if req.name is not None:
        if not NAME_PATTERN.match(req.name):
            c.add(
                "name",
                f"{req.name[:80]!r} is not an RFC 1035 name",
                "lowercase a-z, 0-9 and '-', starting with a letter",
            )
        elif len(req.name) > limit:
            c.add(
                "name",
                f"{len(req.name)} characters; at most {limit} for runtime {runtime.name!r}",
                "shorten it (pod hostnames append the step name and indexes)",
            )
    if req.namespace is not None and (len(req.namespace) > 63 or not NAMESPACE.match(req.namespace)):
        c.add("namespace", f"{req.namespace[:80]!r} is not a valid namespace", "lowercase a-z, 0-9 and '-'")
    if req.idempotency_key is not None and not req.idempotency_key.strip():
        c.add("idempotency_key", "is empty", "omit it or give a stable text such as dag/run/task")
    if req.runtime_kind == "TrainingRuntime" and runtime.kind != "TrainingRuntime":
        c.add("runtime_kind", "does not match the runtime found", "use ClusterTrainingRuntime")


def validate_request(req: TrainJobRequest, runtime: Runtime, *, local: bool = False) -> None:
    """Raise InvalidRequest listing every problem; return quietly when the request is valid.

    ``local``: the job runs on the local engine, where ``file://`` dataset and model URIs are allowed.
    """
    c = _Checker()
    check_identity(c, req, runtime)
    _check_trainer(c, req, runtime)
    _check_resources(c, req)
    _check_env(c, req, runtime)
    _check_initializers(c, req, runtime, local)
    _check_patches(c, req, runtime)
    c.issues += patches.check(req.runtime_patches, runtime)
    if "runtimeRef" in req.spec_patch:
        c.add("spec_patch.runtimeRef", "names the runtime, which trainflow sets", "use the runtime field")
    if c.issues:
        raise InvalidRequest(c.issues)


IMMUTABLE_FIELDS = ("runtimeRef", "trainer", "initializer", "activeDeadlineSeconds", "managedBy")


def immutable_differences(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """Spec fields the Trainer forbids changing that differ between an existing TrainJob and a new one."""
    old, new = existing.get("spec") or {}, wanted.get("spec") or {}
    out = []
    for field in IMMUTABLE_FIELDS:
        a, b = old.get(field), new.get(field)
        if field == "runtimeRef" and a and b:
            a = {**{"apiGroup": GROUP, "kind": "ClusterTrainingRuntime"}, **a}
            b = {**{"apiGroup": GROUP, "kind": "ClusterTrainingRuntime"}, **b}
        if field == "managedBy":
            continue
        if (a or None) != (b or None):
            out.append(f"spec.{field}")
    return out
