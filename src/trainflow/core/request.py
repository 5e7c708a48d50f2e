"""TrainJobRequest: what a pipeline step passes to run one TrainJob, validated at the edge."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    field_validator,
    model_validator,
)

RuntimeKind = Literal["ClusterTrainingRuntime", "TrainingRuntime"]

# Whole-number fields and the values a TrainJob allows: the model reads any whole number (``"+2"``, ``2.0``),
# validation refuses what is out of range, and adapters check the same ranges before a run (Airflow at DAG parse).
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
COUNT_RANGES: dict[str, tuple[int, int]] = {
    "num_nodes": (1, INT32_MAX),
    "proc_per_node": (1, INT32_MAX),
    "max_queue_seconds": (1, INT64_MAX),
    "deadline_seconds": (1, INT64_MAX),
}

_SECRET_REF = re.compile(r"^(?P<name>[^/\s]+)/(?P<key>[^/\s]+)$")


class SecretKeyRef(BaseModel):
    """A key in a Kubernetes Secret; the value never leaves the cluster."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Secret name (same namespace as the TrainJob)")
    key: str = Field(min_length=1, description="Key inside the Secret")


class Resources(BaseModel):
    """Per-node resources: shorthand cpu/memory/gpu, or raw ResourceRequirements (requests/limits)."""

    model_config = ConfigDict(extra="forbid")

    cpu: str | int | float | None = None
    memory: str | None = None
    gpu: int | None = Field(default=None, ge=0)
    gpu_resource: str = "nvidia.com/gpu"
    requests: dict[str, str | int | float] | None = None
    limits: dict[str, str | int | float] | None = None
    claims: list[dict[str, Any]] | None = None

    def requirements(self) -> dict[str, Any] | None:
        """The ``resourcesPerNode`` ResourceRequirements: shorthand cpu/memory/gpu set requests and limits."""
        requests = {k: str(v) for k, v in (self.requests or {}).items()}
        limits = {k: str(v) for k, v in (self.limits or {}).items()}
        shorthand: dict[str, str] = {}
        if self.cpu is not None:
            shorthand["cpu"] = str(self.cpu)
        if self.memory is not None:
            shorthand["memory"] = self.memory
        if self.gpu:
            shorthand[self.gpu_resource] = str(self.gpu)
        for key, value in shorthand.items():
            requests.setdefault(key, value)
            limits.setdefault(key, value)
        out: dict[str, Any] = {}
        if requests:
            out["requests"] = requests
        if limits:
            out["limits"] = limits
        if self.claims:
            out["claims"] = [dict(c) for c in self.claims]
        return out or None


class PvcVolume(BaseModel):
    """A PersistentVolumeClaim mounted into every trainer node."""

    model_config = ConfigDict(extra="forbid")

    claim_name: str = Field(min_length=1)
    mount_path: str = Field(min_length=1)
    name: str | None = None
    read_only: bool = False
    sub_path: str | None = None


InitializerOption = str | int | list[str]
_INITIALIZER_KEYS = "ACCESS_TOKEN (hf); ACCESS_KEY_ID, SECRET_ACCESS_KEY, ENDPOINT, REGION, ROLE_ARN (s3)"


def _initializer_options(step: str) -> Any:
    return Field(
        default_factory=dict,
        description=f"Settings of the {step} initializer, named as in the Kubeflow SDK: "
        "ignore_patterns (hf, s3), endpoint, region, role_arn (s3)",
    )


def _initializer_secret_env(step: str) -> Any:
    return Field(
        default_factory=dict,
        description=f"Credentials of the {step} initializer from Secret keys: NAME -> 'secret/key', "
        "NAME one of access_token (hf), access_key_id, secret_access_key, endpoint, region, role_arn (s3)",
    )


def _parse_secret(value: Any) -> Any:
    if isinstance(value, str):
        match = _SECRET_REF.match(value)
        if not match:
            # never echo the value: a secret value passed where the reference belongs would leak
            raise ValueError(
                "is not 'secret-name/key' (value not shown, it may be the secret itself); "
                "give 'secret-name/key' or {'name': ..., 'key': ...}"
            )
        return {"name": match["name"], "key": match["key"]}
    return value


