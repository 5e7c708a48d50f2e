"""A pod watch beside the TrainJob watch: it hands waiters a crashed pod the moment a container fails.

On a real cluster the Job deletes a crashed pod before the TrainJob turns Failed, taking its exit code and
log with it, and the Trainer's ``jobsStatus`` counts lag behind a short crash. So this watch hands the waiters
of the pod's JobSet (= TrainJob) the pod itself, once per crash, and the waiter reads that container's log
tail at once, before anything else. It keeps no pods in memory. Without RBAC to watch pods it stops and
waiters fall back to the counts.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from trainflow.core.errors import PermissionDenied
from trainflow.core.kube import calls
from trainflow.core.kube.aio import AsyncKubeApi
from trainflow.core.kube.apierrors import described
from trainflow.core.kube.diagnostics import pod_label, pod_problems
from trainflow.core.kube.listwatch import WatchStats, list_and_watch, list_pages, watch_once
from trainflow.core.naming import JOBSET_NAME_LABEL

log = logging.getLogger(__name__)

WINDOW = 300
PAGE = 500


def crash_signature(pod: dict[str, Any]) -> tuple[str, ...]:
    """The failed containers of a pod, with their restart counts: () when none failed."""
    failed = pod_problems([pod])[1]
    if not failed:
        return ()
    restarts = {
        cs.get("name"): cs.get("restartCount", 0)
        for key in ("initContainerStatuses", "containerStatuses")
        for cs in (pod.get("status") or {}).get(key) or []
    }
    return tuple(
        sorted(f"{f['container']}:{f['exit_code']}:{restarts.get(f['container'], 0)}" for f in failed)
    )


def start_signature(pod: dict[str, Any]) -> tuple[str, ...]:
    """The containers of a pod that have started (running or ended), with their restart counts."""
    started = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in (pod.get("status") or {}).get(key) or []:
            state = cs.get("state") or {}
            if state.get("running") is not None or state.get("terminated") is not None:
                started.append(f"{cs.get('name')}:{cs.get('restartCount', 0)}")
    return tuple(sorted(started))


Alert = Callable[[str, dict[str, Any]], None]  # (jobset name, pod)


class CrashAlerts:
    """Event handler: ``alert(jobset name, pod)`` once per new crash signature of a pod, and ``started(...)``
    once per container start (log followers wait for those instead of polling for a pod)."""

    def __init__(self, alert: Alert, started: Alert | None = None) -> None:
        self.alert = alert
        self.started = started
        self.seen: dict[str, tuple[str, ...]] = {}  # pod uid -> crash signature already reported
        self.starts: dict[str, tuple[str, ...]] = {}  # pod uid -> start signature already reported

    def apply(self, kind: str, pod: dict[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if kind == "DELETED":
            self.seen.pop(uid, None)
            self.starts.pop(uid, None)
            return
        name = pod_label(pod, JOBSET_NAME_LABEL)
        if self.started is not None:
            began = start_signature(pod)
            if began and self.starts.get(uid) != began:
                self.starts[uid] = began
                if name:
                    self.started(name, pod)
        signature = crash_signature(pod)
        if not signature or self.seen.get(uid) == signature:
            return
        self.seen[uid] = signature
        if name:
            self.alert(name, pod)

    def keep_only(self, uids: set[str]) -> None:
        """After a re-list: forget the pods that are gone."""
        self.seen = {k: v for k, v in self.seen.items() if k in uids}
        self.starts = {k: v for k, v in self.starts.items() if k in uids}


async def _list(api: AsyncKubeApi, namespace: str, selector: str, alerts: CrashAlerts) -> str:
    uids: set[str] = set()

    def each(pod: dict[str, Any]) -> None:
        uids.add(str(pod["metadata"].get("uid") or ""))
        alerts.apply("ADDED", pod)

    rv = await list_pages(lambda token: api.run(calls.list_pods(namespace, selector, PAGE, token)), each)
    alerts.keep_only(uids)
    return rv


async def watch_crashes(
    api: AsyncKubeApi,
    namespace: str,
    alert: Alert,
    stats: WatchStats,
    job: str | None = None,
    started: Alert | None = None,
    on_stop: Callable[[], None] = lambda: None,
) -> None:
    """Until cancelled (or refused): ``alert(name, pod)`` when a container of TrainJob ``name``'s pods fails,
    ``started(name, pod)`` when one starts. ``job``: that TrainJob's pods only (a waiter of its own), else every
    TrainJob's in the namespace. ``on_stop`` when the watch gives up (no RBAC to watch pods)."""
    alerts = CrashAlerts(alert, started)
    selector = f"{JOBSET_NAME_LABEL}={job}" if job else JOBSET_NAME_LABEL

    def stopped(exc: BaseException) -> None:
        on_stop()
        if isinstance(exc, PermissionDenied):
            log.info("pods in %r cannot be watched (%s); crashes are noticed from job counts", namespace, exc)
        else:
            log.warning("pod watch of %r stopped: %s", namespace, described(exc))

    await list_and_watch(
        functools.partial(_list, api, namespace, selector, alerts),
        lambda rv: watch_once(
            api.run(calls.watch_pods(namespace, selector, rv, WINDOW)), rv, stats, alerts.apply
        ),
        f"pod watch of {namespace!r}",
        stats,
        stopped,
    )
