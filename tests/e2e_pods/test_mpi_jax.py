"""Issue 21 items 1-4: the Trainer's MPI runtimes (deepspeed-distributed, mlx-distributed) and jax-distributed,
unmodified, on real containers across the two nodes. The ranks meet across nodes: the launcher's ``mpirun``
reaches the other node's pod over SSH (port 2222, the key pair the Trainer generated and mounted), the JAX
processes reach the coordinator through the JobSet's headless-service name. Each test checks that its pods ran
on both nodes (``spec.nodeName``).

The image is the runtimes image (``make pods-images``: the trainer image's layers plus Open MPI, sshd,
DeepSpeed, mpi4py, MLX and JAX, CPU builds) imported under the names the runtimes reference.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
import torch

from conftest import TRAINER_GROUP, TRAINER_VERSION, pod_logs, pod_nodes, record, spread_over_nodes
from trainflow.core import JobState, TrainJobRequest

pytestmark = pytest.mark.e2e

BOTH_NODES = ["pods-node-0", "pods-node-1"]
TIMEOUT = 900


def ds_train(steps: int) -> None:
    """A DeepSpeed function trainer: ``deepspeed.initialize`` on a tiny model, a few SGD steps on CPU (gloo)."""
    import socket
    import sys

    import deepspeed
    import deepspeed.ops
    import torch

    from trainflow.core.reporting import output_dir, report

    # DeepSpeed's CPU accelerator JIT-compiles its shared-memory allreduce at init_distributed; the image ships
    # DeepSpeed without compiled ops and without a compiler, so that op stays off (gloo does the allreduce).
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    # Under mpirun: rank and world size from OMPI_COMM_WORLD_*, rank 0's address found through mpi4py.
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    config = {"train_micro_batch_size_per_gpu": 64, "gradient_accumulation_steps": 1}
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.3), config=config
    )
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(64, 2, generator=gen)
    y = x @ torch.tensor([3.0, -2.0]) + 0.5
    mean = float("nan")
    for step in range(steps):
        loss = ((engine(x).squeeze(-1) - y) ** 2).mean()
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        mean = total.item() / world
        # one write per line: mpirun interleaves the ranks' output by write, and print() writes the newline apart
        sys.stdout.write(
            f"ds rank={rank} world_size={world} step={step} loss={mean!r} host={socket.gethostname()}\n"
        )
        sys.stdout.flush()
    report(metrics={"loss": mean, "world_size": world}, progress=100)
    if rank == 0:
        torch.save(model.state_dict(), output_dir() / "model.pt")


def test_deepspeed_function_trainer_runs_ranks_over_ssh_on_both_nodes(
    backend: Any, k8s: Any, namespace: str, shared_volume: Any
) -> None:
    out = shared_volume.path / "ds-model"
    shared_volume.path.chmod(0o777)  # the MPI runtimes run as mpiuser (uid 1000); a hostPath keeps its owner
    request = TrainJobRequest(
        runtime="deepspeed-distributed",
        function=ds_train,
        function_kwargs={"steps": 20},
        num_nodes=2,
        volumes=[shared_volume.request_volume()],
        output_uri=f"file://{out}",
        runtime_patches=spread_over_nodes("node", "launcher"),
    )
    t0 = time.monotonic()
    ref = backend.submit(request)
    result = backend.wait(ref, timeout=TIMEOUT)
    elapsed = time.monotonic() - t0
    assert result.state == JobState.COMPLETE, result

    nodes = pod_nodes(k8s, namespace, f"jobset.sigs.k8s.io/jobset-name={ref.name}")
    assert sorted(nodes.values()) == BOTH_NODES, nodes
    # mpirun gathers every rank's output in the launcher's log: 2 ranks, world size 2, the same loss each step
    logs = pod_logs(
        k8s,
        namespace,
        f"jobset.sigs.k8s.io/replicatedjob-name=launcher,jobset.sigs.k8s.io/jobset-name={ref.name}",
    )
    text = "\n".join(logs.values())
    lines = re.findall(r"ds rank=(\d) world_size=(\d) step=(\d+) loss=([0-9.e+-]+) host=(\S+)", text)
    assert {(r, w) for r, w, *_ in lines} == {("0", "2"), ("1", "2")}, text[-3000:]
    by_step: dict[str, set[str]] = {}
    for _, _, step, loss, _ in lines:
        by_step.setdefault(step, set()).add(loss)
    assert len(by_step) == 20 and all(len(v) == 1 for v in by_step.values()), by_step
    assert len({host for *_, host in lines}) == 2, "both ranks on one pod"
    first, last = float(next(iter(by_step["0"]))), float(next(iter(by_step["19"])))
    assert last < first / 100, (first, last)

    # report() -> the Trainer's status server -> trainerStatus
    tj = k8s.custom.get_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, namespace, "trainjobs", ref.name
    )
    posted = {m["name"]: float(m["value"]) for m in tj["status"]["trainerStatus"]["metrics"]}
    assert posted["world_size"] == 2.0 and posted["loss"] == pytest.approx(float(last), rel=1e-9), posted
    assert result.metrics["world_size"] == 2.0
    # the model, written by rank 0, loads here
    model = torch.nn.Linear(2, 1)
    model.load_state_dict(torch.load(out / "model.pt", map_location="cpu", weights_only=True))
    assert model.weight.detach().flatten().tolist() == pytest.approx([3.0, -2.0], abs=0.2)
    record("deepspeed_function_2_nodes", {"seconds": round(elapsed, 1)})


RANK_SCRIPT = (
    "import os, socket, sys; "
    "sys.stdout.write(f\"rank={os.environ['OMPI_COMM_WORLD_RANK']} size={os.environ['OMPI_COMM_WORLD_SIZE']} "
    "mca={os.environ.get('OMPI_MCA_btl_tcp_if_include')} host={socket.gethostname()}\\n\")"
)


def run_on_both_nodes(backend: Any, k8s: Any, namespace: str, request: TrainJobRequest) -> tuple[Any, str]:
    """Submit, wait for Complete, check the job's pods ran on both nodes; returns (ref, the launcher's log: every
    rank's output, gathered by mpirun)."""
    ref = backend.submit(request)
    result = backend.wait(ref, timeout=TIMEOUT)
    assert result.state == JobState.COMPLETE, result
    nodes = pod_nodes(k8s, namespace, f"jobset.sigs.k8s.io/jobset-name={ref.name}")
    assert sorted(nodes.values()) == BOTH_NODES, nodes
    launcher = f"jobset.sigs.k8s.io/replicatedjob-name=launcher,jobset.sigs.k8s.io/jobset-name={ref.name}"
    return ref, "\n".join(pod_logs(k8s, namespace, launcher).values())


