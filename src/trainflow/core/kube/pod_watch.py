"""A namespace-wide pod watch beside the shared TrainJob watch: it tells waiters the moment a container crashes.

On a real cluster the Job deletes a crashed pod before the TrainJob turns Failed, taking its exit code and
log with it. Waiters on the shared watch read ``jobsStatus`` counts, which can lag behind a short crash, so
this watch names the JobSet (= TrainJob) of every pod whose container failed, once per crash; the waiter
then reads the pods and log tail while they exist. It keeps no pods in memory. Without RBAC to watch pods
it stops and waiters fall back to the counts.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from trainflow.core.errors import PermissionDenied
from trainflow.core.kube.aio import AsyncKubeApi
from trainflow.core.kube.diagnostics import JOBSET_NAME_LABEL, pod_label, pod_problems
from trainflow.core.kube.listwatch import list_and_watch, read_events
from trainflow.core.kube.watch import WatchStats

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


class CrashAlerts:
    """Event handler: calls ``alert(jobset name)`` once per new crash signature of a pod."""

    def __init__(self, alert: Callable[[str], None]) -> None:
        self.alert = alert
        self.seen: dict[str, tuple[str, ...]] = {}  # pod uid -> crash signature already reported

    def apply(self, kind: str, pod: dict[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if kind == "DELETED":
            self.seen.pop(uid, None)
            return
        signature = crash_signature(pod)
        if not signature or self.seen.get(uid) == signature:
            return
        self.seen[uid] = signature
        name = pod_label(pod, JOBSET_NAME_LABEL)
        if name:
            self.alert(name)

    def keep_only(self, uids: set[str]) -> None:
        """After a re-list: forget the pods that are gone."""
        self.seen = {k: v for k, v in self.seen.items() if k in uids}


async def _list(api: AsyncKubeApi, namespace: str, alerts: CrashAlerts) -> str:
    """List page by page (a triggerer never holds a big namespace's pods at once); the version to watch from."""
    rv, token, uids = "", None, set()
    while True:
        page = await api.list_pods_page(namespace, JOBSET_NAME_LABEL, PAGE, token)
        meta = page.get("metadata") or {}
        rv = rv or str(meta.get("resourceVersion") or "")
        for pod in page.get("items") or []:
            uids.add(str((pod.get("metadata") or {}).get("uid") or ""))
            alerts.apply("ADDED", pod)
        token = meta.get("continue")
        if not token:
            alerts.keep_only(uids)
            return rv


async def _watch(
    api: AsyncKubeApi, namespace: str, alerts: CrashAlerts, stats: WatchStats, rv: str
) -> str | None:
    resp = await api.watch_pods(namespace, JOBSET_NAME_LABEL, rv, WINDOW)
    stats.watches += 1
    return await read_events(resp, rv, f"pods in {namespace!r}", stats, alerts.apply)


async def watch_crashes(
    api: AsyncKubeApi, namespace: str, alert: Callable[[str], None], stats: WatchStats
) -> None:
    """Until cancelled (or refused): ``alert(name)`` when a container of TrainJob ``name``'s pods fails."""
    alerts = CrashAlerts(alert)

    def stopped(exc: BaseException) -> None:
        if isinstance(exc, PermissionDenied):
            log.info("pods in %r cannot be watched (%s); crashes are noticed from job counts", namespace, exc)
        else:
            log.warning("pod watch of %r stopped: %r", namespace, exc)

    await list_and_watch(
        functools.partial(_list, api, namespace, alerts),
        functools.partial(_watch, api, namespace, alerts, stats),
        f"pod watch of {namespace!r}",
        stats,
        stopped,
    )
