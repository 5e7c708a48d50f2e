"""The testbed's fixed facts: one instance's directories and ports, the components it runs, its settings."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

CONTEXT = "trainflow-testbed"
INSTANCE_ENV = "TRAINFLOW_TESTBED_INSTANCE"
DEFAULT_DIR = "/tmp/trainflow-testbed"
DEFAULT_PORT_BASE = 26380

# Port layout relative to TRAINFLOW_TESTBED_PORT_BASE. Everything binds 127.0.0.1.
PORTS = {
    "etcd": 0,
    "etcd_peer": 1,
    "apiserver": 2,
    "kcm": 3,
    "scheduler": 4,
    "kwok": 5,
    "jobset_webhook": 6,
    "jobset_health": 7,
    "trainer_webhook": 8,
    "trainer_health": 9,
}

# Start order; down stops in reverse.
COMPONENTS = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "jobset-controller",
    "trainer-controller-manager",
]

# Pods mode: real nodes (containerd, kubelet, kube-proxy, CoreDNS each) instead of kwok, and the Trainer in
# cluster; node 0's components have the plain names.
PODS_COMPONENTS = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "jobset-controller",
    "containerd",
    "kubelet",
    "kube-proxy",
    "coredns",
]


NODE_COMPONENTS = ("containerd", "kubelet", "kube-proxy", "coredns")


def components(L: Layout) -> list[str]:
    """Start order of the instance's processes; in pods mode node ``i`` > 0 adds its own ``<name>-<i>`` (the
    node count is in the mode file node/pods.py writes)."""
    kueue = ["kueue"] if L.kueue_file.exists() else []  # Kueue mode (testbed/kueue/) records itself there
    kueue += ["objstore"] if L.objstore_file.exists() else []  # and the object store (testbed/objstore/)
    if not L.pods:
        return [*COMPONENTS, *kueue]
    nodes = json.loads(L.mode_file.read_text()).get("nodes", []) if L.mode_file.exists() else []
    return [*PODS_COMPONENTS, *(f"{c}-{i}" for i in range(1, len(nodes)) for c in NODE_COMPONENTS), *kueue]


# Readiness timeouts are multiplied by this (slow or heavily shared machines).
TS = float(os.environ.get("TRAINFLOW_TESTBED_TIMEOUT_SCALE", "2"))

# Trainer's TrainJobStatus feature gate is left off; see README.md for why.
TRAINER_FEATURE_GATES = os.environ.get("TRAINFLOW_TESTBED_TRAINER_FEATURE_GATES", "")


def read_versions(bin_dir: Path) -> dict[str, str]:
    """The ``name=value`` lines of a build's ``VERSIONS`` file (what it pinned and how long it took)."""
    text = (Path(bin_dir) / "VERSIONS").read_text()
    return dict(line.split("=", 1) for line in text.split() if "=" in line)


class TestbedError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[testbed {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Layout:
    def __init__(self, run_dir: str, bin_dir: str | None = None) -> None:
        self.dir = Path(run_dir).resolve()
        self.pki = self.dir / "pki"
        self.logs = self.dir / "logs"
        self.pids = self.dir / "pids"
        self.etc = self.dir / "etc"
        self.data = self.dir / "data"
        self.kubeconfig = self.dir / "kubeconfig"
        self.env_file = self.dir / "env"
        self.state_file = self.dir / "state.json"
        self.bin = Path(bin_dir).resolve() if bin_dir else None
        base = int(os.environ.get("TRAINFLOW_TESTBED_PORT_BASE", DEFAULT_PORT_BASE))
        self.port_base = base
        self.ports = {k: base + v for k, v in PORTS.items()}
        # Pods mode (a real node, testbed/node/) records itself here at up; kwok mode has no file.
        self.mode_file = self.dir / "mode.json"
        self.kueue_file = self.dir / "kueue.json"
        self.objstore_file = self.dir / "objstore.json"
        mode = json.loads(self.mode_file.read_text()) if self.mode_file.exists() else {}
        self.pods = mode.get("mode") == "pods"
        self.api_host = str(mode.get("api_host", "127.0.0.1"))
        if self.pods:
            self.ports = {k: int(v) for k, v in mode["ports"].items()}

    def b(self, name: str) -> str:
        assert self.bin is not None
        p = self.bin / name
        if not os.access(p, os.X_OK):
            raise TestbedError(f"missing binary {p}; run testbed/build.sh")
        return str(p)
