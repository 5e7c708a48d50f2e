"""s3:// publish and download: trainflow's transaction (files, then the manifest; reads checked against it) beside
boto3's ``upload_file``/``download_file`` with their default TransferConfig, against the testbed's S3-compatible
store (``up.sh --objstore``), in the same run: a model of one big file and a model of many small files.

    python benchmarks/artifact_overhead.py --big-mib 1024 --files 1000 --file-kib 64 --json out.json

The boto3 peer runs in its own venv (``--peer-python``: boto3 only; run.py makes it), one file after another as
trainflow does. Printed and written as JSON: seconds per side and case, the ratio trainflow / boto3, and what the
manifest costs (its commit: one GET and one PUT; its read; its size).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

from trainflow.core import artifact, storage

PEER = Path(__file__).resolve().parent / "_boto3_peer.py"


def store_env() -> tuple[str, dict[str, str]]:
    state = json.loads((B.testbed_dir() / "state.json").read_text())
    info = state.get("objstore")
    if not info:
        raise SystemExit("the testbed has no object store: start it with `bash testbed/up.sh --objstore`")
    creds = json.loads(Path(info["credentials_file"]).read_text())
    return info["bucket"], {
        "AWS_ENDPOINT_URL": info["endpoint"],
        "AWS_REGION": info["region"],
        "AWS_ACCESS_KEY_ID": creds["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": creds["secret_access_key"],
    }


def make_models(root: Path, big_mib: int, files: int, file_kib: int) -> dict[str, Path]:
    big, many = root / "big", root / "many"
    big.mkdir(parents=True)
    with (big / "model.safetensors").open("wb") as out:
        block = os.urandom(1 << 20)
        for _ in range(big_mib):
            out.write(block)
    for i in range(files):
        sub = many / f"shard-{i // 100:02d}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"part-{i:04d}.bin").write_bytes(os.urandom(file_kib * 1024))
    return {"big": big, "many": many}


def trainflow_side(src: Path, uri: str, env: dict[str, str], dest: Path) -> dict[str, float]:
    bucket, prefix = storage.split(uri)
    op = storage.operator(bucket, env)
    t0 = time.monotonic()
    attempt = artifact.new_attempt()
    entries = storage.put_files(op, uri, prefix, attempt, storage.local_files(src), env)
    t1 = time.monotonic()
    storage.commit(op, uri, prefix, attempt, entries, env)
    t2 = time.monotonic()
    storage.download(uri, dest, env)
    t3 = time.monotonic()
    storage.read_manifest(uri, env)
    t4 = time.monotonic()
    raw = bytes(op.read(artifact.manifest_key(prefix)))
    return {
        "upload_s": t2 - t0,
        "commit_s": t2 - t1,
        "download_s": t3 - t2,
        "manifest_read_s": t4 - t3,
        "manifest_bytes": float(len(raw)),
    }


def peer_side(
    python: str, src: Path, bucket: str, prefix: str, env: dict[str, str], dest: Path
) -> dict[str, float]:
    proc = subprocess.run(
        [python, str(PEER), str(src), bucket, prefix, str(dest)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=3600,
    )
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def store_data_dir() -> Path:
    """The gateway's data directory (its posix backend: buckets are directories under it)."""
    return B.testbed_dir() / "objstore-data"


def need_space(big_mib: int, files: int, file_kib: int, dirs: list[Path]) -> None:
    """Fail before the first byte, naming the shortfall, when the disks cannot hold one side of a case: the
    source, the stored object with its multipart parts until the upload completes, and the download (a
    full disk otherwise shows up as a store's ``507 InsufficientStorage`` mid-upload)."""
    case_mib = max(big_mib, files * file_kib // 1024)
    per_fs: dict[int, tuple[Path, int]] = {}
    for d in dirs:
        dev = os.stat(d).st_dev
        per_fs[dev] = (d, per_fs.get(dev, (d, 0))[1] + 2 * case_mib)
    per_fs[os.stat(dirs[0]).st_dev] = (dirs[0], per_fs[os.stat(dirs[0]).st_dev][1] + 2 * case_mib)
    for where, mib in per_fs.values():
        free = shutil.disk_usage(where).free // (1 << 20)
        if free < mib + 512:
            raise SystemExit(
                f"artifact benchmark: {where} has {free} MiB free, needs {mib + 512} MiB "
                f"(--big-mib {big_mib}: source, stored object and parts, download); free disk space or lower "
                "--big-mib"
            )


def forget(op: Any, prefix: str, local: Path) -> None:
    """Drop one side's stored objects and its download, so the next side has the same disk to work with."""
    op.remove_all(prefix.rstrip("/") + "/")
    shutil.rmtree(local, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--big-mib", type=int, default=1024)
    p.add_argument("--files", type=int, default=1000)
    p.add_argument("--file-kib", type=int, default=64)
    p.add_argument("--peer-python", required=True, help="a python with boto3")
    p.add_argument("--json", default="")
    args = p.parse_args()
    bucket, env = store_env()
    work = Path(tempfile.mkdtemp(prefix="trainflow-bench-artifacts-"))
    need_space(args.big_mib, args.files, args.file_kib, [work, store_data_dir()])
    res: dict[str, Any] = {"big_mib": args.big_mib, "files": args.files, "file_kib": args.file_kib}
    op = storage.operator(bucket, env)
    run = time.time_ns()
    try:
        models = make_models(work / "src", args.big_mib, args.files, args.file_kib)
        for case, src in models.items():
            peer = peer_side(
                args.peer_python, src, bucket, f"bench/{run}/{case}-boto3", env, work / f"{case}-boto3"
            )
            forget(op, f"bench/{run}/{case}-boto3", work / f"{case}-boto3")
            ours = trainflow_side(
                src, f"s3://{bucket}/bench/{run}/{case}-trainflow", env, work / f"{case}-tf"
            )
            forget(op, f"bench/{run}/{case}-trainflow", work / f"{case}-tf")
            res[case] = {
                "trainflow": ours,
                "boto3": peer,
                "upload_ratio": ours["upload_s"] / peer["upload_s"],
                "download_ratio": ours["download_s"] / peer["download_s"],
            }
            print(
                f"{case}: upload {ours['upload_s']:.2f}s (commit {ours['commit_s'] * 1000:.0f} ms) vs boto3 "
                f"{peer['upload_s']:.2f}s = {res[case]['upload_ratio']:.2f}x; download {ours['download_s']:.2f}s "
                f"vs {peer['download_s']:.2f}s = {res[case]['download_ratio']:.2f}x; manifest "
                f"{ours['manifest_bytes'] / 1024:.1f} KiB, read {ours['manifest_read_s'] * 1000:.0f} ms",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(Exception):
            op.remove_all(f"bench/{run}/")
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
