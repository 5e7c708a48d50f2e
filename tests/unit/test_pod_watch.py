"""CrashAlerts: which pod events tell a waiter to look at its pods (once per crash)."""

from __future__ import annotations

import copy
from typing import Any

from trainflow.core.kube.pod_watch import CrashAlerts


def pod(
    job: str, uid: str, state: dict[str, Any], restarts: int = 0, last: dict[str, Any] | None = None
) -> dict:
    status: dict[str, Any] = {"name": "node", "restartCount": restarts, "state": state}
    if last is not None:
        status["lastState"] = last
    return {
        "metadata": {"name": f"{job}-{uid}", "uid": uid, "labels": {"jobset.sigs.k8s.io/jobset-name": job}},
        "status": {"containerStatuses": [status]},
    }


RUNNING: dict[str, Any] = {"running": {}}
CRASH = {"terminated": {"exitCode": 2, "reason": "Error"}}


def test_one_alert_per_crash_and_per_restart() -> None:
    seen: list[str] = []
    alerts = CrashAlerts(lambda name, pod: seen.append(name))
    alerts.apply("ADDED", pod("a", "u1", RUNNING))
    alerts.apply("MODIFIED", pod("a", "u1", {"terminated": {"exitCode": 0, "reason": "Completed"}}))
    assert seen == []  # success is no crash
    alerts.apply("MODIFIED", pod("a", "u2", CRASH))
    alerts.apply("MODIFIED", pod("a", "u2", CRASH))  # the same crash again (deletion timestamp, ...)
    assert seen == ["a"]
    # restartPolicy OnFailure: the container restarts in place and crashes again
    alerts.apply("MODIFIED", pod("a", "u2", RUNNING, restarts=1, last=CRASH))
    assert seen == ["a", "a"]
    alerts.apply("MODIFIED", pod("b", "u3", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}))
    assert seen == ["a", "a", "b"]
    alerts.apply("DELETED", pod("b", "u3", RUNNING))
    assert "u3" not in alerts.seen


def test_relist_forgets_gone_pods_and_reports_crashes_it_missed() -> None:
    seen: list[str] = []
    alerts = CrashAlerts(lambda name, pod: seen.append(name))
    crashed = pod("a", "u1", CRASH)
    alerts.apply("MODIFIED", crashed)
    for again in (copy.deepcopy(crashed), pod("c", "u9", CRASH)):  # a re-list after a 410: u1 known, u9 new
        alerts.apply("ADDED", again)
    alerts.keep_only({"u1", "u9"})
    assert seen == ["a", "c"]
    alerts.keep_only(set())
    assert alerts.seen == {}


def test_pods_without_a_jobset_label_are_ignored() -> None:
    seen: list[str] = []
    alerts = CrashAlerts(lambda name, pod: seen.append(name))
    stray = pod("a", "u1", CRASH)
    del stray["metadata"]["labels"]
    alerts.apply("ADDED", stray)
    assert seen == []
