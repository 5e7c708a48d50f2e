"""Training runtimes: what a TrainJob runs on, read from the cluster or the shipped local catalog."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from trainflow.core.errors import RuntimeNotFound
from trainflow.core.naming import GROUP, TRAINER_CONTAINER
from trainflow.core.schema import SAFE_LOADER

FRAMEWORK_LABEL = f"{GROUP}/framework"
SUPPORT_LABEL = f"{GROUP}/support"
ANCESTOR_LABEL = f"{GROUP}/trainjob-ancestor-step"

# Env names the Trainer sets itself and refuses in spec.trainer.env, by ML policy: exact names, as in
# Trainer v2.3.0's TorchRunReservedEnvNames, MPIReservedEnvNames and XGBoostReservedEnvNames. Other
# OMPI_MCA_* / DMLC_* settings (OMPI_MCA_btl_tcp_if_include, DMLC_WORKER_CONNECT_RETRY) are the user's.
# JAX: the webhook refuses none, but the controller overwrites these three, so a user value would be lost.
RESERVED_ENV: dict[str, frozenset[str]] = {
    "torch": frozenset(
        {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
    ),
    "xgboost": frozenset({"DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER"}),
    "mpi": frozenset(
        {
            "OMPI_MCA_orte_default_hostfile",
            "OMPI_MCA_plm_rsh_args",
            "OMPI_MCA_orte_keep_fqdn_hostnames",
            "OMPI_MCA_orte_set_default_slots",
        }
    ),
    "jax": frozenset({"JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_COORDINATOR_ADDRESS"}),
}


class Runtime(BaseModel):
    """A ClusterTrainingRuntime or TrainingRuntime, reduced to what trainflow checks and uses."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    kind: str = "ClusterTrainingRuntime"
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    ml_policy: dict[str, Any] = Field(default_factory=dict)
    template: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Runtime:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        return cls(
            name=str(meta.get("name", "")),
            kind=str(obj.get("kind", "ClusterTrainingRuntime")),
            namespace=meta.get("namespace"),
            labels=dict(meta.get("labels") or {}),
            ml_policy=dict(spec.get("mlPolicy") or {}),
            template=dict(spec.get("template") or {}),
        )

    @property
    def framework(self) -> str | None:
        return self.labels.get(FRAMEWORK_LABEL)

    @property
    def deprecated(self) -> bool:
        return self.labels.get(SUPPORT_LABEL) == "deprecated"

    @property
    def policy(self) -> str | None:
        """The ML policy source: torch, mpi, jax, xgboost, flux, or None (plain)."""
        for key in ("torch", "mpi", "jax", "xgboost", "flux"):
            if key in self.ml_policy:
                return key
        return None

    @property
    def default_num_nodes(self) -> int:
        """The nodes of a TrainJob that sets no ``numNodes``: the Trainer's rule (runtime/core/trainingruntime.go):
        ``mlPolicy.numNodes`` (1 when the policy omits it); a runtime without an ML policy keeps its trainer
        job's ``parallelism`` (1 when unset)."""
        if self.ml_policy:
            value = self.ml_policy.get("numNodes")
            return 1 if value is None else int(value)
        job = self.ancestor_job("trainer") or {}
        parallelism = ((job.get("template") or {}).get("spec") or {}).get("parallelism")
        return 1 if parallelism is None else int(parallelism)

    @property
    def replicated_jobs(self) -> list[dict[str, Any]]:
        spec = self.template.get("spec") or {}
        return [rj for rj in spec.get("replicatedJobs") or [] if isinstance(rj, dict)]

    @property
    def replicated_job_names(self) -> list[str]:
        return [str(rj.get("name")) for rj in self.replicated_jobs]

    def ancestor_job(self, step: str) -> dict[str, Any] | None:
        for rj in self.replicated_jobs:
            labels = ((rj.get("template") or {}).get("metadata") or {}).get("labels") or {}
            if labels.get(ANCESTOR_LABEL) == step:
                return rj
        return None

    @property
    def trainer_job_name(self) -> str:
        """The replicated job whose ``node`` container the TrainJob's trainer overrides."""
        job = self.ancestor_job("trainer")
        return str(job["name"]) if job else "node"

    @property
    def rank0_job_name(self) -> str:
        """Where rank 0's log lives: ``launcher`` for MPI runtimes, else ``node``."""
        return self.trainer_job_name

    def containers(self, job_name: str) -> list[dict[str, Any]]:
        for rj in self.replicated_jobs:
            if rj.get("name") == job_name:
                pod = (((rj.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
                return [c for c in pod.get("containers") or [] if isinstance(c, dict)]
        return []

    def container_names(self, job_name: str) -> list[str]:
        return [str(c.get("name")) for c in self.containers(job_name)]

    def trainer_container(self) -> dict[str, Any]:
        for container in self.containers(self.trainer_job_name):
            if container.get("name") == TRAINER_CONTAINER:
                return container
        return {}

    @property
    def has_dataset_initializer(self) -> bool:
        return self.ancestor_job("dataset-initializer") is not None

    @property
    def has_model_initializer(self) -> bool:
        return self.ancestor_job("model-initializer") is not None

    @property
    def is_torchtune(self) -> bool:
        """TorchTune runtimes: the trainer command is ``tune run ...`` and args are recipe overrides."""
        command = self.trainer_container().get("command") or []
        return self.framework == "torchtune" or list(command[:2]) == ["tune", "run"]

    def reserved_env(self) -> frozenset[str]:
        """Env names the Trainer sets for this runtime's ML policy (refused in the request's env)."""
        return RESERVED_ENV.get(self.policy or "", frozenset())

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "framework": self.framework,
            "policy": self.policy,
            "num_nodes": self.default_num_nodes,
            "jobs": self.replicated_job_names,
            "deprecated": self.deprecated,
        }


def _load_yaml_documents(text: str) -> Iterable[dict[str, Any]]:
    for doc in yaml.load_all(text, Loader=SAFE_LOADER):
        if isinstance(doc, dict):
            yield doc


def node_count(num_nodes: int | None, runtime: Runtime | None) -> int:
    """How many nodes a TrainJob runs: its ``numNodes`` when set, else its runtime's default (the one rule every
    check, name length, local run and log selection follows)."""
    if num_nodes is not None:
        return int(num_nodes)
    return runtime.default_num_nodes if runtime is not None else 1


@cache
def local_catalog() -> tuple[Runtime, ...]:
    """The default ClusterTrainingRuntimes of Trainer v2.3.0, shipped as package data."""
    folder = resources.files("trainflow.core") / "data" / "runtimes"
    out: list[Runtime] = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            for doc in _load_yaml_documents(entry.read_text(encoding="utf-8")):
                if doc.get("kind") in ("ClusterTrainingRuntime", "TrainingRuntime"):
                    out.append(Runtime.from_object(doc))
    return tuple(out)


def find_runtime(runtimes: Iterable[Runtime], name: str, kind: str = "ClusterTrainingRuntime") -> Runtime:
    """Pick one runtime by name and kind, or raise RuntimeNotFound listing what exists."""
    pool = list(runtimes)
    for runtime in pool:
        if runtime.name == name and runtime.kind == kind:
            return runtime
    raise RuntimeNotFound(name, kind, [r.name for r in pool if r.kind == kind])
