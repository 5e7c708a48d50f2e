"""The measured waiters of benchmarks/wait_cost.py, one per subprocess (``wait_cost.py --role waiter``):
trainflow's shared-watch ``wait_async``, the poll loop of Airflow's ``KubernetesJobTrigger`` and the Kubeflow
SDK's ``wait_for_job_status``. Each records when every job's wait returned and its own peak memory and CPU."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

POLL_INTERVAL = 10.0  # Airflow KubernetesJobTrigger default poll_interval
SDK_INTERVAL = 2  # TrainerClient.wait_for_job_status default polling_interval
WAIT_TIMEOUT = 3600


def _terminal(obj: dict[str, Any]) -> bool:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return True
    return False


async def _wait_trainflow(kubeconfig: str, namespace: str, names: list[str], out: dict[str, Any]) -> None:
    from trainflow.core.kube.backend import KubernetesBackend
    from trainflow.core.kube.shared_watch import registry

    backend = KubernetesBackend(kubeconfig=kubeconfig, namespace=namespace)
    returned: dict[str, float] = out["returned"]
    seen: dict[str, float] = out.setdefault("seen", {})

    async def one(name: str) -> None:
        def on_update(result: Any) -> None:  # the watch event, before finish() reads metrics
            if result.state.terminal:
                seen[name] = time.time()

        await backend.wait_async(name, timeout=WAIT_TIMEOUT, on_update=on_update)
        returned[name] = time.time()

    tasks = [asyncio.create_task(one(n)) for n in names]
    reg = registry()
    key: Any = None
    while True:  # ready once the shared watch has listed the namespace (keyed by connection and namespace)
        key = next((k for k in reg.watches if k[1] == namespace), None)
        if key is not None and reg.watches[key].settled.is_set():
            break
        if all(t.done() for t in tasks):
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    print("READY", flush=True)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    out["errors"] = [repr(r) for r in results if isinstance(r, BaseException)][:5]
    stats = reg.stats(key) if hasattr(reg, "stats") else None
    if stats is None and key in reg.watches:
        stats = reg.watches[key].stats
    out["stats"] = dict(vars(stats)) if stats is not None else {}
    out["watches_started"] = reg.started


async def _wait_poll(
    kubeconfig: str, namespace: str, names: list[str], out: dict[str, Any], fresh_client: bool
) -> None:
    from kubernetes_asyncio import config
    from kubernetes_asyncio.client import ApiClient, Configuration, CustomObjectsApi

    returned: dict[str, float] = out["returned"]
    counters = {"gets": 0}
    cfg = Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)

    async def get(custom: CustomObjectsApi, name: str) -> dict[str, Any]:
        counters["gets"] += 1
        obj: dict[str, Any] = await custom.get_namespaced_custom_object(
            B.GROUP, B.VERSION, namespace, B.PLURAL, name
        )
        return obj

    async with ApiClient(cfg) as shared:

        async def one(name: str) -> None:
            await asyncio.sleep(random.uniform(0, POLL_INTERVAL))  # triggers start at different moments
            while True:
                if fresh_client:  # AsyncKubernetesHook.get_conn: load the config, new ApiClient, close it
                    fresh = Configuration()
                    await config.load_kube_config(config_file=kubeconfig, client_configuration=fresh)
                    async with ApiClient(fresh) as api:
                        obj = await get(CustomObjectsApi(api), name)
                else:
                    obj = await get(CustomObjectsApi(shared), name)
                if _terminal(obj):
                    returned[name] = time.time()
                    return
                await asyncio.sleep(POLL_INTERVAL)

        tasks = [asyncio.create_task(one(n)) for n in names]
        print("READY", flush=True)
        results = await asyncio.gather(*tasks, return_exceptions=True)
    out["errors"] = [repr(r) for r in results if isinstance(r, BaseException)][:5]
    out["stats"] = counters


def _wait_sdk(kubeconfig: str, namespace: str, names: list[str], out: dict[str, Any]) -> None:
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.getLogger("kubeflow").setLevel(logging.ERROR)
    from kubeflow.trainer import KubernetesBackendConfig, TrainerClient

    client = TrainerClient(
        backend_config=KubernetesBackendConfig(namespace=namespace, config_file=kubeconfig)
    )
    returned: dict[str, float] = out["returned"]
    errors: list[str] = []

    def one(name: str) -> None:
        time.sleep(random.uniform(0, SDK_INTERVAL))
        try:
            client.wait_for_job_status(name, timeout=WAIT_TIMEOUT, polling_interval=SDK_INTERVAL)
            returned[name] = time.time()
        except Exception as exc:
            errors.append(repr(exc))

    threading.stack_size(512 * 1024)
    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in names]
    for t in threads:
        t.start()
    print("READY", flush=True)
    for t in threads:
        t.join()
    out["errors"] = errors[:5]
    out["stats"] = {"threads": len(threads)}


def waiter_main(args: argparse.Namespace) -> None:
    names = Path(args.names_file).read_text().split()
    out: dict[str, Any] = {
        "impl": args.impl,
        "returned": {},
        "errors": [],
        "stats": {},
        "t_start": time.time(),
    }
    if args.impl == "trainflow":
        asyncio.run(_wait_trainflow(args.kubeconfig, args.namespace, names, out))
    elif args.impl in ("poll", "poll-fresh"):
        asyncio.run(_wait_poll(args.kubeconfig, args.namespace, names, out, args.impl == "poll-fresh"))
    elif args.impl == "sdk":
        _wait_sdk(args.kubeconfig, args.namespace, names, out)
    else:
        raise SystemExit(f"unknown impl {args.impl}")
    out["t_end"] = time.time()
    out["self"] = B.self_peak()
    Path(args.out).write_text(json.dumps(out))
