"""Local-engine overhead: the same trainer commands started by hand vs through get_backend("local").

By hand = N node processes with the env the engine would inject (PET_*, output URI), started together
and waited for. Engine = submit() + wait() (state directory, detached supervisor, status files, polling).
Two workloads: a trivial command (isolates the fixed cost) and a real 2x2 torchrun gloo all-reduce.
Prints medians and the difference.  Usage: python benchmarks/local_engine_overhead.py [--torch-runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainflow.core import get_backend
from trainflow.core.local import policies

ROOT = Path(__file__).resolve().parents[1]
ALLREDUCE = str(ROOT / "tests" / "integration" / "scripts" / "allreduce.py")


def by_hand(argv: list[str], nodes: int, nproc: int, out: Path) -> float:
    port = policies.free_port()
    base = policies.base_env(dict(os.environ))
    start = time.perf_counter()
    procs = []
    for rank in range(nodes):
        env = {
            **base,
            "PET_NNODES": str(nodes),
            "PET_NPROC_PER_NODE": str(nproc),
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(port),
            "TRAINFLOW_OUTPUT_URI": out.as_uri(),
        }
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - start
    assert codes == [0] * nodes, codes
    return elapsed


def engine(backend, argv: list[str], nodes: int, nproc: int, name: str) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    ref = backend.submit({"name": name, "command": argv, "num_nodes": nodes, "proc_per_node": nproc})
    result = backend.wait(ref, timeout=600)
    elapsed = time.perf_counter() - start
    assert result.succeeded, result
    return elapsed


def compare(backend, label: str, argv: list[str], nodes: int, nproc: int, runs: int, tmp: Path) -> None:  # type: ignore[no-untyped-def]
    hand, eng = [], []
    for i in range(runs):  # interleaved, so machine load drifts hit both sides alike
        hand.append(by_hand(argv, nodes, nproc, tmp / f"hand-{label}-{i}"))
        eng.append(engine(backend, argv, nodes, nproc, f"bench-{label}-{i}"))
    h, e = statistics.median(hand), statistics.median(eng)
    print(f"{label:>9}: by hand {h:7.3f}s   engine {e:7.3f}s   overhead {e - h:+.3f}s   (median of {runs})")
    print(f"{'':>9}  by hand runs {[round(x, 3) for x in hand]}  engine runs {[round(x, 3) for x in eng]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trivial-runs", type=int, default=10)
    parser.add_argument("--torch-runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainflow-bench-") as tmpdir:
        tmp = Path(tmpdir)
        backend = get_backend("local", home=tmp / "home", namespace="bench")
        start = time.perf_counter()
        backend.render({"name": "warm", "command": ["true"]})
        print(
            f"first render in this process (runtime catalog + CRD schema load, once): {time.perf_counter() - start:.3f}s"
        )
        if args.trivial_runs:
            compare(backend, "trivial", [sys.executable, "-c", "pass"], 2, 1, args.trivial_runs, tmp)
        if args.torch_runs:
            compare(backend, "torch-2x2", ["torchrun", ALLREDUCE], 2, 2, args.torch_runs, tmp)
        for job in backend.list():
            backend.cancel(job.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
