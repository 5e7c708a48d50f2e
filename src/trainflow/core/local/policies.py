"""ML policies on one machine: turn a TrainJob manifest plus its runtime into a launch plan, and give each
local "node" the environment the Trainer would inject into its pod.

torch: ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``
(torchrun reads them; static rendezvous on loopback). JAX: ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``,
``JAX_COORDINATOR_ADDRESS``. XGBoost: ``DMLC_TRACKER_URI``, ``DMLC_TRACKER_PORT``, ``DMLC_TASK_ID``,
``DMLC_NUM_WORKER``. MPI: one launcher running the trainer command (``mpirun``) with a local hostfile.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from trainflow.core.artifact import JOB_ENV
from trainflow.core.errors import FieldIssue, InvalidRequest
from trainflow.core.local import limits
from trainflow.core.quantity import quantity_value
from trainflow.core.reporting import OUTPUT_ENV, STAGING_ENV
from trainflow.core.storage import is_object_uri

if TYPE_CHECKING:
    from trainflow.core.runtimes import Runtime

NODE_RANK_ENV = "TRAINFLOW_NODE_RANK"
WORKSPACE_ENV = "TRAINFLOW_WORKSPACE"
STAGING_DIR = "output-staging"
INITIALIZER_ENV = {"dataset": "TRAINFLOW_DATASET_DIR", "model": "TRAINFLOW_MODEL_DIR"}
CLUSTER_HOSTFILE = "/etc/mpi/hostfile"
LOOPBACK = "127.0.0.1"
SUPPORTED_POLICIES = (None, "torch", "jax", "xgboost", "mpi")
# Variables of the caller's environment that must not leak into a job (they belong to another job/pod).
STRIPPED_ENV_PREFIXES = ("TRAINFLOW_LOCAL_", "KUBEFLOW_TRAINER_SERVER_", STAGING_ENV)
# Open MPI's own opt-in to running mpirun as root (both must be set).
ROOT_SWITCHES = frozenset({"OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"})


def output_env(plan: dict[str, Any], index: int, identity: dict[str, str]) -> dict[str, str]:
    """Node ``index``'s output variables: the output URI; for an object store, a staging directory of its own
    in the job dir (published after the job), for a local output URI the job's one staging directory (published
    by the supervisor when the job completes); the job identity a published manifest names (one launch's nodes
    share it)."""
    env = {OUTPUT_ENV: plan["output_uri"]}
    if is_object_uri(plan["output_uri"]):
        staged = Path(plan["output_dir"])
        env[STAGING_ENV] = str(staged / f"node-{index}" if int(plan.get("launched_nodes", 1)) > 1 else staged)
    elif plan.get("output_target"):  # one directory for every node, as a shared volume is on a cluster
        env[STAGING_ENV] = plan["output_dir"]
    env.update({JOB_ENV[key]: value for key, value in identity.items()})
    return env


def local_path(uri: str) -> Path | None:
    """The local directory behind ``file:///abs`` or ``/abs``; None for any other scheme."""
    if uri.startswith("/"):
        return Path(uri)
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost") and parsed.path.startswith("/"):
        return Path(unquote(parsed.path))
    return None


def _quantity_count(value: Any) -> int:
    """GPUs or CPUs of a quantity, rounded up (500m of CPU is one process); 0 when none or not a quantity."""
    return max(quantity_value(value), 0)


def _gpu_count(resources: dict[str, Any]) -> int:
    for part in ("limits", "requests"):
        for name, value in (resources.get(part) or {}).items():
            if "gpu" in name.lower():
                return _quantity_count(value)
    return 0


def _cpu_count(resources: dict[str, Any]) -> int:
    for part in ("limits", "requests"):
        value = (resources.get(part) or {}).get("cpu")
        if value is not None:
            return _quantity_count(value)
    return 0


