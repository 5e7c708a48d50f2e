"""``spec_patch``: a JSON merge patch (RFC 7386) of the rendered TrainJob spec, checked like every other field."""

from __future__ import annotations

import pytest

from trainflow.core import InvalidRequest, build_trainjob, local_catalog
from trainflow.core.manifest import merge_patch
from trainflow.core.runtimes import find_runtime

RUNTIME = find_runtime(local_catalog(), "torch-distributed", "ClusterTrainingRuntime")


def test_merge_patch_is_rfc_7386() -> None:
    # the RFC's own example (section 3)
    target = {"a": "b", "c": {"d": "e", "f": "g"}}
    patch = {"a": "z", "c": {"f": None}}
    assert merge_patch(target, patch) == {"a": "z", "c": {"d": "e"}}
    assert target == {"a": "b", "c": {"d": "e", "f": "g"}}, "the target is not changed in place"
    assert merge_patch({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}  # lists replace


def test_a_known_field_is_set_and_a_rendered_one_overridden() -> None:
    base = {"runtime": "torch-distributed", "command": ["python", "t.py"], "num_nodes": 2}
    manifest = build_trainjob(
        {**base, "spec_patch": {"managedBy": "kueue.x-k8s.io/multikueue", "trainer": {"numNodes": 3}}},
        RUNTIME,
    )
    assert manifest["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"
    assert manifest["spec"]["trainer"]["numNodes"] == 3
    assert manifest["spec"]["trainer"]["command"] == ["python", "t.py"], "the rest of the trainer is kept"


@pytest.mark.parametrize(
    ("patch", "field", "word"),
    [
        ({"managedBy": 5}, "spec_patch.managedBy", "is not of type 'string'"),
        ({"managedByy": "x"}, "spec_patch.managedByy", "unknown field 'managedByy'"),
        ({"trainer": {"numNode": 1}}, "spec_patch.trainer.numNode", "vendored Trainer v2.3.0"),
        ({"runtimeRef": {"name": "other"}}, "spec_patch.runtimeRef", "use the runtime field"),
    ],
)
def test_a_bad_patch_is_refused_naming_its_path(patch: dict[str, object], field: str, word: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        build_trainjob({"runtime": "torch-distributed", "command": ["x"], "spec_patch": patch}, RUNTIME)
    assert info.value.fields == [field], info.value
    assert word in str(info.value)
