"""A completed local job's ``file://`` output, published as one step: the trainer wrote into the job's staging
directory; the supervisor copies it beside the target and swaps the two directories, so a reader of the target
sees the previous model or the new one, never a mix, and a job that failed publishes nothing (docs/artifacts.md).

The swap is Linux's ``renameat2(RENAME_EXCHANGE)``, through ctypes: the standard library has no binding and the
call is one line, so no package is worth its weight here. Where the filesystem refuses it (EINVAL), two renames
are used, with a moment in which the target does not exist (a reader sees no model, never a mix).
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainflow.core import artifact
from trainflow.core.storage import local_files

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


class OutputPublishFailed(RuntimeError):
    """The staged output could not be published to its directory; the previous one is left as it was."""

    reason = "OutputPublishFailed"


def _exchange(a: Path, b: Path) -> bool:
    """Swap the two paths atomically; False when the system or the filesystem cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.renameat2
    except (OSError, AttributeError):
        return False
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if call(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _fsync_tree(root: Path) -> None:
    """The copied files and their directories on disk before the swap makes them the model."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _retire(previous: Path, target: Path) -> None:
    """Keep the model just replaced beside the target until the next publish, so a reader that opened it before
    the swap reads it whole (deleting it at once emptied it under such a reader); the one before it goes now."""
    kept = target.parent / f".{target.name}.trainflow-replaced"
    shutil.rmtree(kept, ignore_errors=True)
    os.rename(previous, kept)


def publish_dir(staging: Path, target: Path) -> list[str]:
    """Make ``target`` hold exactly the files staged in ``staging``; returns their relative paths. Nothing staged
    publishes nothing (a trainer that wrote the path itself keeps what it wrote). The staged tree may not hold
    a symlink; the target, when it exists, must be a directory and not a symlink."""
    files = [rel for _path, rel in local_files(staging)] if staging.is_dir() else []
    if not files:
        return []
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise OutputPublishFailed(f"{target} is not a directory: output_uri must name a directory (or none)")
    target.parent.mkdir(parents=True, exist_ok=True)
    new = target.parent / f".{target.name}.trainflow-{artifact.new_attempt()}"
    try:
        moved = os.stat(staging).st_dev == os.stat(target.parent).st_dev
        if moved:
            os.rename(staging, new)  # same filesystem: the staged tree itself, no copy
        else:
            shutil.copytree(staging, new, symlinks=True)
        _fsync_tree(new)
        if not target.exists():
            os.rename(new, target)
        elif _exchange(new, target):
            _retire(new, target)  # the previous model, now at the new tree's name
        else:
            old = new.with_name(new.name + ".old")
            os.rename(target, old)
            os.rename(new, target)
            _retire(old, target)
    except OSError as e:
        if new.exists() and not staging.exists():
            os.rename(new, staging)  # the job's files stay in its directory, for a look or a publish by hand
        shutil.rmtree(new, ignore_errors=True)
        if e.errno == errno.ENOSPC:
            raise
        raise OutputPublishFailed(f"publishing the output to {target} failed: {e}") from None
    if not moved:
        shutil.rmtree(staging, ignore_errors=True)  # published: the copy in the job directory is spare
    return files


def publish_planned(plan: Mapping[str, Any]) -> str:
    """Publish a job plan's local ``output_uri`` (every node succeeded); the line the supervisor logs."""
    target = plan.get("output_target")
    if not target:
        return f"the output stays in {plan.get('output_dir')}"
    files = publish_dir(Path(plan["output_dir"]), Path(target))
    return f"published {len(files)} file(s) to {target}" if files else f"nothing staged for {target}"
