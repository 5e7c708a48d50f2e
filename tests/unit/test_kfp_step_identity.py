"""The KFP step's TrainJob identity over what each KFP backend version's driver gives a step (kfp_driver_input).

Each case runs the step's own request mapping (``runner.request_fields``) with the output URI, placeholder values
and pod environment of one try of a task, and compares the identity keys of two tries.
"""

from __future__ import annotations

import pytest
from kfp import dsl

from kfp_driver_input import JOB_ID_PLACEHOLDER, TASK_NAME_PLACEHOLDER, StepView, driver_view
from trainflow.core import InvalidRequest
from trainflow.kfp.identity import step_identity
from trainflow.kfp.runner import request_fields

VERSIONS = [(2, 3), (2, 4), (2, 5), (2, 14), (2, 17)]
ARGS = {"runtime": "torch-distributed", "function": "m:train", "function_kwargs": {"lr": 0.1}}
RUN, OTHER_RUN = "6f1c2a0e-0b7d-4f0e-9d55-0d6c3f7c2b11", "0d5c61b2-7f0e-4a4b-9b1e-3c9a2a6f0e55"


def test_placeholders_are_the_ones_kfp_defines() -> None:
    assert (dsl.PIPELINE_JOB_ID_PLACEHOLDER, dsl.PIPELINE_TASK_NAME_PLACEHOLDER) == (
        JOB_ID_PLACEHOLDER,
        TASK_NAME_PLACEHOLDER,
    )


