"""Build images: base layer, one staged venv per family, layers cut by distribution (cached by content)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ocibuild import bytecode, pyenv
from ocibuild.debian import Base, build_base, build_debian_layer, mirror_state
from ocibuild.layers import LAYER_MEDIA_TYPE, write_tree_layer
from ocibuild.layout import ImageLayout, Layer, Runtime, write_image
from ocibuild.recipes import (
    BASE_ENV,
    CMD,
    DEBIAN_LAYERS,
    EXAMPLE_FILES,
    EXAMPLES_DIR,
    FAMILIES,
    GPU_ONLY,
    IMAGES,
    REPO,
    Family,
    LayerSpec,
    cuda_dist,
    gpu_only,
)
from ocibuild.store import Blob, BlobStore, canonical_json, write_atomic

# Bump when the layer recipe changes in a way the cache key would not see.
LAYER_FORMAT = 1


def log(message: str) -> None:
    print(f"[ocibuild] {message}", file=sys.stderr, flush=True)


@dataclass
class Context:
    store: BlobStore
    cache: Path
    base: Base
    constraints: Path
    wheel: Path
    timings: dict[str, float] = field(default_factory=dict)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def created_epoch() -> int:
    """SOURCE_DATE_EPOCH if set, else the time of the HEAD commit (the reproducible-builds convention)."""
    return int(os.environ.get("SOURCE_DATE_EPOCH") or _git("log", "-1", "--format=%ct"))


def _constraints(ctx: Context, family: Family) -> Path:
    """uv.lock's versions, or, for a family of projects, the versions their own locks pin."""
    if not family.projects:
        return ctx.constraints
    locks = [REPO / project / "uv.lock" for project in family.projects]
    return pyenv.lock_constraints(locks, ctx.cache / f"constraints-{family.name}.txt")


def _own(ctx: Context, family: Family, spec: LayerSpec, constraints: Path) -> set[str]:
    """What a layer's own requirements add beyond the family's requirements that are not an ``own`` layer's
    and those of the ``own`` layers before it (role ``own``): adding an ``own`` layer after the others
    leaves their content, and digests, as they were."""
    python = ctx.base.python_version
    own_specs = [s for s in family.layers if s.role == "own"]
    later = {r for s in own_specs[own_specs.index(spec) + 1 :] for r in s.requirements}
    below = [r for r in family.extras_requirements if r not in spec.requirements and r not in later]
    return set(pyenv.resolve([*below, *spec.requirements], constraints, python)) - set(
        pyenv.resolve(below, constraints, python)
    )


def _assign(
    family: Family, dists: dict[str, pyenv.Dist], deps: set[str], own: dict[str, set[str]]
) -> dict[str, set[str]]:
    """Layer name -> the distributions it holds (``own`` maps a layer of that role to its distributions)."""
    by_name: dict[str, set[str]] = {spec.name: set() for spec in family.layers}
    by_role = {spec.role: spec.name for spec in family.layers if spec.role != "own"}
    for name in dists:
        own_layer = next((layer for layer, names in own.items() if name in names), None)
        if name == "trainflow":
            role = "trainflow"
        elif name in deps:
            role = "deps"
        elif own_layer is not None:
            by_name[own_layer].add(name)
            continue
        elif cuda_dist(name) and "cuda" in by_role:
            role = "cuda"
        else:
            role = "rest"
        if role not in by_role:
            raise SystemExit(f"{name} is installed but family {family.name} has no {role!r} layer")
        by_name[by_role[role]].add(name)
    if "gpu" in by_role:  # ``cuda``'s distributions cut by path: each layer lists those it holds files of
        cuda = by_name[by_role["cuda"]]
        by_name[by_role["gpu"]] = {n for n in cuda if any(_gpu_file(p) for p in dists[n].files)}
        by_name[by_role["cuda"]] = {n for n in cuda if not all(_gpu_file(p) for p in dists[n].files)}
    return by_name


def _gpu_file(path: str) -> bool:
    return gpu_only(os.path.relpath(path, pyenv.SITE))


