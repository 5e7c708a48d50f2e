"""Submit throughput: TrainJobs validated and created per second, trainflow ``backend.submit`` vs the SDK's ``train()``.

Both create the same TrainJob (runtime torch-distributed, one node, one image) on the same API server, in a
fresh namespace each, sequentially (one caller) and from ``--threads`` threads sharing one client. The clients
take turns job by job (threaded: round by round), so each meets the same controller load and machine noise. The
Trainer controller reconciles both sets alike (JobSets and kwok pods). trainflow: request parsing,
runtime lookup (1 GET), manifest build, local CRD-schema validation, create (1 POST). SDK: runtime
lookup (namespaced GET, 404, then cluster GET), pydantic models, create (1 POST). Same command on both.
A third client is the floor no client can beat: the POST alone (the manifest trainflow renders, sent through
the kubernetes client), so the table also says how close trainflow comes to the API server's own cost.

Usage: python benchmarks/submit_throughput.py [--jobs 50] [--threads 8] [--json f]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

IMAGE = "registry.invalid/bench:0"
COMMAND = ["python", "-c", "print(1)"]


def trainflow_submitter(kubeconfig: str, namespace: str) -> Callable[[int], Any]:
    from trainflow.core.kube.backend import KubernetesBackend

    backend = KubernetesBackend(kubeconfig=kubeconfig, namespace=namespace)

    def submit(i: int) -> Any:
        return backend.submit(
            {"name": f"tf-{i:05d}", "image": IMAGE, "command": COMMAND, "num_nodes": 1, "runtime": B.RUNTIME}
        )

    return submit


def sdk_submitter(kubeconfig: str, namespace: str) -> Callable[[int], Any]:
    warnings.simplefilter("ignore")
    logging.getLogger("kubeflow").setLevel(logging.ERROR)
    from kubeflow.trainer import CustomTrainerContainer, KubernetesBackendConfig, TrainerClient
    from kubeflow.trainer.options import Name, TrainerCommand

    client = TrainerClient(
        backend_config=KubernetesBackendConfig(namespace=namespace, config_file=kubeconfig)
    )

    def submit(i: int) -> Any:
        return client.train(
            runtime=B.RUNTIME,
            trainer=CustomTrainerContainer(image=IMAGE, num_nodes=1),
            options=[Name(name=f"sdk-{i:05d}"), TrainerCommand(command=COMMAND)],
        )

    return submit


def bare_create_submitter(kubeconfig: str, namespace: str) -> Callable[[int], Any]:
    """One POST per job and nothing else: the manifest trainflow renders, renamed, through the kubernetes client."""
    import copy

    from kubernetes import client

    from trainflow.core.kube.backend import KubernetesBackend

    template = KubernetesBackend(kubeconfig=kubeconfig, namespace=namespace).render(
        {"name": "raw-template", "image": IMAGE, "command": COMMAND, "num_nodes": 1, "runtime": B.RUNTIME}
    )
    custom = client.CustomObjectsApi(B.api_client(kubeconfig))

    def submit(i: int) -> Any:
        manifest = copy.deepcopy(template)
        manifest["metadata"]["name"] = f"raw-{i:05d}"
        return custom.create_namespaced_custom_object(B.GROUP, B.VERSION, namespace, B.PLURAL, manifest)

    return submit


def interleaved(submitters: dict[str, Callable[[int], Any]], ids: range, threads: int) -> dict[str, float]:
    """Jobs per second of each client, taking turns in rounds (a job each sequentially, ``threads * 2`` jobs a
    round with threads) in a rotating order, so every client meets the same background: the controllers
    reconciling what the others created, the machine's other load."""
    spent = dict.fromkeys(submitters, 0.0)
    done = dict.fromkeys(submitters, 0)
    step = 1 if threads <= 1 else threads * 2
    names = list(submitters)
    pool = ThreadPoolExecutor(max_workers=threads) if threads > 1 else None
    try:
        for n, first in enumerate(range(ids.start, ids.stop, step)):
            chunk = range(first, min(first + step, ids.stop))
            for impl in names[n % len(names) :] + names[: n % len(names)]:
                start = time.perf_counter()
                if pool is None:
                    for i in chunk:
                        submitters[impl](i)
                else:
                    list(pool.map(submitters[impl], chunk))
                spent[impl] += time.perf_counter() - start
                done[impl] += len(chunk)
    finally:
        if pool is not None:
            pool.shutdown()
    return {impl: done[impl] / spent[impl] for impl in names}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=50, help="TrainJobs per mode and client")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--json")
    args = p.parse_args()
    kubeconfig = B.kubeconfig_path()
    api = B.api_client(kubeconfig)
    makers = {"trainflow": trainflow_submitter, "sdk": sdk_submitter, "create": bare_create_submitter}
    stamp = int(time.time()) % 100000
    spaces = {impl: f"bench-submit-{impl}-{stamp}" for impl in makers}
    try:
        submitters = {}
        for impl, make in makers.items():
            B.create_namespace(api, spaces[impl])
            submitters[impl] = make(kubeconfig, spaces[impl])
            submitters[impl](99999)  # warm: imports, connection, first runtime lookup
        seq = interleaved(submitters, range(args.jobs), 1)
        par = interleaved(submitters, range(args.jobs, 3 * args.jobs), args.threads)
    finally:
        for namespace in spaces.values():
            B.delete_namespace(api, namespace, wait=120)
    results = {impl: {"sequential_per_s": seq[impl], "threaded_per_s": par[impl]} for impl in makers}
    for impl, r in results.items():
        print(
            f"[submit] {impl}: {r['sequential_per_s']:.1f}/s sequential, "
            f"{r['threaded_per_s']:.1f}/s with {args.threads} threads",
            file=sys.stderr,
        )
    t, s, c = results["trainflow"], results["sdk"], results["create"]
    rows = [
        [
            mode,
            f"{t[key]:.1f}",
            f"{s[key]:.1f}",
            B.ratio(t[key], s[key]),
            f"{c[key]:.1f}",
            B.ratio(t[key], c[key]),
        ]
        for mode, key in (("sequential", "sequential_per_s"), (f"{args.threads} threads", "threaded_per_s"))
    ]
    heads = ["submit", "trainflow jobs/s", "SDK train() jobs/s", "trainflow / SDK", "bare POST jobs/s",
             "trainflow / bare POST"]  # fmt: skip
    print(B.table(heads, rows))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"jobs": args.jobs, "threads": args.threads, **results}, indent=1)
        )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    threading.stack_size(0)
    main()