class TrainJobRequest(BaseModel):
    """Everything a pipeline step may say about one TrainJob.

    Trainer is either a container (``image``/``command``/``args``) or a Python ``function``
    (a callable or ``"module:function"``) called with JSON-encoded ``function_kwargs``.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, validate_default=True)

    runtime: str = Field(
        default="torch-distributed", min_length=1, description="Training runtime that backs the TrainJob"
    )
    runtime_kind: RuntimeKind = Field(
        default="ClusterTrainingRuntime",
        description="ClusterTrainingRuntime, or a namespaced TrainingRuntime",
    )
    name: str | None = Field(
        default=None, description="TrainJob name (default: derived from idempotency_key)"
    )
    idempotency_key: str | None = Field(
        default=None, description="Stable identity: the same key reattaches to (or reuses) the same TrainJob"
    )
    namespace: str | None = Field(default=None, description="Namespace (default: the backend's)")

    image: str | None = Field(default=None, description="Trainer image (default: the runtime's)")
    command: list[str] | None = Field(default=None, description="Trainer command (argv)")
    args: list[str] | None = Field(default=None, description="Trainer arguments (argv)")
    function: str | Callable[..., Any] | None = Field(
        default=None, description="Python function run as the trainer: a callable or 'module:function'"
    )
    function_kwargs: dict[str, JsonValue] = Field(
        default_factory=dict, description="JSON keyword arguments of the function trainer"
    )
    packages_to_install: list[str] = Field(
        default_factory=list,
        description="pip requirements installed on each node before the function runs (as the Kubeflow SDK)",
    )
    pip_index_urls: list[str] = Field(
        default_factory=list,
        description="Package indexes for packages_to_install: the first is --index-url, the others "
        "--extra-index-url (default: the image's pip configuration)",
    )

    num_nodes: int | None = Field(default=None, description="Number of training nodes (pods)")
    proc_per_node: int | Literal["auto"] | None = Field(
        default=None, description="Processes per node (torch: numProcPerNode), or 'auto'"
    )
    resources: Resources | None = Field(
        default=None, description="Per-node resources: cpu/memory/gpu shorthand, or requests/limits"
    )

    env: dict[str, str] = Field(
        default_factory=dict, description="Plain environment variables of the trainer"
    )
    secret_env: dict[str, Annotated[SecretKeyRef, BeforeValidator(_parse_secret)]] = Field(
        default_factory=dict,
        description="Environment variables from Kubernetes Secrets: NAME -> 'secret/key'",
    )
    allow_plain_credentials: bool = Field(
        default=False, description="Allow credential-looking names in plain env (not recommended)"
    )

    dataset_uri: str | None = Field(
        default=None, description="Dataset for the dataset initializer (hf://, s3://, cache://)"
    )
    dataset_secret: str | None = Field(
        default=None,
        description=f"Secret whose keys become the dataset initializer's env: {_INITIALIZER_KEYS}",
    )
    dataset_options: dict[str, InitializerOption] = _initializer_options("dataset")
    dataset_secret_env: dict[str, Annotated[SecretKeyRef, BeforeValidator(_parse_secret)]] = (
        _initializer_secret_env("dataset")
    )
    model_uri: str | None = Field(default=None, description="Model for the model initializer (hf://, s3://)")
    model_secret: str | None = Field(
        default=None, description=f"Secret whose keys become the model initializer's env: {_INITIALIZER_KEYS}"
    )
    model_options: dict[str, InitializerOption] = _initializer_options("model")
    model_secret_env: dict[str, Annotated[SecretKeyRef, BeforeValidator(_parse_secret)]] = (
        _initializer_secret_env("model")
    )
    output_uri: str | None = Field(
        default=None,
        description="Where the trainer writes its model (TRAINFLOW_OUTPUT_URI); reported in the result",
    )

    labels: dict[str, str] = Field(default_factory=dict, description="Labels of the TrainJob and its pods")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations of the TrainJob")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node selector of the trainer pods"
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, description="Tolerations of the trainer pods"
    )
    service_account: str | None = Field(default=None, description="Service account of the trainer pods")
    volumes: list[PvcVolume] = Field(
        default_factory=list, description="PersistentVolumeClaims mounted into every node"
    )
    image_pull_secrets: list[str] = Field(default_factory=list, description="Image pull secrets of the pods")
    runtime_patches: list[dict[str, Any]] = Field(
        default_factory=list, description="Raw spec.runtimePatches entries (TrainJob API)"
    )
    spec_patch: dict[str, Any] = Field(
        default_factory=dict,
        description="A JSON merge patch (RFC 7386) of the TrainJob spec trainflow renders, for a field it has no "
        "parameter for (one a newer Trainer added); checked against the schema the cluster serves",
    )

    queue: str | None = Field(default=None, description="Kueue LocalQueue (label kueue.x-k8s.io/queue-name)")
    priority_class: str | None = Field(
        default=None, description="Kueue WorkloadPriorityClass (label kueue.x-k8s.io/priority-class)"
    )
    suspend: bool = Field(default=False, description="Create the TrainJob suspended")
    max_queue_seconds: int | None = Field(
        default=None,
        description="Queue budget: how long the job may wait for admission each time it is queued (when "
        "submitted, after a preemption); past it the wait fails and the step's finish action applies",
    )
    deadline_seconds: int | None = Field(
        default=None,
        description="Run budget: how long the job may run once admitted, counted from its latest start "
        "(spec.activeDeadlineSeconds; the Trainer fails it with DeadlineExceeded)",
    )

    @field_validator("env", mode="before")
    @classmethod
    def _env_values_as_text(cls, value: Any) -> Any:
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            for key, item in value.items():
                if isinstance(item, bool):
                    out[key] = "true" if item else "false"
                elif isinstance(item, int | float):
                    out[key] = str(item)
                else:
                    out[key] = item
            return out
        return value

    @field_validator("command", "args", mode="before")
    @classmethod
    def _argv_not_shell_string(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("must be a list of arguments (argv), not one shell string")
        return value

    @model_validator(mode="after")
    def _one_trainer_kind(self) -> TrainJobRequest:
        if self.function is not None and self.command:
            raise ValueError("give either 'function' or 'command', not both")
        if self.function_kwargs and self.function is None:
            raise ValueError("'function_kwargs' needs 'function'")
        return self

    @property
    def function_ref(self) -> str | None:
        """The function as ``module:qualname`` text, whatever form it was given in."""
        fn = self.function
        if fn is None or isinstance(fn, str):
            return fn
        return f"{fn.__module__}:{fn.__qualname__}"

    def resolve_function(self) -> Callable[..., Any] | None:
        fn = self.function
        if fn is None or callable(fn):
            return fn
        module, _, attr = fn.partition(":")
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        if not callable(obj):
            raise TypeError(f"{fn} is not callable")
        return obj  # type: ignore[no-any-return]
