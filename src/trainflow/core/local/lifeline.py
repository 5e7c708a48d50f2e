"""Every rank dies with its supervisor, however the supervisor and its guard die.

Each node runs under a small wrapper process (this module's ``main``), the leader of the node's process
group. It holds the read end of a pipe whose write end only the supervisor and its guard hold (made by
``reaper.guard``, close-on-exec, so no rank inherits it). When both are gone, by exit or by any signal
(``kill -KILL -<pgid>`` of the two, as a container runtime, systemd or a shell's job control sends it),
the kernel closes their ends and the wrapper reads end-of-file at once: it then stops its whole rank tree
(``reaper.stop_descendants``: SIGTERM, SIGKILL after ``GRACE_SECONDS``) with no engine call. The wrapper is
a child subreaper, so the tree includes what a rank started in new sessions with an empty environment
(torchrun's workers, daemons).

Why a pipe: its end-of-file covers both holders and every way they die, needs no polling, and exists
everywhere. ``PR_SET_PDEATHSIG`` fires for the parent *thread* only and for one parent, not for the pair;
a pidfd names one process too; cgroups need a delegated hierarchy an ordinary user lacks. The wrapper adds
``PR_SET_PDEATHSIG`` (SIGKILL) to the rank's first process for the case where the wrapper itself is killed
together with the supervisor; when the wrapper alone is killed, its rank tree is re-parented to the
supervisor (a subreaper) and stopped with the failed node.

The wrapper is otherwise invisible: group signals reach the rank (the wrapper does not die of SIGTERM,
SIGINT or SIGHUP), and it exits as the rank did, with its code or by its signal. A rank that cannot start
is reported back on a second pipe, so the supervisor names the command as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import NoReturn

from trainflow.core.local import reaper

GRACE_SECONDS = reaper.GUARD_GRACE_SECONDS  # the same rule as the guard's: SIGTERM, then SIGKILL
PR_SET_PDEATHSIG = 1
_ROOT = str(Path(__file__).resolve().parents[3])  # the directory holding this trainflow


def command(argv: list[str], lifeline_fd: int, report_fd: int) -> list[str]:
    """The wrapper's command line around a node's ``argv`` (both fds must be passed to it).

    ``-I``: the rank's environment (PYTHONPATH, PYTHONWARNINGS, ...) is the rank's, not the wrapper's; this
    trainflow is found by its own path, however the supervisor found it.
    """
    code = (
        f"import sys; sys.path.insert(0, {_ROOT!r}) if {_ROOT!r} not in sys.path else None; "
        "from trainflow.core.local.lifeline import main; main()"
    )
    return [sys.executable, "-I", "-c", code, str(lifeline_fd), str(report_fd), *argv]


def start(
    argv: list[str], lifeline_fd: int, *, env: dict[str, str], cwd: str | None
) -> tuple[subprocess.Popen[bytes], int]:
    """Start a node: its wrapper, leading a new session, output on a pipe; and the fd ``start_error`` reads."""
    report, report_w = os.pipe()
    try:
        proc = subprocess.Popen(
            command(argv, lifeline_fd, report_w),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(lifeline_fd, report_w),
        )
    except BaseException:
        os.close(report)
        raise
    finally:
        os.close(report_w)
    return proc, report


def start_error(report_fd: int) -> str | None:
    """The supervisor's side: wait for the wrapper to start its rank; the reason it could not, or None.

    Closes ``report_fd``. A wrapper that died before reporting reports nothing: its exit tells the rest.
    """
    data = b""
    try:
        while chunk := os.read(report_fd, 4096):
            data += chunk
    finally:
        os.close(report_fd)
    with contextlib.suppress(ValueError):
        error = json.loads(data or b"{}").get("error")
        return str(error) if error else None
    return None


def _ignore(signum: int, frame: FrameType | None) -> None:
    """A handler, not SIG_IGN: the rank starts with default dispositions (caught signals reset at exec)."""


def _die_with_parent(parent: int) -> None:
    """In the rank's first process before exec: SIGKILL when the wrapper dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the wrapper died before the prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


def _broken(lifeline: int, timeout_ms: int) -> bool:
    """True when every holder of the lifeline's write end is gone (end-of-file)."""
    poller = select.poll()
    poller.register(lifeline, select.POLLIN)
    return bool(poller.poll(timeout_ms)) and not os.read(lifeline, 1)


def _watch(proc: subprocess.Popen[bytes], lifeline: int) -> bool:
    """Wait until the rank exits (True) or the lifeline breaks (False)."""
    pidfd: int | None = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(proc.pid)  # readable when the rank exits: no polling where Linux has it
    poller = select.poll()
    poller.register(lifeline, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    while proc.poll() is None:
        for fd, _ in poller.poll(-1 if pidfd is not None else 50):
            if fd == lifeline and not os.read(lifeline, 1):
                return False
    return True


def _stop_tree() -> NoReturn:
    """The lifeline broke: stop every process under this wrapper, then the rest of its process group."""
    reaper.stop_descendants(GRACE_SECONDS)
    if os.getpgrp() == os.getpid():  # without /proc no descendant is known; the group still is (us last)
        with contextlib.suppress(OSError):
            os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(128 + signal.SIGKILL)


def _exit_like(code: int) -> NoReturn:
    """Exit as the rank did: its code, or its signal (no core dump of the wrapper's own)."""
    if code < 0:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        with contextlib.suppress(OSError, ValueError):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code  # a signal whose default action is not to terminate
    os._exit(code)


def main() -> NoReturn:
    lifeline, report = int(sys.argv[1]), int(sys.argv[2])
    argv = sys.argv[3:]
    reaper.make_subreaper()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _ignore)
    if _broken(lifeline, 0):  # the supervisor and its guard died before the rank started: start nothing
        os._exit(128 + signal.SIGKILL)
    me = os.getpid()
    try:
        # preexec_fn is safe here: the wrapper has one thread
        proc = subprocess.Popen(argv, preexec_fn=lambda: _die_with_parent(me))
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.write(report, json.dumps({"error": exc.strerror or str(exc)}).encode())
        os._exit(127)
    with contextlib.suppress(OSError):
        os.close(report)
    if not _watch(proc, lifeline):
        _stop_tree()
    _exit_like(proc.returncode)
