"""Launch plans and env contracts of the local engine, per ML policy (no processes started here)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from trainflow.core import InvalidRequest, build_trainjob, local_catalog
from trainflow.core.local import policies
from trainflow.core.runtimes import Runtime, find_runtime


def runtime(name: str) -> Runtime:
    return find_runtime(local_catalog(), name)


def plan_for(request: dict[str, Any], tmp_path: Path, rt: str = "torch-distributed") -> dict[str, Any]:
    r = runtime(request.get("runtime", rt))
    manifest = build_trainjob(request, r, namespace="ns")
    return policies.make_plan(manifest, r, home=tmp_path / "home", jobdir=tmp_path / "job", cwd="/somewhere")


def test_torch_plan_runs_the_manifest_command(tmp_path: Path) -> None:
    plan = plan_for(
        {"command": ["torchrun", "t.py"], "args": ["--lr", "1"], "num_nodes": 3, "proc_per_node": 2}, tmp_path
    )
    assert plan["argv"] == ["torchrun", "t.py", "--lr", "1"]
    assert (plan["num_nodes"], plan["launched_nodes"], plan["nproc_per_node"]) == (3, 3, 2)
    assert plan["output_dir"] == str(tmp_path / "job" / "output") and plan["cwd"] == "/somewhere"
    env = policies.policy_env(plan, 2, 4242)
    assert env == {
        "PET_NNODES": "3",
        "PET_NPROC_PER_NODE": "2",
        "PET_NODE_RANK": "2",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "4242",
    }


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        (None, 1),
        ({"cpu": 4}, 4),
        ({"cpu": "500m"}, 1),
        ({"cpu": 2, "gpu": 3}, 3),
        ({"limits": {"cpu": "1.5"}}, 2),
    ],
)
def test_torch_auto_proc_per_node(tmp_path: Path, resources: dict[str, Any] | None, expected: int) -> None:
    request: dict[str, Any] = {"command": ["torchrun", "t.py"]}
    if resources:
        request["resources"] = resources
    assert plan_for(request, tmp_path)["nproc_per_node"] == expected


def test_function_trainer_is_a_torchrun_command(tmp_path: Path) -> None:
    plan = plan_for({"function": "json:dumps", "function_kwargs": {"obj": 1}}, tmp_path)
    assert plan["argv"][:4] == ["torchrun", "--no-python", "python3", "-c"]
    assert plan["argv"][-1] == '{"obj":1}'


def test_jax_and_xgboost_env(tmp_path: Path) -> None:
    jax = plan_for({"runtime": "jax-distributed", "command": ["python3", "t.py"], "num_nodes": 2}, tmp_path)
    assert policies.policy_env(jax, 1, 555) == {
        "JAX_NUM_PROCESSES": "2",
        "JAX_PROCESS_ID": "1",
        "JAX_COORDINATOR_ADDRESS": "127.0.0.1:555",
    }
    xgb = plan_for(
        {
            "runtime": "xgboost-distributed",
            "command": ["python3", "t.py"],
            "num_nodes": 2,
            "resources": {"gpu": 2},
        },
        tmp_path,
    )
    assert policies.policy_env(xgb, 0, 9091) == {
        "DMLC_TRACKER_URI": "127.0.0.1",
        "DMLC_TRACKER_PORT": "9091",
        "DMLC_TASK_ID": "0",
        "DMLC_NUM_WORKER": "4",  # GPUs per node x nodes
    }


def test_mpi_plan_uses_a_local_hostfile_when_mpirun_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "mpirun"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    plan = plan_for({"runtime": "deepspeed-distributed", "function": "json:dumps", "num_nodes": 2}, tmp_path)
    assert plan["step"] == "launcher" and plan["launched_nodes"] == 1
    assert plan["argv"][:3] == ["mpirun", "--hostfile", str(tmp_path / "job" / "hostfile")]


def _fake_mpirun(tmp_path: Path, version: str) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "mpirun"
    fake.write_text(f"#!/bin/sh\necho '{version}'\n")
    fake.chmod(0o755)


@pytest.mark.parametrize(
    ("version", "env", "refused"),
    [
        ("mpirun (Open MPI) 4.1.4", {}, True),
        (
            "mpirun (Open MPI) 4.1.4",
            {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"},
            False,
        ),
        ("mpirun (Open MPI) 4.1.4", {"OMPI_ALLOW_RUN_AS_ROOT": "1"}, True),
        ("HYDRA build details:", {}, False),  # MPICH's mpirun runs as root
    ],
)
def test_open_mpi_as_root_is_refused_unless_its_switches_are_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, env: dict[str, str], refused: bool
) -> None:
    _fake_mpirun(tmp_path, version)
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + ":/bin:/usr/bin")
    for name in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    request = {"runtime": "mlx-distributed", "function": "json:dumps", "num_nodes": 2, "env": env}
    if refused:
        with pytest.raises(InvalidRequest, match="refuses to run as root") as info:
            plan_for(request, tmp_path)
        assert info.value.fields == ["runtime"] and "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in str(info.value)
    else:
        assert plan_for(request, tmp_path)["argv"][0] == "mpirun"


def test_mpi_without_mpirun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InvalidRequest, match="mpirun is not installed") as info:
        plan_for({"runtime": "deepspeed-distributed", "function": "json:dumps"}, tmp_path)
    assert info.value.fields == ["runtime"]


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("file:///data/x", "/data/x"),
        ("/abs/p", "/abs/p"),
        ("file://localhost/a%20b", "/a b"),
        ("s3://b/k", None),
        ("file://host/x", None),
        ("pvc://claim/p", None),
    ],
)
def test_local_path(uri: str, expected: str | None) -> None:
    got = policies.local_path(uri)
    assert (str(got) if got else None) == expected


def test_output_uri(tmp_path: Path) -> None:
    plan = plan_for({"command": ["x"], "output_uri": "file:///tmp/models/run1"}, tmp_path)
    # a local path: staged in the job's own directory, published there by the supervisor when the job completes
    assert plan["output_uri"] == "file:///tmp/models/run1" and plan["output_target"] == "/tmp/models/run1"
    assert plan["output_dir"] == str(tmp_path / "job" / "output-staging")
    assert policies.output_env(plan, 1, {})["TRAINFLOW_OUTPUT_STAGING"] == plan["output_dir"]  # every node's
    # s3://: staged in the job's own directory, the URI kept for publish_output()
    plan = plan_for({"command": ["x"], "output_uri": "s3://bucket/m"}, tmp_path)
    assert plan["output_uri"] == "s3://bucket/m"
    assert plan["output_dir"] == str(tmp_path / "job" / "output-staging")
    with pytest.raises(InvalidRequest, match="local engine") as info:
        plan_for({"command": ["x"], "output_uri": "pvc://claim/m"}, tmp_path)
    assert info.value.fields == ["output_uri"]


def test_secret_env_needs_the_local_secret_file_and_stays_a_reference(tmp_path: Path) -> None:
    request = {"command": ["x"], "secret_env": {"HF_TOKEN": "hf/token"}}
    with pytest.raises(InvalidRequest) as info:
        plan_for(request, tmp_path)
    assert info.value.fields == ["secret_env.HF_TOKEN"]
    assert str(tmp_path / "home" / "secrets" / "hf" / "token") in str(info.value)
    (tmp_path / "home" / "secrets" / "hf").mkdir(parents=True)
    (tmp_path / "home" / "secrets" / "hf" / "token").write_text("value-never-in-plan")
    plan = plan_for(request, tmp_path)
    assert {"name": "HF_TOKEN", "secret": {"name": "hf", "key": "token"}} in plan["env"]
    assert "value-never-in-plan" not in repr(plan)


def test_no_command_anywhere_is_refused(tmp_path: Path) -> None:
    r = runtime("torch-distributed")
    manifest = {"spec": {"runtimeRef": {"name": r.name}}}
    with pytest.raises(InvalidRequest, match="images are not run locally") as info:
        policies.make_plan(manifest, r, home=tmp_path, jobdir=tmp_path / "j")
    assert info.value.fields == ["command"]


def test_runtime_container_command_is_the_fallback(tmp_path: Path) -> None:
    r = Runtime.from_object(
        {
            "kind": "ClusterTrainingRuntime",
            "metadata": {"name": "custom", "labels": {"trainer.kubeflow.org/framework": "torch"}},
            "spec": {
                "mlPolicy": {"numNodes": 2, "torch": {}},
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {
                                "name": "node",
                                "template": {
                                    "metadata": {
                                        "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
                                    },
                                    "spec": {
                                        "template": {
                                            "spec": {
                                                "containers": [
                                                    {
                                                        "name": "node",
                                                        "image": "img",
                                                        "command": ["torchrun", "default.py"],
                                                        "args": ["--a"],
                                                        "env": [{"name": "FROM_RUNTIME", "value": "1"}],
                                                    }
                                                ]
                                            }
                                        }
                                    },
                                },
                            }
                        ]
                    }
                },
            },
        }
    )
    plan = policies.make_plan({"spec": {}}, r, home=tmp_path, jobdir=tmp_path / "j")
    assert plan["argv"] == ["torchrun", "default.py", "--a"] and plan["num_nodes"] == 2
    assert {"name": "FROM_RUNTIME", "value": "1"} in plan["env"]
    overridden = policies.make_plan(
        {"spec": {"trainer": {"args": ["--b"]}}}, r, home=tmp_path, jobdir=tmp_path / "j"
    )
    assert overridden["argv"] == ["torchrun", "default.py", "--b"]


def test_base_env_keeps_the_callers_env_and_puts_this_python_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINFLOW_LOCAL_JOB_UID", "outer-job")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "https://outer")
    env = policies.base_env(dict(os.environ))
    assert "TRAINFLOW_LOCAL_JOB_UID" not in env and "KUBEFLOW_TRAINER_SERVER_URL" not in env
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert env.get("HOME") == os.environ.get("HOME")
    assert os.environ["TRAINFLOW_LOCAL_JOB_UID"] == "outer-job"  # the caller's env is not modified


def test_free_port_is_bindable() -> None:
    import socket

    port = policies.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
