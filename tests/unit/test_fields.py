"""One map from manifest paths to request fields (core/fields.py), held to every path the manifest builder emits:
the field it names is the one that put the value there, and the API server's answers name the same field as the
offline schema check."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiException

from trainflow.core import build_trainjob, local_catalog
from trainflow.core.errors import InvalidRequest
from trainflow.core.fields import request_field
from trainflow.core.kube.apierrors import translate
from trainflow.core.naming import MANAGED_BY_LABEL
from trainflow.core.request import TrainJobRequest
from trainflow.core.runtimes import find_runtime
from trainflow.core.validation import parse_request

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "dags_examples" / "requests").glob("*.yaml"))
# What trainflow writes whatever the request says: the object's type, its mark, the frame of its own patch.
FRAME_KEYS = {"apiVersion", "kind", "apiGroup", MANAGED_BY_LABEL, "manager", "name"}


def build(data: dict[str, Any]) -> dict[str, Any]:
    runtime = find_runtime(local_catalog(), data.get("runtime", "torch-distributed"))
    return build_trainjob(data, runtime)


def examples() -> list[tuple[str, dict[str, Any], dict[str, Any], TrainJobRequest]]:
    out = []
    for path in EXAMPLES:
        data = yaml.safe_load(path.read_text())
        out.append((path.stem, data, build(data), parse_request(data)))
    return out


def leaves(node: Any, keys: tuple[Any, ...] = ()) -> Iterator[tuple[str, tuple[Any, ...], Any]]:
    """(path as the schema check writes it, the keys to reach it, value) for every leaf of a manifest."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from leaves(value, (*keys, key))
    elif isinstance(node, list) and node:
        for index, value in enumerate(node):
            yield from leaves(value, (*keys, index))
    else:
        path = ""
        for key in keys:
            path += f"[{key}]" if isinstance(key, int) else (f".{key}" if path else key)
        yield path, keys, node


def at(manifest: Any, keys: tuple[Any, ...]) -> Any:
    node = manifest
    for key in keys:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return KeyError
    return node


def head(field: str) -> str:
    return field.split(".")[0].split("[")[0]


def test_every_emitted_path_names_a_request_field() -> None:
    fields = set(TrainJobRequest.model_fields)
    wrong = []
    for stem, _, manifest, request in examples():
        for path, keys, _ in leaves(manifest):
            field = request_field(path, manifest, request)
            if head(field) not in fields and not (field == "request" and keys[-1] in FRAME_KEYS):
                wrong.append(f"{stem}: {path} -> {field}")
    assert wrong == []


def test_the_named_field_is_the_one_that_wrote_the_value() -> None:
    """Drop the named field from the request and build again: the value at the path changes or goes."""
    checked: set[str] = set()
    wrong = []
    for stem, data, manifest, request in examples():
        for path, keys, value in leaves(manifest):
            name = head(request_field(path, manifest, request))
            if name not in data or data[name] == TrainJobRequest.model_fields[name].default:
                continue  # the request did not set it: the runtime or a default wrote the value
            try:
                again = build({k: v for k, v in data.items() if k != name})
            except InvalidRequest:
                continue  # the request needs the field (e.g. the only trainer it has)
            checked.add(name)
            if at(again, keys) == value:
                wrong.append(f"{stem}: {path} = {value!r} stays without {name}")
    assert wrong == []
    # the examples set every request field (test_manifest_golden); most of them can be dropped and rebuilt
    assert len(checked) >= 25, sorted(checked)


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("metadata.name", "name"),
        ("spec.trainer.numNodes", "num_nodes"),
        ("spec.trainer.env[0].name", "env"),
        ("spec.trainer.resourcesPerNode.limits[cpu]", "resources.limits[cpu]"),
        ("spec.initializer.dataset.storageUri", "dataset_uri"),
        ("spec.initializer.model.secretRef.name", "model_secret"),
        ("spec.activeDeadlineSeconds", "deadline_seconds"),
        ("spec.runtimeRef", "runtime"),
        ("spec.runtimeRef.kind", "runtime_kind"),
        ("metadata.labels[kueue.x-k8s.io/queue-name]", "queue"),
        ("metadata.labels.kueue.x-k8s.io/queue-name", "queue"),
        ("metadata.annotations[trainflow.dev/output-uri]", "output_uri"),
        (
            "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template"
            ".spec.nodeSelector",
            "node_selector",
        ),
        ("spec.runtimePatches[0].manager", "runtime_patches"),
        ("", "request"),
    ],
)
def test_a_path_alone_names_the_field_as_far_as_it_tells(path: str, field: str) -> None:
    assert request_field(path) == field


