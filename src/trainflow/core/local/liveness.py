"""The supervisor's liveness lock: ownership of a local job that no observer can disturb.

The supervisor holds a write lock on ``.supervisor.lock`` for its whole life. On Linux it is an open file
description lock (``F_OFD_SETLK``) and readers test it with ``F_OFD_GETLK``, which acquires nothing: no reader,
however many and however timed, can make the owner see its lock taken and give up (a reader's
``flock(LOCK_SH)`` once could, and the job then ended ``SupervisorLost``). Where there are no OFD locks
(macOS) the owner takes an exclusive ``flock`` and waits out readers' momentary shared locks. A lost verdict
needs more than the lock: ``store.JobDir.supervisor_alive``.
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
_BUSY = (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)


def _lock_request(kind: int) -> bytes:
    """A ``struct flock`` for the whole file (Linux, 64-bit ``off_t``); ``l_pid`` must be 0 for OFD locks."""
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, 0, 0, 0)


def _conflicting_lock(fd: int, kind: int) -> int:
    """The type of a lock another open file holds that conflicts with ``kind`` (``F_UNLCK`` when none)."""
    answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _lock_request(kind))
    return int(struct.unpack("hhqqi4x", answer)[0])


def take_lock(path: Path) -> int | None:
    """The owner's side: an fd holding the write lock on ``path``, or None when another owner holds it.

    A conflicting *read* lock is nobody's ownership (a stray reader): the owner waits it out rather than give up.
    """
    fd = trust.open_state(path, os.O_RDWR | os.O_CREAT)
    if fd is None:  # the job directory is gone
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    deadline = time.monotonic() + OWN_WAIT_SECONDS
    while True:
        try:
            if _OFD:
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _lock_request(fcntl.F_WRLCK))
            else:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in _BUSY:
                os.close(fd)
                raise
        if _OFD and _conflicting_lock(fd, fcntl.F_WRLCK) == fcntl.F_WRLCK:
            os.close(fd)
            return None  # another supervisor owns the job
        if not _OFD and time.monotonic() > deadline:
            os.close(fd)
            return None
        time.sleep(0.01)


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
