"""For each intent, the pods the real Trainer makes from the SDK's TrainJob and from trainflow's are the same,
except for the differences docs/fidelity.md lists, each checked here for what it claims."""

from __future__ import annotations

import json
from typing import Any

import pytest
from diff_intents import INTENTS, Intent
from diff_pods import differences, job_view, matching, sdk_function, tf_function, without_decorators

from trainflow.core import local_catalog
from trainflow.core.naming import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from trainflow.core.runtimes import find_runtime
from trainflow.core.torchtune import runtime_overrides

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

RJOB = "jobset.sigs.k8s.io/replicatedjob-name"
COMMAND, ARGS = "*/containers/node/command", "*/containers/node/args"
LAUNCHERS = {"torchrun": "torchrun --no-python python3", "python": "python3"}


def _node_commands(diff: dict[str, Any]) -> dict[str, Any]:
    found = matching(diff, COMMAND)
    assert found, "the function rows explain a command difference, and there is none"
    return found


def row_f1(intent: Intent, diff: dict[str, Any]) -> set[str]:
    """Same function source, name, kwargs and launcher; only the packaging differs."""
    paths = _node_commands(diff)
    for sdk_cmd, tf_cmd in paths.values():
        sdk, tf = sdk_function(sdk_cmd), tf_function(tf_cmd)
        assert tf["source"] == without_decorators(sdk["source"])
        assert (tf["function"], tf["kwargs"]) == (sdk["function"], sdk["kwargs"] or {})
        sdk_launcher = sdk["launcher"].rsplit(" ", 1)
        assert tf["launcher"] == " ".join([*sdk_launcher[:-1], LAUNCHERS[sdk_launcher[-1]]])
        if "F3" not in intent.rows:
            assert sdk["packages"] == tf["packages"] == []
    return set(paths)


def row_f2(intent: Intent, diff: dict[str, Any]) -> set[str]:
    """The SDK ships the decorator lines (a NameError in the trainer); trainflow ships the def."""
    paths = _node_commands(diff)
    for sdk_cmd, tf_cmd in paths.values():
        assert "@noted" in sdk_function(sdk_cmd)["source"]
        assert "@noted" not in tf_function(tf_cmd)["source"]
    return set(paths)


def row_f3(intent: Intent, diff: dict[str, Any]) -> set[str]:
    """The same packages; the SDK passes its default index when none is given, trainflow the image's pip config."""
    paths = _node_commands(diff)
    for sdk_cmd, tf_cmd in paths.values():
        sdk, tf = sdk_function(sdk_cmd), tf_function(tf_cmd)
        assert sdk["packages"] == tf["packages"] == intent.tf["packages_to_install"]
        assert tf["indexes"] == intent.tf.get("pip_index_urls", [])
        assert sdk["indexes"] == (intent.tf.get("pip_index_urls") or ["https://pypi.org/simple"])
    return set(paths)


def row_t1(intent: Intent, diff: dict[str, Any]) -> set[str]:
    """trainflow's args add only the runtime's dataset overrides that TorchTune mode drops."""
    paths = matching(diff, ARGS)
    assert paths, "no args difference to explain"
    kept = runtime_overrides(find_runtime(local_catalog(), intent.runtime))
    for sdk_args, tf_args in paths.values():
        sdk_args, tf_args = sdk_args or [], tf_args or []
        extra = [a for a in tf_args if a not in sdk_args]
        assert extra and all(a in kept for a in extra), extra
        missing = [a for a in sdk_args if a not in tf_args]
        assert missing == (["dataset.data_dir=/workspace/dataset/."] if "T2" in intent.rows else []), missing
    return set(paths)


def row_t2(intent: Intent, diff: dict[str, Any]) -> set[str]:
    """For a Hugging Face dataset the SDK points data_dir at the download root; trainflow keeps the runtime's."""
    paths = matching(diff, ARGS)
    for sdk_args, tf_args in paths.values():
        assert "dataset.data_dir=/workspace/dataset/." in sdk_args
        assert "dataset.data_dir=/workspace/dataset/data" in tf_args
    return set(paths)


def row_s1(intent: Intent, diff: dict[str, Any]) -> set[str]:
    """Credentials: plain values in the SDK's TrainJob and pods, Secret references in trainflow's."""
    paths = matching(diff, "*/containers/*-initializer/env/*")
    assert paths
    literals = {value for data in intent.secrets.values() for value in data.values()}
    for sdk_value, tf_value in paths.values():
        assert sdk_value in literals
        assert tf_value[0] == "valueFrom", tf_value
        ref = json.loads(tf_value[1])["secretKeyRef"]
        assert intent.secrets[ref["name"]][ref["key"]] == sdk_value
    return set(paths)


def row_l1(intent: Intent, diff: dict[str, Any]) -> set[str]:
    """The SDK puts labels and annotations on the TrainJob only; trainflow on its pods too."""
    paths = matching(diff, "*/labels/*", "*/annotations/*")
    wanted = {**intent.tf.get("labels", {}), **intent.tf.get("annotations", {})}
    assert paths
    for path, (sdk_value, tf_value) in paths.items():
        key = path.split("/labels/", 1)[-1] if "/labels/" in path else path.split("/annotations/", 1)[-1]
        assert sdk_value is None and tf_value == wanted[key]
    return set(paths)


ROWS = {"F1": row_f1, "F2": row_f2, "F3": row_f3, "T1": row_t1, "T2": row_t2, "S1": row_s1, "L1": row_l1}


@pytest.mark.parametrize("intent", INTENTS, ids=[i.id for i in INTENTS])
def test_pods_match_the_sdk(outcomes: dict[str, Any], intent: Intent) -> None:
    result = outcomes[intent.id]
    assert not result.sdk.error, f"Kubeflow SDK side: {result.sdk.error}"
    assert not result.tf.error, f"trainflow side: {result.tf.error}"
    assert result.sdk.pods and result.tf.pods
    sdk_view, tf_view = job_view(result.sdk.pods), job_view(result.tf.pods)
    assert sorted(sdk_view) == sorted(tf_view), "the Trainer made different pods"
    diff = differences(sdk_view, tf_view)
    explained: set[str] = set()
    for row in intent.rows:
        explained |= ROWS[row](intent, diff)
    unexplained = {p: v for p, v in diff.items() if p not in explained}
    assert not unexplained, f"differences not in docs/fidelity.md: {unexplained}"
    if intent.recipe:  # the Trainer's TorchTune mode picked the recipe and config the overrides ask for
        for pod in (p for p in result.tf.pods if p["metadata"]["labels"][RJOB] == "node"):
            command = next(c for c in pod["spec"]["containers"] if c["name"] == "node")["command"]
            recipe, config = intent.recipe
            assert command[:2] == ["tune", "run"] and command[command.index("--config") - 1 :][:3] == [
                recipe,
                "--config",
                config,
            ], command
    # row L2: trainflow's identity label on every pod, none on the SDK's
    assert all(p["metadata"]["labels"].get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE for p in result.tf.pods)
    assert not any(MANAGED_BY_LABEL in p["metadata"]["labels"] for p in result.sdk.pods)
