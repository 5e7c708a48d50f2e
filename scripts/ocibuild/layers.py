"""Deterministic layer tars: sorted entries, one mtime, numeric owners, no inode-dependent hardlinks."""

from __future__ import annotations

import copy
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath

from ocibuild.store import Blob, BlobStore

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
# Layers carry no build time: unchanged content keeps its digest across commits (as ko and jib do).
# 2000-01-01T00:00:00Z, not 0: some tools treat a zero mtime as "unset".
LAYER_MTIME = 946684800


def _dir_info(name: str, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _parents(path: str) -> list[str]:
    parts = PurePosixPath(path).parts[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def write_tree_layer(store: BlobStore, root: Path, paths: Iterable[str], mtime: int = LAYER_MTIME) -> Blob:
    """A layer holding ``paths`` (relative to ``root``: files, symlinks, dirs) and every parent directory.

    Owners are 0:0, directories 0755, files 0755 if executable else 0644 (the umask of the build machine
    does not leak in); a file reached twice through hardlinks is stored twice, so the digest does not
    depend on how the tree was linked.
    """
    wanted = set(paths)
    for path in list(wanted):
        wanted.update(_parents(path))
    with (
        store.writer(LAYER_MEDIA_TYPE) as sink,
        tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name in sorted(wanted):
            full = root / name
            st = full.lstat()
            if stat.S_ISDIR(st.st_mode):
                tar.addfile(_dir_info(name, mtime))
                continue
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
            if stat.S_ISLNK(st.st_mode):
                info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, os.readlink(full)
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                info.mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
                info.size = st.st_size
                with full.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                raise ValueError(f"{full}: only files, directories and symlinks go into a layer")
    assert sink.blob is not None
    return sink.blob


Filter = Callable[[str], bytes | bool]


def normalize_tar_layer(store: BlobStore, source: Path, rewrite: Filter, mtime: int = LAYER_MTIME) -> Blob:
    """Re-emit a rootfs tar as a layer: sorted, ``./`` stripped, one mtime, modes and numeric owners kept.

    ``rewrite(name)`` returns False to drop an entry, bytes to replace a regular file's content, else True.
    Hardlinks are re-pointed at the first member of their group in sorted order, so extraction never meets
    a link before its target.
    """
    with tarfile.open(source, mode="r:") as src:
        originals = {m.name.removeprefix("./").rstrip("/"): m for m in src.getmembers()}
        members = {n: m for n, m in originals.items() if n not in ("", ".") and rewrite(n) is not False}
        groups: dict[str, list[str]] = {}
        for name, member in members.items():
            if member.islnk():
                target = member.linkname.removeprefix("./")
                groups.setdefault(target, [target]).append(name)
        leader = {}
        for target, names in groups.items():
            present = sorted(n for n in names if n in members)
            for name in present:
                leader[name] = (present[0], target)
        with (
            store.writer(LAYER_MEDIA_TYPE) as sink,
            tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name in sorted(members):
                member = members[name]
                info = tarfile.TarInfo(name)
                info.mode, info.uid, info.gid = member.mode, member.uid, member.gid
                info.uname, info.gname, info.mtime = member.uname, member.gname, mtime
                data: io.BufferedIOBase | io.BytesIO | None = None
                if name in leader and leader[name][0] != name:
                    info.type, info.linkname = tarfile.LNKTYPE, leader[name][0]
                elif name in leader:  # the group's first member carries the data of the original target
                    original = originals[leader[name][1]]
                    info.type, info.size = tarfile.REGTYPE, original.size
                    data = src.extractfile(original)  # type: ignore[assignment]
                elif member.isreg():
                    replaced = rewrite(name)
                    if isinstance(replaced, bytes):
                        info.size, data = len(replaced), io.BytesIO(replaced)
                    else:
                        info.size, data = member.size, src.extractfile(member)  # type: ignore[assignment]
                    info.type = tarfile.REGTYPE
                else:
                    info.type, info.linkname = member.type, member.linkname.removeprefix("./")
                    info.devmajor, info.devminor = member.devmajor, member.devminor
                tar.addfile(info, data)
    assert sink.blob is not None
    return sink.blob


def _signature(tar: tarfile.TarFile, member: tarfile.TarInfo) -> tuple[object, ...]:
    digest = ""
    if member.isreg():
        fh = tar.extractfile(member)
        assert fh is not None
        digest = hashlib.file_digest(fh, "sha256").hexdigest()  # type: ignore[arg-type]
    return (member.type, member.mode, member.uid, member.gid, member.linkname, member.size, digest,
            member.devmajor, member.devminor)  # fmt: skip


def diff_layer(store: BlobStore, lower: Path, upper: Path, mtime: int = LAYER_MTIME) -> Blob:
    """The layer that turns normalized layer ``lower`` into normalized layer ``upper``: every entry that is
    new or differs (type, mode, owner, link, content), and an OCI whiteout for each one ``upper`` lacks.

    A hardlink whose target is not in the diff is stored as a regular file (its target lives below).
    """
    with tarfile.open(lower, mode="r:") as low:
        below = {m.name: _signature(low, m) for m in low.getmembers()}
    with tarfile.open(upper, mode="r:") as up:
        members = {m.name: m for m in up.getmembers()}
        changed = {n for n, m in members.items() if below.get(n) != _signature(up, m)}
        present = set(members) | {p for n in members for p in _parents(n)}
        gone = sorted(n for n in below if n not in present and _parent_kept(n, present))
        entries = sorted(
            changed | {f"{os.path.dirname(n)}/.wh.{os.path.basename(n)}".lstrip("/") for n in gone}
        )
        for name in list(entries):
            entries.extend(p for p in _parents(name) if p not in changed)
        with (
            store.writer(LAYER_MEDIA_TYPE) as sink,
            tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name in sorted(set(entries)):
                member = members.get(name)
                if member is None:  # a whiteout, or a parent directory only the lower layer changed
                    info = tarfile.TarInfo(name)
                    info.mtime = mtime
                    if os.path.basename(name).startswith(".wh."):
                        tar.addfile(info, io.BytesIO(b""))
                    else:
                        tar.addfile(_dir_info(name, mtime))
                    continue
                data = None
                if member.islnk() and member.linkname not in changed:
                    target = members[member.linkname]
                    info = copy.copy(member)
                    info.type, info.linkname, info.size = tarfile.REGTYPE, "", target.size
                    data = up.extractfile(target)
                else:
                    info = member
                    data = up.extractfile(member) if member.isreg() else None
                tar.addfile(info, data)
    assert sink.blob is not None
    return sink.blob


def _parent_kept(name: str, present: set[str]) -> bool:
    """Whether ``name``'s directory still exists above (else the parent's own whiteout covers it)."""
    parent = os.path.dirname(name)
    return parent == "" or parent in present
