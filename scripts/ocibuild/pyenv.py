"""The image's virtualenv (/opt/venv): install with uv from the lock, make it host-free, cut it by distribution."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ocibuild.store import write_atomic

VENV = "opt/venv"
SITE = f"{VENV}/lib/python3.11/site-packages"
PLATFORM = "x86_64-manylinux_2_36"  # Debian 12: glibc 2.36
PYTHON = "/usr/bin/python3.11"
SKELETON = ""  # owner of venv files no distribution claims (pyvenv.cfg, bin/python, _virtualenv.py)
_DROP_FILES = ("direct_url.json", "uv_cache.json")  # a host path of the wheel; an install timestamp
_DROP_BIN = re.compile(r"^(activate.*|deactivate\.bat|pydoc\.bat)$")


def uv_binary() -> str:
    found = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    if not Path(found).exists():
        raise SystemExit("uv not found: run 'make setup'")
    return found


def _env() -> dict[str, str]:
    # PYTHONHASHSEED: a package built from its sdist (DeepSpeed) writes set-ordered metadata (its extras):
    # a fixed seed gives the same wheel, so the same layer, on every build
    return {**os.environ, "UV_NO_CONFIG": "1", "VIRTUAL_ENV": "", "PYTHONHASHSEED": "0"}


def locked_constraints(repo: Path, out: Path) -> Path:
    """Every version pinned in uv.lock, as a constraints file (images use exactly the tested versions)."""
    cmd = [uv_binary(), "export", "--frozen", "--all-extras", "--no-emit-project", "--no-hashes",
           "--no-annotate", "--no-header", "-q"]  # fmt: skip
    write_atomic(
        out, subprocess.run(cmd, cwd=repo, check=True, env=_env(), capture_output=True, text=True).stdout
    )
    return out


def lock_constraints(locks: Iterable[Path], out: Path) -> Path:
    """Every version the uv.lock files pin, but their own projects', as one constraints file; the locks must
    agree on each package they share."""
    pins: dict[str, tuple[str, Path]] = {}
    for lock in locks:
        for package in tomllib.loads(lock.read_text())["package"]:
            if {"virtual", "editable"} & set(package.get("source", {})):
                continue  # the project itself
            name, version = normalize(package["name"]), package["version"]
            if pins.setdefault(name, (version, lock))[0] != version:
                raise SystemExit(f"{name}: {pins[name][1]} pins {pins[name][0]}, {lock} pins {version}")
    write_atomic(out, "".join(f"{name}=={version}\n" for name, (version, _) in sorted(pins.items())))
    return out


def resolve(requirements: Iterable[str], constraints: Path, python_version: str) -> dict[str, str]:
    """Distribution name -> version that ``requirements`` resolve to under the constraints."""
    cmd = [uv_binary(), "pip", "compile", "-q", "-", "--no-header", "--no-annotate", "-c", str(constraints),
           "--python-platform", PLATFORM, "--python-version", python_version]  # fmt: skip
    out = subprocess.run(
        cmd, input="\n".join(requirements), capture_output=True, text=True, check=True, env=_env()
    ).stdout
    pins: dict[str, str] = {}
    for line in out.splitlines():
        if "==" in line:
            name, _, version = line.partition("==")
            pins[normalize(name)] = version.split(";")[0].strip()
        elif " @ " in line:
            pins[normalize(line.split(" @ ")[0])] = "(local)"
    return pins


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def install(rootfs: Path, requirements: Iterable[str], constraints: Path, python_version: str) -> None:
    """Create /opt/venv under ``rootfs`` (hardlinked from the uv cache) and make it the image's own."""
    venv = rootfs / VENV
    subprocess.run([uv_binary(), "venv", "-q", "-p", "3.11", str(venv)], check=True, env=_env(), cwd=rootfs)
    cmd = [uv_binary(), "pip", "install", "-q", "--link-mode=hardlink", "--python", str(venv / "bin" / "python"),
           "--python-platform", PLATFORM, "--python-version", python_version, "-c", str(constraints),
           *requirements]  # fmt: skip
    subprocess.run(cmd, check=True, env=_env(), cwd=rootfs)
    _make_host_free(venv, python_version)


