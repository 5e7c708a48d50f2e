"""Issue 22: data in, model out through an S3-compatible store, on real pods.

The Trainer's own dataset and model initializers (images built from its v2.3.0 sources) download a dataset and a
base model from the testbed's store (versitygw, which checks every signature) into ``/workspace``; a torch
function trainer fine-tunes the base model on the data and writes its model to an ``s3://`` output_uri through
``output_dir()``; this process, a downstream KFP step and a downstream Airflow task load it from the store.
Credentials travel only as Secret references, and the store's secret key is found nowhere else. A missing
object, a wrong credential and an unreachable endpoint each end the wait with a TrainJobFailed that names the
step, within a bound.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from s3store import (
    Store,
    everything,
    initializer_fields,
    make_secret,
    trainer_store_fields,
)

from conftest import record
from trainflow.core import TrainJobFailed, TrainJobRequest, storage

pytestmark = pytest.mark.e2e

# y = 2x + 1 on 64 points; the base model starts at w = b = 0
POINTS = "x,y\n" + "".join(f"{i / 16:.4f},{2 * i / 16 + 1:.4f}\n" for i in range(64))
BASE = {"name": "tiny-linear", "w": 0.0, "b": 0.0}
FAILURE_BOUND_S = 240


def first_line() -> str:
    """A trainer that reads the dataset (never reached when an initializer fails)."""
    with open("/workspace/dataset/points.csv") as f:
        return f.readline()


def seed_inputs(store: Store, namespace: str, tmp: Path) -> tuple[str, str]:
    data, model = store.uri(namespace, "data"), store.uri(namespace, "base-model")
    store.seed(data, {"points.csv": POINTS.encode()}, tmp / "data")
    store.seed(model, {"config.json": json.dumps(BASE).encode(), "weights.bin": b"\0" * 64}, tmp / "model")
    return data, model


@pytest.mark.parametrize("fault", ["missing-object", "wrong-credential", "unreachable-endpoint"])
def test_a_store_fault_fails_the_job_naming_the_step_within_a_bound(
    backend: Any,
    k8s: Any,
    namespace: str,
    store: Store,
    initializers_runtime: str,
    tmp_path: Path,
    fault: str,
) -> None:
    data, model = seed_inputs(store, namespace, tmp_path)
    dataset = initializer_fields(store, "dataset", data)
    wrong = "W" * 40
    if fault == "missing-object":
        dataset = initializer_fields(store, "dataset", store.uri(namespace, "no-such-data"))
    elif fault == "wrong-credential":
        make_secret(k8s, namespace, "wrong", store.access_key_id, wrong)
        dataset = initializer_fields(store, "dataset", data, secret="wrong")
    else:  # a name no DNS answers, as a typo in the endpoint gives
        dataset["dataset_options"]["endpoint"] = "http://no-such-store.default.svc.cluster.local:9000"
    request = TrainJobRequest(
        runtime=initializers_runtime,
        runtime_kind="TrainingRuntime",
        function=first_line,
        function_kwargs={"steps": 1, "lr": 0.1},
        proc_per_node=1,
        output_uri=store.uri(namespace, "models", fault),
        **dataset,
        **initializer_fields(store, "model", model),
        **trainer_store_fields(store),
    )
    t0 = time.monotonic()
    ref = backend.submit(request)
    with pytest.raises(TrainJobFailed) as info:
        backend.wait(ref, timeout=FAILURE_BOUND_S + 60)
    elapsed = time.monotonic() - t0
    assert elapsed < FAILURE_BOUND_S, elapsed
    message = str(info.value)
    if fault == "missing-object":
        # Trainer v2.3.0's S3 initializer succeeds on an empty prefix; the function trainer stops at start
        assert "the dataset-initializer left /workspace/dataset empty" in message, message
    else:
        assert "dataset-initializer" in message, message
        tail = info.value.diagnostics.log_tail
        expected = "SignatureDoesNotMatch" if fault == "wrong-credential" else "no-such-store"
        assert expected in tail and "pkg/initializers/dataset" in tail, message
    assert not storage_has(store, store.uri(namespace, "models", fault), tmp_path / "check")
    text = everything(k8s, namespace) + message
    assert store.secret_access_key not in text and wrong not in text
    record(f"objstore_fault_{fault}", {"seconds_to_failed": round(elapsed, 1)})


def storage_has(store: Store, uri: str, scratch: Path) -> bool:
    try:
        storage.download(uri, scratch, store.host_env())
    except storage.StorageError as e:
        assert "no trainflow manifest" in str(e), e
        return False
    return True


WRITE_AND_PUBLISH = """
import json
from trainflow.core import output_dir, publish_output, report
(output_dir() / "weights.json").write_text(json.dumps({"w": 2.5, "b": -1.0}))
report(metrics={"loss": 0.01}, progress=100)
publish_output()
"""


def test_a_downstream_kfp_step_loads_the_model_from_the_store(
    testbed: Any, k8s: Any, namespace: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kfp.local, kubernetes backend: a command trainer publishes its output with one call; the Model artifact
    names the object (its uri), and the next step, in its own process, downloads it with the step's own
    credentials."""
    from kfp import local
    from kfp_steps import retrain_pipeline

    from trainflow.kfp import make_train_job_component

    for key, value in store.host_env().items():  # the downstream step's own credentials (its process env)
        monkeypatch.setenv(key, value)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    train = make_train_job_component(
        base_image="python:3.11", packages_to_install=(), install_kfp_package=False
    )
    output = store.uri(namespace, "kfp", "run-1")
    fields = trainer_store_fields(store)

    retrain = retrain_pipeline(
        train,
        {
            "runtime": "torch-distributed",
            # "python", not "python3": kfp.local's SubprocessRunner rewrites 'python3' in every argument
            "command": ["python", "-c", WRITE_AND_PUBLISH],
            "output_uri": output,
            "env": fields["env"],
            "secret_env": fields["secret_env"],
            "backend": "kubernetes",
            "backend_config": {"kubeconfig": str(testbed.kubeconfig), "context": testbed.context},
            "namespace": namespace,
            "run_id": "run-s3",
            "task_name": "train-job",
            "timeout": 300.0,
        },
    )

    t0 = time.monotonic()
    run = retrain()
    assert run.output == 2.5, run
    text = everything(k8s, namespace) + "".join(p.read_text(errors="replace") for p in
                                                 (tmp_path / "root").rglob("*") if p.is_file())  # fmt: skip
    assert store.secret_access_key not in text
    record("objstore_kfp_downstream", {"seconds": round(time.monotonic() - t0, 1)})


