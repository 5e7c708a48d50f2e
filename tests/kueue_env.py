"""Kueue objects and observations for the suites that run TrainJobs through the real Kueue (a testbed started
with ``up.sh --kueue``): queues per test namespace, a kwok hold, and how many Workloads Kueue admitted at once.

Shared by tests/e2e (CLI, API, KFP) and tests/airflow_deploy (deferred Airflow tasks); only the kubernetes client.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest

KUEUE = ("kueue.x-k8s.io", "v1beta2")
FLAVOR = "trainflow-e2e-flavor"
PRIORITIES = {"trainflow-high": 1000, "trainflow-low": 10}
KWOK_COMPLETE_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"
# a queued wait's status line: Kueue's reason (or its admission), never a bare "Queued"
QUEUED_LINE = re.compile(
    r"[a-z0-9-]+/[a-z0-9.-]+:?\s+Queued\b.*"
)  # "ns/job  Queued..." "TrainJob ns/job: Queued..."
WITH_REASON = re.compile(
    r"Queued: (waiting in LocalQueue [a-z0-9-]+( \(ClusterQueue [^)]+\))?: \S|admitted in LocalQueue)"
)
NO_QUOTA = "insufficient unused quota for cpu"


def unexplained_waits(text: str) -> list[str]:
    """The status lines of a wait's log that say Queued without Kueue's word."""
    return [m.group(0) for m in QUEUED_LINE.finditer(text) if not WITH_REASON.search(m.group(0))]


def require_kueue(api_client: Any) -> None:
    """Fail loudly (never skip) unless Kueue runs: its Workload API is served and its TrainJob webhook set."""
    from kubernetes import client

    try:
        client.CustomObjectsApi(api_client).list_cluster_custom_object(*KUEUE, "workloads", limit=1)
        hooks = client.AdmissionregistrationV1Api(api_client).read_mutating_webhook_configuration(
            "kueue-mutating-webhook-configuration"
        )
    except client.ApiException as exc:
        pytest.fail(
            f"Kueue is not running on the testbed ({exc.status} {exc.reason}): start it with "
            "`bash testbed/up.sh --kueue`",
            pytrace=False,
        )
    assert any(w.name == "mtrainjob.kb.io" for w in hooks.webhooks or []), (
        "Kueue's TrainJob webhook is missing"
    )


def _create(custom: Any, body: dict[str, Any], namespace: str | None = None) -> None:
    from kubernetes import client

    plural = {"WorkloadPriorityClass": "workloadpriorityclasses"}.get(
        body["kind"], body["kind"].lower() + "s"
    )
    try:
        if namespace:
            custom.create_namespaced_custom_object(*KUEUE, namespace, plural, body)
        else:
            custom.create_cluster_custom_object(*KUEUE, plural, body)
    except client.ApiException as exc:
        if exc.status != 409:  # shared cluster-scoped objects: another test made them
            raise


def make_queues(api_client: Any, namespace: str, *, cpu: int, queue: str = "team") -> str:
    """A ClusterQueue of ``cpu`` CPUs for this namespace only (lower priority preempted within it), its LocalQueue,
    and the shared flavor and priority classes. Returns the ClusterQueue's name."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)
    _create(custom, {"apiVersion": "/".join(KUEUE), "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}})
    for name, value in PRIORITIES.items():
        _create(custom, {"apiVersion": "/".join(KUEUE), "kind": "WorkloadPriorityClass",
                         "metadata": {"name": name}, "value": value})  # fmt: skip
    cq = f"cq-{namespace}"
    _create(custom, {
        "apiVersion": "/".join(KUEUE),
        "kind": "ClusterQueue",
        "metadata": {"name": cq},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{
                "coveredResources": ["cpu", "memory"],
                "flavors": [{"name": FLAVOR, "resources": [
                    {"name": "cpu", "nominalQuota": cpu}, {"name": "memory", "nominalQuota": "256Gi"},
                ]}],
            }],
        },
    })  # fmt: skip
    _create(custom, {"apiVersion": "/".join(KUEUE), "kind": "LocalQueue",
                     "metadata": {"name": queue, "namespace": namespace}, "spec": {"clusterQueue": cq}}, namespace)  # fmt: skip
    return cq


@contextmanager
def team_queue(api_client: Any, namespace: str, *, cpu: int = 4) -> Iterator[str]:
    """While inside: a ClusterQueue of ``cpu`` CPUs for this namespace (lower priority preempted in it) and its
    LocalQueue ``team``, which it yields; Kueue is required (never skipped)."""
    require_kueue(api_client)
    cq = make_queues(api_client, namespace, cpu=cpu)
    try:
        yield "team"
    finally:
        delete_cluster_queue(api_client, cq)


def delete_cluster_queue(api_client: Any, name: str) -> None:
    from kubernetes import client

    try:
        client.CustomObjectsApi(api_client).delete_cluster_custom_object(*KUEUE, "clusterqueues", name)
    except client.ApiException as exc:
        if exc.status != 404:
            raise


