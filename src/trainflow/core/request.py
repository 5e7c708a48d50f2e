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

    runtime: str = Field(default="torch-distributed", min_length=1)
    runtime_kind: RuntimeKind = "ClusterTrainingRuntime"
    name: str | None = None
    idempotency_key: str | None = None
    namespace: str | None = None

    image: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    function: str | Callable[..., Any] | None = None
    function_kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    packages_to_install: list[str] = Field(
        default_factory=list,
        description="pip requirements installed on each node before the function runs (as the Kubeflow SDK)",
    )
    pip_index_urls: list[str] = Field(
        default_factory=list,
        description="package indexes for packages_to_install: the first is --index-url, the rest "
        "--extra-index-url; empty: the image's pip configuration",
    )

    num_nodes: int | None = None
    proc_per_node: int | Literal["auto"] | None = None
    resources: Resources | None = None

    env: dict[str, str] = Field(default_factory=dict)
    secret_env: dict[str, Annotated[SecretKeyRef, BeforeValidator(_parse_secret)]] = Field(
        default_factory=dict
    )
    allow_plain_credentials: bool = False

    dataset_uri: str | None = None
    dataset_secret: str | None = Field(
        default=None,
        description="Secret whose keys become the dataset initializer's env: ACCESS_TOKEN (hf); "
        "ACCESS_KEY_ID, SECRET_ACCESS_KEY, ENDPOINT, REGION, ROLE_ARN (s3)",
    )
    dataset_options: dict[str, InitializerOption] = Field(
        default_factory=dict,
        description="dataset initializer settings, as the Kubeflow SDK names them: ignore_patterns (hf, s3); "
        "endpoint, region, role_arn (s3)",
    )
    dataset_secret_env: dict[str, Annotated[SecretKeyRef, BeforeValidator(_parse_secret)]] = Field(
        default_factory=dict,
        description="dataset initializer credentials from Secret keys ('secret-name/key'): access_token (hf); "
        "access_key_id, secret_access_key, endpoint, region, role_arn (s3)",
    )
    model_uri: str | None = None
    model_secret: str | None = Field(
        default=None,
        description="Secret whose keys become the model initializer's env: ACCESS_TOKEN (hf); "
        "ACCESS_KEY_ID, SECRET_ACCESS_KEY, ENDPOINT, REGION, ROLE_ARN (s3)",
    )
    model_options: dict[str, InitializerOption] = Field(
        default_factory=dict,
        description="model initializer settings: ignore_patterns (hf, s3; default as the Kubeflow SDK); "
        "endpoint, region, role_arn (s3)",
    )
    model_secret_env: dict[str, Annotated[SecretKeyRef, BeforeValidator(_parse_secret)]] = Field(
        default_factory=dict,
        description="model initializer credentials from Secret keys ('secret-name/key'): access_token (hf); "
        "access_key_id, secret_access_key, endpoint, region, role_arn (s3)",
    )
    output_uri: str | None = None

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    service_account: str | None = None
    volumes: list[PvcVolume] = Field(default_factory=list)
    image_pull_secrets: list[str] = Field(default_factory=list)
    runtime_patches: list[dict[str, Any]] = Field(default_factory=list)

    queue: str | None = None
    suspend: bool = False
    deadline_seconds: int | None = None

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
