"""Pods mode of the testbed: start the real nodes and the in-cluster Trainer; stop them; report leftovers.

Called by testbed.py (``up --node-bin``, ``down``) with the helpers (toolkit.py) as ``tb``. Order at up: host
network (before the API server, which binds the node veth's host end), then after the control plane:
node PKI and RBAC, containerd (+ images), kubelet, kube-proxy, CoreDNS, JobSet's webhooks, the Trainer
controller in cluster (TrainJobStatus on, its status server), the default runtimes as users install them.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import configs
import node
import trainer


def net_of(L: Any) -> node.Net:
    """Node 0 (the API server binds its host side)."""
    return nets_of(L)[0]


def nets_of(L: Any) -> list[node.Net]:
    mode = json.loads(L.mode_file.read_text())
    return [node.Net(**n) for n in mode.get("nodes", [mode["net"]])]


def prepare(tb: Any, L: Any) -> None:
    nets = node.nets_for(L.port_base, node.node_count())
    node.prepare(tb, L, nets)
    L.pods, L.api_host = True, nets[0].host_ip
    L.mode_file.write_text(
        json.dumps(
            {
                "mode": "pods",
                "api_host": nets[0].host_ip,
                "ports": L.ports,
                "net": node.describe(nets[0]),
                "nodes": [node.describe(n) for n in nets],
            }
        )
    )


def down(tb: Any, L: Any) -> None:
    nets = nets_of(L)
    for net in nets:
        for name in ("coredns", "kube-proxy", "kubelet"):  # no more restarts, then no containers
            node.stop(tb, L, net.component(name))
    for net in nets:
        node.kill_containers(net)
    nb = node_bin(L)
    for net in nets:
        if nb is not None and tb.running(L, net.component("containerd")):
            trainer.remove_containers(configs.containerd_sock(L, net), nb)
        node.stop(tb, L, net.component("containerd"))
        node.kill_shims(L, net)
    tb.stop_all(L)
    node.cleanup_host(L, nets)
    left = {k: v for k, v in node.leftovers(L, nets).items() if v}
    if left:
        raise tb.TestbedError(f"pods mode left behind: {left}")
    L.mode_file.unlink()


def node_bin(L: Any) -> Path | None:
    f = L.dir / "node-bin.json"
    return Path(json.loads(f.read_text())["node_bin"]) if f.exists() else None


def state(L: Any) -> dict[str, Any]:
    nets = nets_of(L)
    nodes = [
        {
            **node.describe(n),
            "cluster_dns": n.node_ip,
            "containerd_socket": str(configs.containerd_sock(L, n)),
        }
        for n in nets
    ]
    return {
        "node": nodes[0],
        "nodes": nodes,
        "node_bin": str(node_bin(L)),
        "containerd_socket": str(configs.containerd_sock(L, nets[0])),
        "images": json.loads((L.dir / "images.json").read_text()),
        "trainer_namespace": trainer.NAMESPACE,
        "trainer_feature_gates": trainer.FEATURE_GATES,
    }


def start_containerd(tb: Any, L: Any, nb: Path, net: node.Net) -> None:
    name = net.component("containerd")
    argv = [str(nb / "containerd"), "--config", str(L.etc / f"{name}.toml")]
    tb.start(L, name, node.in_netns(net, argv), configs.env(nb))
    tb.wait_for(f"{name} socket", configs.containerd_sock(L, net).exists, 60 * tb.TS, watch=[name], L=L)


DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")


def start_kubelet_proxy_dns(tb: Any, L: Any, nb: Path, net: node.Net) -> None:
    name, env = net.component, configs.env(nb)
    kubelet = [
        str(nb / "kubelet"),
        "--config",
        str(L.etc / f"{name('kubelet')}.yaml"),
        "--kubeconfig",
        str(L.etc / f"{name('kubelet')}.kubeconfig"),
        "--root-dir",
        str(L.dir / "node" / name("kubelet")),
        "--hostname-override",
        net.node_name,
        "--node-ip",
        net.node_ip,
        "--v",
        "1",
    ]
    started = time.time()
    tb.start(L, name("kubelet"), node.in_netns(net, kubelet), env)
    # The device manager's registration socket ignores --root-dir (a fixed path), and each kubelet clears that
    # folder before it listens: two kubelets starting together race there and one exits ("bind: address
    # already in use"). So the next node's kubelet starts once this one listens.
    tb.wait_for(
        f"{name('kubelet')}'s device-plugin socket",
        lambda: DEVICE_PLUGIN_SOCKET.is_socket() and DEVICE_PLUGIN_SOCKET.stat().st_mtime >= started - 1,
        60 * tb.TS,
        interval=0.2,
        watch=[name("kubelet")],
        L=L,
    )
    proxy = [str(nb / "kube-proxy"), "--config", str(L.etc / f"{name('kube-proxy')}.yaml"), "--v", "1"]
    tb.start(L, name("kube-proxy"), node.in_netns(net, proxy), env)
    coredns = [str(nb / "coredns"), "-conf", str(L.etc / name("Corefile"))]
    tb.start(L, name("coredns"), node.in_netns(net, coredns), env)


def wait_node_ready(tb: Any, L: Any, k: Any, net: node.Net) -> None:
    watch = tb.components(L)
    tb.wait_for(
        f"node {net.node_name} Ready",
        lambda: (
            k.run(
                "get",
                "node",
                net.node_name,
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                check=False,
            ).stdout.strip()
            == "True"
        ),
        120 * tb.TS,
        interval=1,
        watch=watch,
        L=L,
    )
    tb.wait_for(
        f"CoreDNS of {net.node_name} to resolve kubernetes.default.svc.cluster.local",
        lambda: configs.dns_query(net.node_ip, "kubernetes.default.svc.cluster.local") == ["10.96.0.1"],
        60 * tb.TS,
        interval=1,
        watch=watch,
        L=L,
    )
    tb.log(f"node {net.node_name} Ready (containerd, kubelet, kube-proxy nftables, CoreDNS on {net.node_ip})")


def seed_roots(tb: Any, L: Any, nb: Path, nets: list[node.Net]) -> list[node.Net]:
    """Nodes without a containerd root of their own start from a hardlinked copy of node 0's, taken with its
    containerd stopped right after its import (content blobs and committed snapshots are never written again:
    what one node later deletes, it unlinks only from its own tree). A registry-less stand-in for nodes that
    pull the same images: it saves each further node the whole import (minutes for the runtimes image).
    Returns the nodes seeded."""
    fresh = [n for n in nets[1:] if not (L.dir / node.containerd_dir(n) / "root").exists()]
    if not fresh:
        return []
    first = nets[0]
    node.stop(tb, L, first.component("containerd"))
    t0 = time.time()
    for net in fresh:
        dest = L.dir / node.containerd_dir(net)
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["cp", "-a", "-l", str(L.dir / node.containerd_dir(first) / "root"), str(dest / "root")],
            check=True,
        )
        unshare_metadata(dest / "root")
    tb.log(f"containerd roots of {', '.join(n.node_name for n in fresh)} hardlinked from {first.node_name}'s "
           f"in {time.time() - t0:.1f}s")  # fmt: skip
    start_containerd(tb, L, nb, first)
    return fresh


# Under containerd's root, what is written once and then only read or unlinked: content blobs, and the trees
# of the snapshotter's snapshots. Everything else (the bolt databases above all) each node must own.
SHARED_TREES = ("io.containerd.content.v1.content/blobs", "io.containerd.snapshotter.v1.overlayfs/snapshots")


def unshare_metadata(root: Path) -> None:
    """Replace every hardlinked file outside SHARED_TREES with a copy of its own (a shared meta.db would be one
    database for two containerds)."""
    for top, dirs, files in os.walk(root):
        rel = os.path.relpath(top, root)
        dirs[:] = [d for d in dirs if os.path.normpath(os.path.join(rel, d)) not in SHARED_TREES]
        for name in files:
            path = Path(top) / name
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                mode = path.stat().st_mode
                path.unlink()
                path.write_bytes(data)
                path.chmod(mode & 0o7777)


def start_nodes(tb: Any, L: Any, k: Any, nb: Path, nets: list[node.Net]) -> None:
    """containerd and its images on every node (node 0 imports; a node without a root of its own starts from
    node 0's, the others import in parallel), then kubelet, kube-proxy and CoreDNS."""
    k.apply_objs(configs.node_rbac())
    archives = trainer.archives(L, nb)
    for net in nets:
        configs.write_configs(tb, L, nb, net)
    start_containerd(tb, L, nb, nets[0])

    def load(net: node.Net) -> list[dict[str, Any]]:
        return trainer.import_images(tb, configs.containerd_sock(L, net), nb, net.node_name, archives)

    images = load(nets[0])
    seeded = seed_roots(tb, L, nb, nets)
    for net in nets[1:]:
        start_containerd(tb, L, nb, net)
    with ThreadPoolExecutor(max(1, len(nets) - 1)) as pool:
        for entries in pool.map(load, nets[1:]):  # seeded nodes find every image present
            images += [{**e, "seeded_from": nets[0].node_name} if e["node"] in {n.node_name for n in seeded}
                       else e for e in entries]  # fmt: skip
    (L.dir / "images.json").write_text(json.dumps(images, indent=1))
    for net in nets:
        start_kubelet_proxy_dns(tb, L, nb, net)
    for net in nets:
        wait_node_ready(tb, L, k, net)


def up_node(tb: Any, L: Any, k: Any, nb: Path, trainer_upstream: Path) -> list[dict[str, Any]]:
    """Start the nodes and the in-cluster Trainer; returns the installed ClusterTrainingRuntimes."""
    t0 = time.time()
    nets = nets_of(L)
    (L.dir / "node-bin.json").write_text(json.dumps({"node_bin": str(nb)}))
    configs.node_pki(tb, L, nets)
    start_nodes(tb, L, k, nb, nets)
    # JobSet stays a host process: its webhooks on loopback, as in kwok mode.
    k.apply_objs([d for d in tb.webhook_configs(L) if d["metadata"]["name"].startswith("jobset-")])
    all_procs = tb.components(L)
    tb.wait_for(
        "JobSet validating webhook to answer",
        lambda: tb.probe_jobset_webhook(k),
        60 * tb.TS,
        watch=all_procs,
        L=L,
    )
    runtimes = trainer.install(tb, L, k, nb)
    tb.log(f"pods mode: {len(nets)} nodes + Trainer ready in {time.time() - t0:.0f}s")
    return runtimes
