"""Issue 10 items 7 (KFP) and 8: trainflow's ``train_job`` KFP component under ``kfp.local`` with the
kubernetes backend against real pods: the Model artifact holds the files the pods wrote on the shared volume;
a SIGTERM to the running step deletes the TrainJob and leaves no pod or container.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from kfp import local

from conftest import SLEEPER, TORCH_IMAGE, record, sigterm_when_running
from trainflow.kfp import make_train_job_component

pytestmark = pytest.mark.e2e

WRITE_MODEL = textwrap.dedent(
    """
    from trainflow.core.reporting import output_dir, report
    out = output_dir()
    (out / "weights.txt").write_text("w=3.0,-2.0 b=0.5\\n")
    (out / "config.json").write_text('{"layers": 1}')
    report(metrics={"accuracy": 0.97}, progress=100)
    print("wrote", sorted(p.name for p in out.iterdir()), flush=True)
    """
)

STEP_SCRIPT = """
import json, signal, sys
from kfp import local
signal.signal(signal.SIGTERM, lambda *_: None)  # the "launcher" keeps streaming the step's log
from trainflow.kfp import make_train_job_component
local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=sys.argv[1])
op = make_train_job_component(base_image="python:3.11", packages_to_install=(), install_kfp_package=False)
op(**json.loads(sys.argv[2]))
"""


def train_op() -> Any:
    return make_train_job_component(
        base_image="python:3.11", packages_to_install=(), install_kfp_package=False
    )


def test_model_artifact_holds_the_files_the_pods_wrote(
    testbed: Any, namespace: str, shared_volume: Any, tmp_path: Path
) -> None:
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    t0 = time.monotonic()
    task = train_op()(
        runtime="torch-distributed",
        image=TORCH_IMAGE,
        # "python", not "python3": kfp.local's SubprocessRunner rewrites 'python3' in every argument, pipeline
        # parameters included, to the host's interpreter path (replace_python_executable)
        command=["python", "-c", WRITE_MODEL],
        output_uri=f"file://{shared_volume.path}/kfp-model",
        volumes=[shared_volume.request_volume()],
        backend="kubernetes",
        backend_config={"kubeconfig": str(testbed.kubeconfig), "context": testbed.context},
        namespace=namespace,
        run_id="run-pods",
        task_name="train-job",
        timeout=300.0,
    )
    elapsed = time.monotonic() - t0
    assert task.outputs["state"] == "Complete" and task.outputs["namespace"] == namespace
    model = Path(task.outputs["model"].path)
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "weights.txt"]
    assert (model / "weights.txt").read_text() == "w=3.0,-2.0 b=0.5\n"
    assert task.outputs["model"].metadata["files"] == ["config.json", "weights.txt"]
    metrics = task.outputs["metrics"].metadata
    assert metrics["accuracy"] == pytest.approx(0.97), metrics  # from trainerStatus
    record("kfp_train_job", {"seconds": round(elapsed, 1)})


def test_sigterm_to_the_step_leaves_no_trainjob_pod_or_container(
    testbed: Any, k8s: Any, namespace: str, tmp_path: Path
) -> None:
    kwargs = {
        "runtime": "torch-distributed",
        "image": TORCH_IMAGE,
        "command": SLEEPER,
        "num_nodes": 2,
        "backend": "kubernetes",
        "backend_config": {"kubeconfig": str(testbed.kubeconfig), "context": testbed.context},
        "namespace": namespace,
        "run_id": "run-term",
        "task_name": "train-job",
        "timeout": 600.0,
    }
    script = tmp_path / "step.py"
    script.write_text(textwrap.dedent(STEP_SCRIPT))
    log = tmp_path / "step.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "root"), json.dumps(kwargs)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    total, gone = sigterm_when_running(testbed, k8s, namespace, proc, group=True)
    text = log.read_text()
    assert "received signal 15" in text and "deleted" in text, text[-6000:]
    record("kfp_sigterm", {"sigterm_to_all_gone_s": round(total, 1), "wait_s": round(gone, 1)})
