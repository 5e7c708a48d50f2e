"""Failure diagnostics extracted from pod and event objects as the API server returns them (camelCase)."""

from __future__ import annotations

from trainflow.core.errors import Diagnostics
from trainflow.core.kube.diagnostics import collect, event_lines, has_creation_failure, pod_problems
from trainflow.core.kube.plan import run


def pod(
    name: str, *, rank: str = "0", containers=(), init=(), conditions=(), phase="Pending", reason=None
) -> dict:
    status = {"phase": phase, "conditions": list(conditions), "containerStatuses": list(containers)}
    if init:
        status["initContainerStatuses"] = list(init)
    if reason:
        status["reason"], status["message"] = reason, "The node was low on resource: memory."
    return {
        "metadata": {
            "name": name,
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": "job",
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "batch.kubernetes.io/job-completion-index": rank,
            },
            "creationTimestamp": "2026-11-29T10:00:00Z",
        },
        "status": status,
    }


def waiting(name: str, reason: str, message: str = "") -> dict:
    return {"name": name, "state": {"waiting": {"reason": reason, "message": message}}}


def terminated(name: str, code: int, reason: str = "Error") -> dict:
    return {"name": name, "state": {"terminated": {"exitCode": code, "reason": reason}}}


def test_waiting_reasons_unschedulable_oom_and_exit_codes():
    pods = [
        pod(
            "job-node-0-0",
            containers=[waiting("node", "ImagePullBackOff", 'Back-off pulling image "nope:1"')],
        ),
        pod("job-node-0-1", rank="1", containers=[waiting("node", "CrashLoopBackOff", "back-off 5m0s")]),
        pod(
            "job-node-0-2",
            rank="2",
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes: Insufficient nvidia.com/gpu.",
                }
            ],
        ),
        pod("job-node-0-3", rank="3", phase="Failed", containers=[terminated("node", 137, "OOMKilled")]),
        pod("job-node-0-4", rank="4", phase="Failed", containers=[terminated("node", 3)]),
        pod("job-node-0-5", rank="5", phase="Running", containers=[waiting("node", "ContainerCreating")]),
        pod(
            "job-node-0-6",
            rank="6",
            containers=[waiting("node", "CreateContainerConfigError", 'secret "hf" not found')],
        ),
    ]
    problems, failed = pod_problems(pods)
    text = "\n".join(problems)
    assert 'job-node-0-0 container node: ImagePullBackOff: Back-off pulling image "nope:1"' in text
    assert "CrashLoopBackOff" in text
    assert "job-node-0-2: not scheduled (Unschedulable): 0/3 nodes: Insufficient nvidia.com/gpu." in text
    assert "OOMKilled (exit code 137)" in text
    assert 'CreateContainerConfigError: secret "hf" not found' in text
    assert "ContainerCreating" not in text  # normal start-up is not a problem
    assert [(f["pod"], f["rank"], f["exit_code"], f["reason"]) for f in failed] == [
        ("job-node-0-3", "3", 137, "OOMKilled"),
        ("job-node-0-4", "4", 3, "Error"),
    ]


def test_evicted_pod_and_truncation():
    problems, _ = pod_problems(
        [pod("p", phase="Failed", reason="Evicted", containers=[waiting("node", "ErrImagePull", "x" * 5000)])]
    )
    assert any("Evicted" in p for p in problems)
    assert all(len(p) < 400 for p in problems)


def test_event_lines_warning_only_dedup_sorted_and_bounded():
    events = [
        {
            "type": "Normal",
            "reason": "Created",
            "message": "ok",
            "involvedObject": {"kind": "TrainJob", "name": "job"},
        },
        {
            "type": "Warning",
            "reason": "TrainJobResourcesCreationFailed",
            "message": 'JobSet.jobset.x-k8s.io "job" is invalid',
            "count": 4,
            "lastTimestamp": "2026-11-29T10:00:02Z",
            "involvedObject": {"kind": "TrainJob", "name": "job"},
        },
        {
            "type": "Warning",
            "reason": "FailedScheduling",
            "message": "0/2 nodes are available",
            "lastTimestamp": "2026-11-29T10:00:01Z",
            "involvedObject": {"kind": "Pod", "name": "job-node-0-0"},
        },
        {
            "type": "Warning",
            "reason": "BackOff",
            "message": "other",
            "involvedObject": {"kind": "Pod", "name": "unrelated"},
        },
    ]
    lines = event_lines(events, {"job", "job-node-0-0"})
    assert lines == [
        "Pod/job-node-0-0 FailedScheduling: 0/2 nodes are available",
        'TrainJob/job TrainJobResourcesCreationFailed: JobSet.jobset.x-k8s.io "job" is invalid (x4)',
    ]
    assert has_creation_failure(events)
    assert not has_creation_failure(events[:1])
    many = [
        {**events[2], "message": f"m{i}", "lastTimestamp": f"2026-11-29T10:{i:02d}:00Z"} for i in range(50)
    ]
    assert len(event_lines(many)) == 20


class FakeApi:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def list_pods(self, namespace, selector, limit=100):
        self.calls.append(f"pods {selector}")
        return [pod("job-node-0-0", phase="Failed", containers=[terminated("node", 2)])]

    def list_events(self, namespace, selector, limit=200):
        self.calls.append(f"events {selector}")
        if "TrainJob" in selector:
            return []
        return [
            {
                "type": "Warning",
                "reason": "BackOff",
                "message": "restarting",
                "involvedObject": {"kind": "Pod", "name": "job-node-0-0"},
            }
        ]

    def log_text(self, namespace, pod, container, **kw):
        self.calls.append(f"log {pod}/{container} tail={kw.get('tail_lines')}")
        return "\n".join(f"line {i}" for i in range(100)) + "\nTraceback: boom\n"


def test_collect_is_bounded_and_complete():
    api = FakeApi()
    diag = run(collect("ns", "job", tail_lines=5), api)
    assert isinstance(diag, Diagnostics)
    assert diag.failed_ranks[0]["exit_code"] == 2
    assert diag.events == ["Pod/job-node-0-0 BackOff: restarting"]
    assert diag.log_tail.splitlines()[-1] == "Traceback: boom"
    assert len(diag.log_tail.splitlines()) == 5
    assert len(api.calls) == 4  # pods, TrainJob events, pod events, one log tail


def test_collect_never_raises():
    class Broken:
        def __getattr__(self, name):
            def fail(*a, **k):
                raise ConnectionResetError("down")

            return fail

    assert run(collect("ns", "job"), Broken()).lines() == []
