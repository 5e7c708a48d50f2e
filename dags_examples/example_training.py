"""Training and evaluation code shared by the example DAGs, the KFP pipeline and the demo.

``train_regression`` is shipped into the TrainJob as a function trainer: it must stay self-contained
(imports inside), because its source is what runs on every node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def train_regression(
    epochs: int = 60,
    lr: float = 0.1,
    seed: int = 0,
    samples_per_rank: int = 256,
    report_every: int = 4,
    epoch_seconds: float = 0.0,
) -> None:
    """Fit y = 3*x1 - 2*x2 + 0.5 with DistributedDataParallel over gloo; rank 0 saves and reports the loss and
    progress every ``report_every`` epochs (the ETA is extrapolated from progress). ``epoch_seconds`` paces
    the epochs, to watch a run live (a demo, a UI check)."""
    import json
    import os
    import time

    import torch
    import torch.distributed as dist

    from trainflow.core.reporting import output_dir, report

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    true_w, true_b = torch.tensor([3.0, -2.0]), 0.5
    x = torch.randn(samples_per_rank, 2, generator=gen)
    y = x @ true_w + true_b + 0.01 * torch.randn(samples_per_rank, generator=gen)
    model = torch.nn.Linear(2, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr)
    mean_loss = float("nan")
    for epoch in range(epochs):
        optimizer.zero_grad()
        loss = ((ddp(x).squeeze(-1) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        mean_loss = total.item() / world
        if rank == 0 and (epoch % 10 == 0 or epoch == epochs - 1):
            print(f"epoch={epoch} loss={mean_loss:.6f} world_size={world}", flush=True)
        if rank == 0 and (epoch + 1) % report_every == 0:
            report(metrics={"loss": mean_loss}, progress=int(100 * (epoch + 1) / epochs))
        if epoch_seconds:
            time.sleep(epoch_seconds)
    if rank == 0:
        out = output_dir()
        out.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), out / "model.pt")
        info = {
            "world_size": world,
            "epochs": epochs,
            "lr": lr,
            "node_rank": os.environ.get("GROUP_RANK", "0"),
        }
        (out / "training.json").write_text(json.dumps(info))
        report(metrics={"train_loss": mean_loss, "world_size": world}, progress=100)
        print(f"saved model to {out / 'model.pt'}", flush=True)
    dist.destroy_process_group()


def evaluate_model(model_path: str | Path, samples: int = 1024, seed: int = 12345) -> dict[str, Any]:
    """Load the weights the trainer wrote and measure them on fresh held-out data."""
    import torch

    state = torch.load(Path(model_path), map_location="cpu", weights_only=True)
    model = torch.nn.Linear(2, 1)
    model.load_state_dict(state)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 2, generator=gen)
    y = x @ torch.tensor([3.0, -2.0]) + 0.5
    with torch.no_grad():
        mse = float(((model(x).squeeze(-1) - y) ** 2).mean())
    weights = [round(v, 4) for v in model.weight.detach().flatten().tolist()]
    return {"mse": mse, "weights": weights, "bias": round(model.bias.detach().item(), 4)}
