"""The base layer: a slim Debian 12 with Python 3.11, made by mmdebstrap and normalized into a layer."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ocibuild.layers import LAYER_MTIME, diff_layer, normalize_tar_layer
from ocibuild.store import Blob, BlobStore, canonical_json, write_atomic

SUITE = "bookworm"
SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
PACKAGES = ("python3.11", "python3", "ca-certificates", "netbase")
# As debian:bookworm-slim: no man pages, docs (copyright files stay) or translations; unsafe-io for speed.
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "force-unsafe-io",
)
# The runtime mounts these; the copies mmdebstrap takes from the build machine must not ship.
EMPTIED = ("etc/resolv.conf", "etc/hostname")


@dataclass(frozen=True)
class Base:
    blob: Blob
    packages: dict[str, str]  # Debian package -> version
    python_version: str  # e.g. 3.11.2

    @property
    def description(self) -> str:
        return f"Debian {SUITE} (mmdebstrap minbase, slim) + {' '.join(PACKAGES)}"


@functools.cache
def mirror_state() -> dict[str, str]:
    """Each source's checksum of its ``main`` package index, read from its InRelease: the mirror moves (security
    updates), and a layer built from an older index must not be taken from the cache for a newer one."""
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True)
    index = f"main/binary-{arch.stdout.strip()}/Packages.xz"
    state: dict[str, str] = {}
    for source in SOURCES:
        _, uri, suite, _ = source.split(" ", 3)
        url = f"{uri}/dists/{suite}/InRelease"
        with urllib.request.urlopen(url, timeout=60) as response:
            text = response.read().decode()
        sha256 = text.split("\nSHA256:\n", 1)[-1]
        found = [line.split()[0] for line in sha256.splitlines() if line.split()[-1:] == [index]]
        if not found:
            raise SystemExit(f"{url} lists no {index}")
        state[f"{uri} {suite}"] = found[0]
    return state


def _recipe() -> dict[str, object]:
    version = subprocess.run(["mmdebstrap", "--version"], capture_output=True, text=True, check=True)
    return {
        "suite": SUITE,
        "sources": SOURCES,
        "mirror": mirror_state(),
        "packages": PACKAGES,
        "dpkg": DPKG_OPTIONS,
        "epoch": LAYER_MTIME,
        "mmdebstrap": version.stdout.strip(),
        "emptied": EMPTIED,
        "format": 1,
    }


def _rewrite(name: str) -> bytes | bool:
    if name.startswith("dev/"):  # device nodes: the runtime provides /dev
        return False
    if name in EMPTIED:
        return b""
    return True


def _dpkg_status(layer: Path) -> dict[str, str]:
    with tarfile.open(layer) as tar:
        fh = tar.extractfile("var/lib/dpkg/status")
        assert fh is not None
        text = fh.read().decode()
    packages: dict[str, str] = {}
    for stanza in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace()
        )
        if "Package" in fields and fields.get("Status", "").endswith(" installed"):
            packages[fields["Package"]] = fields["Version"]
    return dict(sorted(packages.items()))


def _mmdebstrap(
    store: BlobStore, cache: Path, key: str, packages: tuple[str, ...], hooks: tuple[str, ...]
) -> Blob:
    """One mmdebstrap run (minbase + ``packages``, then the customize ``hooks``), normalized into a layer."""
    if os.geteuid() != 0:
        raise SystemExit("building a Debian layer needs root (mmdebstrap --mode=root)")
    cache.mkdir(parents=True, exist_ok=True)
    raw = cache / f".mmdebstrap-{key}-{os.getpid()}.tar"
    cmd = [
        "mmdebstrap", "--variant=minbase", "--mode=root", "--format=tar",
        "--include=" + ",".join(packages),
        *(f"--dpkgopt={opt}" for opt in DPKG_OPTIONS),
        *(f"--customize-hook={hook}" for hook in hooks),
        "--verbose" if os.environ.get("OCIBUILD_VERBOSE") else "--quiet",
        SUITE, str(raw), *SOURCES,
    ]  # fmt: skip
    try:
        subprocess.run(cmd, check=True, env={**os.environ, "SOURCE_DATE_EPOCH": str(LAYER_MTIME)})
        return normalize_tar_layer(store, raw, _rewrite)
    finally:
        raw.unlink(missing_ok=True)


def build_base(store: BlobStore, cache: Path, refresh: bool = False) -> Base:
    """The base layer, from the cache while the mirror's package indexes are the ones it was built from."""
    recipe = _recipe()
    key = hashlib.sha256(canonical_json(recipe)).hexdigest()[:16]
    record = cache / f"base-{key}.json"
    if record.is_file() and not refresh:
        saved = json.loads(record.read_text())
        blob = Blob(saved["digest"], saved["size"], saved["mediaType"])
        if store.has(blob.digest):
            return Base(blob, saved["packages"], saved["python_version"])
    blob = _mmdebstrap(store, cache, key, PACKAGES, ())
    packages = _dpkg_status(store.path(blob.digest))
    python_version = packages["python3.11"].split("-", 1)[0]
    write_atomic(
        record,
        json.dumps(
            {
                "digest": blob.digest,
                "size": blob.size,
                "mediaType": blob.media_type,
                "packages": packages,
                "python_version": python_version,
                "recipe": recipe,
            },
            indent=1,
        ),
    )
    return Base(blob, packages, python_version)


@dataclass(frozen=True)
class DebianLayer:
    """Debian packages (and customize hooks) on top of the base, as one layer: what they add or change."""

    blob: Blob
    packages: dict[str, str]  # the packages this layer adds -> version
    comment: str


def build_debian_layer(
    store: BlobStore, cache: Path, base: Base, name: str, packages: tuple[str, ...], hooks: tuple[str, ...]
) -> DebianLayer:
    """mmdebstrap of the base's packages plus ``packages``, minus the base: the files that differ, with
    whiteouts for what the base has and the result does not. Cached by recipe and base digest."""
    recipe = {**_recipe(), "base": base.blob.digest, "extra": packages, "hooks": hooks, "layer": name}
    key = hashlib.sha256(canonical_json(recipe)).hexdigest()[:16]
    record = cache / f"debian-{name}-{key}.json"
    comment = f"Debian packages {' '.join(packages)} (and their dependencies) over the base"
    if record.is_file():
        saved = json.loads(record.read_text())
        blob = Blob(saved["digest"], saved["size"], saved["mediaType"])
        if store.has(blob.digest):
            return DebianLayer(blob, saved["packages"], comment)
    full = _mmdebstrap(store, cache, key, PACKAGES + packages, hooks)
    try:
        blob = diff_layer(store, store.path(base.blob.digest), store.path(full.digest))
    finally:
        if full.digest != base.blob.digest:
            store.path(full.digest).unlink(missing_ok=True)
    # dpkg's status file changed, so the layer holds it: what it lists beyond the base is what was added
    added = {p: v for p, v in _dpkg_status(store.path(blob.digest)).items() if base.packages.get(p) != v}
    write_atomic(record, json.dumps({"digest": blob.digest, "size": blob.size, "mediaType": blob.media_type,
                                     "packages": added, "recipe": recipe}, indent=1))  # fmt: skip
    return DebianLayer(blob, added, comment)