class Step:
    """Runs the step's request mapping for one try, in that try's environment."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
        self.monkeypatch, self.capsys = monkeypatch, capsys

    def key(self, view: StepView, *, pair: bool, args: dict[str, object] = ARGS) -> tuple[str, str]:
        """(identity key, warning the step logged); ``pair``: the explicit run_id/task_name placeholders."""
        params = dict(args)
        if pair:
            params.update(run_id=view.run_id, task_name=view.task_name)
        with self.monkeypatch.context() as m:
            for name in ("KFP_RUN_ID", "KFP_TASK_NAME", "KFP_POD_NAME", "KFP_POD_UID"):
                m.delenv(name, raising=False)
            for name, value in view.env.items():
                m.setenv(name, value)
            self.capsys.readouterr()
            fields = request_fields(params, None, None, artifact_uri=view.model_uri)
        logged = [line for line in self.capsys.readouterr().out.splitlines() if "WARNING" in line]
        return fields["idempotency_key"], "\n".join(logged)


@pytest.fixture
def step(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Step:
    return Step(monkeypatch, capsys)


def view(version: tuple[int, int], execution: str, pod: str, **kw: str) -> StepView:
    kw.setdefault("run_id", RUN)
    kw.setdefault("task_key", "train-job")
    return driver_view(version, execution=execution, pod=pod, **kw)


@pytest.mark.parametrize("pair", [False, True], ids=["folder", "explicit-pair"])
@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: f"kfp-{v[0]}.{v[1]}")
def test_loop_iterations_and_sub_pipelines_never_share(
    version: tuple[int, int], pair: bool, step: Step
) -> None:
    # two ParallelFor iterations with identical arguments: one task key, two executions, two pods
    a = step.key(view(version, "iteration-0", "pod-a"), pair=pair)
    b = step.key(view(version, "iteration-1", "pod-b"), pair=pair)
    assert a[0] != b[0]
    # a sub-pipeline used twice: the inner task has one key in the sub-pipeline's DAG, two executions
    c = step.key(view(version, "sub-1/train-job", "pod-c"), pair=pair)
    d = step.key(view(version, "sub-2/train-job", "pod-d"), pair=pair)
    assert c[0] != d[0]
    # two tasks of one display name: one folder before 2.14 (taskInfo.name)
    e = step.key(view(version, "t1", "pod-e", task_key="train-job", display_name="train"), pair=pair)
    f = step.key(view(version, "t2", "pod-f", task_key="train-job-2", display_name="train"), pair=pair)
    assert e[0] != f[0]
    old = version < (2, 4)
    for _, warning in (a, b, c, d, e, f):
        assert ("not per task execution (a KFP backend before 2.4)" in warning) is old


@pytest.mark.parametrize("pair", [False, True], ids=["folder", "explicit-pair"])
@pytest.mark.parametrize("version", [v for v in VERSIONS if v >= (2, 4)], ids=lambda v: f"kfp-{v[0]}.{v[1]}")
def test_pod_retry_and_run_retry_keep_the_identity(version: tuple[int, int], pair: bool, step: Step) -> None:
    first = step.key(view(version, "x", "train-abc-system-container-impl-1"), pair=pair)
    pod_retry = step.key(view(version, "x", "train-abc-system-container-impl-2"), pair=pair)
    run_retry = step.key(view(version, "x", "train-abc-system-container-impl-3"), pair=pair)
    assert first == pod_retry == run_retry and first[1] == ""
    # the next run of a recurring pipeline (same arguments) is a new job
    assert step.key(view(version, "y", "p", run_id=OTHER_RUN), pair=pair)[0] != first[0]
    # different arguments in the same execution are another job (the spec changed)
    assert step.key(view(version, "x", "q"), pair=pair, args={**ARGS, "num_nodes": 2})[0] != first[0]


def test_explicit_pair_labels_the_key_where_the_backend_resolves_it(step: Step) -> None:
    labelled = step.key(view((2, 17), "x", "p"), pair=True)[0]
    assert labelled.startswith(f"train-job/{RUN}/")
    assert labelled != step.key(view((2, 17), "x", "p"), pair=False)[0]
    # before 2.5 the placeholders arrive verbatim: they are not values, the folder's task names the key
    assert step.key(view((2, 4), "x", "p"), pair=True) == step.key(view((2, 4), "x", "p"), pair=False)
    assert step.key(view((2, 5), "x", "p", display_name="Train"), pair=True)[0].startswith(f"Train/{RUN}/")


def test_before_kfp_2_4_a_retried_run_trains_again_and_says_why(step: Step) -> None:
    first, warning = step.key(view((2, 3), "x", "pod-1"), pair=False)
    again, _ = step.key(view((2, 3), "x", "pod-2"), pair=False)  # the same folder, another pod
    assert first != again
    assert "A retried run trains again instead of reattaching" in warning and "KFP 2.4" in warning
    assert "idempotency_key" in warning


def test_an_explicit_key_is_taken_as_given_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    old = view((2, 3), "x", "pod-1")
    with monkeypatch.context() as m:
        for name, value in old.env.items():
            m.setenv(name, value)
        identity = step_identity(
            idempotency_key="nightly-2026-12-01",
            run_id=None,
            task_name=None,
            params=ARGS,
            artifact_uri=old.model_uri,
        )
    assert identity.key == "nightly-2026-12-01" and identity.warning is None


def test_kfp_local_folders_are_per_execution(monkeypatch: pytest.MonkeyPatch) -> None:
    """kfp.local (no KFP_POD_NAME) lays out loop iterations apart and keeps a folder across its retries."""
    local = "/tmp/root/train-2026-12-01-13-25-56-013443/for-loop-2-iteration-{i}/train-job/model"
    monkeypatch.delenv("KFP_POD_NAME", raising=False)
    keys = [
        step_identity(idempotency_key=None, run_id="1234", task_name="train-job", params=ARGS,
                      artifact_uri=local.format(i=i))
        for i in (0, 1, 0)
    ]  # fmt: skip
    assert keys[0] == keys[2] and keys[0] != keys[1] and not any(k.warning for k in keys)


def test_outside_kfp_the_pair_alone_identifies_and_nothing_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("KFP_RUN_ID", "KFP_TASK_NAME", "KFP_POD_NAME"):
        monkeypatch.delenv(name, raising=False)
    fields = request_fields({**ARGS, "run_id": "r1", "task_name": "train"}, None, None, artifact_uri=None)
    assert fields["idempotency_key"].startswith("train/r1/")
    monkeypatch.setenv("KFP_RUN_ID", "r1")
    monkeypatch.setenv("KFP_TASK_NAME", "train")
    assert request_fields(ARGS, None, None, artifact_uri=None)["idempotency_key"] == fields["idempotency_key"]
    monkeypatch.delenv("KFP_RUN_ID")
    with pytest.raises(InvalidRequest) as err:
        request_fields(ARGS, None, None, artifact_uri=None)
    assert err.value.fields == ["run_id"] and "idempotency_key" in str(err.value)
    for no_folder in ("", "model", "/model", "s3://model", "{{$.outputs.artifacts['model'].uri}}"):
        with pytest.raises(InvalidRequest):
            request_fields(ARGS, None, None, artifact_uri=no_folder)
