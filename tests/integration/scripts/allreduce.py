"""2-node x 2-process gloo all-reduce: each rank contributes rank+1; rank 0 writes the sum and reports it."""

import json
import os
import sys

import torch
import torch.distributed as dist

from trainflow.core import output_dir, report


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    node = os.environ.get("PET_NODE_RANK")
    print(
        f"rank={rank} world={world} node={node} local_rank={os.environ.get('LOCAL_RANK')} sum={value.item()}",
        flush=True,
    )
    fail_rank = os.environ.get("FAIL_RANK")
    if fail_rank is not None and int(fail_rank) == rank:
        print(f"rank {rank} failing on purpose", flush=True)
        sys.stdout.flush()
        os._exit(int(os.environ.get("FAIL_CODE", "3")))
    if rank == 0:
        out = output_dir()
        (out / "result.json").write_text(json.dumps({"sum": value.item(), "world": world}))
    report(metrics={"sum": value.item(), "world": world, "note": "ok"}, progress=100)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
