"""Case 5: a canary secret value planted as a Kubernetes Secret is found nowhere trainflow writes.

Scanned: every TrainJob/JobSet/Job/Pod manifest in the namespace, trainflow's log records (DEBUG), CLI
stdout/stderr of every verb, error messages (including the value given by mistake where a reference
belongs), the KFP step's printed log, return values and artifact metadata (run in-process against the
testbed), and the result dict that the Airflow operator pushes to XCom. Secrets must reach the TrainJob
only as ``secretKeyRef`` / ``secretRef``. The local engine's secret file is covered by
tests/integration/test_local_engine.py::test_secret_values_reach_only_the_child_env.
"""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG
from conftest import IMAGE, held_request

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

EXE = Path(sys.executable).parent / "trainflow"


@pytest.fixture
def canary(k8s: Any, namespace: str) -> str:
    value = f"CANARY-{uuid.uuid4().hex}"
    k8s.core.create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": "canary"},
            "data": {"token": base64.b64encode(value.encode()).decode()},
        },
    )
    return value


def _everything(k8s: Any, ns: str) -> str:
    """Every object trainflow and the controllers made from its TrainJobs, as JSON text."""
    parts = []
    for group, version, plural in (
        ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
        ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
    ):
        parts.append(json.dumps(k8s.custom.list_namespaced_custom_object(group, version, ns, plural)))
    api = k8s.core.api_client
    parts.append(json.dumps(api.sanitize_for_serialization(k8s.batch.list_namespaced_job(ns))))
    parts.append(json.dumps(api.sanitize_for_serialization(k8s.core.list_namespaced_pod(ns))))
    parts.append(json.dumps(api.sanitize_for_serialization(k8s.core.list_namespaced_config_map(ns))))
    parts.append(json.dumps(api.sanitize_for_serialization(k8s.core.list_namespaced_event(ns))))
    return "\n".join(parts)


def cli(testbed: Any, ns: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EXE), "--backend", "kubernetes", "-n", ns, "--context", testbed.context, *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=HANG,
        env={**testbed.env, "TRAINFLOW_DEBUG": ""},
    )


def test_canary_secret_appears_nowhere(
    testbed, k8s, namespace, canary, kube_backend, caplog, capsys, tmp_path
):
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []

    # 1. CLI: submit with secret_env and wait; every read verb after it
    req = held_request("rel/secret-cli", secret_env={"HF_TOKEN": "canary/token"})
    req_file = tmp_path / "req.json"
    req_file.write_text(json.dumps(req))
    for args in (
        ("render", "-f", str(req_file), "--json"),
        ("submit", "-f", str(req_file), "--wait", "--timeout", "120", "--json"),
        ("list", "--json"),
    ):
        proc = cli(testbed, namespace, *args)
        seen += [proc.stdout, proc.stderr]
        assert proc.returncode == 0, proc.stderr
    name = json.loads(seen[0])["metadata"]["name"]
    for args in (("status", name, "--json"), ("wait", name, "--json"), ("logs", name)):
        proc = cli(testbed, namespace, *args)
        seen += [proc.stdout, proc.stderr]
        assert proc.returncode == 0, (args, proc.stderr)

    # 2. errors: the value given where a reference belongs, or as a plain credential env
    for bad in (
        {"secret_env": {"HF_TOKEN": canary}},
        {"secret_env": {"HF_TOKEN": {"name": canary, "key": "k"}}},
        {"env": {"HF_TOKEN": canary}},
        {"runtime": "torchtune-llama3.2-1b", "dataset_uri": f"s3://user:{canary}@bucket/d", "command": None},
        {"output_uri": f"s3://user:{canary}@bucket/m"},
    ):
        bad_file = tmp_path / "bad.json"
        bad_file.write_text(
            json.dumps({k: v for k, v in {**held_request("rel/bad"), **bad}.items() if v is not None})
        )
        proc = cli(testbed, namespace, "submit", "-f", str(bad_file))
        assert proc.returncode == 2, (bad, proc.stdout, proc.stderr)
        seen += [proc.stdout, proc.stderr]

    # 3. Python API: submit/wait/get/logs/list with a dataset secret (secretRef) and secret_env
    ref = kube_backend.submit(
        held_request(
            "rel/secret-api",
            runtime="torchtune-llama3.2-1b",
            command=None,
            image=None,
            args=["epochs=1"],
            dataset_uri="hf://tatsu-lab/alpaca",
            dataset_secret="canary",
            model_uri="hf://meta-llama/Llama-3.2-1B-Instruct",
            model_secret="canary",
            secret_env={"WANDB_API_KEY": "canary/token"},
        )
    )
    # the initializers wait for a PVC the testbed cannot provision: read it, do not wait for it
    seen.append(json.dumps(kube_backend.get(ref).to_dict()))
    cli_ref = f"{namespace}/{name}"
    result = kube_backend.wait(cli_ref, timeout=HANG)
    seen.append(json.dumps(result.to_dict()))  # what the Airflow operator pushes to XCom
    seen += [json.dumps(r.to_dict()) for r in kube_backend.list()]
    seen += list(kube_backend.logs(cli_ref))

    # 4. KFP step, in-process against the testbed
    from trainflow.kfp.runner import run_train_job

    class Artifact:
        def __init__(self, path: Path) -> None:
            self.path, self.metadata, self.uri = str(path), {}, str(path)

    model = Artifact(tmp_path / "model")
    out = run_train_job(
        {
            "backend": "kubernetes",
            "backend_config": {"kubeconfig": str(testbed.kubeconfig), "context": testbed.context},
            "namespace": namespace,
            "runtime": "torch-distributed",
            "image": IMAGE,
            "command": ["torchrun", "train.py"],
            "secret_env": {"HF_TOKEN": "canary/token"},
            "run_id": "run-1",
            "task_name": "train",
            "timeout": 180,
        },
        model=model,
    )
    seen += [json.dumps(out), json.dumps(model.metadata)]

    captured = capsys.readouterr()
    seen += [captured.out, captured.err, *(r.getMessage() for r in caplog.records)]
    manifests = _everything(k8s, namespace)

    assert not [s for s in seen if canary in s], "canary leaked into trainflow output"
    assert canary not in manifests, "canary leaked into a Kubernetes object"
    # secrets reach the TrainJob only as references
    for tj in k8s.custom.list_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs"
    )["items"]:
        spec = tj["spec"]
        for env in spec.get("trainer", {}).get("env", []):
            if env["name"] in ("HF_TOKEN", "WANDB_API_KEY"):
                assert env == {
                    "name": env["name"],
                    "valueFrom": {"secretKeyRef": {"name": "canary", "key": "token"}},
                }
        for key in ("dataset", "model"):
            init = spec.get("initializer", {}).get(key)
            if init:
                assert init["secretRef"] == {"name": "canary"}
    pods = k8s.core.list_namespaced_pod(namespace).items
    assert pods, "no pods were created: nothing was scanned"
    for pod in pods:
        for c in pod.spec.containers:
            for env in c.env or []:
                if env.name in ("HF_TOKEN", "WANDB_API_KEY"):
                    assert env.value is None and env.value_from.secret_key_ref.name == "canary"
    print(f"\nscanned {len(seen)} outputs, {len(manifests)} bytes of manifests, {len(pods)} pods: no canary")
