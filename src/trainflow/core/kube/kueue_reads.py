"""Kueue's objects as trainflow reads them: a job's Workload (a plan, for any waiter) and, before a create, the
LocalQueue and WorkloadPriorityClass a request names.

The Workload read is a plan (``kube/plan.py``), run on the sync client or on an event loop; what it means is
``core/kueue.py``'s, and when to read is ``core/observe.py``'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainflow.core import kueue
from trainflow.core.errors import FieldIssue, InvalidRequest, NotFound, PermissionDenied
from trainflow.core.kube import calls
from trainflow.core.kube.plan import Plan
from trainflow.core.kueue import QueueStatus
from trainflow.core.naming import PRIORITY_CLASS_LABEL, QUEUE_LABEL
from trainflow.core.observe import QUEUE_RECHECK_SECONDS, Outcome, Waiter, observe_queue
from trainflow.core.result import TrainJobResult

__all__ = ["QUEUE_RECHECK_SECONDS", "SchedulingChecks", "WorkloadRead", "look", "with_kueue", "workload"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkloadRead:
    """One look at a job's Workload: ``available`` False when it cannot be read at all (no Kueue on the
    cluster, or no RBAC to list Workloads): waiters then stop asking."""

    status: QueueStatus | None
    available: bool = True


def workload(namespace: str, uid: str | None) -> Plan[WorkloadRead]:
    """The job's Workload, by Kueue's ``job-uid`` label: one LIST (two on a Kueue serving only v1beta1)."""
    if not uid:
        return WorkloadRead(None)
    for version in kueue.VERSIONS:
        try:
            answer = yield calls.list_workloads(namespace, f"{kueue.JOB_UID_LABEL}={uid}", version)
        except NotFound:  # this version of the API is not served
            continue
        except PermissionDenied as exc:
            log.info("Kueue's Workloads cannot be read (%s); waits show the TrainJob's own state", exc)
            return WorkloadRead(None, available=False)
        except Exception as exc:  # best effort, as every diagnostic read: try again later
            log.debug("Workload of %s/%s: %r", namespace, uid, exc)
            return WorkloadRead(None)
        return WorkloadRead(kueue.workload_of(list(answer.get("items") or [])))
    return WorkloadRead(None, available=False)


def look(waiter: Waiter, now: float) -> Plan[Outcome]:
    """Read the waited job's Workload and fold it into the waiter (``observe`` asked: ``check_queue``)."""
    assert waiter.result is not None
    got = yield from workload(waiter.result.namespace, waiter.result.uid)
    if not got.available:
        waiter.queue_reads = False
    return observe_queue(waiter, got.status, now)


def with_kueue(obj: Mapping[str, Any], result: TrainJobResult) -> Plan[TrainJobResult]:
    """``result`` with Kueue's word when Kueue manages the job (one read); as it is otherwise."""
    if not kueue.managed(obj):
        return result
    got = yield from workload(result.namespace, result.uid)
    return kueue.with_queue(result, got.status, datetime.now(UTC))


class SchedulingChecks:
    """``check_scheduling`` for a manifest's Kueue labels, remembered for ``ttl`` seconds once they check out."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.checked: dict[tuple[str, str | None, str | None], float] = {}

    def check(self, api: Any, namespace: str, manifest: Mapping[str, Any]) -> None:
        labels = (manifest.get("metadata") or {}).get("labels") or {}
        key = (namespace, labels.get(QUEUE_LABEL), labels.get(PRIORITY_CLASS_LABEL))
        when = self.checked.get(key)
        if (key[1] is None and key[2] is None) or (when is not None and time.monotonic() - when < self.ttl):
            return
        check_scheduling(api, *key)
        self.checked[key] = time.monotonic()


def check_scheduling(api: Any, namespace: str, queue: str | None, priority_class: str | None) -> None:
    """Before a create: the LocalQueue and the WorkloadPriorityClass exist (else InvalidRequest naming the field).

    Kueue would otherwise hold the job forever ("LocalQueue x doesn't exist") or refuse its Workload. Without
    RBAC to read them the check is skipped (the wait then shows Kueue's verdict)."""
    issues = []
    for field, plural, ns, name in (
        ("queue", "localqueues", namespace, queue),
        ("priority_class", "workloadpriorityclasses", None, priority_class),
    ):
        if name is None:
            continue
        problem = _missing(api, plural, name, ns)
        if problem is not None:
            issues.append(FieldIssue(field, *problem))
    if issues:
        raise InvalidRequest(issues)


def _missing(api: Any, plural: str, name: str, namespace: str | None) -> tuple[str, str] | None:
    """(problem, fix) when the object does not exist, or Kueue is not installed; None when it exists."""
    kind = "LocalQueue" if plural == "localqueues" else "WorkloadPriorityClass"
    where = f" in namespace {namespace!r}" if namespace else ""
    for version in kueue.VERSIONS:
        try:
            api.run(calls.get_kueue_object(plural, name, version, namespace))
            return None
        except PermissionDenied as exc:
            log.info("cannot check that %s %r exists (%s)", kind, name, exc)
            return None
        except NotFound:
            pass
        try:
            available = sorted(
                str((o.get("metadata") or {}).get("name"))
                for o in api.run(calls.list_kueue_objects(plural, version, namespace)).get("items") or []
            )
        except NotFound:  # the resource type itself: this API version is not served
            continue
        except PermissionDenied:
            available = []
        choices = ", ".join(available[:20]) or "none"
        return f"{kind} {name!r} not found{where}", f"use one of: {choices}"
    return (
        f"{kind} {name!r}: Kueue is not installed on this cluster (no {plural}.{kueue.GROUP})",
        f"leave it unset, or install Kueue with the TrainJob integration ({kueue.INTEGRATION})",
    )
