"""The testbed's real node (pods mode): containerd, runc, CNI, kubelet, kube-proxy and CoreDNS.

Everything the nodes change on the host is private to one testbed instance and undone by ``down``:
- per node ``i`` a network namespace ``tbp<base>`` (node 0) / ``tbp<base>n<i>`` joined to the host by a veth
  pair: node 0's host side carries the API server's address (``10.<n>.0.1``); node ``i``'s node IP is
  ``10.<n>.0.<4i+2>``; its pods get ``10.<n>.<i+1>.0/24`` on a bridge inside its namespace. The nodes meet on
  a bridge in a namespace of its own (``tbf<base>``, addresses ``10.<n>.255.<i+1>``), and route each other's
  pod ranges over it, so pods reach pods on any node by pod IP without NAT (as Kubernetes' network model
  asks). No namespace has a default route and the host does not forward, so no packet can leave the
  machine. containerd, the kubelet, kube-proxy and CoreDNS of a node join only its network namespace
  (``nsenter --net``): the mount namespace stays shared, as the kubelet and containerd need.
- cgroup root ``/trainflow-<base>`` (node 0) / ``/trainflow-<base>-<i>`` in every cgroup v1 controller;
- containerd's root, state and socket, the kubelet's root dir and pod logs, all under the run dir;
- the global sysctls the kubelet sets (vm.overcommit_memory, kernel.panic, ...), recorded and restored.
Functions take the testbed's helpers (``tb``, testbed/toolkit.py: Layout, start, wait_for, ...) first.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

NODE_NAME = "pods-node-0"
# Nodes of one instance (TRAINFLOW_TESTBED_NODES overrides): two, so ranks of one job meet across nodes.
NODE_COUNT = 2
CGROUP_BASE = Path("/sys/fs/cgroup")
# Controllers the kubelet needs on cgroup v1 (cpu, cpuacct, cpuset, memory) and the others it manages.
CGROUP_CONTROLLERS = ["blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids", "systemd"]
# What the kubelet sets at start (pkg/kubelet/cm: setupKernelTunables); restored by down.
KUBELET_SYSCTLS = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
]


@dataclass(frozen=True)
class Net:
    netns: str
    host_if: str
    host_ip: str
    node_ip: str
    pod_cidr: str
    cgroup: str
    node_name: str = NODE_NAME
    index: int = 0
    fabric_netns: str = ""  # the namespace of the bridge the nodes meet on
    fabric_ip: str = ""  # this node's address on it (/24)
    api_ip: str = ""  # where the API server binds (node 0's host side)

    def component(self, name: str) -> str:
        """The testbed component name of this node's ``name`` (containerd, kubelet, ...)."""
        return name if self.index == 0 else f"{name}-{self.index}"


def net_for(base: int, index: int = 0) -> Net:
    """Instance-private names and addresses of node ``index``, derived from TRAINFLOW_TESTBED_PORT_BASE."""
    n = 100 + (base % 10000) // 100
    suffix = "" if index == 0 else f"n{index}"
    return Net(
        netns=f"tbp{base}{suffix}",
        host_if=f"tbh{base}{suffix}",
        host_ip=f"10.{n}.0.{4 * index + 1}",
        node_ip=f"10.{n}.0.{4 * index + 2}",
        pod_cidr=f"10.{n}.{index + 1}.0/24",
        cgroup=f"trainflow-{base}" + (f"-{index}" if index else ""),
        node_name=f"pods-node-{index}",
        index=index,
        fabric_netns=f"tbf{base}",
        fabric_ip=f"10.{n}.255.{index + 1}",
        api_ip=f"10.{n}.0.1",
    )


def nets_for(base: int, count: int) -> list[Net]:
    return [net_for(base, i) for i in range(count)]


def node_count() -> int:
    count = int(os.environ.get("TRAINFLOW_TESTBED_NODES", NODE_COUNT))
    if not 1 <= count <= 8:
        raise ValueError(f"TRAINFLOW_TESTBED_NODES={count}: give 1 to 8 nodes")
    return count


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}"
        )
    return r


def in_netns(net: Net, argv: list[str]) -> list[str]:
    """argv run in the node's network namespace only (the mount namespace stays the host's)."""
    return ["nsenter", f"--net=/run/netns/{net.netns}", "--", *argv]


# --------------------------------------------------------------------------- host preparation


