"""Failure diagnostics extracted from pod and event objects as the API server returns them (camelCase)."""

from __future__ import annotations

from trainflow.core.errors import Diagnostics
from trainflow.core.kube import diagnostics
from trainflow.core.kube.diagnostics import (
    collect,
    event_lines,
    has_creation_failure,
    keep_first_crash,
    pod_problems,
    with_first_crash,
)
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


class CallApi:
    """Answers kube/calls.py calls by resource: ``list_pods``, ``list_events``, ``log_text`` of a subclass."""

    def run(self, call):
        query = dict(call.query)
        if call.resource == "pods":
            return {
                "items": self.list_pods(
                    call.namespace, query.get("labelSelector"), int(query.get("limit", 100))
                )
            }
        if call.resource == "events":
            return {"items": self.list_events(call.namespace, query.get("fieldSelector"))}
        if call.resource == "pods/log":
            return self.log_text(
                call.namespace,
                call.name,
                query["container"],
                tail_lines=int(query["tailLines"]),
                previous=query.get("previous") == "true",
            )
        raise AssertionError(call)


class FakeApi(CallApi):
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


TORCHRUN_LOG = (
    """step 1
Traceback (most recent call last):
  File "/tmp/trainer.py", line 12, in <module>
    import accelerate
ModuleNotFoundError: No module named 'accelerate'
F1202 21:49:29.001000 10 coordination_service_agent.cc:332] DEADLINE_EXCEEDED: a rank's own glog line
E1202 21:49:30.123000 10 torch/distributed/elastic/multiprocessing/api.py:900] failed (exitcode: 1)
Traceback (most recent call last):
  File "/opt/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 936, in main
    run(args)
"""
    + "\n".join(f"    frame {i}" for i in range(30))
    + """
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
python3 FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 10)
============================================================
"""
)


def test_a_ranks_traceback_survives_torchruns_report_below_it():
    """torchrun prints its own traceback and report after a rank's: the tail keeps the rank's error and the
    report, drops torchrun's frames, and the log is read far enough back to find it (the same rule as locally)."""

    class Torchrun(FakeApi):
        def log_text(self, namespace, pod, container, **kw):
            self.calls.append(f"log tail={kw.get('tail_lines')}")
            return TORCHRUN_LOG

    api = Torchrun()
    diag = run(collect("ns", "job", tail_lines=20), api)
    tail = diag.log_tail.splitlines()
    assert "ModuleNotFoundError: No module named 'accelerate'" in tail, diag.log_tail
    assert "  exitcode  : 1 (pid: 10)" in tail and len(tail) <= 20
    assert any("DEADLINE_EXCEEDED: a rank's own glog line" in line for line in tail), diag.log_tail
    assert not any("multiprocessing/api.py" in line for line in tail), diag.log_tail  # torchrun's agent line
    assert not any("frame" in line or "torch/distributed/run.py" in line for line in tail), diag.log_tail
    assert "log tail=400" in api.calls


def test_a_container_restarted_in_place_gives_the_crashed_instances_log():
    """restartPolicy OnFailure: the kubelet restarts the crashed container at once; the crash is lastState and
    its log is the previous instance's (the current one has only just started)."""

    class Restarted(FakeApi):
        def list_pods(self, namespace, selector, limit=100):
            crashed = {"name": "node", "state": {"running": {}}, "lastState": terminated("node", 1)["state"]}
            return [pod("job-launcher-0-0", phase="Running", containers=[crashed])]

        def log_text(self, namespace, pod, container, **kw):
            self.calls.append(f"log previous={kw.get('previous')}")
            return "Traceback: crashed instance" if kw.get("previous") else "starting again"

    api = Restarted()
    diag = run(collect("ns", "job"), api)
    assert diag.failed_ranks[0]["exit_code"] == 1 and diag.failed_ranks[0]["restarted"] is True
    assert diag.log_tail == "Traceback: crashed instance"
    assert "log previous=True" in api.calls


def test_collect_never_raises():
    class Broken:
        def run(self, call):
            raise ConnectionResetError("down")

    assert run(collect("ns", "job"), Broken()).lines() == []


def _pod(name: str, created: str, *, waiting: str | None = None, unschedulable: bool = False) -> dict:
    status: dict = {}
    if waiting:
        status["containerStatuses"] = [
            {"name": "node", "state": {"waiting": {"reason": waiting, "message": f"{waiting} detail"}}}
        ]
    if unschedulable:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes: Insufficient cpu",
            }
        ]
    return {"metadata": {"name": name, "creationTimestamp": created}, "status": status}


NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
OLD, NEW = "2027-01-15T07:57:00Z", "2027-01-15T07:59:30Z"  # 180 s and 30 s before NOW


def test_stuck_reason_names_an_old_pod_that_cannot_pull_or_schedule() -> None:
    assert diagnostics.stuck_reason([_pod("a", OLD, waiting="ImagePullBackOff")], NOW, 120) == (
        "ImagePullBackOff",
        "pod a container node: ImagePullBackOff detail",
    )
    reason, detail = diagnostics.stuck_reason([_pod("b", OLD, unschedulable=True)], NOW, 120) or ("", "")
    assert reason == "Unschedulable" and "Insufficient cpu" in detail


def test_stuck_reason_waits_for_young_pods_and_ignores_recoverable_states() -> None:
    assert diagnostics.stuck_reason([_pod("a", NEW, waiting="ErrImagePull")], NOW, 120) is None
    assert diagnostics.stuck_reason([_pod("a", OLD, waiting="CrashLoopBackOff")], NOW, 120) is None
    assert diagnostics.stuck_reason([_pod("a", OLD, waiting="ContainerCreating")], NOW, 120) is None
    assert diagnostics.stuck_reason([{"metadata": {"name": "x"}}], NOW, 120) is None


