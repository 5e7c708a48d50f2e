"""The supervisor's liveness lock: ownership of a local job that no observer can disturb.

The supervisor holds a write lock on ``.supervisor.lock`` for its whole life. On Linux it is an open file
description lock (``F_OFD_SETLK``) and readers test it with ``F_OFD_GETLK``, which acquires nothing: no reader,
however many and however timed, can make the owner see its lock taken and give up (a reader's
``flock(LOCK_SH)`` once could, and the job then ended ``SupervisorLost``). Where there are no OFD locks
(macOS) the owner takes an exclusive ``flock`` and waits out readers' momentary shared locks; with OFD locks it
takes that flock too, for readers of earlier versions. A lost verdict needs more than the lock:
``store.JobDir.supervisor_alive``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from pathlib import Path

from trainflow.core.local import trust

_OFD = hasattr(fcntl, "F_OFD_GETLK")
OWN_WAIT_SECONDS = 2.0  # without OFD locks: how long the owner waits out readers' shared flocks
_BUSY = (errno.EAGAIN, errno.EACCES)


def _lock_request(kind: int) -> bytes:
    """A ``struct flock`` for the whole file (Linux, 64-bit ``off_t``); ``l_pid`` must be 0 for OFD locks."""
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, 0, 0, 0)


def _conflicting_lock(fd: int, kind: int) -> int:
    """The type of a lock another open file holds that conflicts with ``kind`` (``F_UNLCK`` when none)."""
    answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _lock_request(kind))
    return int(struct.unpack("hhqqi4x", answer)[0])


def _take_write_lock(fd: int) -> bool:
    """The OFD write lock; False when another owner holds one. A read lock (a stray reader) is waited out."""
    while True:
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _lock_request(fcntl.F_WRLCK))
            return True
        except OSError as exc:
            if exc.errno not in _BUSY:
                raise
        if _conflicting_lock(fd, fcntl.F_WRLCK) == fcntl.F_WRLCK:
            return False
        time.sleep(0.01)


def _take_flock(fd: int) -> bool:
    """The exclusive flock, waiting out readers' momentary shared ones for up to ``OWN_WAIT_SECONDS``."""
    deadline = time.monotonic() + OWN_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
        time.sleep(0.01)


def take_lock(path: Path) -> int | None:
    """The owner's side: an fd holding the lock on ``path`` (never to be closed), or None when another owns it.

    With OFD locks the write lock decides; the flock is then taken too, for readers of earlier trainflow
    versions (they test only the flock, and would otherwise see no owner).
    """
    fd = trust.open_state(path, os.O_RDWR | os.O_CREAT)
    if fd is None:  # the job directory is gone
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    try:
        owned = _take_write_lock(fd) if _OFD else _take_flock(fd)
        if owned and _OFD:
            _take_flock(fd)  # best effort: ownership is already decided
    except BaseException:
        os.close(fd)
        raise
    if not owned:
        os.close(fd)
        return None
    return fd


def lock_held(path: Path) -> bool:
    """The readers' side: True when another open file holds the write lock on ``path``; acquires nothing on Linux."""
    fd = trust.open_state(path)
    if fd is None:
        return False
    try:
        if _OFD:
            return _conflicting_lock(fd, fcntl.F_RDLCK) == fcntl.F_WRLCK
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False
    finally:
        os.close(fd)
