"""Pods mode: images for containerd, and the Trainer controller installed in cluster as users install it.

The Trainer runs from ``manifests/overlays/manager`` of the pinned release (minus its remote JobSet
reference: JobSet runs as a host process) with the TrainJobStatus feature gate, so its status server
takes ``report()`` calls from pods; the default runtimes come from ``manifests/overlays/runtimes``, with
the release's image tags (IfNotPresent pulls), as a Helm or kustomize install has them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import oci
import yaml
from layout import read_versions

NAMESPACE = "kubeflow-system"
DEPLOYMENT = "kubeflow-trainer-controller-manager"
FEATURE_GATES = "TrainJobStatus=true"
CONTROLLER_IMAGE = "ghcr.io/kubeflow/trainer/trainer-controller-manager"
# Images to import besides pause and the controller, separated by ':': OCI archives (*.tar), OCI layout
# directories (holding an oci-layout file), or directories of either. make e2e-pods passes the runtime images
# built by `make pods-images` as layouts whose blobs are hardlinks into the build cache, so a multi-GB image
# is never copied into an archive first: it is streamed into containerd.
IMAGES_ENV = "TRAINFLOW_TESTBED_IMAGES"


def _is_layout(path: Path) -> bool:
    return path.is_dir() and (path / "oci-layout").is_file()


def _archive_index(path: Path) -> tuple[list[str], list[str]]:
    """Image names and manifest digests in an OCI archive's (or layout's) index.json."""
    index = json.loads((path / "index.json").read_text()) if _is_layout(path) else _tar_index(path)
    manifests = index.get("manifests", [])
    names = [m.get("annotations", {}).get("io.containerd.image.name", "?") for m in manifests]
    return names, [m["digest"] for m in manifests]


def _tar_index(path: Path) -> Any:
    with tarfile.open(path) as t:
        for member in t:
            if member.name.removeprefix("./") == "index.json":
                f = t.extractfile(member)
                assert f is not None
                return json.load(f)
    raise FileNotFoundError(f"{path}: no index.json (not an OCI archive)")


def image_archives(L: Any, nb: Path, version: str) -> list[Path]:
    """pause, the Trainer controller (built here from the testbed's binary), then $TRAINFLOW_TESTBED_IMAGES."""
    out_dir = L.dir / "images"
    out_dir.mkdir(exist_ok=True)
    controller = out_dir / "trainer-controller-manager.oci.tar"
    oci.write_image(
        controller,
        [f"{CONTROLLER_IMAGE}:{version}"],
        [(L.bin / "trainer-controller-manager", "/manager", 0o755)],
        ["/manager"],
        user="65532:65532",
    )
    archives = [nb / "pause.oci.tar", controller]
    for item in filter(None, os.environ.get(IMAGES_ENV, "").split(":")):
        p = Path(item)
        if _is_layout(p):
            archives.append(p)
        elif p.is_dir():
            archives += sorted(q for q in p.iterdir() if q.suffix == ".tar" or _is_layout(q))
        elif p.is_file():
            archives.append(p)
        else:
            raise FileNotFoundError(f"{IMAGES_ENV}: {p} does not exist")
    return archives


def _ctr(sock: Path, nb: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(nb / "ctr"), "--address", str(sock), "--namespace", "k8s.io", *args]
    return subprocess.run(argv, capture_output=True, text=True)


def _import(sock: Path, nb: Path, archive: Path) -> subprocess.CompletedProcess[str]:
    """ctr images import, a layout streamed as a tar; containerd drops each layer's blob once unpacked (the
    snapshot is what runs), so a node holds an image once, not twice (ctr allows that only with --local: the
    import runs in ctr, against containerd's content and snapshot services)."""
    argv = [str(nb / "ctr"), "--address", str(sock), "--namespace", "k8s.io", "images", "import",
            "--local", "--discard-unpacked-layers"]  # fmt: skip
    if not _is_layout(archive):
        return subprocess.run([*argv, str(archive)], capture_output=True, text=True)
    members = ["oci-layout", "index.json", "blobs"]
    with (
        tempfile.TemporaryFile() as err
    ):  # a file, not a pipe: tar never blocks on a full stderr while ctr reads
        with subprocess.Popen(["tar", "-C", str(archive), "--hard-dereference", "-cf", "-", *members],
                              stdout=subprocess.PIPE, stderr=err) as tar:  # fmt: skip
            r = subprocess.run([*argv, "-"], stdin=tar.stdout, capture_output=True, text=True)
            assert tar.stdout is not None
            tar.stdout.close()
        err.seek(0)
        tar_err = err.read().decode(errors="replace")
    if tar.returncode != 0 and r.returncode == 0:
        return subprocess.CompletedProcess(r.args, tar.returncode, r.stdout, f"tar: {tar_err}")
    return r


def _present(sock: Path, nb: Path) -> dict[str, str]:
    """Image name -> manifest digest already in containerd (its root outlives down, as a node's images do)."""
    out = {}
    for line in _ctr(sock, nb, "images", "ls").stdout.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 3:
            out[cols[0]] = cols[2]
    return out


def archives(L: Any, nb: Path) -> list[Path]:
    return image_archives(L, nb, _trainer_version(L))


def import_images(
    tb: Any, sock: Path, nb: Path, node_name: str, archives: list[Path]
) -> list[dict[str, Any]]:
    """Import into one node's containerd every archive whose images it does not hold at the same digest."""
    present = _present(sock, nb)
    done = []
    for archive in archives:
        t0 = time.time()
        names, digests = _archive_index(archive)
        size = _size(archive)
        cached = all(present.get(n) == d for n, d in zip(names, digests, strict=True))
        if not cached:
            r = _import(sock, nb, archive)
            if r.returncode != 0:
                raise tb.TestbedError(
                    f"ctr images import {archive} on {node_name} failed: {r.stderr.strip()}"
                )
        seconds = round(time.time() - t0, 1)
        done.append(
            {
                "names": names,
                "archive": str(archive),
                "bytes": size,
                "import_seconds": seconds,
                "cached": cached,
                "node": node_name,
            }
        )
        how = "already present" if cached else f"imported in {seconds}s"
        tb.log(f"{node_name}: image {', '.join(names)} ({size / 2**20:.0f} MiB): {how}")
    return done


def _size(archive: Path) -> int:
    if not _is_layout(archive):
        return archive.stat().st_size
    return sum(p.stat().st_size for p in (archive / "blobs").rglob("*") if p.is_file())


def remove_containers(sock: Path, nb: Path) -> None:
    """Delete every task and container (pods' sandboxes too) so the next start finds only images."""
    for task in _ctr(sock, nb, "tasks", "ls", "-q").stdout.split():
        _ctr(sock, nb, "tasks", "rm", "-f", task)
    ids = _ctr(sock, nb, "containers", "ls", "-q").stdout.split()
    if ids:
        _ctr(sock, nb, "containers", "rm", *ids)


def _trainer_version(L: Any) -> str:
    return read_versions(L.bin)["trainer"]


def _kustomize(tb: Any, k: Any, path: Path) -> list[dict[str, Any]]:
    r = k.run("kustomize", str(path))
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def install(tb: Any, L: Any, k: Any, nb: Path) -> list[dict[str, Any]]:
    """Install the Trainer controller in cluster; wait until its webhook answers; install the runtimes."""
    src = L.etc / "trainer-manifests"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(nb / "manifests" / "trainer", src)
    kfile = src / "overlays" / "manager" / "kustomization.yaml"
    kust = yaml.safe_load(kfile.read_text())
    kust["resources"] = [r for r in kust["resources"] if "third-party/jobset" not in r]
    kust.setdefault("patches", []).append(
        {
            "target": {"kind": "Deployment", "name": DEPLOYMENT},
            "patch": yaml.safe_dump(
                [
                    {
                        "op": "add",
                        "path": "/spec/template/spec/containers/0/args/-",
                        "value": f"--feature-gates={FEATURE_GATES}",
                    }
                ]
            ),
        }
    )
    kfile.write_text(yaml.safe_dump(kust, sort_keys=False))
    k.apply_objs(_kustomize(tb, k, src / "overlays" / "manager"))
    all_procs = tb.components(L)
    t0 = time.time()
    tb.wait_for(
        "Trainer controller Deployment available",
        lambda: (
            k.run(
                "get",
                "deploy",
                DEPLOYMENT,
                "-n",
                NAMESPACE,
                "-o",
                "jsonpath={.status.availableReplicas}",
                check=False,
            ).stdout.strip()
            == "1"
        ),
        240 * tb.TS,
        interval=1,
        watch=all_procs,
        L=L,
    )
    tb.wait_for(
        "Trainer validating webhook to answer",
        lambda: tb.probe_trainer_webhook(k),
        120 * tb.TS,
        watch=all_procs,
        L=L,
    )
    tb.log(
        f"Trainer controller in cluster ({FEATURE_GATES}) and its webhook ready in {time.time() - t0:.0f}s"
    )
    runtimes = _kustomize(tb, k, src / "overlays" / "runtimes")
    k.apply_objs(runtimes)
    tb.log(
        f"ClusterTrainingRuntimes (overlays/runtimes): {', '.join(r['metadata']['name'] for r in runtimes)}"
    )
    return runtimes
