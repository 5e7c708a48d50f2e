"""``testbed/down.sh`` after the pods suite leaves nothing behind on any node: no process of the instance
(control plane, nodes, containers), no mount under the run dir, no network namespace (the nodes' and their fabric's), interface or route, no cgroup, and the
kernel settings the kubelet changed are back. Runs last, on its own (it stops the testbed)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[3]


def instance_processes(run_dir: Path) -> list[str]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                env = (d / "environ").read_bytes()
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            tagged = f"TRAINFLOW_TESTBED_INSTANCE={run_dir}".encode() in env.split(b"\0")
            # components name their files under the run dir (the make recipe's shell only names the dir)
            if tagged or any(f"{run_dir}/{sub}" in cmd for sub in ("etc/", "containerd", "node/", "data/")):
                out.append(f"{d.name}: {cmd[:120]}")
    return out


def cgroup_procs(root: Path) -> list[str]:
    return [p for f in root.rglob("cgroup.procs") for p in f.read_text().split()] if root.exists() else []


def test_down_leaves_no_process_mount_interface_cgroup_or_sysctl_change(testbed: Any) -> None:
    nodes = testbed.state["nodes"]
    assert len(nodes) >= 2, nodes
    run_dir = testbed.dir
    cgroups = {
        n["node_name"]: [
            Path("/sys/fs/cgroup") / c / n["cgroup"] for c in ("cpu", "memory", "pids", "freezer")
        ]
        for n in nodes
    }
    fabric = Path(f"/run/netns/{nodes[0]['fabric_netns']}")
    sysctls_before = json.loads((run_dir / "node-sysctls-before.json").read_text())
    # every node is really there before down: its containerd answers, its netns and veth exist; containers
    # run in the nodes' cgroups (the Trainer controller's pod, at least, on one of them); the fabric
    for n in nodes:
        assert _socket_answers(testbed, n["containerd_socket"]), (
            f"containerd of {n['node_name']} does not answer"
        )
        assert Path(f"/run/netns/{n['netns']}").exists()
        assert Path(f"/sys/class/net/{n['host_if']}").exists()
    assert any(cgroup_procs(c) for cs in cgroups.values() for c in cs), "no container process on any node"
    assert fabric.exists()
    mounts_before = [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines() if str(run_dir) in ln]
    assert mounts_before, "no mount under the run dir before down"

    r = subprocess.run(
        ["bash", str(REPO / "testbed" / "down.sh")],
        env={**os.environ, "TRAINFLOW_TESTBED_DIR": str(run_dir)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr

    assert instance_processes(run_dir) == []
    assert [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines() if str(run_dir) in ln] == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    assert not fabric.exists() and nodes[0]["fabric_netns"] not in netns
    for n in nodes:
        assert not Path(f"/run/netns/{n['netns']}").exists()
        assert n["netns"] not in netns.split()
        assert not Path(f"/sys/class/net/{n['host_if']}").exists()
        assert n["pod_cidr"] not in routes and n["host_ip"] not in routes, routes
        assert [str(c) for c in cgroups[n["node_name"]] if c.exists()] == []
        assert not Path(n["containerd_socket"]).exists() or not _socket_answers(
            testbed, n["containerd_socket"]
        )
    assert {k: (Path("/proc/sys") / k).read_text().strip() for k in sysctls_before} == sysctls_before


def _socket_answers(testbed: Any, socket: str) -> bool:
    r = subprocess.run(
        [str(Path(testbed.state["node_bin"]) / "ctr"), "--address", socket, "version"],
        capture_output=True,
        timeout=HANG,
    )
    return r.returncode == 0