def test_container_trainer_runs_its_own_mpirun_args_with_ompi_mca_env(
    backend: Any, k8s: Any, namespace: str
) -> None:
    request = TrainJobRequest(
        runtime="deepspeed-distributed",
        command=["mpirun", "--hostfile", "/etc/mpi/hostfile", "--tag-output", "python3", "-c", RANK_SCRIPT],
        num_nodes=2,
        env={"OMPI_MCA_btl_tcp_if_include": "eth0"},
        runtime_patches=spread_over_nodes("node", "launcher"),
    )
    _, logs = run_on_both_nodes(backend, k8s, namespace, request)
    # --tag-output (the user's own mpirun argument) prefixes each line with [job,rank]; the user's
    # OMPI_MCA_* setting reached the remote rank too (mpirun forwards OMPI_* variables to every rank)
    found = re.findall(r"\[1,(\d)\]<stdout>:rank=(\d) size=2 mca=eth0 host=(\S+)", logs)
    assert sorted((tag, rank) for tag, rank, _ in found) == [("0", "0"), ("1", "1")], logs
    assert len({host for *_, host in found}) == 2, logs


def mlx_all_sum() -> None:
    """MLX's distributed API over MPI: every rank adds rank+1; the sum proves the world size."""
    import socket
    import sys

    import mlx.core as mx

    group = mx.distributed.init(strict=True, backend="mpi")
    total = mx.distributed.all_sum(mx.array([float(group.rank() + 1)]), group=group)
    mx.eval(total)
    sys.stdout.write(
        f"mlx rank={group.rank()} size={group.size()} all_sum={total.item():g} host={socket.gethostname()}\n"
    )
    sys.stdout.flush()


def test_mlx_all_sum_over_mpi_on_both_nodes(backend: Any, k8s: Any, namespace: str) -> None:
    request = TrainJobRequest(
        runtime="mlx-distributed",
        function=mlx_all_sum,
        num_nodes=2,
        runtime_patches=spread_over_nodes("node", "launcher"),
    )
    _, logs = run_on_both_nodes(backend, k8s, namespace, request)
    found = re.findall(r"mlx rank=(\d) size=(\d) all_sum=(\S+) host=(\S+)", logs)
    assert sorted((r, s, a) for r, s, a, _ in found) == [("0", "2", "3"), ("1", "2", "3")], logs
    assert len({h for *_, h in found}) == 2, logs


def jax_process_sum() -> None:
    """jax.distributed from the Trainer's JAX_* env alone, then a sum across processes on CPU (gloo)."""
    import os
    import socket

    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    # JAX reads JAX_COORDINATOR_ADDRESS itself, but not JAX_NUM_PROCESSES / JAX_PROCESS_ID (without them it
    # asks the Kubernetes API, which a pod's default ServiceAccount may not read): pass them, as the
    # Trainer's own JAX example does.
    jax.distributed.initialize(
        coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]),
        initialization_timeout=120,
    )
    mine = jnp.array([float(jax.process_index() + 1)])
    total = multihost_utils.process_allgather(mine).sum()
    print(
        f"jax process={jax.process_index()} count={jax.process_count()} devices={jax.device_count()} "
        f"sum={float(total):g} host={socket.gethostname()}",
        flush=True,
    )
    jax.distributed.shutdown()


def test_jax_processes_meet_the_coordinator_across_nodes(backend: Any, k8s: Any, namespace: str) -> None:
    request = TrainJobRequest(
        runtime="jax-distributed",
        function=jax_process_sum,
        num_nodes=2,
        runtime_patches=spread_over_nodes("node"),
    )
    ref = backend.submit(request)
    result = backend.wait(ref, timeout=TIMEOUT)
    assert result.state == JobState.COMPLETE, result
    selector = f"jobset.sigs.k8s.io/jobset-name={ref.name}"
    nodes = pod_nodes(k8s, namespace, selector)
    assert sorted(nodes.values()) == BOTH_NODES, nodes
    found = re.findall(
        r"jax process=(\d) count=(\d) devices=(\d+) sum=(\S+) host=(\S+)",
        "\n".join(pod_logs(k8s, namespace, selector).values()),
    )
    assert sorted((p, c, s) for p, c, _, s, _ in found) == [("0", "2", "3"), ("1", "2", "3")], found
