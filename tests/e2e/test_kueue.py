"""TrainJobs through the real Kueue (v0.17.0, TrainJob integration) on the testbed (``up.sh --kueue``): queued,
admitted, preempted and given up on, from the CLI, the backend API (sync and async waits) and KFP steps.

The oracle is Kueue itself: how many Workloads hold quota at once, their preemption counts, and the reasons
its scheduler writes. Deferred Airflow tasks through Kueue are tests/airflow_deploy/test_deploy_kueue.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG
from conftest import wait_until
from kueue_env import (
    HELD,
    KUEUE,
    KWOK_COMPLETE_DELAY,
    NO_QUOTA,
    admission_watch,
    evictions,
    hold,
    holds_quota,
    release_once_all_wait,
    team_queue,
    unexplained_waits,
    workloads,
)
from trainflow.core import TrainJobRequest
from trainflow.core.errors import QueueBudgetExceeded, TrainJobNotFound
from trainflow.core.kube.backend import KubernetesBackend
from trainflow.core.lifecycle import launch
from trainflow.core.observe import QUEUE_BUDGET_EXPIRED
from trainflow.core.result import JobState, TrainJobResult

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"


@pytest.fixture
def queue(testbed: Any, namespace: str) -> Iterator[str]:
    """A ClusterQueue of 4 CPUs for this namespace, LocalQueue ``team``: 4 one-CPU jobs run at once."""
    with team_queue(testbed.api_client, namespace) as name:
        yield name


def request(name: str, cpu: int, seconds: float, **fields: Any) -> TrainJobRequest:
    return TrainJobRequest(
        name=name,
        image=IMAGE,
        command=["python", "train.py"],
        num_nodes=1,
        resources={"cpu": cpu},
        runtime_patches=[hold(seconds)],
        **fields,
    )


def cli(testbed: Any, namespace: str, *args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "trainflow.core.cli", "--backend", "kubernetes", "-n", namespace, *args]
    env = {**testbed.env, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


KFP_STEP = textwrap.dedent(
    """
    import json, sys
    from kfp import local
    from trainflow.kfp import make_train_job_component

    args = json.loads(sys.argv[1])
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=args.pop("root"), raise_on_error=True)
    op = make_train_job_component(base_image="python:3.11", packages_to_install=(), install_kfp_package=False)
    task = op(**args)
    print("STEP-STATE", task.outputs["state"], flush=True)
    """
)


def kfp_step(testbed: Any, namespace: str, name: str, root: Path, **fields: Any) -> subprocess.Popen[str]:
    args: dict[str, Any] = {
        "root": str(root / name),
        "name": name,
        "image": IMAGE,
        "command": ["python", "train.py"],
        "num_nodes": 1,
        "resources": {"cpu": 1},
        "queue": "team",
        "extra": {"runtime_patches": [hold(HELD)]},
        "backend": "kubernetes",
        "backend_config": {"kubeconfig": str(testbed.kubeconfig)},
        "namespace": namespace,
        "timeout": 900.0,
        **fields,
    }
    env = {**testbed.env, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-c", KFP_STEP, json.dumps(args)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def trainjobs(k8s: Any, ns: str) -> list[dict[str, Any]]:
    return k8s.custom.list_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", ns, "trainjobs")[
        "items"
    ]


def test_forty_jobs_from_the_cli_and_kfp_steps_run_four_at_a_time(
    testbed: Any, k8s: Any, namespace: str, queue: str, tmp_path: Path
) -> None:
    """20 ``trainflow submit --wait`` and 20 KFP steps at once through a ClusterQueue that fits 4: Kueue never
    holds quota for more than 4, all 40 complete, each exactly once, and every wait that was held says why."""
    hold_cli = json.dumps([hold(HELD)])  # held until every step waits, then 2 s each: 10 waves of 4
    job = ["--queue", queue, "--image", IMAGE, "--num-nodes", "1", "--resources", '{"cpu": 1}']
    job += ["--set", f"runtime_patches={hold_cli}", "--wait", "--timeout", "900", "--", "python", "train.py"]
    with (
        admission_watch(testbed.api_client, namespace) as seen,
        release_once_all_wait(testbed.api_client, namespace, 40),
    ):
        procs = {f"cli-{i}": cli(testbed, namespace, "submit", "--name", f"cli-{i}", *job) for i in range(20)}
        procs |= {f"kfp-{i}": kfp_step(testbed, namespace, f"kfp-{i}", tmp_path) for i in range(20)}
        outputs = {name: p.communicate(timeout=1200) for name, p in procs.items()}
    failed = {
        n: (out[-2000:], (err or "")[-2000:]) for n, (out, err) in outputs.items() if procs[n].returncode
    }
    assert not failed, failed
    assert not seen["errors"], seen["errors"]
    assert seen["max"] == 4, f"Kueue held quota for {seen['max']} Workloads at once; the queue fits 4"
    jobs = trainjobs(k8s, namespace)
    assert sorted(j["metadata"]["name"] for j in jobs) == sorted(procs), (
        "one TrainJob per step, no duplicates"
    )
    assert all(j["status"]["conditions"][-1]["type"] == "Complete" for j in jobs)
    assert len(workloads(testbed.api_client, namespace)) == 40 and len(seen["names"]) == 40
    logs = {n: (out or "") + (err or "") for n, (out, err) in outputs.items()}
    unexplained = {n: lines for n, text in logs.items() if (lines := unexplained_waits(text))}
    assert not unexplained, unexplained  # every queued wait gives Kueue's reason
    held = [n for n, text in logs.items() if NO_QUOTA in text]
    assert len(held) >= 30, f"only {len(held)} of 40 waits saw their job held back by the queue"


def test_preemption_is_not_failure_for_sync_and_async_waits(testbed: Any, namespace: str, queue: str) -> None:
    """A high-priority job preempts two running low ones; both waits see Kueue's reason, keep waiting through
    re-admission and end Complete with one preemption counted (Kueue's own count agrees)."""
    be = KubernetesBackend(kubeconfig=str(testbed.kubeconfig), namespace=namespace)
    for name in ("low-sync", "low-async"):
        launch(be, request(name, 2, 60, queue=queue, priority_class="trainflow-low"))
    wait_until(
        lambda: all(be.get(n).state is JobState.RUNNING for n in ("low-sync", "low-async")), 120, "running"
    )
    updates: dict[str, list[Any]] = {"low-sync": [], "low-async": []}

    async def both() -> list[Any]:
        sync = asyncio.to_thread(be.wait, "low-sync", timeout=600, on_update=updates["low-sync"].append)
        deferred = be.wait_async("low-async", timeout=600, on_update=updates["low-async"].append)
        await asyncio.sleep(3)
        await asyncio.to_thread(
            launch, be, request("urgent", 4, 20, queue=queue, priority_class="trainflow-high")
        )
        return list(await asyncio.gather(sync, deferred))

    results = asyncio.run(both())
    for result, name in zip(results, ("low-sync", "low-async"), strict=True):
        states = [u.state for u in updates[name]]
        assert result.state is JobState.COMPLETE and result.preemptions == 1, (name, result)
        assert JobState.QUEUED in states and states[-1] is JobState.COMPLETE, (name, states)
        queued = [u for u in updates[name] if u.state is JobState.QUEUED]
        assert any("Preempted to accommodate" in (u.message or "") for u in queued), (name, queued)
        assert result.queued_seconds is not None and result.queued_seconds >= 10, (
            name,
            result.queued_seconds,
        )
    by_job = {
        w["metadata"]["ownerReferences"][0]["name"]: w for w in workloads(testbed.api_client, namespace)
    }
    assert {n: evictions(by_job[n]) for n in ("low-sync", "low-async", "urgent")} == {
        "low-sync": 1, "low-async": 1, "urgent": 0,
    }  # fmt: skip
    assert be.get("urgent").state is JobState.COMPLETE


BUDGET = 60  # the queue budget of the job preempted twice: far above its waits for re-admission (seconds)


def _state(be: KubernetesBackend, name: str) -> JobState | None:
    try:
        return be.get(name).state
    except TrainJobNotFound:
        return None


def _resumed(api_client: Any, namespace: str, name: str) -> bool:
    """Kueue admitted the job and the Trainer said so: ``spec.suspend`` clear, Suspended=False (Resumed)."""
    from kubernetes import client

    obj = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", name
    )
    return not obj["spec"].get("suspend") and _condition_time(obj, "Suspended", "False") is not None