def _in_layer(spec: LayerSpec, split: bool, path: str) -> bool:
    """Whether a path of one of the layer's distributions is in it: with a ``gpu`` layer in the family
    (``split``), ``cuda`` and ``gpu`` divide their distributions' files by GPU_ONLY."""
    return not split or spec.role not in ("cuda", "gpu") or _gpu_file(path) == (spec.role == "gpu")


def _extras(stage: Path, family: Family, spec: LayerSpec) -> list[str]:
    """Repository files and directories a layer adds besides distributions (created in the stage)."""
    if spec.role == "deps":
        (stage / family.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        return [family.workdir.lstrip("/")]
    if spec.role == "files":
        source, target = spec.copy
        shutil.copytree(REPO / source, stage / target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        return sorted(str(p.relative_to(stage)) for p in (stage / target).rglob("*") if not p.is_dir())
    if spec.role == "examples":
        dest = stage / EXAMPLES_DIR
        dest.mkdir(parents=True, exist_ok=True)
        for rel in EXAMPLE_FILES:
            shutil.copyfile(REPO / rel, dest / Path(rel).name)
        return [f"{EXAMPLES_DIR}/{Path(rel).name}" for rel in EXAMPLE_FILES]
    return []


def _file_digest(path: Path) -> str:
    if path.is_symlink():
        return "link:" + os.readlink(path)
    if path.is_dir():
        return "dir"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _by_import(family: Family, spec: LayerSpec) -> bool:
    """Whether the layer's byte code follows the family's imports (Family.imports) rather than every source."""
    return bool(family.imports) and spec.role in ("cuda", "gpu", "rest", "own")


def _layer_key(
    ctx: Context, family: Family, stage: Path, spec: LayerSpec, dists: Iterable[pyenv.Dist], paths: list[str]
) -> str:
    payload = {
        "format": LAYER_FORMAT,
        "base": ctx.base.blob.digest,
        "layer": spec.name,
        "dists": sorted((d.name, d.version, hashlib.sha256(d.record).hexdigest()) for d in dists),
        "paths": sorted((p, _file_digest(stage / p)) for p in paths),
    }
    if _by_import(family, spec):  # which modules get byte code is part of the layer
        payload["bytecode_imports"] = list(family.imports)
    if spec.role in ("cuda", "gpu"):
        payload["gpu_only"] = list(GPU_ONLY)  # the rule that splits them
    return hashlib.sha256(canonical_json(payload)).hexdigest()


def _cached(ctx: Context, key: str) -> Blob | None:
    record = ctx.cache / "layers" / f"{key}.json"
    if not record.is_file():
        return None
    saved = json.loads(record.read_text())
    blob = Blob(saved["digest"], saved["size"], LAYER_MEDIA_TYPE)
    return blob if ctx.store.has(blob.digest) else None


def _remember(ctx: Context, key: str, blob: Blob) -> None:
    (ctx.cache / "layers").mkdir(parents=True, exist_ok=True)
    write_atomic(ctx.cache / "layers" / f"{key}.json", json.dumps({"digest": blob.digest, "size": blob.size}))


def _drop_stale_stages(work: Path) -> None:
    """A build killed mid-way leaves its staged rootfs (GBs for torch): drop those whose builder is gone."""
    for stage in work.glob("*-*") if work.is_dir() else ():
        pid = stage.name.rsplit("-", 1)[1]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stage, ignore_errors=True)


def build_family(
    ctx: Context, family: Family, wanted: set[str]
) -> tuple[dict[str, Layer], dict[str, dict[str, str]]]:
    """Stage the family's venv on the base; returns its ``wanted`` layers (built or cached) and each one's
    packages. Layers no requested image uses are not built (``runtimes`` alone never writes ``cuda-gpu``)."""
    stage = ctx.cache / "work" / f"{family.name}-{os.getpid()}"
    _drop_stale_stages(ctx.cache / "work")
    shutil.rmtree(stage, ignore_errors=True)
    rootfs = stage / "rootfs"
    rootfs.mkdir(parents=True)
    try:
        started = time.monotonic()
        subprocess.run(["tar", "-xpf", str(ctx.store.path(ctx.base.blob.digest)), "-C", str(rootfs),
                        "--numeric-owner"], check=True)  # fmt: skip
        constraints = _constraints(ctx, family)
        pyenv.install(rootfs, family.requirements(ctx.wheel), constraints, ctx.base.python_version)
        ctx.timings[f"{family.name}: install"] = time.monotonic() - started
        deps = set(pyenv.resolve(family.base_requirements(ctx.wheel), constraints, ctx.base.python_version))
        dists = pyenv.distributions(rootfs)
        own = {
            spec.name: _own(ctx, family, spec, constraints) - deps
            for spec in family.layers
            if spec.role == "own"
        }
        members = _assign(family, dists, deps - {"trainflow"}, own)
        extras = {spec.name: _extras(rootfs, family, spec) for spec in family.layers}
        skeleton = sorted(p for p, o in pyenv.owners(rootfs, dists).items() if o == pyenv.SKELETON)
        keys: dict[str, str] = {}
        for spec in family.layers:
            paths = extras[spec.name] + (skeleton if spec.role == "deps" else [])
            keys[spec.name] = _layer_key(
                ctx, family, rootfs, spec, (dists[n] for n in members[spec.name]), paths
            )
        specs = [spec for spec in family.layers if spec.name in wanted]
        todo = [spec for spec in specs if _cached(ctx, keys[spec.name]) is None]
        loaded: set[str] = set()
        if any(_by_import(family, s) for s in todo):
            started = time.monotonic()
            loaded = bytecode.imported_sources(rootfs, family.imports)
            ctx.timings[f"{family.name}: import probe"] = time.monotonic() - started
        started = time.monotonic()
        sources = list(
            dict.fromkeys(
                p
                for spec in todo
                for n in members[spec.name]
                for p in dists[n].files
                if not _by_import(family, spec) or p in loaded
            )
        )
        sources += [p for spec in todo for p in extras[spec.name]]
        if any(spec.role == "deps" for spec in todo):
            sources += skeleton
        if sources:
            bytecode.compile_bytecode(rootfs, sources)
        log(f"{family.name}: byte-compiled {sum(p.endswith('.py') for p in sources)} sources")
        ctx.timings[f"{family.name}: byte-compile"] = time.monotonic() - started
        owned = pyenv.owners(rootfs, dists)
        split = any(spec.role == "gpu" for spec in family.layers)
        layers: dict[str, Layer] = {}
        for spec in specs:
            blob = _cached(ctx, keys[spec.name])
            if blob is None:
                started = time.monotonic()
                names = members[spec.name] | ({pyenv.SKELETON} if spec.role == "deps" else set())
                paths = [p for p, owner in owned.items() if owner in names and _in_layer(spec, split, p)]
                paths += _with_pycache(rootfs, extras[spec.name])
                blob = write_tree_layer(ctx.store, rootfs, paths)
                _remember(ctx, keys[spec.name], blob)
                ctx.timings[f"{family.name}: layer {spec.name}"] = time.monotonic() - started
                log(f"layer {spec.name}: built {blob.digest[:19]} ({blob.size / 1e6:.0f} MB)")
            else:
                log(f"layer {spec.name}: cached {blob.digest[:19]} ({blob.size / 1e6:.0f} MB)")
            layers[spec.name] = Layer(blob, blob.digest, spec.comment)
        packages = {name: {n: dists[n].version for n in sorted(members[name])} for name in members}
        return layers, packages
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _with_pycache(rootfs: Path, paths: list[str]) -> list[str]:
    out = list(paths)
    for rel in paths:
        cache = (rootfs / rel).parent / "__pycache__"
        if (rootfs / rel).suffix == ".py" and cache.is_dir():
            stem = Path(rel).stem + "."
            out += [str(p.relative_to(rootfs)) for p in sorted(cache.iterdir()) if p.name.startswith(stem)]
    return out


def build(
    image_ids: list[str], out: Path, cache: Path, wheel: Path, refresh_base: bool = False
) -> dict[str, Any]:
    """Build the images into the layout ``out/oci`` and write ``out/images.json``; returns that summary."""
    started = time.monotonic()
    store = BlobStore(cache / "blobs")
    base = build_base(store, cache, refresh_base)
    ctx = Context(store, cache, base, cache / "constraints.txt", wheel)
    ctx.timings["base"] = time.monotonic() - started
    pyenv.locked_constraints(REPO, ctx.constraints)
    log(f"base: {base.blob.digest[:19]} ({base.blob.size / 1e6:.0f} MB), python {base.python_version}")
    created = created_epoch()
    revision = _git("rev-parse", "HEAD")
    layout = ImageLayout(out / "oci")
    summary_path = out / "images.json"
    summary: dict[str, Any] = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    built: dict[str, tuple[dict[str, Layer], dict[str, dict[str, str]]]] = {}
    debian_packages: dict[str, dict[str, str]] = {}  # Debian layer -> the packages it adds
    for image_id in image_ids:
        spec = IMAGES[image_id]
        if spec.family not in built:
            wanted = {name for i in image_ids if IMAGES[i].family == spec.family for name in IMAGES[i].layers}
            built[spec.family] = build_family(ctx, FAMILIES[spec.family], wanted)
        family_layers, packages = built[spec.family]
        for name in spec.layers:
            if name in DEBIAN_LAYERS and name not in family_layers:
                deb = DEBIAN_LAYERS[name]
                started_deb = time.monotonic()
                debian = build_debian_layer(store, cache, base, name, deb.packages, deb.hooks)
                ctx.timings[f"debian {name}"] = time.monotonic() - started_deb
                log(f"layer {name}: {debian.blob.digest[:19]} ({debian.blob.size / 1e6:.0f} MB)")
                family_layers[name] = Layer(debian.blob, debian.blob.digest, debian.comment)
                packages[name] = {}
                debian_packages[name] = debian.packages
        base_layer = Layer(base.blob, base.blob.digest, base.description)
        layers = [base_layer, *(family_layers[name] for name in spec.layers)]
        labels = {
            "org.opencontainers.image.title": spec.title,
            "org.opencontainers.image.description": spec.description,
            "org.opencontainers.image.version": spec.version,
            "org.opencontainers.image.licenses": "Apache-2.0",
            "org.opencontainers.image.revision": revision,
        }
        workdir = spec.workdir or FAMILIES[spec.family].workdir
        cmd = () if spec.entrypoint else CMD  # as a Dockerfile's ENTRYPOINT drops the base image's CMD
        runtime = Runtime((*BASE_ENV, *spec.env), cmd, workdir, labels, spec.entrypoint)
        manifest, config = write_image(store, layers, runtime, created)
        layout.tag(store, manifest, [spec.default_name])
        summary[image_id] = {
            "names": [spec.default_name],
            "manifest": manifest.digest,
            "config": config.digest,
            "size": sum(layer.blob.size for layer in layers),
            "layers": [
                {"digest": layer.blob.digest, "size": layer.blob.size, "comment": layer.comment}
                for layer in layers
            ],
            "python_packages": dict(sorted(kv for name in spec.layers for kv in packages[name].items())),
            "debian_packages": dict(
                sorted(
                    base.packages.items()
                    | {kv for n in spec.layers for kv in debian_packages.get(n, {}).items()}
                )
            ),
        }
        log(f"{image_id}: {spec.default_name} {manifest.digest} ({summary[image_id]['size'] / 1e6:.0f} MB)")
    ctx.timings["total"] = time.monotonic() - started
    summary["_build"] = {
        "timings_s": {k: round(v, 1) for k, v in ctx.timings.items()},
        "created": created,
        "debian_mirror": mirror_state(),
    }
    summary_path.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return summary
