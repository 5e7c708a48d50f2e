"""Pods mode: the files each node's components read (containerd, CNI, kubelet, kube-proxy, CoreDNS), the
nodes' PKI and RBAC, and a one-query DNS probe. Called by pods.py with the testbed module as ``tb``."""

from __future__ import annotations

import json
import os
import random
import socket
import struct
from pathlib import Path
from typing import Any

import node
import yaml
from layout import read_versions

PATH_EXTRA = "/usr/sbin:/sbin"


def containerd_sock(L: Any, net: node.Net) -> Path:
    return L.dir / node.containerd_dir(net) / "containerd.sock"


# --------------------------------------------------------------------------- PKI and RBAC


def node_pki(tb: Any, L: Any, nets: list[node.Net]) -> None:
    for net in nets:
        kubelet = net.component("kubelet")
        tb.leaf(L, kubelet, f"system:node:{net.node_name}", "system:nodes", [], "clientAuth")
        tb.leaf(
            L,
            f"{kubelet}-serving",
            net.node_name,
            None,
            [f"IP:{net.node_ip}", f"DNS:{net.node_name}"],
            "serverAuth",
        )
    tb.leaf(L, "kube-proxy", "system:kube-proxy", None, [], "clientAuth")
    tb.leaf(L, "coredns", "trainflow-testbed:coredns", None, [], "clientAuth")
    for f in L.pki.glob("*.key"):
        f.chmod(0o600)
    for user in (*(n.component("kubelet") for n in nets), "kube-proxy", "coredns"):
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


def containerd_config(L: Any, nb: Path, net: node.Net) -> str:
    cd = L.dir / node.containerd_dir(net)
    return f"""version = 3
root = '{cd / "root"}'
state = '{cd / "state"}'
[grpc]
  address = '{containerd_sock(L, net)}'
[ttrpc]
  address = '{containerd_sock(L, net)}.ttrpc'
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
    conf_dir = '{L.etc / net.component("cni")}'
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
                # No NAT between pods: traffic to other nodes' pods keeps its pod IP (Open MPI's TCP
                # transport, for one, drops connections from an address its peer did not announce).
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(L.dir / "node" / net.component("cni-ipam")),
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
        "containerRuntimeEndpoint": f"unix://{containerd_sock(L, net)}",
        "address": net.node_ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(pki / f"{net.component('kubelet')}-serving.crt"),
        "tlsPrivateKeyFile": str(pki / f"{net.component('kubelet')}-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local",
        "clusterDNS": [net.node_ip],
        "resolvConf": str(L.etc / "node-resolv.conf"),
        "podLogsDir": str(L.dir / "node" / net.component("pod-logs")),
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
    return read_versions(nb)


def env(nb: Path) -> dict[str, str]:
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


def write_configs(tb: Any, L: Any, nb: Path, net: node.Net) -> None:
    name = net.component
    (L.etc / name("cni")).mkdir(parents=True, exist_ok=True)
    (L.dir / "node").mkdir(exist_ok=True)
    (L.etc / name("cni") / "10-trainflow.conflist").write_text(json.dumps(cni_config(L, net), indent=1))
    (L.etc / f"{name('containerd')}.toml").write_text(containerd_config(L, nb, net))
    (L.etc / "node-resolv.conf").write_text("# pods mode: cluster DNS only (CoreDNS on the node IP)\n")
    (L.etc / f"{name('kubelet')}.yaml").write_text(yaml.safe_dump(kubelet_config(L, net)))
    (L.etc / f"{name('kube-proxy')}.yaml").write_text(yaml.safe_dump(kube_proxy_config(L, net)))
    (L.etc / name("Corefile")).write_text(corefile(L, net, tb.CONTEXT))
