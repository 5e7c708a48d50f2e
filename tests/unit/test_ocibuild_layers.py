"""ocibuild layer tars: the digest depends on content only (not mtimes, umask or hardlinks), rootfs tars are
normalized (device nodes and host files out, hardlinks before their data fixed), blobs are content-addressed."""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from ocibuild.layers import LAYER_MTIME, normalize_tar_layer, write_tree_layer  # noqa: E402
from ocibuild.store import BlobStore  # noqa: E402


def _tree(root: Path, *, exec_mode: int, data_mode: int, mtime: int, hardlink: bool) -> list[str]:
    (root / "opt/venv/bin").mkdir(parents=True)
    (root / "opt/venv/lib/pkg").mkdir(parents=True)
    (root / "opt/venv/bin/tool").write_text("#!/opt/venv/bin/python\n")
    (root / "opt/venv/bin/tool").chmod(exec_mode)
    (root / "opt/venv/lib/pkg/a.py").write_text("A = 1\n")
    if hardlink:
        os.link(root / "opt/venv/lib/pkg/a.py", root / "opt/venv/lib/pkg/b.py")
    else:
        (root / "opt/venv/lib/pkg/b.py").write_text("A = 1\n")
    (root / "opt/venv/bin/python").symlink_to("/usr/bin/python3.11")
    for path in root.rglob("*"):
        if not path.is_symlink():
            if path.is_file() and path.name.endswith(".py"):
                path.chmod(data_mode)
            os.utime(path, (mtime, mtime))
    return ["opt/venv/bin/tool", "opt/venv/bin/python", "opt/venv/lib/pkg/b.py", "opt/venv/lib/pkg/a.py"]


def test_tree_layer_digest_depends_on_content_only(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    one, two = tmp_path / "one", tmp_path / "two"
    paths = _tree(one, exec_mode=0o755, data_mode=0o644, mtime=1_000_000, hardlink=False)
    _tree(two, exec_mode=0o775, data_mode=0o664, mtime=2_000_000, hardlink=True)
    first, second = write_tree_layer(store, one, paths), write_tree_layer(store, two, reversed(paths))
    assert first == second
    assert first.digest == "sha256:" + hashlib.sha256(store.path(first.digest).read_bytes()).hexdigest()
    with tarfile.open(store.path(first.digest)) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert names[:3] == ["opt", "opt/venv", "opt/venv/bin"]  # parents come first and are listed once
    assert {m.mtime for m in members} == {LAYER_MTIME} and {(m.uid, m.gid, m.uname) for m in members} == {
        (0, 0, "")
    }
    modes = {m.name: (m.type, m.mode) for m in members}
    assert modes["opt/venv/bin/tool"] == (tarfile.REGTYPE, 0o755)
    assert modes["opt/venv/lib/pkg/b.py"] == (tarfile.REGTYPE, 0o644)  # a hardlink in the tree, a file here
    assert modes["opt/venv/bin/python"][0] == tarfile.SYMTYPE


def test_tree_layer_digest_changes_with_content(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    paths = _tree(tmp_path / "t", exec_mode=0o755, data_mode=0o644, mtime=1, hardlink=False)
    before = write_tree_layer(store, tmp_path / "t", paths)
    (tmp_path / "t/opt/venv/lib/pkg/a.py").write_text("A = 2\n")
    assert write_tree_layer(store, tmp_path / "t", paths).digest != before.digest


def _rootfs_tar(path: Path) -> None:
    def add(name: str, kind: bytes, data: bytes = b"", **attrs: object) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.size, info.mtime = kind, len(data), 1_700_000_000
        for key, value in attrs.items():
            setattr(info, key, value)
        tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        add("./", tarfile.DIRTYPE, mode=0o755)
        add("./usr/", tarfile.DIRTYPE, mode=0o755)
        add("./usr/bin/", tarfile.DIRTYPE, mode=0o755)
        add("./usr/bin/z", tarfile.REGTYPE, b"perl", mode=0o755)
        add("./usr/bin/a", tarfile.LNKTYPE, linkname="./usr/bin/z", mode=0o755)
        add("./dev/", tarfile.DIRTYPE, mode=0o755)
        add("./dev/null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3)
        add("./etc/", tarfile.DIRTYPE, mode=0o755)
        add("./etc/resolv.conf", tarfile.REGTYPE, b"nameserver 10.255.255.53\n", mode=0o644)
        add(
            "./etc/shadow",
            tarfile.REGTYPE,
            b"root:*:10957:0:99999:7:::\n",
            mode=0o640,
            gid=42,
            gname="shadow",
        )


def test_rootfs_tar_is_normalized_into_a_layer(tmp_path: Path) -> None:
    _rootfs_tar(tmp_path / "rootfs.tar")
    store = BlobStore(tmp_path / "blobs")

    def rewrite(name: str) -> bytes | bool:
        return False if name.startswith("dev/") else b"" if name == "etc/resolv.conf" else True

    blob = normalize_tar_layer(store, tmp_path / "rootfs.tar", rewrite)
    with tarfile.open(store.path(blob.digest)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert list(members) == sorted(members)
        assert "dev/null" not in members and "dev" in members
        assert members["etc/resolv.conf"].size == 0
        assert (members["etc/shadow"].mode, members["etc/shadow"].gid) == (0o640, 42)
        # "usr/bin/a" sorts first: it now carries the data and "z" links to it
        assert members["usr/bin/a"].isreg() and tar.extractfile("usr/bin/a").read() == b"perl"  # type: ignore[union-attr]
        assert members["usr/bin/z"].islnk() and members["usr/bin/z"].linkname == "usr/bin/a"
        assert {m.mtime for m in members.values()} == {LAYER_MTIME}
        tar.extractall(tmp_path / "out", filter="tar")
    assert (tmp_path / "out/usr/bin/z").read_bytes() == b"perl"
    assert normalize_tar_layer(store, tmp_path / "rootfs.tar", rewrite) == blob


def test_distributions_are_cut_into_the_family_layers() -> None:
    """deps, cuda and trainflow by kind; what xgboost-cpu adds beyond torch in its own layer; torch gets the rest."""
    from ocibuild.build import _assign
    from ocibuild.recipes import FAMILIES

    names = ["trainflow", "kfp", "pyyaml", "nvidia-cublas-cu13", "triton", "torch", "numpy", "sympy"]
    dists: dict[str, Any] = dict.fromkeys([*names, "xgboost-cpu", "scipy"])
    layers = _assign(FAMILIES["torch"], dists, {"kfp", "pyyaml"}, {"xgboost": {"xgboost-cpu", "scipy"}})
    assert layers == {
        "deps": {"kfp", "pyyaml"},
        "cuda": {"nvidia-cublas-cu13", "triton"},
        "torch": {"torch", "numpy", "sympy"},
        "xgboost": {"xgboost-cpu", "scipy"},
        "trainflow": {"trainflow"},
        "examples": set(),
    }
