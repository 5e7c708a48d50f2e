"""Byte code in the staged image: which sources a family's programs load at start (an import probe run as a
container would run it), and compiling them with the image's own python."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from ocibuild.pyenv import PYTHON, VENV


def compile_bytecode(rootfs: Path, sources: Iterable[str]) -> None:
    """Byte-compile with the image's own python (chroot): unchecked-hash pycs, valid whatever the mtimes."""
    listing = "\n".join("/" + s for s in sorted(sources) if s.endswith(".py")) + "\n"
    (rootfs / "dev" / "shm").mkdir(parents=True, exist_ok=True)  # multiprocessing's semaphores
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    cmd = [chroot, str(rootfs), PYTHON, "-m", "compileall", "-q", "-j", "2",
           "--invalidation-mode", "unchecked-hash", "-i", "-"]  # fmt: skip
    result = subprocess.run(cmd, input=listing, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    # compileall exits 1 when a file does not compile (e.g. Python 2 leftovers in some wheels): not fatal,
    # such modules are never imported; anything else is.
    if result.returncode not in (0, 1):
        raise SystemExit(f"compileall failed ({result.returncode}): {result.stderr[-2000:]}")


# Imports each module named on the command line and writes the source file of every module then loaded (and
# each import that failed, with its error) as JSON to argv[1]; run with the venv's python in the rootfs.
_PROBE = """\
import importlib, json, sys
failed = {}
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed[name] = ("%s: %s" % (type(exc).__name__, exc))[:500]
files = sorted({f for m in list(sys.modules.values()) for f in [getattr(m, "__file__", None)]
                if isinstance(f, str) and f.endswith(".py")})
with open(sys.argv[1], "w") as out:
    json.dump({"files": files, "failed": failed}, out)
"""


# The character devices a program expects (the base layer has no device nodes; a container runtime makes them).
_DEVICES = {"null": (1, 3), "zero": (1, 5), "random": (1, 8), "urandom": (1, 9)}


def imported_sources(rootfs: Path, modules: Sequence[str]) -> set[str]:
    """The rootfs-relative sources that importing ``modules`` loads, run with the image's own venv (chroot) and
    no byte code written: what a program of the image that imports them reads at start. It runs as a container
    would: device nodes and its own /proc (a private mount and PID namespace: nothing outlives it)."""
    probe, report = "tmp/ocibuild-probe.py", "tmp/ocibuild-probe.json"
    (rootfs / "tmp").mkdir(exist_ok=True)
    (rootfs / "proc").mkdir(exist_ok=True)
    (rootfs / "dev" / "shm").mkdir(parents=True, exist_ok=True)
    (rootfs / probe).write_text(_PROBE)
    made: list[Path] = []
    env = {
        "PATH": f"/{VENV}/bin:/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": "/root",
        "LANG": "C.UTF-8",
    }
    cmd = [shutil.which("unshare") or "/usr/bin/unshare", "--mount", "--pid", "--fork",
           f"--mount-proc={rootfs / 'proc'}", shutil.which("chroot") or "/usr/sbin/chroot", str(rootfs),
           f"/{VENV}/bin/python", f"/{probe}", f"/{report}", *modules]  # fmt: skip
    try:
        for name, (major, minor) in _DEVICES.items():
            node = rootfs / "dev" / name
            if not os.path.lexists(node):
                os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
                made.append(node)
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/")
        if result.returncode != 0:
            raise SystemExit(f"import probe failed ({result.returncode}): {result.stderr[-2000:]}")
        found = json.loads((rootfs / report).read_text())
    finally:
        for path in [rootfs / probe, rootfs / report, *made]:
            path.unlink(missing_ok=True)
    if found["failed"]:
        raise SystemExit(
            f"the image cannot import what its recipe says it imports at start: {found['failed']}"
        )
    return {os.path.normpath(f.lstrip("/")) for f in found["files"]}