def _env_example() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    manifest = build(
        {
            "command": ["python3", "train.py"],
            "env": {"A": "1"},
            "secret_env": {"HF_TOKEN": "hf/token"},
            "output_uri": "s3://bucket/out",
            "runtime_patches": [{"manager": "example.com/m", "trainingRuntimeSpec": {}}],
            "labels": {"team": "a"},
        }
    )
    return manifest, manifest["spec"]["trainer"]["env"]


def test_each_env_entry_names_its_own_field() -> None:
    manifest, env = _env_example()
    named = [request_field(f"spec.trainer.env[{i}].name", manifest) for i in range(len(env))]
    # the s3:// output's job identity (fieldRefs) is trainflow's, named by output_uri
    assert named == ["env.A", "secret_env.HF_TOKEN", "output_uri", "output_uri", "output_uri", "output_uri"]
    # trainflow's own patch comes first; the user's first patch is runtime_patches[0]
    assert request_field("spec.runtimePatches[1].trainingRuntimeSpec", manifest) == (
        "runtime_patches[0].trainingRuntimeSpec"
    )


def rejected(path: str) -> ApiException:
    exc = ApiException(status=422, reason="Invalid")
    cause = {"reason": "FieldValueInvalid", "message": "Invalid value", "field": path}
    exc.body = json.dumps(
        {"kind": "Status", "code": 422, "reason": "Invalid", "message": "x", "details": {"causes": [cause]}}
    )
    return exc


def test_the_server_names_the_field_the_schema_check_names() -> None:
    """A 422 on the manifest that was sent names each path's field as the offline check does (which also knows
    the request: it alone tells TorchTune's runtime and dataset args from the user's)."""
    for _, _, manifest, request in examples():
        torchtune = manifest["spec"]["trainer"].get("command") == ["tune", "run"]
        for path, _, _ in leaves(manifest):
            err = translate(rejected(path), "create", "trainjobs", "ns", "j", sent=manifest)
            assert isinstance(err, InvalidRequest)
            offline = request_field(path, manifest, request)
            if torchtune and path.startswith("spec.trainer.args["):
                assert err.fields[0].startswith("args["), path
            else:
                assert err.fields == [offline], path


def test_a_rejected_create_names_the_env_entry_it_sent() -> None:
    """KubeApi hands the manifest a create sent to the translation (env[i] is not just 'env')."""
    from trainflow.core.kube import calls
    from trainflow.core.kube.client import KubeApi
    from trainflow.core.kube.config import ClusterConfig

    manifest, env = _env_example()
    index = [e["name"] for e in env].index("HF_TOKEN")
    refusal = rejected(f"spec.trainer.env[{index}].valueFrom")

    class Refusing:
        def send(self, call: Any) -> Any:
            raise calls.ApiException(422, "Invalid", refusal.body)

    api = KubeApi(ClusterConfig(server="https://127.0.0.1:1", namespace="ns"))
    api._http = Refusing()  # type: ignore[assignment]
    with pytest.raises(InvalidRequest) as info:
        api.run(calls.create_trainjob("ns", manifest))
    assert info.value.fields == ["secret_env.HF_TOKEN"]


def test_a_denial_naming_the_whole_env_names_the_entries_it_quotes() -> None:
    """The Trainer's webhook names spec.trainer.env (no index) and quotes the reserved names it found."""
    manifest = build({"command": ["python3", "t.py"], "env": {"A": "1"}})  # the offline check refuses it
    manifest["spec"]["trainer"]["env"].append({"name": "PET_NNODES", "value": "5"})
    exc = ApiException(status=403, reason="Forbidden")
    exc.body = json.dumps(
        {
            "kind": "Status",
            "code": 403,
            "message": 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: '
            'spec.trainer.env: Invalid value: [{"name":"PET_NNODES","value":"5"}]: must not have reserved '
            "envs, invalid envs configured: [PET_NNODES]",
        }
    )
    err = translate(exc, "create", "trainjobs", "ns", "j", sent=manifest)
    assert isinstance(err, InvalidRequest) and err.fields == ["env.PET_NNODES"]
    assert translate(exc, "create", "trainjobs", "ns", "j").fields == ["env"]  # without the manifest sent
