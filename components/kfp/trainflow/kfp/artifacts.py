"""Step outputs: the trainer's files into the Model artifact, numeric metrics into Metrics, a dataset input."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from trainflow.core import storage
from trainflow.kfp.params import invalid
from trainflow.kfp.steplog import fail, log


class ArtifactLike(Protocol):
    """The parts of a KFP artifact the runner uses (dsl.Model / dsl.Metrics / dsl.Dataset)."""

    uri: str
    metadata: dict[str, Any]

    @property
    def path(self) -> str: ...


def dataset_field(fields: dict[str, Any], dataset: ArtifactLike | None) -> dict[str, Any]:
    """An ``Input[Dataset]`` URI becomes dataset_uri (hf/s3/cache), else the trainer gets it as env."""
    if dataset is None:
        return fields
    uri = getattr(dataset, "uri", "") or ""
    if not uri:
        return fields
    if fields.get("dataset_uri"):
        raise invalid("dataset", "both the dataset artifact and dataset_uri are given", "give one of them")
    out = dict(fields)
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if scheme in ("hf", "s3", "cache"):
        out["dataset_uri"] = uri
    else:
        # gs://, minio://, file paths: no Trainer initializer reads them; hand the location to the code.
        out["env"] = {**(out.get("env") or {}), "TRAINFLOW_DATASET_URI": uri}
        local = getattr(dataset, "path", None)
        if local and Path(local).exists():
            out["env"]["TRAINFLOW_DATASET_PATH"] = str(local)
    return out


def local_dir(uri: str | None) -> Path | None:
    """A readable local directory for ``file://`` URIs and absolute paths (workspace PVC), else None."""
    if not uri:
        return None
    if uri.startswith("file://"):
        path = Path(unquote(urlparse(uri).path))
    elif uri.startswith("/"):
        path = Path(uri)
    else:
        return None
    return path if path.exists() else None


def copy_model(source: Path, destination: str) -> list[str]:
    """Copy the trainer's output directory into the Output[Model] path (a directory); return file names."""
    dest = Path(destination)
    if dest.exists() and dest.is_file():
        dest.unlink()
    if source.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest / source.name)
    else:
        shutil.copytree(source, dest, dirs_exist_ok=True)
    return sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            out[key] = float(value)
    return out


def result_metadata(result: Any, runtime: Any | None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job_name": result.name,
        "namespace": result.namespace,
        "state": result.state.value,
        "runtime": result.runtime or (runtime.name if runtime is not None else None),
        "framework": getattr(runtime, "framework", None) or getattr(runtime, "policy", None),
        "metrics": dict(result.metrics),
    }
    if result.duration_seconds is not None:
        data["duration_seconds"] = round(result.duration_seconds, 3)
    if result.output_uri:
        data["model_uri"] = result.output_uri
    return {k: v for k, v in data.items() if v is not None}


def committed_files(uri: str) -> dict[str, Any]:
    """The manifest's view of an ``s3://`` output, read with the step's own credentials: its files (path, size,
    SHA-256), the attempt and the prefix holding exactly those files. A completed TrainJob whose output has no
    manifest fails the step (its publish never committed, so a Model would name no model); a manifest the step
    cannot read (no credentials or client here) is recorded as unverified, and readers still verify it."""
    try:
        manifest = storage.read_manifest(uri)
    except storage.NoManifest as e:
        raise fail(f"the TrainJob completed but its output was never committed: {e}") from None
    except storage.StorageError as e:
        log(f"the manifest of {uri} is not readable from this step ({e}); the Model names it unverified")
        return {"manifest": f"unverified: {e}"}
    files = [{"path": f["path"], "size": f["size"], "sha256": f["sha256"]} for f in manifest.get("files", [])]
    return {
        "manifest": "verified",
        "files": [f["path"] for f in files],
        "manifest_files": files,
        "attempt": manifest["attempt"],
        "committed_uri": storage.attempt_uri(uri, manifest["attempt"]),
    }


def publish(
    result: Any, runtime: Any, location: str | None, model: ArtifactLike | None, metrics: Any | None
) -> None:
    """Fill the Model artifact (files copied when the location is readable here, else its URI) and Metrics."""
    meta = result_metadata(result, runtime)
    if model is not None:
        model.metadata.update(meta)
        source = local_dir(location)
        if source is not None:
            files = copy_model(source, model.path)
            model.metadata["files"] = files
            log(f"copied {len(files)} model file(s) from {location} into the Model artifact: {files}")
        elif location and storage.is_object_uri(location):
            # the artifact names the output URI; a downstream step reads it through its manifest
            # (trainflow.core.download), and the files the manifest committed are recorded here
            model.uri = location
            model.metadata["model_uri"] = location
            model.metadata.update(committed_files(location))
            log(f"model stays at {location} (the Model artifact's uri)")
        elif location and "://" in location:
            model.uri = location
            model.metadata["model_uri"] = location
            log(f"model stays at {location} (the Model artifact's uri)")
        elif location:
            model.metadata["model_uri"] = location
            log(f"model stays at {location} (recorded in the Model artifact metadata)")
        else:
            log("the trainer reported no output location; the Model artifact holds metadata only")
    log_metrics(metrics, result.metrics)


def log_metrics(metrics: Any | None, values: Mapping[str, Any]) -> None:
    """One ``log_metric`` per numeric metric (the UI shows them), and the same as JSON in the artifact's file: a
    Metrics artifact without a file is missing from the object store, and kfp.local never serves a cache entry
    that names a missing artifact."""
    if metrics is None:
        return
    numeric = numeric_metrics(values)
    for metric, value in sorted(numeric.items()):
        metrics.log_metric(metric, value)
    path = getattr(metrics, "path", None)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(numeric, sort_keys=True), encoding="utf-8")