def _replace(path: Path, data: bytes) -> None:
    """Write a new file instead of editing in place: the old one may be a hardlink into the uv cache."""
    mode = path.stat().st_mode & 0o777
    path.unlink()
    path.write_bytes(data)
    path.chmod(mode)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _make_host_free(venv: Path, python_version: str) -> None:
    """Point the venv at the image's python and drop every trace of the build machine."""
    (venv / "pyvenv.cfg").write_text(
        f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {python_version}\n"
    )
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").symlink_to(PYTHON)
    for name in ("CACHEDIR.TAG", ".gitignore", ".lock"):
        (venv / name).unlink(missing_ok=True)
    host_shebang = b"#!" + str(venv / "bin" / "python").encode()
    rewritten: dict[str, bytes] = {}
    for script in sorted((venv / "bin").iterdir()):
        if _DROP_BIN.match(script.name):
            script.unlink()
        elif script.is_file() and not script.is_symlink():
            data = script.read_bytes()
            if data.startswith(host_shebang + b"\n"):
                new = b"#!/" + VENV.encode() + b"/bin/python" + data[len(host_shebang) :]
                _replace(script, new)
                rewritten[f"bin/{script.name}"] = new
    site = venv / "lib" / "python3.11" / "site-packages"
    for record in sorted(site.glob("*.dist-info/RECORD")):
        dropped = {f"{record.parent.name}/{name}" for name in _DROP_FILES if (record.parent / name).exists()}
        for name in dropped:
            (site / name).unlink()
        lines = []
        for line in record.read_text().splitlines():
            path = line.rsplit(",", 2)[0]
            if path in dropped:
                continue
            in_venv = os.path.normpath(f"lib/python3.11/site-packages/{path}")
            if in_venv in rewritten:
                data = rewritten[in_venv]
                line = f"{path},{_record_hash(data)},{len(data)}"
            lines.append(line)
        _replace(record, ("\n".join(lines) + "\n").encode())


@dataclass
class Dist:
    name: str
    version: str
    record: bytes
    files: set[str] = field(default_factory=set)  # rootfs-relative


def distributions(rootfs: Path) -> dict[str, Dist]:
    """Installed distributions and the files each RECORD lists (rootfs-relative paths)."""
    dists: dict[str, Dist] = {}
    for record in sorted((rootfs / SITE).glob("*.dist-info/RECORD")):
        stem = record.parent.name.removesuffix(".dist-info")
        name, _, version = stem.rpartition("-")
        data = record.read_bytes()
        dist = Dist(normalize(name), version, data)
        for line in data.decode().splitlines():
            path = line.rsplit(",", 2)[0]
            if path:
                dist.files.add(os.path.normpath(f"{SITE}/{path}"))
        dists[dist.name] = dist
    return dists


def owners(rootfs: Path, dists: dict[str, Dist]) -> dict[str, str]:
    """Every file, symlink and empty directory under /opt/venv -> the distribution that owns it.

    A ``__pycache__`` file belongs to the owner of its source; the rest is the venv skeleton.
    """
    by_path = {path: dist.name for dist in dists.values() for path in dist.files}
    owned: dict[str, str] = {}
    for top, dirs, files in os.walk(rootfs / VENV):
        rel_top = os.path.relpath(top, rootfs)
        entries = list(files) + [d for d in dirs if (Path(top) / d).is_symlink()]
        if not entries and not dirs:
            owned[rel_top] = SKELETON
        for name in entries:
            rel = f"{rel_top}/{name}"
            owner = by_path.get(rel)
            if owner is None and os.path.basename(rel_top) == "__pycache__":
                source = os.path.dirname(rel_top) + "/" + name.split(".", 1)[0] + ".py"
                owner = by_path.get(source)
            owned[rel] = owner if owner is not None else SKELETON
    return owned
