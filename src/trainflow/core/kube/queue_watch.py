"""A Workload watch beside a namespace's shared TrainJob watch (Kueue): what Kueue says about each job.

Kueue keeps why a TrainJob waits, and how often it was preempted, in the job's Workload (core/kueue.py). Waiters
sharing a namespace watch learn it from this one watch of the namespace's Workloads instead of a read per
waiter: it keeps one small ``QueueStatus`` per TrainJob (by the Workload's owner), and hands a changed one to
that job's waiters. On a cluster without Kueue (no Workload API, either version) or without RBAC to watch
Workloads it stops at once, and waiters read the Workload themselves when they need it (kube/kueue_reads.py).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from trainflow.core import kueue
from trainflow.core.errors import NotFound, PermissionDenied
from trainflow.core.kube import calls
from trainflow.core.kube.aio import AsyncKubeApi
from trainflow.core.kube.apierrors import described
from trainflow.core.kube.listwatch import WatchStats, list_and_watch, list_pages, watch_once
from trainflow.core.kueue import QueueStatus

log = logging.getLogger(__name__)

WINDOW = 300
PAGE = 500  # Workloads carry their pods' templates: a page at a time


def owner(workload: Mapping[str, Any]) -> str | None:
    """The name of the TrainJob that owns a Workload (None for other kinds of jobs)."""
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("kind") == "TrainJob":
            return str(ref.get("name"))
    return None


class QueueNews:
    """Event handler: keeps each TrainJob's QueueStatus and hands a changed one to that job's waiters
    (``mailboxes``: TrainJob name -> the mailboxes of its waiters, each with ``put_queue``)."""

    def __init__(self, mailboxes: Mapping[str, Iterable[Any]]) -> None:
        self.mailboxes = mailboxes
        self.status: dict[str, QueueStatus] = {}  # TrainJob name -> what its Workload says
        self.synced = False  # listed, and watching: ``status`` is current
        self.off = False  # not watching (no Kueue, no RBAC, or stopped): waiters read Workloads themselves

    def tell(self, name: str, status: QueueStatus | None) -> None:
        for box in self.mailboxes.get(name, ()):
            box.put_queue(status)

    def apply(self, kind: str, workload: dict[str, Any]) -> None:
        name = owner(workload)
        if name is None:
            return
        old = self.status.get(name)
        if kind == "DELETED":
            if old is not None and old.workload == (workload.get("metadata") or {}).get("name"):
                del self.status[name]
                self.tell(name, None)
            return
        new = kueue.queue_status(workload)
        if new != old:
            self.status[name] = new
            self.tell(name, new)

    def keep_only(self, names: set[str]) -> None:
        """After a re-list: forget the jobs whose Workload is gone."""
        for name in set(self.status) - names:
            del self.status[name]
            self.tell(name, None)
        self.synced = True


async def _list(api: AsyncKubeApi, namespace: str, version: str, news: QueueNews) -> str:
    names: set[str] = set()

    def each(workload: dict[str, Any]) -> None:
        names.add(owner(workload) or "")
        news.apply("ADDED", workload)

    rv = await list_pages(
        lambda token: api.run(calls.list_workloads(namespace, None, version, PAGE, token)), each
    )
    news.keep_only(names)
    return rv


async def served_version(api: AsyncKubeApi, namespace: str) -> str | None:
    """The Workload API version this cluster serves to us (None: no Kueue, or no RBAC to list Workloads)."""
    for version in kueue.VERSIONS:
        try:
            await api.run(calls.list_workloads(namespace, None, version, 1))
            return version
        except NotFound:
            continue
        except PermissionDenied as exc:
            log.info("Workloads in %r cannot be listed (%s); waiters read them as needed", namespace, exc)
            return None
    return None


async def watch_queue(api: AsyncKubeApi, namespace: str, news: QueueNews, stats: WatchStats) -> None:
    """Until cancelled (or refused): keep ``news`` current with the namespace's Workloads."""
    version = await served_version(api, namespace)
    if version is None:
        news.off = True
        return

    def stopped(exc: BaseException) -> None:
        log.info(
            "Workload watch of %r stopped (%s); waiters read Workloads as needed", namespace, described(exc)
        )

    try:
        await list_and_watch(
            functools.partial(_list, api, namespace, version, news),
            lambda rv: watch_once(
                api.run(calls.watch_workloads(namespace, version, rv, WINDOW)), rv, stats, news.apply
            ),
            f"Workload watch of {namespace!r}",
            stats,
            stopped,
        )
    finally:
        news.synced, news.off = False, True