def preflight(tb: Any, L: Any, net: Net) -> None:
    """Refuse early, naming the fix, when this machine cannot host the node."""
    problems = []
    if os.geteuid() != 0:
        problems.append("pods mode needs root (network namespaces, cgroups, mounts)")
    for c in ("cpu", "cpuacct", "cpuset", "memory"):
        if not (CGROUP_BASE / c).is_dir():
            problems.append(f"cgroup v1 controller {c} is not mounted at {CGROUP_BASE / c}")
    for binary in ("nsenter", "ip", "nft", "iptables", "mount"):
        if _run("sh", "-c", f"command -v {binary}", check=False).returncode != 0:
            problems.append(f"{binary} not found (testbed/node/build.sh installs the Debian packages)")
    if _run("ip", "netns", "pids", net.netns, check=False).returncode == 0:
        problems.append(f"network namespace {net.netns} exists: run testbed/down.sh for this instance first")
    if _mounts_under([L.dir]):
        problems.append(f"mounts left under {L.dir}: run testbed/down.sh for this instance first")
    if _run("ip", "link", "show", net.host_if, check=False).returncode == 0:
        problems.append(f"interface {net.host_if} exists: run testbed/down.sh for this instance first")
    if net.index == 0:
        routes = _run("ip", "-4", "route", "show", check=False).stdout
        prefix = net.host_ip.rsplit(".", 2)[0] + "."
        if prefix in routes:
            problems.append(
                f"addresses {prefix}0.0/16 are already routed on this host; "
                "set another TRAINFLOW_TESTBED_PORT_BASE"
            )
        if (Path("/run/netns") / net.fabric_netns).exists():
            problems.append(
                f"network namespace {net.fabric_netns} exists: run testbed/down.sh for this instance first"
            )
    if problems:
        raise tb.TestbedError("pods mode cannot start:\n  - " + "\n  - ".join(problems))


def read_sysctls() -> dict[str, str]:
    return {k: (Path("/proc/sys") / k).read_text().strip() for k in KUBELET_SYSCTLS}


def make_cgroups(net: Net) -> None:
    for c in CGROUP_CONTROLLERS:
        if (CGROUP_BASE / c).is_dir():
            (CGROUP_BASE / c / net.cgroup).mkdir(exist_ok=True)
    cs = CGROUP_BASE / "cpuset"
    for f in ("cpuset.cpus", "cpuset.mems"):
        (cs / net.cgroup / f).write_text((cs / f).read_text())


def make_network(net: Net) -> None:
    _run("ip", "netns", "add", net.netns)
    _run("ip", "link", "add", net.host_if, "type", "veth", "peer", "name", "eth0", "netns", net.netns)
    _run("ip", "addr", "add", f"{net.host_ip}/30", "dev", net.host_if)
    _run("ip", "link", "set", net.host_if, "up")
    _run("ip", "-n", net.netns, "addr", "add", f"{net.node_ip}/30", "dev", "eth0")
    _run("ip", "-n", net.netns, "link", "set", "eth0", "up")
    _run("ip", "-n", net.netns, "link", "set", "lo", "up")
    if net.api_ip != net.host_ip:  # the API server binds node 0's host side: reached through this veth
        _run("ip", "-n", net.netns, "route", "add", f"{net.api_ip}/32", "via", net.host_ip, "dev", "eth0")
    # The API server (host side) reaches pods (webhooks) through the node; nothing else is routed.
    _run("ip", "route", "add", net.pod_cidr, "via", net.node_ip, "dev", net.host_if)
    # Forwarding inside the node's namespace only (pods of other nodes pass through it; the host's stays off).
    _run("ip", "netns", "exec", net.netns, "sysctl", "-qw", "net.ipv4.ip_forward=1")


def make_fabric(nets: list[Net]) -> None:
    """The bridge the nodes meet on (its own namespace) and each node's routes to the others' pods."""
    fabric = nets[0].fabric_netns
    _run("ip", "netns", "add", fabric)
    _run("ip", "-n", fabric, "link", "add", "br0", "type", "bridge")
    _run("ip", "-n", fabric, "link", "set", "br0", "up")
    for net in nets:
        port = f"n{net.index}"
        _run(
            "ip",
            "-n",
            net.netns,
            "link",
            "add",
            "fab0",
            "type",
            "veth",
            "peer",
            "name",
            port,
            "netns",
            fabric,
        )
        _run("ip", "-n", fabric, "link", "set", port, "master", "br0", "up")
        _run("ip", "-n", net.netns, "addr", "add", f"{net.fabric_ip}/24", "dev", "fab0")
        _run("ip", "-n", net.netns, "link", "set", "fab0", "up")
    for net in nets:
        for other in nets:
            if other is not net:
                _run(
                    "ip",
                    "-n",
                    net.netns,
                    "route",
                    "add",
                    other.pod_cidr,
                    "via",
                    other.fabric_ip,
                    "dev",
                    "fab0",
                )


def prepare(tb: Any, L: Any, nets: list[Net]) -> None:
    for net in nets:
        preflight(tb, L, net)
    # Fresh node state each up; containerd's root (content, snapshots: the images) is kept.
    for d in (L.dir / "node", *(L.dir / containerd_dir(net) / "state" for net in nets)):
        if d.exists():
            shutil.rmtree(d)
    (L.dir / "node-sysctls-before.json").write_text(json.dumps(read_sysctls()))
    for net in nets:
        make_cgroups(net)
        make_network(net)
        tb.log(
            f"node {net.node_name}: netns {net.netns}, {net.host_if} {net.host_ip} <-> {net.node_ip}, "
            f"pods {net.pod_cidr}"
        )
    if len(nets) > 1:
        make_fabric(nets)
        tb.log(
            f"nodes meet on bridge br0 in netns {nets[0].fabric_netns}: {', '.join(n.fabric_ip for n in nets)}"
        )


