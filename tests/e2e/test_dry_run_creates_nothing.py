"""Issue 11.1: ``--dry-run`` means "validated, nothing created", on the testbed and on the local engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG

pytestmark = pytest.mark.e2e

EXE = Path(sys.executable).parent / "trainflow"
IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"


def trainflow(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=HANG, env=env)


def test_kubernetes_dry_run_validates_on_the_server_and_creates_nothing(
    testbed: Any, k8s: Any, namespace: str
) -> None:
    base = ["--backend", "kubernetes", "--kubeconfig", str(testbed.kubeconfig), "--context", testbed.context]
    base += ["-n", namespace, "submit", "--dry-run", "--runtime", "torch-distributed", "--name", "dry"]
    ok = trainflow(testbed.env, *base, "--image", IMAGE, "--", "torchrun", "/app/train.py")
    assert ok.returncode == 0, ok.stderr
    assert "nothing was created" in ok.stdout
    refused = trainflow(testbed.env, *base, "--num-nodes", "0", "--", "torchrun", "/app/train.py")
    assert refused.returncode == 2 and "num_nodes" in refused.stderr
    jobs = k8s.custom.list_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs"
    )
    assert jobs["items"] == []
    assert k8s.core.list_namespaced_pod(namespace).items == []


def test_local_dry_run_creates_nothing(tmp_path: Path, testbed: Any) -> None:
    home = tmp_path / "home"
    run = trainflow(
        testbed.env, "--backend", "local", "--home", str(home), "submit", "--dry-run", "--name", "dry",
        "--", sys.executable, "-c", "print(1)",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert not home.exists() or not any(p.is_file() for p in home.rglob("*.json"))
