"""Can the Kubeflow SDK's LocalProcessBackend run the local-engine benchmark's torch job offline? Measure it.

The SDK's local runtime is single-node (``num_nodes`` fixed at 1, so no 2x2 job) and installs ``torch``
into a fresh venv for every job. This probe runs a one-node torch function through it with pip kept
offline (``PIP_NO_INDEX=1``; ``--online`` lets pip reach the configured index) and prints how it ended
and how long it took, as JSON on the last line.

Usage: python benchmarks/sdk_local_process.py [--online] [--timeout 300]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import warnings


def train() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    print(f"rank={dist.get_rank()} world={dist.get_world_size()} sum={t.item()}")
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--online", action="store_true", help="let pip download torch (GBs) from the index")
    p.add_argument("--timeout", type=int, default=300)
    args = p.parse_args()
    if not args.online:
        os.environ["PIP_NO_INDEX"] = "1"
    warnings.simplefilter("ignore")
    logging.getLogger("kubeflow").setLevel(logging.ERROR)
    from kubeflow.trainer import CustomTrainer, LocalProcessBackendConfig, TrainerClient

    client = TrainerClient(backend_config=LocalProcessBackendConfig(cleanup_venv=True))
    start = time.perf_counter()
    outcome: dict[str, object] = {"online": args.online, "num_nodes": 1}
    try:
        runtime = client.get_runtime("torch-distributed")
        name = client.train(runtime=runtime, trainer=CustomTrainer(func=train, num_nodes=1))
        job = client.wait_for_job_status(
            name, status={"Complete", "Failed"}, timeout=args.timeout, polling_interval=1
        )
        outcome["status"] = job.status
        outcome["log_tail"] = [line[:200] for line in list(client.get_job_logs(name))[-4:]]
    except Exception as exc:
        outcome["status"] = "Error"
        outcome["error"] = f"{type(exc).__name__}: {exc}"[:300]
    outcome["seconds"] = round(time.perf_counter() - start, 2)
    print(json.dumps(outcome))


if __name__ == "__main__":
    main()
