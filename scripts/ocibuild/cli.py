"""Command line: ``build`` images into an OCI layout, ``archive`` one image under any names for containerd."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from ocibuild.layout import MANIFEST_MEDIA_TYPE, ImageLayout, write_archive
from ocibuild.recipes import IMAGES, REPO, VERSION
from ocibuild.store import Blob, BlobStore

DEFAULT_OUT = REPO / "dist" / "images"
DEFAULT_CACHE = Path.home() / ".cache" / "trainflow" / "images"


def _fully_qualified(name: str) -> str:
    first = name.split("/", 1)[0]
    if "/" not in name or not ("." in first or ":" in first or first == "localhost"):
        raise argparse.ArgumentTypeError(
            f"{name!r} is not fully qualified: containerd's CRI looks images up as registry/path:tag, "
            "e.g. docker.io/pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
        )
    if ":" not in name.rsplit("/", 1)[1] and "@" not in name:
        raise argparse.ArgumentTypeError(
            f"{name!r} has no tag: add one (':latest' makes kubelets pull Always)"
        )
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ocibuild", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build images into <out>/oci and write <out>/images.json")
    build.add_argument(
        "images", nargs="*", metavar="IMAGE", help=f"any of {', '.join(IMAGES)} (default: all)"
    )
    build.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="output directory (default: dist/images)"
    )
    build.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="base, layer and blob cache")
    build.add_argument(
        "--wheel", type=Path, help=f"trainflow wheel (default: dist/trainflow-{VERSION}-*.whl)"
    )
    build.add_argument("--refresh-base", action="store_true", help="rebuild the Debian base (mirror updates)")
    archive = sub.add_parser("archive", help="write one built image as an OCI archive under the given names")
    archive.add_argument("image", choices=list(IMAGES))
    archive.add_argument("--name", action="append", type=_fully_qualified, default=[],
                         help="fully qualified name (repeatable; default: the image's default name)")  # fmt: skip
    archive.add_argument("-o", "--output", required=True, help="archive path, or - for stdout")
    archive.add_argument("--layout", action="store_true",
                         help="write an OCI layout directory (blobs hardlinked, nothing copied) instead of a tar")  # fmt: skip
    archive.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="where 'build' wrote (default: dist/images)"
    )
    opts = parser.parse_args(argv)
    if opts.command == "build":
        from ocibuild.build import build as run_build

        unknown = sorted(set(opts.images) - set(IMAGES))
        if unknown:
            parser.error(f"unknown image(s) {', '.join(unknown)}: choose from {', '.join(IMAGES)}")
        wheel = opts.wheel or next(iter(sorted((REPO / "dist").glob(f"trainflow-{VERSION}-*.whl"))), None)
        if wheel is None or not wheel.is_file():
            parser.error("no trainflow wheel: run 'make dist' first (or pass --wheel)")
        summary = run_build(opts.images or list(IMAGES), opts.out, opts.cache, wheel, opts.refresh_base)
        for image_id in opts.images or list(IMAGES):
            entry = summary[image_id]
            print(f"{image_id:9} {entry['names'][0]}  {entry['manifest']}  {entry['size'] / 1e6:,.0f} MB")
        return 0
    summary_path = opts.out / "images.json"
    if not summary_path.is_file():
        parser.error(f"{summary_path} not found: run 'make images' first")
    entry = json.loads(summary_path.read_text()).get(opts.image)
    if entry is None:
        parser.error(f"{opts.image} is not built in {opts.out}: run 'make images'")
    store = BlobStore(opts.out / "oci" / "blobs")
    manifest = Blob(entry["manifest"], store.path(entry["manifest"]).stat().st_size, MANIFEST_MEDIA_TYPE)
    names = opts.name or entry["names"]
    if opts.layout:
        if opts.output == "-":
            parser.error("--layout writes a directory: give -o DIR")
        out = Path(opts.output)
        if out.is_symlink() or (out.exists() and not (out / "oci-layout").is_file()):
            parser.error(
                f"{out} exists and is not an OCI layout: give a new directory (only a layout is replaced)"
            )
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        ImageLayout(out).tag(store, manifest, names)
        print(f"wrote {out}/: {opts.image} as {', '.join(names)} (layout)", file=sys.stderr)
    elif opts.output == "-":
        write_archive(store, manifest, names, sys.stdout.buffer)
    else:
        Path(opts.output).parent.mkdir(parents=True, exist_ok=True)
        with open(opts.output, "wb") as fh:
            write_archive(store, manifest, names, fh)
        print(f"wrote {opts.output}: {opts.image} as {', '.join(names)}", file=sys.stderr)
    return 0