def hold(seconds: float) -> dict[str, Any]:
    """A runtime patch keeping the job's kwok pods Running ``seconds`` before they complete."""
    meta = {"annotations": {KWOK_COMPLETE_DELAY: f"{int(seconds)}s"}}
    job = {"name": "node", "template": {"spec": {"template": {"metadata": meta}}}}
    return {
        "manager": "example.com/kueue-e2e",
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job]}}},
    }


def workloads(api_client: Any, namespace: str) -> list[dict[str, Any]]:
    from kubernetes import client

    return list(
        client.CustomObjectsApi(api_client).list_namespaced_custom_object(*KUEUE, namespace, "workloads")[
            "items"
        ]
    )


def _cond(wl: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in (wl.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return None


def holds_quota(wl: Mapping[str, Any]) -> bool:
    """Kueue's own status: quota reserved and not finished (the Workload counts against its ClusterQueue)."""
    reserved, finished = _cond(wl, "QuotaReserved"), _cond(wl, "Finished")
    return bool(reserved and reserved.get("status") == "True") and not (
        finished and finished.get("status") == "True"
    )


def evictions(wl: Mapping[str, Any], reason: str = "Preempted") -> int:
    stats = ((wl.get("status") or {}).get("schedulingStats") or {}).get("evictions") or []
    return sum(int(e.get("count") or 0) for e in stats if e.get("reason") == reason)


HELD = 900  # seconds a held kwok pod would run, until ``release_once_all_wait`` lets it finish


@contextmanager
def release_once_all_wait(api_client: Any, namespace: str, jobs: int, settle: float = 20.0) -> Iterator[None]:
    """While inside: the jobs' pods (kwok, ``hold(HELD)``) run until ``jobs`` TrainJobs exist and ``settle``
    seconds passed (every waiter has started: on a loaded machine a step's launch can take a minute), then each
    pod finishes 2 s after it starts. So the queue stays full while the waits begin, whatever the load."""
    from kubernetes import client

    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            tj = custom.list_namespaced_custom_object(
                "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs"
            )
            if len(tj["items"]) >= jobs:
                break
            stop.wait(1.0)
        stop.wait(settle)
        released: set[str] = set()
        while not stop.is_set():
            for pod in core.list_namespaced_pod(namespace).items:
                if pod.metadata.name not in released:
                    patch = {"metadata": {"annotations": {KWOK_COMPLETE_DELAY: "2s"}}}
                    core.patch_namespaced_pod(pod.metadata.name, namespace, patch)
                    released.add(pod.metadata.name)
            stop.wait(1.0)

    thread = threading.Thread(target=run, name=f"kueue-release-{namespace}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def _watch_error(exc: BaseException) -> str:
    """``transient <status>`` for what a reflector retries (410, 429, 5xx, connection errors), else its repr
    with the status and reason an ``ApiException`` keeps out of its repr."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        if status in (410, 429) or status >= 500:
            return f"transient {status} {exc.reason}"
        return f"ApiException {status} {exc.reason}: {(exc.body or '')[:300]}"
    if isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError):
        return f"transient {exc!r}"
    return repr(exc)


@contextmanager
def admission_watch(api_client: Any, namespace: str) -> Iterator[dict[str, Any]]:
    """While inside: watch the namespace's Workloads and record the most that held quota at once
    (``seen["max"]``) and every Workload seen (``seen["names"]``), from Kueue's Workload status."""
    from kubernetes import client, watch

    seen: dict[str, Any] = {"max": 0, "names": set(), "errors": [], "retried": []}
    stop = threading.Event()

    def run() -> None:
        custom = client.CustomObjectsApi(api_client)
        while not stop.is_set():
            holding: set[str] = set()  # each watch begins with every Workload as ADDED: the state rebuilt
            w = watch.Watch()
            try:
                for ev in w.stream(custom.list_namespaced_custom_object, *KUEUE, namespace, "workloads",
                                   timeout_seconds=5):  # fmt: skip
                    wl, name = ev["object"], ev["object"]["metadata"]["name"]
                    seen["names"].add(name)
                    if ev["type"] != "DELETED" and holds_quota(wl):
                        holding.add(name)
                    else:
                        holding.discard(name)
                    seen["max"] = max(seen["max"], len(holding))
                    if stop.is_set():
                        break
            except Exception as exc:
                # as client-go's reflector: 410, 429, 5xx and a dropped connection restart the watch (its
                # ADDED events rebuild ``holding``); anything else is recorded and fails the asserting test
                kind = _watch_error(exc)
                seen["retried" if kind.startswith("transient") else "errors"].append(kind)
                time.sleep(0.5)
            finally:
                w.stop()

    thread = threading.Thread(target=run, name=f"kueue-watch-{namespace}", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(10)
