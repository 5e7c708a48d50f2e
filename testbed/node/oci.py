#!/usr/bin/env python3
"""Write a single-layer OCI image archive (an OCI layout in a tar), importable by ``ctr images import``.

For the testbed's small images (the pause sandbox, the Trainer controller): files from the host, owned by
root, mtime 0, so the same inputs give the same digests. Usage:
  oci.py OUT.tar --name REF [--name REF ...] --entrypoint JSON [--user U] [--env K=V ...] SRC=DEST[:MODE] ...
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
from pathlib import Path


def _tar_layer(files: list[tuple[Path, str, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        dirs: set[str] = set()
        for _, dest, _ in sorted(files, key=lambda f: f[1]):
            parts = dest.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    ti = tarfile.TarInfo(d)
                    ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                    t.addfile(ti)
        for src, dest, mode in sorted(files, key=lambda f: f[1]):
            data = src.read_bytes()
            ti = tarfile.TarInfo(dest.strip("/"))
            ti.size, ti.mode = len(data), mode
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def write_image(
    out: Path,
    names: list[str],
    files: list[tuple[Path, str, int]],
    entrypoint: list[str],
    user: str = "",
    env: list[str] | None = None,
) -> str:
    """Write the archive; returns the manifest digest."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> tuple[str, int]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return digest, len(data)

    layer, layer_size = blob(_tar_layer(files))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "User": user, "Env": env or []},
        "rootfs": {"type": "layers", "diff_ids": [layer]},
    }
    cfg, cfg_size = blob(json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg, "size": cfg_size},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": layer_size}
        ],
    }
    man, man_size = blob(json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": man,
                "size": man_size,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                },
            }
            for name in names
        ],
    }
    entries = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": json.dumps(index).encode()}
    entries.update({f"blobs/sha256/{d.split(':', 1)[1]}": b for d, b in blobs.items()})
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as t:
        for d in ("blobs", "blobs/sha256"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            t.addfile(ti)
        for name in sorted(entries):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(entries[name]), 0o644
            t.addfile(ti, io.BytesIO(entries[name]))
    tmp.replace(out)
    return man


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--name", action="append", required=True)
    ap.add_argument("--entrypoint", required=True)
    ap.add_argument("--user", default="")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("files", nargs="+", help="SRC=DEST[:MODE]")
    a = ap.parse_args()
    files = []
    for spec in a.files:
        src, _, dest = spec.partition("=")
        dest, _, mode = dest.partition(":")
        files.append((Path(src), dest, int(mode or "755", 8)))
    print(write_image(a.out, a.name, files, json.loads(a.entrypoint), a.user, a.env))


if __name__ == "__main__":
    main()