def dcp_shards(steps: int) -> dict[str, int]:
    """Each rank trains its own slice of a model and saves it with torch.distributed.checkpoint into
    output_dir(): a real sharded checkpoint, one ``__<rank>_0.distcp`` per rank and rank 0's ``.metadata``."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from trainflow.core import output_dir

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    weight = torch.full((64, 64), float(rank + 1))
    for _ in range(steps):
        weight = weight * 0.5 + float(rank + 1)  # converges to 2 * (rank + 1)
    dcp.save({f"slice-{rank}": weight}, checkpoint_id=str(output_dir()))
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "world": world}


def test_every_rank_s_dcp_shard_of_a_two_node_job_is_published_and_loads(
    backend: Any, k8s: Any, namespace: str, store: Store, tmp_path: Path
) -> None:
    """Two pods on two nodes, one rank each; each pod's output_dir() holds only its rank's files. Every node
    publishes its part and node 0 commits one manifest: the downloaded checkpoint loads with DCP here, each
    slice the value its rank computed."""
    import torch
    import torch.distributed.checkpoint as dcp

    from conftest import TORCH_IMAGE, spread_over_nodes

    uri = store.uri(namespace, "dcp", "model")
    request = TrainJobRequest(
        runtime="torch-distributed",
        image=TORCH_IMAGE,
        function=dcp_shards,
        function_kwargs={"steps": 30},
        num_nodes=2,
        proc_per_node=1,
        output_uri=uri,
        runtime_patches=spread_over_nodes("node"),
        **trainer_store_fields(store),
    )
    t0 = time.monotonic()
    result = backend.wait(backend.submit(request), timeout=900)
    assert result.state.value == "Complete", result
    got = tmp_path / "dcp"
    files = storage.download(uri, got, store.host_env())
    assert sorted(files) == [".metadata", "__0_0.distcp", "__1_0.distcp"], files
    manifest = storage.read_manifest(uri, store.host_env())
    assert manifest["job"]["name"] == result.name
    state = {"slice-0": torch.zeros(64, 64), "slice-1": torch.zeros(64, 64)}
    dcp.load(state, checkpoint_id=str(got), no_dist=True)
    for rank in (0, 1):
        assert torch.allclose(state[f"slice-{rank}"], torch.full((64, 64), 2.0 * (rank + 1)), atol=1e-6), rank
    record("objstore_dcp_two_nodes", {"seconds": round(time.monotonic() - t0, 1)})
