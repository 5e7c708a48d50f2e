"""Offline validation of manifests against the vendored Trainer v2.3.0 CRD openAPIV3Schema.

The schema is made strict (unknown fields are errors, as with the API server's fieldValidation=Strict),
so a typo in a raw runtime patch is caught before submit instead of being pruned silently.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any

import yaml

# libyaml when present: the pure-Python parser is far slower on the 3,000-line CRD (docs/benchmarks.md).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_CRD_FILES = {
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
    "TrainingRuntime": "trainer.kubeflow.org_trainingruntimes.yaml",
    "ClusterTrainingRuntime": "trainer.kubeflow.org_clustertrainingruntimes.yaml",
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


@cache
def _validator(kind: str) -> Any:
    from jsonschema import Draft7Validator

    schema = copy.deepcopy(openapi_schema(kind))
    _strict(schema)
    # metadata is validated by the API server's ObjectMeta rules, not by the CRD schema.
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return Draft7Validator(schema)


def schema_errors(manifest: Mapping[str, Any], kind: str = "TrainJob") -> Iterator[tuple[str, str]]:
    """(path, message) for every place the manifest breaks the CRD schema; paths look like spec.trainer.numNodes."""
    for error in sorted(
        _validator(kind).iter_errors(manifest), key=lambda e: list(map(str, e.absolute_path))
    ):
        path = ""
        for part in error.absolute_path:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        yield path or "(root)", error.message
