"""The testbed's real node (pods mode): containerd, runc, CNI, kubelet, kube-proxy and CoreDNS.

Everything the node changes on the host is private to one testbed instance and undone by ``down``:
- a network namespace ``tbp<base>`` joined to the host by a veth pair: the host side carries the API
  server's address (``10.<n>.0.1``), the node side the node IP (``10.<n>.0.2``); pods get ``10.<n>.1.0/24``
  on a bridge inside the namespace. The namespace has no default route and the host does not forward, so
  no packet can leave the machine. containerd, the kubelet, kube-proxy and CoreDNS join only that network
  namespace (``nsenter --net``): the mount namespace stays shared, as the kubelet and containerd need.
- cgroup root ``/trainflow-<base>`` in every cgroup v1 controller (the kubelet's ``cgroupRoot``);
- containerd's root, state and socket, the kubelet's root dir and pod logs, all under the run dir;
- the global sysctls the kubelet sets (vm.overcommit_memory, kernel.panic, ...), recorded and restored.
Functions take the testbed module (``tb``: Layout, start, wait_for, ...) as their first argument.
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
# Started after the control plane and JobSet, in this order; down stops them in reverse.
NODE_COMPONENTS = ["containerd", "kubelet", "kube-proxy", "coredns"]
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


def net_for(base: int) -> Net:
    """Instance-private names and addresses, derived from TRAINFLOW_TESTBED_PORT_BASE."""
    n = 100 + (base % 10000) // 100
    return Net(
        netns=f"tbp{base}",
        host_if=f"tbh{base}",
        host_ip=f"10.{n}.0.1",
        node_ip=f"10.{n}.0.2",
        pod_cidr=f"10.{n}.1.0/24",
        cgroup=f"trainflow-{base}",
    )


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
    routes = _run("ip", "-4", "route", "show", check=False).stdout
    prefix = net.host_ip.rsplit(".", 2)[0] + "."
    if prefix in routes:
        problems.append(
            f"addresses {prefix}0.0/16 are already routed on this host; set another TRAINFLOW_TESTBED_PORT_BASE"
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
    # The API server (host side) reaches pods (webhooks) through the node; nothing else is routed.
    _run("ip", "route", "add", net.pod_cidr, "via", net.node_ip, "dev", net.host_if)


def prepare(tb: Any, L: Any, net: Net) -> None:
    preflight(tb, L, net)
    # Fresh node state each up; containerd's root (content, snapshots: the images) is kept.
    for d in (L.dir / "node", L.dir / "containerd" / "state"):
        if d.exists():
            shutil.rmtree(d)
    (L.dir / "node-sysctls-before.json").write_text(json.dumps(read_sysctls()))
    make_cgroups(net)
    make_network(net)
    tb.log(
        f"node network: netns {net.netns}, {net.host_if} {net.host_ip} <-> {net.node_ip}, pods {net.pod_cidr}"
    )


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


def _shim_pids(L: Any) -> list[int]:
    """containerd-shim processes serving this instance's containerd (they outlive containerd)."""
    sock = str(L.dir / "containerd" / "containerd.sock")
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


def unmount_all(L: Any, net: Net) -> None:
    paths = [L.dir, Path("/run/netns") / net.netns]
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


def kill_shims(L: Any) -> None:
    for pid in _shim_pids(L):
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
        while time.time() < deadline and tb._alive(pid):
            time.sleep(0.1)
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    f = L.pids / f"{name}.pid"
    if f.exists():
        f.unlink()


def cleanup_host(L: Any, net: Net) -> None:
    """Undo every host change of the node (after all its processes are gone)."""
    kill_containers(net, timeout=5)
    kill_shims(L)
    unmount_all(L, net)
    _run("ip", "netns", "del", net.netns, check=False)
    _run("ip", "link", "del", net.host_if, check=False)
    remove_cgroups(net)
    restore_sysctls(L)


def leftovers(L: Any, net: Net) -> dict[str, Any]:
    """What the node left on the host (empty lists when down cleaned up everything)."""
    return {
        "mounts": _mounts_under([L.dir, Path("/run/netns") / net.netns]),
        "netns": [net.netns] if (Path("/run/netns") / net.netns).exists() else [],
        "interfaces": [net.host_if] if Path(f"/sys/class/net/{net.host_if}").exists() else [],
        "routes": [r for r in _run("ip", "-4", "route", "show").stdout.splitlines() if net.pod_cidr in r],
        "cgroups": [str(d) for d in _cgroup_dirs(net)],
        "container_processes": sorted(_cgroup_pids(net)),
        "shims": _shim_pids(L),
    }


def describe(net: Net) -> dict[str, Any]:
    return asdict(net)
