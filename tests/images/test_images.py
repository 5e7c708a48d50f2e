"""make images: the KFP step image built twice (shared cache, then from scratch) has one digest, independent
OCI tools read it, and trainflow runs inside it from the image's own config; archives name it for containerd;
the compiled ``train_job`` component's own container command runs in it.

Needs root (mmdebstrap, chroot) and umoci/skopeo (make image-tools). Run by ``make test-images``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from kfp_driver_input import OUTPUT_FILE, TASK_ROOT, step_container

REPO = Path(__file__).resolve().parents[2]
NAME = "ghcr.io/trainflow/trainflow-kfp:0.1.0"
REQUEST = REPO / "dags_examples" / "requests" / "torch-function.yaml"

pytestmark = pytest.mark.images


def ocibuild(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "scripts")}
    return subprocess.run(
        [sys.executable, "-m", "ocibuild", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def built(out: Path, cache: Path | None) -> dict[str, Any]:
    args = ["build", "kfp", "--out", str(out)] + (["--cache", str(cache)] if cache else [])
    proc = ocibuild(*args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary: dict[str, Any] = json.loads((out / "images.json").read_text())
    print(f"\n{out.name}: {summary['_build']['timings_s']}", file=sys.stderr)
    return summary


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any], Path]:
    root = tmp_path_factory.mktemp("images")
    first = built(root / "shared-cache", None)  # the default cache: warm on a developer machine
    second = built(root / "from-scratch", root / "fresh-cache")  # base (mmdebstrap) and every layer rebuilt
    if first["_build"]["debian_mirror"] != second["_build"]["debian_mirror"]:
        # Debian published between the two builds (the cache keys on its package indexes): build again on it
        shutil.rmtree(root / "shared-cache")
        first = built(root / "shared-cache", None)
    assert first["_build"]["debian_mirror"] == second["_build"]["debian_mirror"]
    return first, second, root / "shared-cache"


def test_two_builds_give_one_digest(builds: tuple[dict[str, Any], dict[str, Any], Path]) -> None:
    first, second, _ = builds
    layers = list(zip(first["kfp"]["layers"], second["kfp"]["layers"], strict=True))
    assert [a["digest"] for a, _ in layers] == [b["digest"] for _, b in layers], layers
    assert first["kfp"]["config"] == second["kfp"]["config"]
    assert first["kfp"]["manifest"] == second["kfp"]["manifest"]
    assert first["kfp"]["python_packages"]["trainflow"] == "0.1.0"
    assert "torch" not in first["kfp"]["python_packages"] and "pip" not in first["kfp"]["python_packages"]


def test_runs_trainflow_from_its_own_config(
    builds: tuple[dict[str, Any], dict[str, Any], Path], tmp_path: Path
) -> None:
    _, _, out = builds
    # skopeo and umoci are independent OCI implementations; umoci checks every digest while unpacking
    inspect = json.loads(_tool(["skopeo", "inspect", f"oci:{out / 'oci'}:{NAME}"]))
    assert inspect["Digest"] == builds[0]["kfp"]["manifest"]
    config = json.loads(_tool(["skopeo", "inspect", "--config", f"oci:{out / 'oci'}:{NAME}"]))["config"]
    _tool(["umoci", "unpack", "--image", f"{out / 'oci'}:{NAME}", str(tmp_path / "bundle")])
    rootfs = tmp_path / "bundle" / "rootfs"
    (rootfs / "workspace" / "request.yaml").write_text(REQUEST.read_text())

    def run_in_image(*argv: str) -> str:
        shell = f"cd {config['WorkingDir']} && exec {shlex.join(argv)}"
        return _tool(["chroot", str(rootfs), "/usr/bin/env", "-i", *config["Env"], "/bin/sh", "-c", shell])

    manifest = yaml.safe_load(run_in_image("trainflow", "render", "-f", "request.yaml"))
    assert manifest["kind"] == "TrainJob"
    # the image renders exactly what the repository's trainflow renders for the same request
    host = subprocess.run(
        [sys.executable, "-m", "trainflow.core.cli", "render", "-f", str(REQUEST)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert manifest["spec"] == yaml.safe_load(host.stdout)["spec"]
    probe = (
        "import importlib.util as u, sys, kfp.dsl.executor_main, trainflow.kfp.components; "
        "print(sys.prefix, sys.version_info[:2], u.find_spec('pip'), u.find_spec('torch'))"
    )
    assert run_in_image("python3", "-c", probe).split() == ["/opt/venv", "(3,", "11)", "None", "None"]
    # byte code shipped in the image is valid as is: nothing new gets compiled at start
    before = set(rootfs.rglob("*.pyc"))
    run_in_image("trainflow", "render", "-f", "request.yaml")
    assert set(rootfs.rglob("*.pyc")) == before


def test_archive_names_the_image_for_containerd(
    builds: tuple[dict[str, Any], dict[str, Any], Path], tmp_path: Path
) -> None:
    _, _, out = builds
    names = ["docker.io/pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime", "localhost:5000/ml/step:1"]
    archives = [tmp_path / "a.tar", tmp_path / "b.tar"]
    for archive in archives:
        proc = ocibuild(
            "archive", "kfp", *(f"--name={n}" for n in names), "-o", str(archive), "--out", str(out)
        )
        assert proc.returncode == 0, proc.stderr
    assert _sha256(archives[0]) == _sha256(archives[1])
    with tarfile.open(archives[0]) as tar:
        fh = tar.extractfile("index.json")
        assert fh is not None
        index = json.load(io.TextIOWrapper(fh))
    entries = index["manifests"]
    assert [e["annotations"]["io.containerd.image.name"] for e in entries] == names
    assert {e["digest"] for e in entries} == {builds[0]["kfp"]["manifest"]}
    assert all(e["platform"] == {"architecture": "amd64", "os": "linux"} for e in entries)
    for name in names:
        inspect = json.loads(_tool(["skopeo", "inspect", f"oci-archive:{archives[0]}:{name}"]))
        assert inspect["Digest"] == builds[0]["kfp"]["manifest"]


def test_archive_rejects_a_short_name(
    builds: tuple[dict[str, Any], dict[str, Any], Path], tmp_path: Path
) -> None:
    proc = ocibuild("archive", "kfp", "--name", "pytorch/pytorch:2.13.0", "-o", str(tmp_path / "x.tar"),
                    "--out", str(builds[2]))  # fmt: skip
    assert proc.returncode == 2
    assert "not fully qualified" in proc.stderr and "docker.io/pytorch/pytorch" in proc.stderr
    assert not (tmp_path / "x.tar").exists()


def test_compiled_train_job_runs_in_the_image_and_its_retry_reuses_the_trainjob(
    builds: tuple[dict[str, Any], dict[str, Any], Path], tmp_path: Path
) -> None:
    _, _, out = builds
    image, command, args = step_container(
        {
            "runtime": "torch-distributed",
            "command": ["python3", "-c", "print('trained by the step image')"],
            "num_nodes": 1,
            "backend": "local",
            "backend_config": {"home": "/mnt/volume/trainflow-home"},  # the job's state on a volume
        }
    )
    assert image == NAME
    config = json.loads(_tool(["skopeo", "inspect", "--config", f"oci:{out / 'oci'}:{NAME}"]))["config"]
    _tool(["umoci", "unpack", "--image", f"{out / 'oci'}:{NAME}", str(tmp_path / "bundle")])
    rootfs = tmp_path / "bundle" / "rootfs"
    volume = tmp_path / "volume"  # survives the pod, like a PVC; everything else is the pod's own
    volume.mkdir()
    (rootfs / "mnt" / "volume").mkdir(parents=True)
    argv = [*command, *args]

    def pod() -> tuple[dict[str, Any], str, str]:
        """One container of the step: its own mount and pid namespaces, /dev and /proc, the image's config."""
        for scratch in ("minio", str(Path(OUTPUT_FILE).parent).lstrip("/")):
            shutil.rmtree(rootfs / scratch, ignore_errors=True)
        step = ["/bin/sh", "-c", f'cd {config["WorkingDir"]} && exec "$@"', "step", *argv]
        script = " && ".join(
            [
                f"mount --rbind /dev {rootfs}/dev",
                f"mount -t proc proc {rootfs}/proc",
                f"mount --bind {volume} {rootfs}/mnt/volume",
                f"exec chroot {rootfs} /usr/bin/env -i {shlex.join([*config['Env'], *step])}",
            ]
        )
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        written = json.loads((rootfs / OUTPUT_FILE.lstrip("/")).read_text())["parameterValues"]
        summary = (rootfs / TASK_ROOT.replace("minio://", "minio/") / "summary").read_text()
        return written, proc.stdout, summary

    outputs, first, summary = pod()
    name = outputs["job_name"]
    assert {k: outputs[k] for k in ("job_name", "namespace", "state")} == {
        "job_name": name,
        "namespace": "default",
        "state": "Complete",
    }
    assert json.loads(outputs["result"])["name"] == name
    assert name.startswith("train-job-") and f"Submitted TrainJob default/{name} (attempt 1)" in first
    assert summary.startswith(f"## TrainJob `default/{name}`: Complete")
    again, second, _ = pod()  # the retried pod: same executor input, fresh container
    # the reused TrainJob's outputs are the fresh run's, its result JSON included
    assert again == outputs and f"TrainJob default/{name} already completed" in second
    assert [p.name for p in (volume / "trainflow-home" / "jobs" / "default").iterdir()] == [name]


def _tool(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)}: {proc.stderr[-3000:]}"
    return proc.stdout


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
