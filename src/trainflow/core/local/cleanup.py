"""Ending a local job from outside its supervisor: stop what a dead supervisor left, record it, remove the job.

Each step works on a full disk (``ENOSPC``): a failure that cannot be written is still reported, and removal
(what frees the space) never needs new space.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any

from trainflow.core.local import store, trust


def no_space(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def kill_nodes(job: store.JobDir, uid: str) -> None:
    """SIGKILL the recorded node process groups (guarding pid reuse) and every process with the job marker."""
    for node in store.read_aux(job.nodes) or []:
        pid = int(node.get("pid") or 0)
        if not pid or (store.pid_alive(pid) and not store.pid_alive(pid, node.get("start_time"))):
            continue  # never recorded, or the pid now belongs to another process
        if store.group_alive(pid):  # a dead leader's group keeps its id while any member lives
            store.signal_group(pid, signal.SIGKILL)
    if uid:
        store.kill_marked(uid)


def mark_lost(job: store.JobDir) -> dict[str, Any] | None:
    """The supervisor died without finishing: stop its nodes and record Failed (in memory only on a full disk).

    None when the job vanished meanwhile, or is being deleted (a cancel stopped its supervisor on purpose: the
    job is gone, not lost, as on a cluster a deleted TrainJob is).
    """
    failed: dict[str, Any] | None = None
    try:
        with job.update() as obj:
            if store.is_terminal(obj) or job.supervisor_alive():
                return obj  # it finished (or started) between our two looks
            if (obj.get("metadata") or {}).get("deletionTimestamp"):
                return None  # cancelled: its canceller stops the nodes and removes it
            kill_nodes(job, str(obj["metadata"].get("uid", "")))
            tail = " | ".join(store.tail_lines(job.log("supervisor"), 3))
            message = "the local supervisor process died; its nodes were stopped"
            if tail:
                message += f" (supervisor log: {tail[-500:]})"
            store.set_condition(obj.setdefault("status", {}), "Failed", True, "SupervisorLost", message)
            for item in obj["status"].get("jobsStatus") or []:
                item["active"] = item["ready"] = 0
            failed = obj
    except FileNotFoundError:
        return None
    except OSError as exc:
        if not no_space(exc):
            raise
    return failed


def remove(home: Path, job: store.JobDir, trash_name: str) -> bool:
    """Delete the job directory: renamed into ``.trash`` first (atomic), in place when even that needs space."""
    target = job.root
    try:
        target = trust.jobs_dir(home, ".trash") / f"{trash_name}.{uuid.uuid4().hex[:8]}"
        os.rename(job.root, target)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if not no_space(exc):
            raise
        target = job.root
    shutil.rmtree(target, ignore_errors=True)
    return not job.root.exists()


RESERVE_FILE = ".reserve"
RESERVE_BYTES = 256 * 1024


def reserve(root: Path) -> None:
    """Set aside a little space for the supervisor's last status write (released when the disk is full)."""
    with contextlib.suppress(OSError):
        fd = os.open(root / RESERVE_FILE, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        finally:
            os.close(fd)


def release(root: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(root / RESERVE_FILE)


def disk_full(root: Path) -> bool:
    """Less than 64 KiB left for this user on the job's file system."""
    try:
        st = os.statvfs(root)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 64 * 1024
