"""One testbed instance: bring it up (control plane, then kwok mode or pods mode), take it down, report it."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import control_plane
import kwok
import toolkit
from kubectl import Kubectl
from layout import CONTEXT, TRAINER_FEATURE_GATES, TS, Layout, TestbedError, components, log, read_versions
from pki import make_pki, write_kubeconfig
from procs import instance_pids, pid_of, running, stop_all
from ready import admin_ssl, http_ok, port_free, wait_for


def _pods() -> Any:
    """testbed/node/ (pods mode), imported only when used."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "node"))
    import pods

    return pods


def _kueue() -> Any:
    """testbed/kueue/ (Kueue mode), imported only when used."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "kueue"))
    import kueue

    return kueue


def _objstore() -> Any:
    """testbed/objstore/ (object-store mode), imported only when used."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "objstore"))
    import objstore

    return objstore


def up(
    L: Layout,
    trainer_upstream: Path,
    node_bin: Path | None = None,
    kueue_bin: Path | None = None,
    objstore_bin: Path | None = None,
) -> None:
    want_pods, want_kueue = node_bin is not None, kueue_bin is not None
    same_mode = (
        L.pods == want_pods
        and L.kueue_file.exists() == want_kueue
        and L.objstore_file.exists() == (objstore_bin is not None)
    )
    if L.state_file.exists() and same_mode and all(running(L, n) for n in components(L)):
        try:
            if http_ok(f"https://{L.api_host}:{L.ports['apiserver']}/readyz", admin_ssl(L)):
                log(f"testbed already up in {L.dir}")
                return
        except Exception:
            pass
    if instance_pids(L) or L.pods or L.kueue_file.exists() or L.objstore_file.exists():
        log("stale testbed found; stopping it first")
        down(L)
    t0 = time.time()
    for d in (
        L.pki,
        L.logs,
        L.pids,
        L.etc,
        L.data,
        L.dir / "tmp",
        L.dir / "webhook-certs",
        L.dir / "objstore-data",
    ):
        if d.exists():
            shutil.rmtree(d)
    for f in (L.state_file, L.env_file, L.kubeconfig, L.mode_file, L.dir / "objstore-credentials.json"):
        if f.exists():
            f.unlink()
    for d in (L.pki, L.logs, L.pids, L.etc, L.data, L.dir / "tmp" / "trainer"):
        d.mkdir(parents=True, exist_ok=True)
    wanted = {**L.ports, **(_kueue().ports(L) if want_kueue else {})}
    busy = [f"{k}={p}" for k, p in wanted.items() if not port_free(p)]
    if busy:
        raise TestbedError(
            f"ports in use on 127.0.0.1: {', '.join(busy)} "
            "(set TRAINFLOW_TESTBED_PORT_BASE to move the testbed)"
        )
    if want_kueue:
        _kueue().hold_ports(L)  # started last: its ports must not become the control plane's source ports
    pods = _pods() if want_pods else None
    if pods is not None:
        # The node's network first: the API server binds the host end of the node's veth.
        pods.prepare(toolkit, L)
    make_pki(L, (f"IP:{L.api_host}",) if L.pods else ())
    write_kubeconfig(L, L.kubeconfig, "admin")
    write_kubeconfig(L, L.etc / "kube-controller-manager.kubeconfig", "kube-controller-manager")
    write_kubeconfig(L, L.etc / "kube-scheduler.kubeconfig", "kube-scheduler")
    api = control_plane.api_url(L)
    control_plane.start_etcd(L)
    control_plane.start_apiserver(L)
    k = Kubectl(L)
    control_plane.start_kcm_and_scheduler(L)
    control_plane.install_crds(L, k, trainer_upstream)
    control_plane.start_jobset(L)
    if not L.pods:
        kwok.start_kwok(L)
        kwok.start_local_trainer(L)
    all_procs = [n for n in components(L) if pid_of(L, n)]  # started so far
    control_plane.wait_controllers(L, all_procs)
    if L.pods:
        assert pods is not None and node_bin is not None
        runtimes = pods.up_node(toolkit, L, k, Path(node_bin), trainer_upstream)
    else:
        runtimes = kwok.trainer_ready(L, k, trainer_upstream)
    extra = pods.state(L) if pods is not None else {}
    if kueue_bin is not None:  # after the Trainer answers: Kueue's TrainJob integration reads its runtimes
        extra.update(_kueue().up(toolkit, L, k, kueue_bin, "torch-distributed"))
    if objstore_bin is not None:
        extra.update(_objstore().up(toolkit, L, k, objstore_bin))
    wait_for(
        "ServiceAccount default/default",
        lambda: k.run("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0,
        60 * TS,
        watch=all_procs,
        L=L,
    )
    write_state(L, api, trainer_upstream, runtimes, time.time() - t0, extra)


def write_state(
    L: Layout,
    api: str,
    trainer_upstream: Path,
    runtimes: list[dict],
    elapsed: float,
    pods_state: dict[str, Any],
) -> None:
    """state.json (what tests read about the instance) and env (shell exports for it)."""
    assert L.bin is not None
    P = L.ports
    state = {
        "dir": str(L.dir),
        "bin": str(L.bin),
        "kubeconfig": str(L.kubeconfig),
        "context": CONTEXT,
        "server": api,
        "ports": P,
        "versions": read_versions(L.bin),
        "webhooks": True,
        "mode": "pods" if L.pods else "kwok",
        "trainer_feature_gates": TRAINER_FEATURE_GATES,
        "kwok_nodes": [] if L.pods else kwok.KWOK_NODES,
        "kwok_fail_label": kwok.FAIL_LABEL,
        "simulated_log_lines": [ln.split(" ", 3)[3] for ln in kwok.SIMULATED_LOG.splitlines()],
        "runtimes": [r["metadata"]["name"] for r in runtimes],
        "trainer_upstream": str(trainer_upstream),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "start_seconds": round(elapsed, 1),
        **pods_state,
    }
    L.state_file.write_text(json.dumps(state, indent=2) + "\n")
    L.env_file.write_text(
        "".join(
            f"export {k_}={v}\n"
            for k_, v in {
                "TRAINFLOW_TESTBED_DIR": L.dir,
                "TRAINFLOW_TESTBED_KUBECONFIG": L.kubeconfig,
                "TRAINFLOW_TESTBED_CONTEXT": CONTEXT,
                "TRAINFLOW_TESTBED_SERVER": api,
                "TRAINFLOW_TESTBED_BIN": L.bin,
                "KUBECONFIG": L.kubeconfig,
            }.items()
        )
    )
    log(f"testbed up in {elapsed:.1f}s: kubeconfig {L.kubeconfig} (source {L.env_file})")


def down(L: Layout) -> None:
    """Stop every process of the instance (in pods mode also undo the node's host changes) and free the disk
    its data held."""
    if L.pods:
        _pods().down(toolkit, L)
    else:
        stop_all(L)
    for f in (L.state_file, L.kueue_file, L.objstore_file):
        if f.exists():
            f.unlink()
    # what the next up wipes anyway: etcd's data, the store's objects, scratch; the logs stay for a post-mortem
    for d in (L.data, L.dir / "tmp", L.dir / "objstore-data"):
        if d.exists():
            shutil.rmtree(d, ignore_errors=True)


def status(L: Layout) -> int:
    ok = True
    for name in components(L):
        r = running(L, name)
        ok &= r
        print(f"{name:28s} {'running pid ' + str(pid_of(L, name)) if r else 'NOT RUNNING'}")
    if L.state_file.exists():
        print(L.state_file.read_text())
    else:
        ok = False
        print(f"no state file {L.state_file}")
    return 0 if ok else 1
