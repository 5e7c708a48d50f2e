"""Issue 10 items 1 and 4, issue 21 item 5: torch-distributed, 2 nodes x 2 processes, a container trainer
(torchrun, DDP on gloo) in real containers, one node pod on each real node (the rendezvous crosses nodes); the model lands on the shared RWX volume; rank 0's ``report()`` goes through the
Trainer's status server into ``status.trainerStatus`` and from there into ``TrainJobResult``.
"""

from __future__ import annotations

import re
import textwrap
import time
from typing import Any

import pytest
import torch

from conftest import (
    TORCH_IMAGE,
    TRAINER_GROUP,
    TRAINER_VERSION,
    pod_logs,
    pod_nodes,
    record,
    spread_over_nodes,
)
from trainflow.core import JobState, TrainJobRequest

pytestmark = pytest.mark.e2e

TRAIN = textwrap.dedent(
    """
    import os, socket, time
    import torch, torch.distributed as dist
    from trainflow.core.reporting import output_dir, report

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank={rank} world_size={world} node_rank={os.environ['GROUP_RANK']} "
          f"local_rank={os.environ['LOCAL_RANK']} host={socket.gethostname()}", flush=True)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(128, 2, generator=gen)
    y = x @ torch.tensor([3.0, -2.0]) + 0.5
    model = torch.nn.Linear(2, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    epochs = 40
    for epoch in range(epochs):
        opt.zero_grad()
        loss = ((ddp(x).squeeze(-1) - y) ** 2).mean()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if epoch % 10 == 9:
            report(metrics={"loss": total.item() / world}, progress=int(100 * (epoch + 1) / epochs) - 1)
            time.sleep(1)  # lets the watch see progress move while the job runs
    if rank == 0:
        out = output_dir()
        torch.save(model.state_dict(), out / "model.pt")
        report(metrics={"loss": total.item() / world, "world_size": world}, progress=100)
        print(f"saved {out / 'model.pt'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    """
)


def test_two_nodes_two_procs_train_write_the_model_and_report_through_the_status_server(
    backend: Any, k8s: Any, namespace: str, shared_volume: Any
) -> None:
    script = shared_volume.path / "train_ddp.py"
    script.write_text(TRAIN)
    out = shared_volume.path / "model-out"
    request = TrainJobRequest(
        runtime="torch-distributed",
        image=TORCH_IMAGE,
        command=["torchrun", str(script)],
        num_nodes=2,
        proc_per_node=2,
        volumes=[shared_volume.request_volume()],
        output_uri=f"file://{out}",
        runtime_patches=spread_over_nodes("node"),
    )
    t0 = time.monotonic()
    ref = backend.submit(request)
    seen: list[tuple[str, int | None, dict[str, Any]]] = []
    result = backend.wait(
        ref, timeout=900, on_update=lambda r: seen.append((r.state.value, r.progress, dict(r.metrics)))
    )
    elapsed = time.monotonic() - t0

    assert result.state == JobState.COMPLETE, result
    # rank logs (both pods, both local ranks each): world size 4, ranks 0-3 on two nodes
    logs = pod_logs(k8s, namespace, f"jobset.sigs.k8s.io/jobset-name={ref.name}")
    assert len(logs) == 2, list(logs)
    # one pod on each real node: the rendezvous (PET_MASTER_ADDR, the JobSet's DNS name) crossed nodes
    nodes = pod_nodes(k8s, namespace, f"jobset.sigs.k8s.io/jobset-name={ref.name}")
    assert sorted(nodes.values()) == ["pods-node-0", "pods-node-1"], nodes
    ranks = {
        int(m["rank"]): (int(m["world"]), m["node"])
        for text in logs.values()
        for m in re.finditer(r"rank=(?P<rank>\d) world_size=(?P<world>\d) node_rank=(?P<node>\d)", text)
    }
    assert ranks == {0: (4, "0"), 1: (4, "0"), 2: (4, "1"), 3: (4, "1")}, logs

    # the model on the shared volume, written by rank 0 inside a pod, loads here
    state = torch.load(out / "model.pt", map_location="cpu", weights_only=True)
    model = torch.nn.Linear(2, 1)
    model.load_state_dict(state)
    assert model.weight.detach().flatten().tolist() == pytest.approx([3.0, -2.0], abs=0.2)

    # report() -> status server -> status.trainerStatus (written by the Trainer, not by us) -> result
    tj = k8s.custom.get_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, namespace, "trainjobs", ref.name
    )
    trainer_status = tj["status"]["trainerStatus"]
    assert trainer_status["progressPercentage"] == 100, trainer_status
    posted = {m["name"]: float(m["value"]) for m in trainer_status["metrics"]}
    assert posted["world_size"] == 4.0 and posted["loss"] < 0.05, trainer_status
    assert result.progress == 100
    assert result.metrics["world_size"] == 4.0 and result.metrics["loss"] == pytest.approx(posted["loss"])
    # no log scraping on this path: with the status server present, report() never prints its log line
    assert not any("TRAINFLOW_REPORT" in text for text in logs.values())
    # the watch saw progress move while the job ran (intermediate reports, before Complete)
    running_progress = {p for state, p, _ in seen if state == "Running" and p is not None}
    assert any(p < 100 for p in running_progress), seen
    record("torch_ddp_2x2", {"seconds": round(elapsed, 1), "updates": len(seen)})
