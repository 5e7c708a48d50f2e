"""The local engine trusts only what this user made: its directories are private, its state is never a link.

Job names are predictable (derived from idempotency keys). If another local user could write ``jobs/<ns>/``,
they could plant ``trainjob.json`` and ``plan.json`` at a name and have the submitter adopt and run their
command. So every directory the engine creates is 0700 whatever the umask (an existing one of ours is
tightened), a home owned by someone else or writable by others is refused, and a job directory or state file
that is a symbolic link or belongs to another uid is refused (O_NOFOLLOW, owner checks) before anything in it
is read, signalled or run.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from trainflow.core.errors import PermissionDenied

FIX = "remove it, or use a TRAINFLOW_HOME of your own (--home)"


def _refuse_foreign(path: Path | str, st: os.stat_result, what: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise PermissionDenied(
            f"{what} {path} is a symbolic link; the local engine never follows links in its state: {FIX}"
        )
    if st.st_uid != os.geteuid():
        raise PermissionDenied(
            f"{what} {path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}); the local "
            f"engine only runs jobs it created: {FIX}"
        )


def private_dir(path: Path, what: str = "local engine directory") -> Path:
    """``path`` as a directory only this user can enter: created 0700 whatever the umask, tightened if ours."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    _refuse_foreign(path, st, what)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionDenied(f"{what} {path} is not a directory: {FIX}")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def home_dir(home: Path) -> Path:
    """The engine's home: created 0700 if missing; refused when another user owns it or others may write it."""
    if not home.exists():
        home.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(home, 0o700)
    st = os.stat(home)  # a home may be a link (to a data disk); what it points to must be ours
    _refuse_foreign(home, st, "TRAINFLOW_HOME")
    if stat.S_IMODE(st.st_mode) & 0o022:
        raise PermissionDenied(
            f"TRAINFLOW_HOME {home} may be written by other users (mode {stat.S_IMODE(st.st_mode):o}): they "
            f"could plant jobs there; run: chmod go-w {home}"
        )
    return home


def jobs_dir(home: Path, *parts: str) -> Path:
    """``<home>/jobs/<parts...>``, each level private (see ``private_dir``)."""
    path = private_dir(home_dir(home) / "jobs")
    for part in parts:
        path = private_dir(path / part)
    return path


def check_job(root: Path) -> bool:
    """False when no job is at ``root``; PermissionDenied when what is there is a link or another user's."""
    try:
        st = os.lstat(root)
    except (FileNotFoundError, NotADirectoryError):
        return False
    _refuse_foreign(root, st, "job directory")
    return True


def open_state(path: Path, flags: int = os.O_RDONLY, mode: int = 0o600) -> int | None:
    """A file descriptor on a state file (never through a link, only this user's), None when it does not exist.

    ``flags`` may add ``O_CREAT`` (then the file is made with ``mode``, private whatever the umask).
    """
    try:
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            _refuse_foreign(path, os.lstat(path), "state file")
        raise
    try:
        _refuse_foreign(path, os.fstat(fd), "state file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_json(path: Path) -> Any:
    """The parsed file (never through a link, only this user's), or None when it does not exist."""
    fd = open_state(path)
    if fd is None:
        return None
    with open(fd, encoding="utf-8") as fh:
        return json.load(fh)
