"""Pods mode of the testbed: start the real node and the in-cluster Trainer; stop them; report leftovers.

Called by testbed.py (``up --node-bin``, ``down``) with the testbed module as ``tb``. Order at up: host
network (before the API server, which binds the node veth's host end), then after the control plane:
node PKI and RBAC, containerd (+ images), kubelet, kube-proxy, CoreDNS, JobSet's webhooks, the Trainer
controller in cluster (TrainJobStatus on, its status server), the default runtimes as users install them.
"""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import time
from pathlib import Path
from typing import Any

import node
import trainer
import yaml

PATH_EXTRA = "/usr/sbin:/sbin"


def net_of(L: Any) -> node.Net:
    return node.Net(**json.loads(L.mode_file.read_text())["net"])


def prepare(tb: Any, L: Any) -> None:
    net = node.net_for(L.port_base)
    node.prepare(tb, L, net)
    L.pods, L.api_host = True, net.host_ip
    L.mode_file.write_text(
        json.dumps({"mode": "pods", "api_host": net.host_ip, "ports": L.ports, "net": node.describe(net)})
    )


def down(tb: Any, L: Any) -> None:
    net = net_of(L)
    for name in ("coredns", "kube-proxy", "kubelet"):  # no more restarts, then no containers
        node.stop(tb, L, name)
    node.kill_containers(net)
    nb = node_bin(L)
    if nb is not None and tb.running(L, "containerd"):
        trainer.remove_containers(L, nb)
    node.stop(tb, L, "containerd")
    node.kill_shims(L)
    tb.stop_all(L)
    node.cleanup_host(L, net)
    left = {k: v for k, v in node.leftovers(L, net).items() if v}
    if left:
        raise tb.TestbedError(f"pods mode left behind: {left}")
    L.mode_file.unlink()


def node_bin(L: Any) -> Path | None:
    f = L.dir / "node-bin.json"
    return Path(json.loads(f.read_text())["node_bin"]) if f.exists() else None


def state(L: Any) -> dict[str, Any]:
    net = net_of(L)
    return {
        "node": {**node.describe(net), "cluster_dns": net.node_ip},
        "node_bin": str(node_bin(L)),
        "containerd_socket": str(containerd_sock(L)),
        "images": json.loads((L.dir / "images.json").read_text()),
        "trainer_namespace": trainer.NAMESPACE,
        "trainer_feature_gates": trainer.FEATURE_GATES,
    }


def containerd_sock(L: Any) -> Path:
    return L.dir / "containerd" / "containerd.sock"


# --------------------------------------------------------------------------- PKI and RBAC


def node_pki(tb: Any, L: Any, net: node.Net) -> None:
    tb.leaf(L, "kubelet", f"system:node:{net.node_name}", "system:nodes", [], "clientAuth")
    tb.leaf(
        L, "kubelet-serving", net.node_name, None, [f"IP:{net.node_ip}", f"DNS:{net.node_name}"], "serverAuth"
    )
    tb.leaf(L, "kube-proxy", "system:kube-proxy", None, [], "clientAuth")
    tb.leaf(L, "coredns", "trainflow-testbed:coredns", None, [], "clientAuth")
    for f in L.pki.glob("*.key"):
        f.chmod(0o600)
    for user in ("kubelet", "kube-proxy", "coredns"):
        tb.write_kubeconfig(L, L.etc / f"{user}.kubeconfig", user)


def node_rbac() -> list[dict[str, Any]]:
    """The API server's kubelet-client identity may use the kubelet API (logs, exec), as kubeadm grants;
    CoreDNS reads Services, EndpointSlices, Pods and Namespaces."""
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "trainflow-testbed:apiserver-kubelet-api-admin"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:kubelet-api-admin",
            },
            "subjects": [
                {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "User",
                    "name": "kube-apiserver-kubelet-client",
                }
            ],
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": {"name": "trainflow-testbed:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "trainflow-testbed:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "trainflow-testbed:coredns",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "trainflow-testbed:coredns"}
            ],
        },
    ]


# --------------------------------------------------------------------------- node processes


def containerd_config(L: Any, nb: Path) -> str:
    cd = L.dir / "containerd"
    return f"""version = 3
root = '{cd / "root"}'
state = '{cd / "state"}'
[grpc]
  address = '{containerd_sock(L)}'
[ttrpc]
  address = '{containerd_sock(L)}.ttrpc'
[debug]
  level = 'warn'
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{_versions(nb)["pause_image"]}'
[plugins.'io.containerd.cri.v1.runtime']
  # This machine's sandbox drops CAP_SYS_RESOURCE: nothing may lower oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = false
      BinaryName = '{nb / "runc"}'
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['{nb / "cni"}']
    conf_dir = '{L.etc / "cni"}'
"""


