"""The CRD's CEL rules, as tests of their own: each rule is known and trainflow enforces it offline."""

from __future__ import annotations

import re

import pytest
import yaml

from trainflow.core import InvalidRequest, build_trainjob, local_catalog
from trainflow.core.runtimes import find_runtime
from trainflow.core.schema import openapi_schema
from trainflow.core.validation import immutable_differences

TORCH = find_runtime(local_catalog(), "torch-distributed")
TORCHTUNE = find_runtime(local_catalog(), "torchtune-llama3.2-1b")
NAME_RULE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
URI_RULE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$")

# Every CEL rule in the vendored TrainJob CRD, and how trainflow covers it.
KNOWN_RULES = {
    ("", "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"): "name pattern",
    ("", "size(self.metadata.name) <= 63"): "name length",
    (
        ".spec.initializer.dataset.storageUri",
        "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')",
    ): "uri",
    (
        ".spec.initializer.model.storageUri",
        "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')",
    ): "uri",
    (
        ".spec.managedBy",
        "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']",
    ): "never set",
    (".status.trainerStatus", "has(self.lastUpdatedTime)"): "status only",
}


def cel_rules() -> set[tuple[str, str]]:
    rules: set[tuple[str, str]] = set()

    def walk(node: object, path: str) -> None:
        if not isinstance(node, dict):
            return
        for rule in node.get("x-kubernetes-validations", []):
            rules.add((path, rule["rule"]))
        for key, value in node.get("properties", {}).items():
            walk(value, f"{path}.{key}")
        walk(node.get("items"), path + "[]")

    walk(openapi_schema(), "")
    return rules


def test_every_cel_rule_is_accounted_for() -> None:
    for path, rule in cel_rules():
        if rule == "self == oldSelf":
            continue  # immutability: checked on adopt by immutable_differences
        assert (path, rule) in KNOWN_RULES, f"new CEL rule in the CRD, audit it: {path}: {rule}"


@pytest.mark.parametrize("name", ["a", "job-1", "x" * 39])
def test_valid_names_pass_the_cel_rule_and_trainflow(name: str) -> None:
    manifest = build_trainjob({"name": name, "command": ["true"]}, TORCH)
    assert NAME_RULE.match(manifest["metadata"]["name"]) and len(manifest["metadata"]["name"]) <= 63


@pytest.mark.parametrize("name", ["1job", "Job", "job-", "job_x", "j" * 64, "ünï"])
def test_names_the_cel_rule_rejects_are_rejected_offline(name: str) -> None:
    assert not (NAME_RULE.match(name) and len(name) <= 63) or len(name) > 40
    with pytest.raises(InvalidRequest) as err:
        build_trainjob({"name": name, "command": ["true"]}, TORCH)
    assert err.value.fields == ["name"]


@pytest.mark.parametrize("uri", ["foo", "://x", "hf:/x", "1hf://x", "hf://"])
def test_storage_uris_the_cel_rule_rejects_are_rejected_offline(uri: str) -> None:
    assert not URI_RULE.match(uri)
    with pytest.raises(InvalidRequest) as err:
        build_trainjob({"name": "t", "dataset_uri": uri}, TORCHTUNE)
    assert "dataset_uri" in err.value.fields


def test_derived_names_always_satisfy_the_cel_rule() -> None:
    for key in ["dag/run/task", "ÜBER weird key!!", "x" * 500, "123", "---"]:
        name = build_trainjob({"idempotency_key": key, "command": ["true"]}, TORCH)["metadata"]["name"]
        assert NAME_RULE.match(name) and len(name) <= 40, name


def test_immutable_fields_are_compared_on_adopt() -> None:
    a = build_trainjob({"name": "t", "command": ["a"]}, TORCH)
    b = build_trainjob({"name": "t", "command": ["b"]}, TORCH)
    assert immutable_differences(a, a) == []
    assert immutable_differences(a, b) == ["spec.trainer"]
    existing = yaml.safe_load(yaml.safe_dump(a))
    existing["spec"]["runtimeRef"] = {"name": "torch-distributed"}  # server defaults apiGroup/kind
    assert immutable_differences(existing, a) == []