def test_finish_reads_metrics_and_a_function_trainers_return_value_in_one_log_read() -> None:
    """A Complete function-trainer job: rank 0's log tail gives the return value (and the metrics when
    trainerStatus has none), with one pod list and one log read; other jobs with metrics read nothing."""
    from trainflow.core.kube.wait import finish
    from trainflow.core.observe import Waiter, observe
    from trainflow.core.result import RETURNS_ANNOTATION

    class LogApi(CallApi):
        def __init__(self) -> None:
            self.calls: list[str] = []

        def list_pods(self, namespace, selector, limit=100):
            self.calls.append("pods")
            return [pod("job-node-0-0")]

        def log_text(self, namespace, pod_name, container, **kw):
            self.calls.append(f"log {pod_name}")
            return 'step 1\nTRAINFLOW_REPORT {"metrics": {"loss": 0.5}}\nTRAINFLOW_RETURN {"acc": 0.93}\n'

    def job(annotations: dict, metrics: list) -> Waiter:
        """A waiter that has seen the TrainJob end (what ``finish`` starts from)."""
        status = {
            "conditions": [{"type": "Complete", "status": "True"}],
            "trainerStatus": {"metrics": metrics},
        }
        meta = {"name": "job", "namespace": "ns", "annotations": annotations}
        waiter = Waiter()
        assert observe(waiter, {"metadata": meta, "spec": {}, "status": status}, 0.0).done
        return waiter

    api = LogApi()
    result = run(finish(job({RETURNS_ANNOTATION: "json"}, []), True, 200), api).result
    assert (result.return_value, result.metrics, api.calls) == (
        {"acc": 0.93},
        {"loss": 0.5},
        ["pods", "log job-node-0-0"],
    )
    api = LogApi()
    served = [{"name": "loss", "value": "0.25"}]
    result = run(finish(job({RETURNS_ANNOTATION: "json"}, served), True, 200), api).result
    assert (result.return_value, result.metrics) == (
        {"acc": 0.93},
        {"loss": 0.25},
    )  # the server's metrics win
    api = LogApi()
    result = run(finish(job({}, served), True, 200), api).result
    assert (result.return_value, api.calls) == (None, [])


def _crash(pod: str, code: int, tail: str = "") -> Diagnostics:
    rank = {"pod": pod, "container": "node", "exit_code": code, "reason": "Error"}
    return Diagnostics(failed_ranks=[rank], log_tail=tail)


def test_the_first_crash_seen_stays_the_root_cause() -> None:
    captured: list[Diagnostics] = []
    keep_first_crash(captured, None)
    keep_first_crash(captured, Diagnostics())
    assert captured == []
    keep_first_crash(captured, _crash("r1", 5))
    keep_first_crash(
        captured, _crash("r0", 137, "Terminated")
    )  # rank 0 killed by the teardown: not the cause
    keep_first_crash(captured, _crash("r1", 5, "diverged"))  # the same pod's log, read on a later look
    assert [(r["pod"], r["exit_code"]) for r in captured[0].failed_ranks] == [("r1", 5)]
    assert captured[0].log_tail == "diverged"


def test_the_final_look_names_the_captured_crash_first() -> None:
    final = with_first_crash(_crash("r0", 137, "Terminated"), _crash("r1", 5, "diverged"))
    assert [r["pod"] for r in final.failed_ranks] == ["r1", "r0"] and final.log_tail == "diverged"
    untailed = with_first_crash(_crash("r0", 137, "Terminated"), _crash("r1", 5))
    assert untailed.log_tail == ""  # rank 0's log is not the crash's
    same = with_first_crash(_crash("r1", 5, "diverged"), _crash("r1", 5))
    assert [r["pod"] for r in same.failed_ranks] == ["r1"] and same.log_tail == "diverged"
    assert with_first_crash(_crash("r0", 1, "x"), None).failed_ranks[0]["pod"] == "r0"


def test_a_container_restarted_between_the_look_and_the_read_gives_the_crashed_instances_log():
    """The pod showed the container terminated, but the kubelet restarted it before its log was read: the
    current instance's log is "unable to retrieve container logs", so the previous instance is read (seen on
    real pods: a dataset initializer with a wrong credential, OnFailure)."""

    class RestartedMeanwhile(FakeApi):
        def list_pods(self, namespace, selector, limit=100):
            return [pod("job-node-0-0", phase="Running", containers=[terminated("node", 1)])]

        def log_text(self, namespace, pod, container, **kw):
            self.calls.append(f"log previous={kw.get('previous')}")
            if kw.get("previous"):
                return "Traceback: crashed instance"
            return "unable to retrieve container logs for containerd://2500a34ce9a1"

    api = RestartedMeanwhile()
    diag = run(collect("ns", "job"), api)
    assert diag.log_tail == "Traceback: crashed instance"
    assert api.calls.count("log previous=False") == 1 and api.calls.count("log previous=True") == 1

    class Gone(RestartedMeanwhile):
        def log_text(self, namespace, pod, container, **kw):
            self.calls.append(f"log previous={kw.get('previous')}")
            return "unable to retrieve container logs for containerd://2500a34ce9a1"

    assert run(collect("ns", "job"), Gone()).log_tail == ""  # no tail rather than the kubelet's words
