"""Minimal reproductions of performance issues found in trainflow.core.kube while benchmarking the waits.

Each case creates N TrainJobs the Trainer controller skips, waits on them with ``wait_async`` in one event
loop, counts the API requests it causes (kube-apiserver metrics and the shared watch's own stats), prints
the figures and cleans up. Run against a testbed (``TRAINFLOW_TESTBED_DIR``).

  stuck-created   Jobs that stay Created (no jobsStatus) past ``submit_timeout``: every waiter LISTs
                  events for its job each time its window expires, so the cost is per job, not per namespace.
  slow-list       When the shared watch's first LIST takes longer than GRACE (5 s; simulated here by
                  GRACE=0), every waiter GETs its job after the list has already delivered it.
  import-race     The first waiters of a process import kubernetes_asyncio in a thread, but only while the
                  module is missing from sys.modules; a waiter arriving once the import has started sees
                  the half-imported module, starts the watch, and its ``from kubernetes_asyncio.client
                  import ...`` blocks the event loop on the import lock until the import ends. Compare
                  --n 1 with --n 50: the largest event-loop stall at start.
  window-herd     Waiters that start together wake up together: every ``submit_timeout / 4`` (75 s by
                  default; 10 s here) all N run ``asyncio.to_thread(_creation_stuck)`` at the same instant,
                  and the event loop stalls; watch events (completions) wait behind the herd. Prints the
                  event-loop lag per second and the moments it spikes.

Usage: python benchmarks/repro_core.py stuck-created|slow-list [--n 200] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B


async def wait_all(backend: Any, names: list[str], seconds: float) -> int:
    async def one(name: str) -> None:
        await backend.wait_async(name, timeout=seconds)

    results = await asyncio.gather(*(one(n) for n in names), return_exceptions=True)
    return sum(1 for r in results if isinstance(r, BaseException))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", choices=["stuck-created", "slow-list", "window-herd", "import-race"])
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--seconds", type=float, default=60.0)
    args = p.parse_args()
    from trainflow.core.kube import shared_watch
    from trainflow.core.kube.backend import KubernetesBackend

    kubeconfig = B.kubeconfig_path()
    api = B.api_client(kubeconfig)
    namespace = f"bench-repro-{args.case}-{int(time.time()) % 100000}"
    names = [f"r{i:05d}" for i in range(args.n)]
    B.create_namespace(api, namespace)
    try:
        B.create_trainjobs(api, namespace, names)
        if args.case == "stuck-created":
            # created long enough ago: submit_timeout=10 s stands in for the default 300 s (window 75 s)
            backend = KubernetesBackend(kubeconfig=kubeconfig, namespace=namespace, submit_timeout=10)
            time.sleep(11)
        elif args.case == "slow-list":
            B.set_statuses(api, namespace, names, lambda: B.RUNNING_STATUS)
            backend = KubernetesBackend(kubeconfig=kubeconfig, namespace=namespace)
            shared_watch.GRACE = 0.0  # what a first LIST slower than 5 s does to every waiter
        elif args.case == "import-race":
            B.set_statuses(api, namespace, names, lambda: B.RUNNING_STATUS)
            backend = KubernetesBackend(kubeconfig=kubeconfig, namespace=namespace)
        else:
            B.set_statuses(api, namespace, names, lambda: B.RUNNING_STATUS)
            backend = KubernetesBackend(kubeconfig=kubeconfig, namespace=namespace, submit_timeout=40)
        c0, t0 = B.request_counts(api), time.time()
        lags: list[tuple[float, float]] = []

        async def lag_probe() -> None:
            loop = asyncio.get_running_loop()
            while True:
                before = loop.time()
                await asyncio.sleep(0.01)
                lags.append((time.time() - t0, loop.time() - before - 0.01))

        async def run() -> tuple[int, Any]:
            probe = asyncio.create_task(lag_probe())
            timed_out = await wait_all(backend, names, args.seconds)
            probe.cancel()
            reg = shared_watch.registry()
            return timed_out, reg.stats(backend.watch_key(namespace))

        timed_out, stats = asyncio.run(run())
        c1, t1 = B.request_counts(api), time.time()
        d = B.breakdown(B.delta(c1, c0))
        minutes = (t1 - t0) / 60
        print(f"case {args.case}: N={args.n}, {t1 - t0:.0f}s, waits ended by timeout/error: {timed_out}")
        print(f"  shared watch stats: {vars(stats) if stats else None}")
        print(f"  API requests on trainjobs/pods/events during the waits: {d}")
        extra = sum(v for k, v in d.items() if k.startswith(("LIST events", "GET trainjobs")))
        print(f"  per-job requests besides the shared watch: {extra / args.n:.2f} per job "
              f"({extra / (args.n * minutes):.2f} per job-minute)")  # fmt: skip
        per_second: dict[int, float] = {}
        for at, lag in lags:
            per_second[int(at)] = max(per_second.get(int(at), 0.0), lag)
        spikes = {s: round(v * 1000) for s, v in per_second.items() if v > 0.1}
        quiet = sorted(v for v in per_second.values())
        print(f"  largest event-loop stall: {1000 * max(v for _, v in lags):.0f} ms")
        print(f"  event-loop lag: median of per-second max {1000 * quiet[len(quiet) // 2]:.0f} ms; "
              f"seconds with a stall > 100 ms (second: ms): {spikes}")  # fmt: skip
    finally:
        B.delete_namespace(api, namespace, wait=60)


if __name__ == "__main__":
    main()