def cni_config(L: Any, net: node.Net) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "trainflow-testbed",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(L.dir / "node" / "cni-ipam"),
                    "ranges": [[{"subnet": net.pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(L: Any, net: node.Net) -> dict[str, Any]:
    pki = L.pki
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine mounts cgroup v1: the documented opt-out of KEP-5573's refusal (default true since 1.35).
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{net.cgroup}",
        "containerRuntimeEndpoint": f"unix://{containerd_sock(L)}",
        "address": net.node_ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(pki / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local",
        "clusterDNS": [net.node_ip],
        "resolvConf": str(L.etc / "node-resolv.conf"),
        "podLogsDir": str(L.dir / "node" / "pod-logs"),
        "failSwapOn": True,
        "serializeImagePulls": False,
        # Secret/ConfigMap volumes (the Trainer's webhook certs) refresh within seconds, not a minute.
        "syncFrequency": "10s",
        "imageGCHighThresholdPercent": 100,
        "evictionHard": {"nodefs.available": "0%", "nodefs.inodesFree": "0%", "imagefs.available": "0%"},
        "maxPods": 110,
    }


def kube_proxy_config(L: Any, net: node.Net) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(L.etc / "kube-proxy.kubeconfig")},
        "hostnameOverride": net.node_name,
        "bindAddress": net.node_ip,
        "clusterCIDR": net.pod_cidr,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {"maxPerCore": 0},
    }


def corefile(L: Any, net: node.Net, context: str) -> str:
    # No `forward`: names outside the cluster never leave the node's network namespace.
    return f""".:53 {{
    bind {net.node_ip}
    errors
    ready 127.0.0.1:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {L.etc / "coredns.kubeconfig"} {context}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
    loop
}}
"""


def _versions(nb: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (nb / "VERSIONS").read_text().split() if "=" in line)


def _env(nb: Path) -> dict[str, str]:
    return {"PATH": f"{nb}:{os.environ.get('PATH', '')}:{PATH_EXTRA}"}


def dns_query(server: str, name: str, timeout: float = 2.0) -> list[str]:
    """A records for ``name`` from ``server`` (one UDP query, no retries)."""
    qid = random.randrange(65536)
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(q, (server, 53))
        data = s.recv(4096)
    an = struct.unpack(">H", data[6:8])[0]
    i = len(q)  # the answer section follows the echoed header and question
    out = []
    for _ in range(an):
        i += 2 if data[i] & 0xC0 == 0xC0 else data.index(b"\0", i) - i + 1
        rtype, _cls, _ttl, rdlen = struct.unpack(">HHIH", data[i : i + 10])
        i += 10
        if rtype == 1:
            out.append(".".join(str(b) for b in data[i : i + 4]))
        i += rdlen
    return out


def start_node(tb: Any, L: Any, k: Any, nb: Path, net: node.Net) -> None:
    (L.etc / "cni").mkdir(parents=True, exist_ok=True)
    (L.dir / "node").mkdir(exist_ok=True)
    (L.etc / "cni" / "10-trainflow.conflist").write_text(json.dumps(cni_config(L, net), indent=1))
    (L.etc / "containerd.toml").write_text(containerd_config(L, nb))
    (L.etc / "node-resolv.conf").write_text("# pods mode: cluster DNS only (CoreDNS on the node IP)\n")
    (L.etc / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_config(L, net)))
    (L.etc / "kube-proxy.yaml").write_text(yaml.safe_dump(kube_proxy_config(L, net)))
    (L.etc / "Corefile").write_text(corefile(L, net, tb.CONTEXT))
    k.apply_objs(node_rbac())
    env = _env(nb)
    tb.start(
        L,
        "containerd",
        node.in_netns(net, [str(nb / "containerd"), "--config", str(L.etc / "containerd.toml")]),
        env,
    )
    tb.wait_for("containerd socket", containerd_sock(L).exists, 60 * tb.TS, watch=["containerd"], L=L)
    images = trainer.import_images(tb, L, nb)
    (L.dir / "images.json").write_text(json.dumps(images, indent=1))
    kubelet = [
        str(nb / "kubelet"),
        "--config",
        str(L.etc / "kubelet.yaml"),
        "--kubeconfig",
        str(L.etc / "kubelet.kubeconfig"),
        "--root-dir",
        str(L.dir / "node" / "kubelet"),
        "--hostname-override",
        net.node_name,
        "--node-ip",
        net.node_ip,
        "--v",
        "1",
    ]
    tb.start(L, "kubelet", node.in_netns(net, kubelet), env)
    proxy = [str(nb / "kube-proxy"), "--config", str(L.etc / "kube-proxy.yaml"), "--v", "1"]
    tb.start(L, "kube-proxy", node.in_netns(net, proxy), env)
    tb.start(L, "coredns", node.in_netns(net, [str(nb / "coredns"), "-conf", str(L.etc / "Corefile")]), env)
    watch = list(node.NODE_COMPONENTS)
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
        "CoreDNS to resolve kubernetes.default.svc.cluster.local",
        lambda: dns_query(net.node_ip, "kubernetes.default.svc.cluster.local") == ["10.96.0.1"],
        60 * tb.TS,
        interval=1,
        watch=watch,
        L=L,
    )
    tb.log(f"node {net.node_name} Ready (containerd, kubelet, kube-proxy nftables, CoreDNS on {net.node_ip})")


def up_node(tb: Any, L: Any, k: Any, nb: Path, trainer_upstream: Path) -> list[dict[str, Any]]:
    """Start the node and the in-cluster Trainer; returns the installed ClusterTrainingRuntimes."""
    t0 = time.time()
    net = net_of(L)
    (L.dir / "node-bin.json").write_text(json.dumps({"node_bin": str(nb)}))
    node_pki(tb, L, net)
    start_node(tb, L, k, nb, net)
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
    tb.log(f"pods mode node + Trainer ready in {time.time() - t0:.0f}s")
    return runtimes
