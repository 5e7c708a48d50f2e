"""OCI image config, manifest, image layout (index.json) and archives that ``ctr images import`` reads."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from ocibuild.layers import LAYER_MTIME
from ocibuild.store import Blob, BlobStore, canonical_json

CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
PLATFORM = {"architecture": "amd64", "os": "linux"}
NAME_ANNOTATION = "io.containerd.image.name"
REF_ANNOTATION = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class Layer:
    blob: Blob
    diff_id: str  # digest of the uncompressed tar: the blob itself, since layers are not compressed
    comment: str


@dataclass(frozen=True)
class Runtime:
    env: Sequence[str]
    cmd: Sequence[str]
    workdir: str
    labels: dict[str, str]
    entrypoint: Sequence[str] = ()  # in the config only when set (as Cmd), so other images keep their digests


def _rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_image(
    store: BlobStore, layers: Sequence[Layer], runtime: Runtime, created: int
) -> tuple[Blob, Blob]:
    """Store the config and manifest of an image; returns (manifest, config)."""
    when = _rfc3339(created)
    settings: dict[str, Any] = {
        "Env": list(runtime.env),
        "WorkingDir": runtime.workdir,
        "Labels": runtime.labels,
    }
    if runtime.entrypoint:
        settings["Entrypoint"] = list(runtime.entrypoint)
    if runtime.cmd:
        settings["Cmd"] = list(runtime.cmd)
    config = {
        **PLATFORM,
        "created": when,
        "config": settings,
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [
            {"created": _rfc3339(LAYER_MTIME), "created_by": "ocibuild", "comment": layer.comment}
            for layer in layers
        ],
    }
    config_blob = store.put(canonical_json(config), CONFIG_MEDIA_TYPE)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": config_blob.descriptor(),
        "layers": [layer.blob.descriptor() for layer in layers],
        "annotations": {"org.opencontainers.image.created": when, **runtime.labels},
    }
    return store.put(canonical_json(manifest), MANIFEST_MEDIA_TYPE), config_blob


def tag_of(name: str) -> str:
    """The tag of a fully qualified name (``docker.io/pytorch/pytorch:2.13.0-...`` -> ``2.13.0-...``)."""
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else "latest"


def index_entry(manifest: Blob, name: str) -> dict[str, Any]:
    annotations = {NAME_ANNOTATION: name, REF_ANNOTATION: name}
    entry: dict[str, Any] = manifest.descriptor(platform=PLATFORM, annotations=annotations)
    return entry


def referenced_blobs(store: BlobStore, manifest: Blob) -> list[str]:
    doc = store.read_json(manifest.digest)
    return [manifest.digest, doc["config"]["digest"], *(layer["digest"] for layer in doc["layers"])]


class ImageLayout:
    """An OCI image layout directory; ``skopeo copy oci:<dir>:<name> ...`` reads an image by its name."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = BlobStore(root / "blobs")
        (root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
        index = root / "index.json"
        self.entries: list[dict[str, Any]] = (
            json.loads(index.read_text())["manifests"] if index.exists() else []
        )

    def tag(self, source: BlobStore, manifest: Blob, names: Iterable[str]) -> None:
        for digest in referenced_blobs(source, manifest):
            source.link_into(self.blobs, digest)
        names = list(names)
        self.entries = [e for e in self.entries if e["annotations"][NAME_ANNOTATION] not in names]
        self.entries += [index_entry(manifest, name) for name in names]
        self.entries.sort(key=lambda e: e["annotations"][NAME_ANNOTATION])
        index = {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": self.entries}
        (self.root / "index.json").write_bytes(canonical_json(index))


def _member(name: str, size: int = 0, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode, info.size, info.mtime = (0o755 if directory else 0o644), size, LAYER_MTIME
    return info


def write_archive(store: BlobStore, manifest: Blob, names: Sequence[str], out: BinaryIO) -> None:
    """An OCI layout as one tar holding one image under each of ``names`` (``ctr images import`` input)."""
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [index_entry(manifest, name) for name in names],
    }
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        layout = b'{"imageLayoutVersion":"1.0.0"}'
        tar.addfile(_member("oci-layout", len(layout)), io.BytesIO(layout))
        data = canonical_json(index)
        tar.addfile(_member("index.json", len(data)), io.BytesIO(data))
        tar.addfile(_member("blobs", directory=True))
        tar.addfile(_member("blobs/sha256", directory=True))
        for digest in sorted(set(referenced_blobs(store, manifest))):
            path = store.path(digest)
            with path.open("rb") as fh:
                tar.addfile(_member("blobs/sha256/" + digest.split(":", 1)[1], path.stat().st_size), fh)
