"""Validation of manifests against a TrainJob CRD schema: the one the cluster serves when a cluster is asked
(``KubernetesBackend.schema_picture``), else the vendored Trainer v2.3.0 one, and the messages say which.

The schema is made strict (unknown fields are errors, as with the API server's fieldValidation=Strict),
so a typo in a raw runtime patch is caught before submit instead of being pruned silently; a field a newer
Trainer added passes when the cluster serves it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

from trainflow.core.naming import GROUP

# libyaml when present: the pure-Python parser is far slower on the 3,000-line CRD (docs/benchmarks.md).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

VENDORED_VERSION = "v2.3.0"
_CRD_FILES = {
    "TrainJob": f"{GROUP}_trainjobs.yaml",
    "TrainingRuntime": f"{GROUP}_trainingruntimes.yaml",
    "ClusterTrainingRuntime": f"{GROUP}_clustertrainingruntimes.yaml",
}


@cache
def crd(kind: str) -> dict[str, Any]:
    path = resources.files("trainflow.core") / "data" / "crds" / _CRD_FILES[kind]
    loaded: dict[str, Any] = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)
    return loaded


def openapi_schema(kind: str = "TrainJob") -> dict[str, Any]:
    versions = crd(kind)["spec"]["versions"]
    schema: dict[str, Any] = next(v for v in versions if v["name"] == "v1alpha1")["schema"]["openAPIV3Schema"]
    return schema


def _strict(node: Any) -> None:
    if isinstance(node, dict):
        open_object = node.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in node
        if node.get("type") == "object" and "properties" in node and not open_object:
            node["additionalProperties"] = False
        if node.get("x-kubernetes-int-or-string"):
            node.pop("type", None)
            node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        for value in node.values():
            _strict(value)
    elif isinstance(node, list):
        for value in node:
            _strict(value)


def _make_validator(openapi: Mapping[str, Any]) -> Any:
    from jsonschema import Draft7Validator

    schema = copy.deepcopy(dict(openapi))
    _strict(schema)
    # metadata is validated by the API server's ObjectMeta rules, not by the CRD schema.
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return Draft7Validator(schema)


@cache
def _validator(kind: str) -> Any:
    return _make_validator(openapi_schema(kind))


@dataclass(frozen=True)
class Picture:
    """The TrainJob schema a request is checked against, and where it came from (said in every refusal)."""

    source: str
    fix: str
    validator: Any = field(repr=False)
    beyond_vendored: tuple[str, ...] = ()  # spec fields the served schema has and the vendored one lacks


@cache
def vendored() -> Picture:
    return Picture(
        f"the vendored Trainer {VENDORED_VERSION} TrainJob schema (no cluster was asked)",
        f"compare with the TrainJob CRD of Trainer {VENDORED_VERSION}; a field a newer Trainer added is checked "
        "by the cluster that serves it: submit (or render) against that cluster",
        _validator("TrainJob"),
    )


def _fields(node: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    for name, sub in ((node or {}).get("properties") or {}).items():
        path = f"{prefix}.{name}" if prefix else name
        out.add(path)
        out |= _fields(sub, path)
        out |= _fields((sub or {}).get("items"), f"{path}[]")
    return out


def served(crd_object: Mapping[str, Any]) -> Picture:
    """The picture of a TrainJob CRD as a cluster serves it (its v1alpha1 openAPIV3Schema)."""
    versions = (crd_object.get("spec") or {}).get("versions") or []
    version = next((v for v in versions if v.get("name") == "v1alpha1" and v.get("served", True)), None)
    openapi = ((version or {}).get("schema") or {}).get("openAPIV3Schema")
    if not isinstance(openapi, Mapping):
        raise ValueError("the cluster's TrainJob CRD serves no v1alpha1 schema")
    extra = sorted(
        _fields(openapi.get("properties", {}).get("spec"), "spec")
        - _fields(openapi_schema("TrainJob").get("properties", {}).get("spec"), "spec")
    )
    rv = (crd_object.get("metadata") or {}).get("resourceVersion", "?")
    return Picture(
        f"the TrainJob CRD the cluster serves (resourceVersion {rv})",
        "compare with the cluster's TrainJob CRD: kubectl explain trainjob.spec --recursive",
        _make_validator(openapi),
        tuple(extra),
    )


def schema_errors(
    manifest: Mapping[str, Any], kind: str = "TrainJob", picture: Picture | None = None
) -> Iterator[tuple[str, str]]:
    """(path, message) for every place the manifest breaks the CRD schema; paths look like spec.trainer.numNodes.
    ``picture``: the TrainJob schema to use (default: the vendored one of ``kind``)."""
    validator = picture.validator if picture is not None else _validator(kind)
    for error in sorted(validator.iter_errors(manifest), key=lambda e: list(map(str, e.absolute_path))):
        path = ""
        for part in error.absolute_path:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        unexpected = []
        if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
            known = set((error.schema or {}).get("properties") or {})
            unexpected = sorted(str(k) for k in error.instance if k not in known)
        for (
            key
        ) in unexpected:  # the path names the unknown field itself, as the API server's strict check does
            yield (f"{path}.{key}" if path else key), f"unknown field {key!r} ({error.message})"
        if not unexpected:
            yield path or "(root)", error.message


def describe(picture: Picture | None) -> str:
    """One line on the TrainJob schema requests are checked against, and what the cluster has beyond v2.3.0."""
    picture = picture or vendored()
    newer = picture.beyond_vendored
    beyond = f"; beyond Trainer {VENDORED_VERSION}: {', '.join(newer[:8])}" if newer else ""
    more = f" (+{len(newer) - 8} more)" if len(newer) > 8 else ""
    return f"TrainJob schema: {picture.source}{beyond}{more}"