def containerd_dir(net: Net) -> str:
    """containerd's directory under the run dir (root, state, socket) for this node."""
    return "containerd" if net.index == 0 else f"containerd-{net.index}"


# --------------------------------------------------------------------------- cleanup


def _mounts_under(paths: list[Path]) -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].replace("\\040", " ")
        if any(mp == str(p) or mp.startswith(str(p) + "/") for p in paths):
            out.append(mp)
    return out


def _cgroup_dirs(net: Net) -> list[Path]:
    return [
        CGROUP_BASE / c / net.cgroup
        for c in [*CGROUP_CONTROLLERS, "unified"]
        if (CGROUP_BASE / c / net.cgroup).is_dir()
    ]


def _cgroup_pids(net: Net) -> set[int]:
    pids: set[int] = set()
    for root in _cgroup_dirs(net):
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def _shim_pids(L: Any, net: Net) -> list[int]:
    """containerd-shim processes serving this node's containerd (they outlive containerd)."""
    sock = str(L.dir / containerd_dir(net) / "containerd.sock")
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (d / "cmdline").read_bytes().split(b"\0")
                if argv and argv[0].endswith(b"containerd-shim-runc-v2") and sock.encode() in argv:
                    out.append(int(d.name))
    return out


def kill_containers(net: Net, timeout: float = 20.0) -> None:
    """Freeze the instance's cgroup tree, SIGKILL every process in it, thaw, wait until empty."""
    freezer = CGROUP_BASE / "freezer" / net.cgroup / "freezer.state"
    deadline = time.time() + timeout
    while True:
        pids = _cgroup_pids(net)
        if not pids or time.time() > deadline:
            break
        with contextlib.suppress(OSError):
            freezer.write_text("FROZEN")
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            freezer.write_text("THAWED")
        time.sleep(0.2)


def remove_cgroups(net: Net) -> None:
    for root in _cgroup_dirs(net):
        for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()


def unmount_all(L: Any, nets: list[Net]) -> None:
    paths = [L.dir, *(Path("/run/netns") / n for n in (*(net.netns for net in nets), nets[0].fabric_netns))]
    for _ in range(3):
        mps = _mounts_under(paths)
        if not mps:
            return
        for mp in sorted(mps, key=lambda m: m.count("/"), reverse=True):
            _run("umount", "-l", mp, check=False)


def restore_sysctls(L: Any) -> None:
    f = L.dir / "node-sysctls-before.json"
    if not f.exists():
        return
    # Another pods instance still running needs the kubelet's values: leave them to its own down.
    if any(p.name.startswith("trainflow-") for p in (CGROUP_BASE / "cpu").iterdir() if p.is_dir()):
        return
    for k, v in json.loads(f.read_text()).items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / k).write_text(v)
    f.unlink()


def kill_shims(L: Any, net: Net) -> None:
    for pid in _shim_pids(L, net):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def stop(tb: Any, L: Any, name: str, timeout: float = 15.0) -> None:
    """SIGTERM one component's process group, SIGKILL after ``timeout``."""
    pid = tb.pid_of(L, name)
    if pid and tb.running(L, name):
        tb.log(f"stopping {name} (pid {pid})")
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.time() + timeout
        while time.time() < deadline and tb.alive(pid):
            time.sleep(0.1)
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    f = L.pids / f"{name}.pid"
    if f.exists():
        f.unlink()


def cleanup_host(L: Any, nets: list[Net]) -> None:
    """Undo every host change of the nodes (after all their processes are gone)."""
    for net in nets:
        kill_containers(net, timeout=5)
        kill_shims(L, net)
    unmount_all(L, nets)
    for net in nets:
        _run("ip", "netns", "del", net.netns, check=False)
        _run("ip", "link", "del", net.host_if, check=False)
        remove_cgroups(net)
    _run("ip", "netns", "del", nets[0].fabric_netns, check=False)
    restore_sysctls(L)


def leftovers(L: Any, nets: list[Net]) -> dict[str, Any]:
    """What the nodes left on the host (empty lists when down cleaned up everything)."""
    routes = _run("ip", "-4", "route", "show").stdout.splitlines()
    netns = [n.netns for n in nets] + [nets[0].fabric_netns]
    return {
        "mounts": _mounts_under([L.dir, *(Path("/run/netns") / n for n in netns)]),
        "netns": [n for n in netns if (Path("/run/netns") / n).exists()],
        "interfaces": [n.host_if for n in nets if Path(f"/sys/class/net/{n.host_if}").exists()],
        "routes": [r for r in routes for n in nets if n.pod_cidr in r],
        "cgroups": [str(d) for n in nets for d in _cgroup_dirs(n)],
        "container_processes": sorted(p for n in nets for p in _cgroup_pids(n)),
        "shims": [p for n in nets for p in _shim_pids(L, n)],
    }


def describe(net: Net) -> dict[str, Any]:
    return asdict(net)