def _merged_resources(trainer: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    base = container.get("resources") or {}
    own = trainer.get("resourcesPerNode") or {}
    return {part: {**(base.get(part) or {}), **(own.get(part) or {})} for part in ("limits", "requests")}


def _env_entries(trainer: dict[str, Any], container: dict[str, Any], home: Path) -> list[dict[str, Any]]:
    """Runtime container env, then trainer env (same name wins), as plan entries; secrets stay references."""
    merged: dict[str, dict[str, Any]] = {}
    issues: list[FieldIssue] = []
    for source, field in ((container.get("env") or [], "runtime env"), (trainer.get("env") or [], "env")):
        for item in source:
            name = str(item.get("name"))
            value_from = item.get("valueFrom")
            if name in JOB_ENV.values():
                continue  # the job's identity: the supervisor sets it from the job itself
            if value_from is None:
                merged[name] = {"name": name, "value": str(item.get("value", ""))}
                continue
            ref = value_from.get("secretKeyRef") if isinstance(value_from, dict) else None
            if not ref:
                issues.append(
                    FieldIssue(
                        f"{field}.{name}", "valueFrom other than secretKeyRef is not available locally"
                    )
                )
                continue
            path = home / "secrets" / str(ref.get("name")) / str(ref.get("key"))
            if not path.is_file():
                issues.append(
                    FieldIssue(
                        f"secret_env.{name}",
                        f"secret {ref.get('name')}/{ref.get('key')} is not available locally: {path} does not exist",
                        f"create the file {path} holding the value (like a mounted Secret; chmod 600)",
                    )
                )
                continue
            merged[name] = {"name": name, "secret": {"name": ref.get("name"), "key": ref.get("key")}}
    if issues:
        raise InvalidRequest(issues)
    return list(merged.values())


def _initializers(manifest: dict[str, Any], runtime: Runtime, jobdir: Path) -> list[dict[str, str]]:
    spec_init = (manifest.get("spec") or {}).get("initializer") or {}
    out: list[dict[str, str]] = []
    issues: list[FieldIssue] = []
    for key, present in (
        ("dataset", runtime.has_dataset_initializer),
        ("model", runtime.has_model_initializer),
    ):
        uri = (spec_init.get(key) or {}).get("storageUri")
        if not uri and present:
            step = runtime.ancestor_job(f"{key}-initializer") or {}
            pod = (((step.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            for container in pod.get("containers") or []:
                for env in container.get("env") or []:
                    if env.get("name") == "STORAGE_URI":
                        uri = env.get("value")
        if not uri:
            continue
        path = local_path(uri) if str(uri).startswith("file://") else None
        if path is None:
            issues.append(
                FieldIssue(
                    f"{key}_uri",
                    f"{uri!r} needs the cluster's {key}-initializer; the local engine only reads file:// URIs",
                    f"download it first (s3://: trainflow.core.download(uri, path)) and pass "
                    f"{key}_uri='file:///path', or use the kubernetes backend",
                )
            )
            continue
        if not path.exists():
            issues.append(
                FieldIssue(
                    f"{key}_uri", f"{path} does not exist", "point it at an existing file or directory"
                )
            )
            continue
        target = jobdir / "workspace" / key
        out.append(
            {
                "step": f"{key}-initializer",
                "source": str(path),
                "target": str(target),
                "env": INITIALIZER_ENV[key],
            }
        )
    if issues:
        raise InvalidRequest(issues)
    return out


def output_for(manifest: dict[str, Any], jobdir: Path) -> tuple[Path, str, Path | None]:
    """Where the trainer writes, the output URI, and the local directory a completed job publishes to: for
    ``s3://`` and for ``output_uri`` naming a local path (file:// or absolute), the job's staging directory
    (``publish_output()`` uploads the first; the supervisor publishes the second when every node succeeded);
    without ``output_uri``, ``<jobdir>/output`` itself, private to the job."""
    for item in ((manifest.get("spec") or {}).get("trainer") or {}).get("env") or []:
        if item.get("name") == OUTPUT_ENV and "value" in item:
            uri = str(item["value"])
            if is_object_uri(uri):
                return jobdir / STAGING_DIR, uri, None
            path = local_path(uri)
            if path is None:
                raise InvalidRequest.one(
                    "output_uri",
                    f"{uri[:80]!r} cannot be written by the local engine",
                    "use s3://, file:///path or an absolute path locally, or run on the kubernetes backend",
                )
            return jobdir / STAGING_DIR, path.as_uri(), path
    return jobdir / "output", (jobdir / "output").as_uri(), None


def make_plan(
    manifest: dict[str, Any], runtime: Runtime, *, home: Path, jobdir: Path, cwd: str | None = None
) -> dict[str, Any]:
    """What the supervisor will launch for this manifest; raises InvalidRequest when it cannot run here.

    The plan holds the argv, plain env values and secret *references* (never values), node counts and
    policy, so the job can be relaunched (resume) without the submitting process.
    """
    spec = manifest.get("spec") or {}
    trainer = spec.get("trainer") or {}
    container = runtime.trainer_container()
    policy = runtime.policy
    if policy not in SUPPORTED_POLICIES:
        raise InvalidRequest.one(
            "runtime",
            f"{runtime.name!r} uses the {policy} ML policy, which the local engine cannot run",
            "use the kubernetes backend",
        )
    if (
        runtime.is_torchtune
    ):  # the Trainer's TorchTune mode (recipe, config, rendezvous) exists only in a cluster
        raise InvalidRequest.one(
            "runtime",
            f"{runtime.name!r} is a TorchTune runtime: it runs only on a cluster (the Trainer's TorchTune mode)",
            "use the kubernetes backend",
        )
    command = list(trainer.get("command") or container.get("command") or [])
    args = list(trainer["args"]) if "args" in trainer else list(container.get("args") or [])
    if not command:
        raise InvalidRequest.one(
            "command",
            f"neither the request nor runtime {runtime.name!r} gives a command, and images are "
            "not run locally (the image entrypoint is unknown)",
            "give 'command' (argv) or 'function'",
        )
    argv = command + args
    from trainflow.core.runtimes import node_count  # the caller holds a Runtime: loaded already

    num_nodes = node_count(trainer.get("numNodes"), runtime)
    if num_nodes < 1:
        raise InvalidRequest.one("num_nodes", f"{num_nodes} nodes", "use 1 or more")
    env = [e for e in _env_entries(trainer, container, home) if e["name"] != OUTPUT_ENV]
    limits.check(argv, len(command), env, home / "secrets", num_nodes)
    resources = _merged_resources(trainer, container)
    nproc: int = 1
    step = runtime.trainer_job_name
    if policy == "torch":
        configured = trainer.get("numProcPerNode") or (runtime.ml_policy.get("torch") or {}).get(
            "numProcPerNode"
        )
        if isinstance(configured, int) and configured > 0:
            nproc = configured
        else:  # auto: GPUs per node, else the CPU count from resources, min 1
            nproc = _gpu_count(resources) or _cpu_count(resources) or 1
    elif policy == "mpi":
        configured = trainer.get("numProcPerNode") or (runtime.ml_policy.get("mpi") or {}).get(
            "numProcPerNode"
        )
        nproc = int(configured or 1)
        _check_mpirun(argv, runtime.name, {e["name"] for e in env if "value" in e})
        argv = [str(jobdir / "hostfile") if a == CLUSTER_HOSTFILE else a for a in argv]
    elif policy == "xgboost":
        nproc = _gpu_count(resources) or 1
    out_dir, out_uri, out_target = output_for(manifest, jobdir)
    workdir = container.get("workingDir")
    return {
        "version": 1,
        "log_max_bytes": limits.log_cap(),
        "runtime": runtime.name,
        "policy": policy,
        "step": step,
        "num_nodes": num_nodes,
        "launched_nodes": 1 if policy == "mpi" else num_nodes,
        "nproc_per_node": nproc,
        "argv": argv,
        "env": env,
        "cwd": workdir if workdir and os.path.isdir(workdir) else (cwd or os.getcwd()),
        "output_dir": str(out_dir),
        "output_uri": out_uri,
        "output_target": str(out_target) if out_target else None,
        "initializers": _initializers(manifest, runtime, jobdir),
        "deadline_seconds": spec.get("activeDeadlineSeconds"),
        "secrets_dir": str(home / "secrets"),
    }


def _check_mpirun(argv: list[str], runtime: str, env_names: set[str]) -> None:
    """mpirun must be installed; Open MPI's refuses to start as root unless its own two switches are set."""
    if argv[0] != "mpirun":
        return
    search = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    mpirun = shutil.which("mpirun", path=search)
    if mpirun is None:
        raise InvalidRequest.one(
            "runtime",
            f"runtime {runtime!r} launches with mpirun (MPI policy), and mpirun is not installed here",
            "install Open MPI so that mpirun is on PATH, or use the kubernetes backend",
        )
    allowed = (env_names | set(os.environ)) >= ROOT_SWITCHES
    if os.geteuid() == 0 and not allowed and _is_open_mpi(mpirun):
        raise InvalidRequest.one(
            "runtime",
            f"runtime {runtime!r} launches with Open MPI's mpirun, which refuses to run as root",
            "run as a regular user, or set env OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
        )


def _is_open_mpi(mpirun: str) -> bool:
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Open MPI" in out


def free_port() -> int:
    """A free loopback TCP port (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def policy_env(plan: dict[str, Any], index: int, port: int) -> dict[str, str]:
    """The env the Trainer injects into node ``index`` of this policy, pointed at loopback."""
    policy = plan.get("policy")
    nodes = int(plan["num_nodes"])
    nproc = int(plan.get("nproc_per_node") or 1)
    if policy == "torch":
        return {
            "PET_NNODES": str(nodes),
            "PET_NPROC_PER_NODE": str(nproc),
            "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": LOOPBACK,
            "PET_MASTER_PORT": str(port),
        }
    if policy == "jax":
        return {
            "JAX_NUM_PROCESSES": str(nodes),
            "JAX_PROCESS_ID": str(index),
            "JAX_COORDINATOR_ADDRESS": f"{LOOPBACK}:{port}",
        }
    if policy == "xgboost":
        return {
            "DMLC_TRACKER_URI": LOOPBACK,
            "DMLC_TRACKER_PORT": str(port),
            "DMLC_TASK_ID": str(index),
            "DMLC_NUM_WORKER": str(nodes * nproc),
        }
    return {}


def base_env(environ: dict[str, str]) -> dict[str, str]:
    """The caller's environment minus another job's markers, with this interpreter's bin dir first on PATH."""
    env = {k: v for k, v in environ.items() if not k.startswith(STRIPPED_ENV_PREFIXES)}
    bindir = os.path.dirname(sys.executable)
    path = env.get("PATH", os.defpath)
    env["PATH"] = bindir + os.pathsep + path if path else bindir
    return env
