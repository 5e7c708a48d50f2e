"""The instance's processes: start one tagged with the instance, find, stop and list them, tail their logs.

Every process carries ``TRAINFLOW_TESTBED_INSTANCE=<run dir>`` in its environment, so ``down`` finds all of
them (children and lost pid files included) and never touches another instance's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from layout import INSTANCE_ENV, Layout, TestbedError, components, log


def _proc_env(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, _, v = item.partition(b"=")
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
        if st.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    except OSError:
        return False
    return True


def _ours(L: Layout, pid: int) -> bool:
    return _proc_env(pid).get(INSTANCE_ENV) == str(L.dir)


def instance_pids(L: Layout) -> list[int]:
    """All live processes tagged with this testbed instance (pid files or not)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            pid = int(d.name)
            if pid != os.getpid() and _ours(L, pid) and alive(pid):
                pids.append(pid)
    return pids


def start(
    L: Layout, name: str, argv: list[str], extra_env: dict[str, str] | None = None, uid: int | None = None
) -> int:
    """Start one component in a session of its own, tagged with the instance (as user and group ``uid``
    when given, without supplementary groups)."""
    L.logs.mkdir(parents=True, exist_ok=True)
    L.pids.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    env[INSTANCE_ENV] = str(L.dir)
    env.update(extra_env or {})
    (L.logs / f"{name}.cmd").write_text(" ".join(argv) + "\n")
    with open(L.logs / f"{name}.log", "ab") as logf:
        proc = subprocess.Popen(
            argv,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(L.dir),
            env=env,
            start_new_session=True,
            **({"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}),
        )
    (L.pids / f"{name}.pid").write_text(str(proc.pid))
    log(f"started {name} (pid {proc.pid})")
    return proc.pid


def pid_of(L: Layout, name: str) -> int | None:
    f = L.pids / f"{name}.pid"
    if not f.exists():
        return None
    try:
        return int(f.read_text().strip())
    except ValueError:
        return None


def running(L: Layout, name: str) -> bool:
    pid = pid_of(L, name)
    if pid is None or not alive(pid):
        return False
    # Right after exec /proc/<pid>/environ can read empty; a reused pid would
    # show a non-empty environment without our instance tag.
    env = _proc_env(pid)
    return not env or env.get(INSTANCE_ENV) == str(L.dir)


def stop_all(L: Layout, timeout: float = 15.0) -> None:
    names = list(reversed(components(L)))
    for name in names:
        pid = pid_of(L, name)
        if pid and running(L, name):
            log(f"stopping {name} (pid {pid})")
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGTERM)
            deadline = time.time() + timeout
            while time.time() < deadline and alive(pid):
                time.sleep(0.1)
        f = L.pids / f"{name}.pid"
        if f.exists():
            f.unlink()
    # Anything still tagged with this instance (children, lost pid files): kill.
    for _ in range(3):
        left = instance_pids(L)
        if not left:
            break
        for pid in left:
            log(f"killing leftover testbed process {pid}")
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    left = instance_pids(L)
    if left:
        raise TestbedError(f"processes still alive after down: {left}")


def tail_logs(L: Layout, lines: int = 40) -> str:
    out = []
    for name in [*components(L), "setup"]:
        f = L.logs / f"{name}.log"
        if not f.exists():
            out.append(f"===== {name}: no log =====")
            continue
        text = f.read_text(errors="replace").splitlines()
        state = "running" if running(L, name) else "NOT running"
        if name == "setup":
            state = "-"
        out.append(f"===== {name} ({state}) last {min(lines, len(text))} of {len(text)} lines: {f}")
        out.extend(text[-lines:])
    return "\n".join(out)
