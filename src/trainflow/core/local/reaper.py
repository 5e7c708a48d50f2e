"""Every process a local job starts stays within the engine's reach and is stopped when the job ends.

The supervisor command forks. The parent, the *guard*, only waits; the child is the supervisor. Both are
child subreapers (Linux ``PR_SET_CHILD_SUBREAPER``): a process whose parent exits is re-parented to its
nearest living subreaper ancestor instead of init, so a rank's grandchild that starts a new session with an
empty environment stays a descendant. The supervisor stops all its descendants before it records the end of
the job (completion, failure, deadline, cancel, suspend). If the supervisor is SIGKILLed, its nodes become the
guard's children and the guard stops them at once, with nobody calling ``get``. If both are killed together
(a signal to their process group), each node's wrapper sees its lifeline break and stops its rank tree
(core/local/lifeline.py).

Chosen over ``PR_SET_PDEATHSIG`` (reaches direct children only, and fires when the parent *thread* exits) and
cgroups (they need a delegated hierarchy that an ordinary user does not have). Without ``prctl`` (macOS) there
is no guard; the supervisor's process groups and environment marker still apply.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from types import FrameType

PR_SET_CHILD_SUBREAPER = 36
GUARD_GRACE_SECONDS = 1.0


def make_subreaper() -> bool:
    """Make this process a child subreaper (Linux); False where the kernel or platform has no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def proc_files(name: str) -> Iterator[tuple[int, bytes]]:
    """(pid, contents of ``/proc/<pid>/<name>``) of every process whose file this user may read."""
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/{name}", "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            yield int(entry.name), data


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process, from /proc."""
    out: dict[int, int] = {}
    for pid, text in proc_files("stat"):
        fields = text[text.rfind(b")") + 2 :].split()
        if len(fields) > 1 and fields[0] not in (b"Z", b"X"):
            out[pid] = int(fields[1])
    return out


def descendants(root: int) -> list[int]:
    """Live descendants of ``root`` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    out, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def reap() -> None:
    """Collect exited children (re-parented orphans included) so none lingers as a zombie."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_descendants(grace: float) -> int:
    """SIGTERM every descendant of this process, SIGKILL what is left after ``grace``; how many there were."""
    me = os.getpid()
    first = descendants(me)
    _signal(first, signal.SIGTERM)
    end = time.monotonic() + grace
    while first and time.monotonic() < end and descendants(me):
        reap()
        time.sleep(0.02)
    for _ in range(50):
        left = descendants(me)
        if not left:
            break
        _signal(left, signal.SIGKILL)
        reap()
        time.sleep(0.02)
    reap()
    return len(first)


def guard(run: Callable[[int], int]) -> int:
    """Run ``run`` (the supervisor) in a forked child; afterwards stop whatever it left behind.

    ``run`` gets the read end of the lifeline (core/local/lifeline.py), a pipe whose write end only the guard
    and the supervisor hold: it reaches end-of-file when both are gone, however they die.
    """
    lifeline, holder = os.pipe()  # close-on-exec: no process but these two ever holds the write end
    if not make_subreaper():
        return run(lifeline)
    pid = os.fork()
    if pid == 0:  # the supervisor
        code = 1
        try:
            make_subreaper()  # not inherited across fork
            code = run(lifeline)
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(OSError):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    os.close(lifeline)  # the guard holds the write end only

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    _, status = os.waitpid(pid, 0)
    left = stop_descendants(GUARD_GRACE_SECONDS)
    if left:
        print(f"guard: the supervisor ended ({status:#x}); stopped {left} process(es) it left", flush=True)
    os.close(holder)
    return max(os.waitstatus_to_exitcode(status), 0)