def _workload_of(api_client: Any, namespace: str, job: str) -> dict[str, Any] | None:
    for wl in workloads(api_client, namespace):
        if any(o.get("name") == job for o in wl["metadata"].get("ownerReferences") or []):
            return wl
    return None


def activate(api_client: Any, namespace: str, workload: str, active: bool) -> None:
    """Kueue's own switch: an inactive Workload is neither admitted nor preempts (``spec.active``)."""
    from kubernetes import client

    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        *KUEUE, namespace, "workloads", workload, {"spec": {"active": active}}
    )


def _condition_time(obj: dict[str, Any], kind: str, status: str = "True") -> datetime | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == status:
            return datetime.fromisoformat(c["lastTransitionTime"].replace("Z", "+00:00"))
    return None


@contextmanager
def versions_of(api_client: Any, namespace: str, name: str) -> Iterator[list[dict[str, Any]]]:
    """While inside: every version of the TrainJob ``name`` a watch delivers (event type, uid, spec.suspend, the
    Trainer's Suspended condition, its active pods), in order: the oracle for "never deleted" and for what the
    real Trainer writes around a preemption."""
    from kubernetes import client, watch

    seen: list[dict[str, Any]] = []
    stop = threading.Event()

    def run() -> None:
        custom = client.CustomObjectsApi(api_client)
        rv = None
        while not stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(
                    custom.list_namespaced_custom_object, "trainer.kubeflow.org", "v1alpha1", namespace,
                    "trainjobs", field_selector=f"metadata.name={name}", timeout_seconds=5,
                    **({"resource_version": rv} if rv else {}),
                ):  # fmt: skip
                    obj = ev["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    status = obj.get("status") or {}
                    cond = next((c for c in status.get("conditions") or [] if c["type"] == "Suspended"), {})
                    seen.append({
                        "type": ev["type"], "uid": obj["metadata"]["uid"], "at": time.time(),
                        "suspend": bool((obj.get("spec") or {}).get("suspend")),
                        "suspended": (cond.get("status"), cond.get("reason")),
                        "active": sum(int(j.get("active") or 0) for j in status.get("jobsStatus") or []),
                    })  # fmt: skip
                    if stop.is_set():
                        break
            except Exception as exc:  # a 410 re-lists; anything else is recorded and fails the test
                if "410" not in str(exc):
                    seen.append({"type": "ERROR", "error": repr(exc)})
                rv = None
                time.sleep(0.2)
            finally:
                w.stop()

    thread = threading.Thread(target=run, name=f"trainjob-versions-{name}", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(10)


def test_a_job_preempted_right_after_admission_keeps_its_queue_budget(
    testbed: Any, namespace: str, queue: str, tmp_path: Path
) -> None:
    """Issue 33: a job older than its queue budget, preempted while it runs and again right after Kueue admits it
    once more (before its pods run). Every waiter (the KFP step that submitted it, which deletes a job over its
    budget; a sync and an async wait) reports it Queued and preempted, then Complete: never
    QueueBudgetExceeded, and the job is never deleted. Each wait's budget counts from its preemption as the
    Trainer and Kueue time it (``kueue.queue_clock``), never from the job's creation."""
    from kubernetes import client

    api = testbed.api_client
    core = client.CoreV1Api(api)
    be = KubernetesBackend(kubeconfig=str(testbed.kubeconfig), namespace=namespace)
    urgent = request("urgent", 4, HELD, queue=queue, priority_class="trainflow-high")
    with versions_of(api, namespace, "late") as versions:
        step = kfp_step(
            testbed, namespace, "late", tmp_path, resources={"cpu": 4}, priority_class="trainflow-low",
            max_queue_seconds=BUDGET,
        )  # fmt: skip
        wait_until(lambda: _state(be, "late") is JobState.RUNNING, 600, "the step's job running")
        created = be.get("late").created_at
        assert created is not None

        def late() -> JobState:
            """late's state; deleted (a waiter judged it over its budget and its step deleted it): the test fails."""
            state = _state(be, "late")
            if state is None:
                out = step.communicate(timeout=300)[0]  # the step that deleted it ends at once
                pytest.fail(f"late was deleted; the step said:\n{out[-3000:]}", pytrace=False)
            return state

        updates: dict[str, list[Any]] = {"sync": [], "async": []}
        ends: dict[str, Any] = {}

        def sync_wait() -> None:
            try:
                ends["sync"] = be.wait("late", timeout=900, on_update=updates["sync"].append)
            except Exception as exc:  # the test fails with it below
                ends["sync"] = exc

        def async_wait() -> None:
            try:
                ends["async"] = asyncio.run(
                    be.wait_async("late", timeout=900, on_update=updates["async"].append)
                )
            except Exception as exc:
                ends["async"] = exc

        waits = [threading.Thread(target=f, daemon=True) for f in (sync_wait, async_wait)]
        for t in waits:
            t.start()
        # 1. preempted while it runs, once it is older than its budget
        time.sleep(max(0.0, created.timestamp() + BUDGET + 5 - time.time()))
        first = launch(be, urgent).ref
        wait_until(
            lambda: evictions(_workload_of(api, namespace, "late") or {}) == 1, 300, "first preemption"
        )
        wait_until(lambda: late() is JobState.QUEUED, 300, "late queued")
        wait_until(lambda: not holds_quota(_workload_of(api, namespace, "late") or {}), 300, "quota released")
        # 2. preempted again right after Kueue admits it once more, before any pod of it exists: no pod may be
        # created in the namespace meanwhile (a ResourceQuota of 0 pods), the preemptor waits behind the first,
        # deactivated (Kueue's Workload spec.active), and is activated once the Trainer says late resumed
        core.create_namespaced_resource_quota(
            namespace, {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
        )
        second = launch(be, urgent.model_copy(update={"name": "urgent-2"})).ref
        preemptor = wait_until(lambda: _workload_of(api, namespace, "urgent-2"), 300, "the second Workload")
        activate(api, namespace, preemptor["metadata"]["name"], False)
        assert be.cancel(first)  # frees the quota: Kueue admits late again
        wait_until(
            lambda: _resumed(api, namespace, "late"), 300, "late admitted again, the Trainer's Resumed", 0.05
        )
        readmitted = time.time()
        activate(api, namespace, preemptor["metadata"]["name"], True)
        wait_until(
            lambda: evictions(_workload_of(api, namespace, "late") or {}) == 2, 300, "second preemption"
        )
        evicted = _condition_time(_workload_of(api, namespace, "late") or {}, "Evicted")
        assert evicted is not None and (evicted - created).total_seconds() > BUDGET  # older than its budget
        wait_until(lambda: late() is JobState.QUEUED, 300, "late queued again")
        core.delete_namespaced_resource_quota("no-pods", namespace)
        assert be.cancel(second)
        # 3. admitted a third time: its pods finish 2 s after they start (each pod of late patched as it comes:
        # one created by the second admission may still be on its way out)
        wait_until(lambda: late() is JobState.RUNNING, 300, "late running again")
        released = set[str]()
        while step.poll() is None:
            selector = "jobset.sigs.k8s.io/jobset-name=late"
            for pod in core.list_namespaced_pod(namespace, label_selector=selector).items:
                if pod.metadata.name not in released and not pod.metadata.deletion_timestamp:
                    patch = {"metadata": {"annotations": {KWOK_COMPLETE_DELAY: "2s"}}}
                    core.patch_namespaced_pod(pod.metadata.name, namespace, patch)
                    released.add(pod.metadata.name)
            time.sleep(1.0)
        out, _ = step.communicate(timeout=900)
        for t in waits:
            t.join(900)
    for name in ("sync", "async"):  # first: the waiters' own verdicts say most
        result = ends.get(name)
        assert isinstance(result, TrainJobResult), (name, result)
        assert result.state is JobState.COMPLETE and result.preemptions == 2, (name, result)
        queued = [u for u in updates[name] if u.state is JobState.QUEUED]
        assert any("Preempted to accommodate" in (u.message or "") for u in queued), (name, queued)
        assert not any(u.reason == QUEUE_BUDGET_EXPIRED for u in updates[name]), name
    assert "QueueBudgetExceeded" not in out and "within its queue budget" not in out, out[-3000:]
    assert step.returncode == 0 and "STEP-STATE Complete" in out, out[-3000:]
    # the oracle: the job was never deleted, and what the real Trainer wrote
    assert not [v for v in versions if v["type"] in ("DELETED", "ERROR")], versions
    assert {v["uid"] for v in versions} == {be.get("late").uid}
    reasons = {v["suspended"] for v in versions if v["suspended"] != (None, None)}
    assert reasons <= {("True", "Suspended"), ("False", "Resumed")}, reasons
    # and Kueue: it turns Evicted False when it admits the job again (an eviction time never outlives its wait)
    final = _workload_of(api, namespace, "late") or {}
    assert _condition_time(final, "Evicted", "False") is not None and evictions(final) == 2, final.get(
        "status"
    )
    ran = next(i for i, v in enumerate(versions) if not v["suspend"])  # before: created suspended
    window = [v for v in versions[ran:] if v["suspend"] and v["suspended"][0] != "True" and not v["active"]]
    assert window, versions  # the order: Kueue's spec.suspend, the Trainer still Resumed, no pod
    print(
        f"late: created {created.isoformat()}, re-admitted {readmitted - created.timestamp():.1f} s later, "
        f"evicted again at {(evicted - created).total_seconds():.0f} s; {len(versions)} versions, "
        f"{len(window)} suspended without the Trainer's Suspended=True and without active pods"
    )
    for v in versions:  # what the Trainer wrote, in order (shown with -s)
        at = v["at"] - created.timestamp()
        print(f"  {at:7.2f} s  suspend={v['suspend']!s:5}  {v['suspended']}  active={v['active']}")


def test_queue_budget_fails_the_wait_naming_the_queue(testbed: Any, namespace: str, queue: str) -> None:
    """A job that can never fit (8 CPUs in a 4-CPU queue) fails its wait at max_queue_seconds, with Kueue's
    reason; the job is left queued (the adapters delete it per their cancel setting), never started."""
    be = KubernetesBackend(kubeconfig=str(testbed.kubeconfig), namespace=namespace)
    ref = launch(be, request("too-big", 8, 5, queue=queue, max_queue_seconds=15)).ref
    created = be.get(ref).created_at
    assert created is not None
    with pytest.raises(QueueBudgetExceeded) as exc:
        be.wait(ref, timeout=300)
    assert 15 <= time.time() - created.timestamp() < 90  # counted from the suspension Kueue made at creation
    text = str(exc.value)
    assert "not admitted by LocalQueue team within its queue budget, max_queue_seconds=15" in text, text
    # Kueue's word for a job larger than the whole queue
    assert "insufficient quota for cpu" in text and "> maximum capacity (4)" in text, text
    assert be.get(ref).state is JobState.QUEUED  # still queued: never started
    (wl,) = workloads(testbed.api_client, namespace)
    assert not holds_quota(wl)
    # Kueue writes Admitted and Evicted only for a job it admitted: this one's clock may start at its creation
    kinds = {c["type"] for c in wl["status"].get("conditions") or []}
    assert not kinds & {"Admitted", "Evicted"}, wl["status"]


def test_cancel_while_queued_deletes_the_trainjob_and_its_workload(
    testbed: Any, namespace: str, queue: str
) -> None:
    be = KubernetesBackend(kubeconfig=str(testbed.kubeconfig), namespace=namespace)
    ref = launch(be, request("waits", 8, 5, queue=queue)).ref
    wait_until(lambda: workloads(testbed.api_client, namespace), HANG, "its Workload")
    assert be.get(ref).state is JobState.QUEUED
    assert be.cancel(ref)
    wait_until(
        lambda: not workloads(testbed.api_client, namespace), HANG, "the Workload deleted with the job"
    )
    assert be.list() == []


def test_a_retry_reattaches_to_a_queued_or_preempted_job(testbed: Any, namespace: str, queue: str) -> None:
    """launch() again while the job waits in the queue, and while it is suspended by a preemption: the same
    TrainJob is reattached, never a second one (Kueue would queue it behind the first)."""
    be = KubernetesBackend(kubeconfig=str(testbed.kubeconfig), namespace=namespace)
    blocker = launch(be, request("blocker", 4, 60, queue=queue, priority_class="trainflow-low")).ref
    wait_until(lambda: be.get(blocker).state is JobState.RUNNING, 120, "blocker running")
    keyed = {"idempotency_key": "dag/run-1/train", "queue": queue, "priority_class": "trainflow-high"}
    first = launch(be, request("keyed", 2, 5, **keyed).model_copy(update={"name": None}))
    wait_until(lambda: be.get(first.ref).state in (JobState.QUEUED, JobState.RUNNING), 60, "keyed exists")
    again = launch(be, request("keyed", 2, 5, **keyed).model_copy(update={"name": None}))
    assert again.adopted and again.ref.name == first.ref.name and again.attempt == first.attempt == 1
    # the high job preempts the blocker; a retry of the blocker's step while it is suspended reattaches
    wait_until(lambda: be.get(blocker).state is JobState.QUEUED, 120, "blocker preempted")
    retried = launch(be, request("blocker", 4, 60, queue=queue, priority_class="trainflow-low"))
    assert retried.adopted and retried.ref.name == "blocker" and retried.state is JobState.QUEUED
    assert be.wait(blocker, timeout=600).preemptions == 1
    names = sorted(r.name for r in be.list())
    assert names == sorted(["blocker", first.ref.name]), names


def test_status_and_dry_run_check_the_queue_and_priority_class(
    testbed: Any, namespace: str, queue: str
) -> None:
    bad = ["--queue", "nope", "--priority-class", "nope-either", "--image", IMAGE, "--dry-run", "--", "train"]
    proc = cli(testbed, namespace, "submit", "--name", "x", *bad)
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 2, err
    assert "queue: LocalQueue 'nope' not found" in err and f"use one of: {queue}" in err, err
    assert "priority_class: WorkloadPriorityClass 'nope-either' not found" in err, err
    be = KubernetesBackend(kubeconfig=str(testbed.kubeconfig), namespace=namespace)
    launch(be, request("hog", 4, 60, queue=queue))
    waiting = launch(be, request("next", 1, 5, queue=queue)).ref
    wait_until(lambda: NO_QUOTA in (be.get(waiting).message or ""), 60, "Kueue's reason in the status")
    proc = cli(testbed, namespace, "status", waiting.name)
    out, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 0, err
    assert "State:     Queued (Pending)" in out and NO_QUOTA in out and "Queue:     team" in out, out
    assert any(line.startswith("Queued:") and line.endswith("s") for line in out.splitlines()), out
