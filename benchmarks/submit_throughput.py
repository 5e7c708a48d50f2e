"""Submit throughput: TrainJobs validated and created per second, trainflow ``backend.submit`` vs the SDK's ``train()``.

Both create the same TrainJob (runtime torch-distributed, one node, one image) on the same API server, in a
fresh namespace each, sequentially (one caller) and from ``--threads`` threads sharing one client. The
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


def rate(submit: Callable[[int], Any], ids: range, threads: int) -> float:
    start = time.perf_counter()
    if threads <= 1:
        for i in ids:
            submit(i)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(submit, ids))
    return len(ids) / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=50, help="TrainJobs per mode and client")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--json")
    args = p.parse_args()
    kubeconfig = B.kubeconfig_path()
    api = B.api_client(kubeconfig)
    makers = {"trainflow": trainflow_submitter, "sdk": sdk_submitter, "create": bare_create_submitter}
    results: dict[str, dict[str, float]] = {}
    for impl, make in makers.items():
        namespace = f"bench-submit-{impl}-{int(time.time()) % 100000}"
        B.create_namespace(api, namespace)
        try:
            submit = make(kubeconfig, namespace)
            submit(99999)  # warm: imports, connection, first runtime lookup
            seq = rate(submit, range(args.jobs), 1)
            par = rate(submit, range(args.jobs, 3 * args.jobs), args.threads)
            results[impl] = {"sequential_per_s": seq, "threaded_per_s": par}
            print(
                f"[submit] {impl}: {seq:.1f}/s sequential, {par:.1f}/s with {args.threads} threads",
                file=sys.stderr,
            )
        finally:
            B.delete_namespace(api, namespace, wait=120)
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
