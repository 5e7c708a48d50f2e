"""ocibuild layer tars: the digest depends on content only (not mtimes, umask or hardlinks), rootfs tars are
normalized (device nodes and host files out, hardlinks before their data fixed), blobs are content-addressed."""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
from pathlib import Path

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
    from ocibuild.pyenv import SITE, Dist
    from ocibuild.recipes import FAMILIES

    names = [
        "trainflow",
        "kfp",
        "pyyaml",
        "nvidia-cublas-cu13",
        "nvidia-cusolver",
        "triton",
        "torch",
        "numpy",
    ]
    dists = {n: Dist(n, "1", b"", {f"{SITE}/{n}/x.py"}) for n in [*names, "sympy", "xgboost-cpu", "scipy"]}
    dists |= {
        n: Dist(n, "1", b"", {f"{SITE}/{n}/x.py"})
        for n in ["deepspeed", "jaxlib", "transformers", "torchtune"]
    }
    dists["nvidia-cublas-cu13"].files = {
        f"{SITE}/nvidia/cu13/lib/libcublas.so.13",
        f"{SITE}/nvidia/cu13/lib/x.a",
    }
    dists["nvidia-cusolver"].files = {f"{SITE}/nvidia/cu13/lib/libcusolver.so.12"}  # only a GPU loads it
    dists["triton"].files = {f"{SITE}/triton/__init__.py", f"{SITE}/triton-3.9.0.dist-info/RECORD"}
    own = {
        "xgboost": {"xgboost-cpu", "scipy"},
        "frameworks": {"deepspeed", "jaxlib"},
        "hf": {"transformers"},
        "torchtune": {"torchtune"},
    }
    layers = _assign(FAMILIES["torch"], dists, {"kfp", "pyyaml"}, own)
    assert layers == {
        "deps": {"kfp", "pyyaml"},
        "cuda": {"nvidia-cublas-cu13"},  # cut by path: each layer lists the distributions it holds files of
        "cuda-gpu": {"nvidia-cublas-cu13", "nvidia-cusolver", "triton"},
        "torch": {"torch", "numpy", "sympy"},
        "xgboost": {"xgboost-cpu", "scipy"},
        "frameworks": {"deepspeed", "jaxlib"},
        "hf": {"transformers"},
        "torchtune": {"torchtune"},
        "trainflow": {"trainflow"},
        "examples": set(),
    }


def test_byte_code_follows_the_imports_only_in_the_layers_no_other_family_shares() -> None:
    """The torch family's framework layers hold byte code for what its programs import; ``deps`` and
    ``trainflow`` (the same layers as the kfp image's) and every layer of a family without imports hold all."""
    from ocibuild.build import _by_import
    from ocibuild.recipes import FAMILIES

    torch, kfp = FAMILIES["torch"], FAMILIES["kfp"]
    assert {s.name for s in torch.layers if _by_import(torch, s)} == {
        "cuda", "cuda-gpu", "torch", "xgboost", "frameworks", "hf", "torchtune"
    }  # fmt: skip
    assert not any(_by_import(kfp, s) for s in kfp.layers)
    assert not any(_by_import(f, s) for f in FAMILIES.values() if not f.imports for s in f.layers)


def test_the_cuda_distributions_are_split_into_what_torch_loads_and_what_only_a_gpu_loads() -> None:
    """Each file of a CUDA distribution is in exactly one of ``cuda`` and ``cuda-gpu``; the libraries that
    torch, NCCL and cuSPARSE link at load time stay in ``cuda`` (the CPU-only runtimes image has only it)."""
    from ocibuild.build import _in_layer
    from ocibuild.pyenv import SITE
    from ocibuild.recipes import FAMILIES, IMAGES

    family = FAMILIES["torch"]
    assert any(s.role == "gpu" for s in family.layers)
    cuda, gpu = (next(s for s in family.layers if s.name == n) for n in ("cuda", "cuda-gpu"))
    loaded = ["nvidia/cu13/lib/libcublasLt.so.13", "nvidia/cu13/lib/libcusparse.so.12",
              "nvidia/cu13/lib/libnvJitLink.so.13", "nvidia/cudnn/lib/libcudnn.so.9",
              "nvidia/nvshmem/lib/libnvshmem_host.so.3", "nvidia/nccl/lib/libnccl.so.2",
              "nvidia_cudnn_cu13-9.15.0.dist-info/RECORD"]  # fmt: skip
    gpu_only = ["nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9", "nvidia/cu13/lib/libcusolver.so.12",
                "nvidia/nvshmem/lib/nvshmem_transport_ucx.so.6", "nvidia/nccl/lib/libnccl_device.bc",
                "nvidia/cu13/lib/libcudart_static.a", "triton/__init__.py", "triton/__pycache__/x.cpython-311.pyc",
                "triton-3.9.0.dist-info/RECORD"]  # fmt: skip
    for rel in loaded + gpu_only:
        path = f"{SITE}/{rel}"
        assert _in_layer(cuda, True, path) != _in_layer(gpu, True, path), rel
        assert _in_layer(gpu, True, path) == (rel in gpu_only), rel
        assert _in_layer(cuda, False, path)  # a family without a gpu layer keeps every file in cuda
    assert "cuda-gpu" in IMAGES["trainer"].layers
    assert not {"cuda-gpu"} & (set(IMAGES["runtimes"].layers) | set(IMAGES["torchtune"].layers))


def test_a_debian_layer_is_what_the_bigger_rootfs_adds_changes_or_removes(tmp_path: Path) -> None:
    """diff_layer: new and changed entries, a whiteout for what is gone, a hardlink to an unchanged file stored
    as a file; extracted over the lower layer it gives the upper one."""
    from ocibuild.layers import diff_layer

    def rootfs_tar(name: str, files: dict[str, bytes], links: dict[str, str]) -> Path:
        out = tmp_path / f"{name}.tar"
        with tarfile.open(out, "w") as tar:
            for path, data in files.items():
                info = tarfile.TarInfo(path)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            for path, target in links.items():
                info = tarfile.TarInfo(path)
                info.type, info.linkname = tarfile.LNKTYPE, target
                tar.addfile(info)
        return out

    store = BlobStore(tmp_path / "blobs")
    keep = {"etc/keep": b"same", "usr/lib/libc": b"libc"}
    lower = rootfs_tar("lower", {**keep, "etc/status": b"v1", "etc/gone": b"x"}, {})
    upper = rootfs_tar(
        "upper", {**keep, "etc/status": b"v2", "usr/bin/mpirun": b"mpi"}, {"usr/lib/libc2": "usr/lib/libc"}
    )
    blob = diff_layer(store, lower, upper)
    with tarfile.open(store.path(blob.digest)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {
            "etc",
            "etc/status",
            "etc/.wh.gone",
            "usr",
            "usr/bin",
            "usr/bin/mpirun",
            "usr/lib",
            "usr/lib/libc2",
        }
        assert tar.extractfile("etc/status").read() == b"v2"  # type: ignore[union-attr]
        assert members["usr/lib/libc2"].isreg() and tar.extractfile("usr/lib/libc2").read() == b"libc"  # type: ignore[union-attr]
    assert diff_layer(store, lower, upper) == blob
