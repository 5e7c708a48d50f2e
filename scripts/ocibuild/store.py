"""Content-addressed blob store (``<root>/sha256/<hex>``), the same shape as an OCI layout's blobs dir."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Blob:
    digest: str  # "sha256:<hex>"
    size: int
    media_type: str

    def descriptor(self, **extra: Any) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size, **extra}


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` whole: builds sharing a cache (make test's image lanes run side by side) read records
    and constraints files another build may be rewriting, and must never see one half written."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def canonical_json(value: Any) -> bytes:
    """One byte form per value: sorted keys, no spaces (so a config or manifest digest is stable)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class Sink:
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, fh: Any, media_type: str) -> None:
        self._fh, self._hash, self._size, self.media_type = fh, hashlib.sha256(), 0, media_type
        self.blob: Blob | None = None

    def write(self, data: bytes) -> int:
        self._hash.update(data)
        self._size += len(data)
        return int(self._fh.write(data))

    def tell(self) -> int:
        return self._size

    def read(self, size: int = -1) -> bytes:
        raise OSError("a blob sink is write-only")

    def seek(self, pos: int) -> int:
        if pos != self._size:
            raise OSError("a blob sink only appends")
        return pos

    def close(self) -> None:
        """The store closes the file when the blob is complete."""

    def finish(self) -> Blob:
        return Blob("sha256:" + self._hash.hexdigest(), self._size, self.media_type)


class BlobStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "sha256").mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        algo, _, hexdigest = digest.partition(":")
        return self.root / algo / hexdigest

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    @contextmanager
    def writer(self, media_type: str) -> Iterator[Sink]:
        """Stream a blob in; on success it is stored under its digest and ``sink.blob`` is set."""
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".incoming-")
        try:
            with os.fdopen(fd, "wb") as fh:
                sink = Sink(fh, media_type)
                yield sink
            sink.blob = sink.finish()
            os.replace(tmp, self.path(sink.blob.digest))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def put(self, data: bytes, media_type: str) -> Blob:
        with self.writer(media_type) as sink:
            sink.write(data)
        assert sink.blob is not None
        return sink.blob

    def read_json(self, digest: str) -> Any:
        return json.loads(self.path(digest).read_bytes())

    def link_into(self, other: BlobStore, digest: str) -> None:
        """Put a blob of this store into another one: a hardlink where possible, else a copy."""
        dest = other.path(digest)
        if dest.is_file():
            return
        try:
            os.link(self.path(digest), dest)
        except OSError:
            shutil.copyfile(self.path(digest), dest)
