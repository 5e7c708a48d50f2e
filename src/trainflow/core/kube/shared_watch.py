"""TrainJob watches shared by the waiters of one event loop: one per (identity, namespace) for deferred tasks,
or one per job for a waiter of its own.

A ``SharedWatch`` task lists the TrainJobs in its scope, watches from that resourceVersion (kube/listwatch.py:
client-go's reflector rules) and hands each event to the waiters of that TrainJob's name; a pod watch beside
it hands them a crashed pod, and beside a namespace's, a Workload watch hands them Kueue's word. A fatal error
(403, 404 of the TrainJob API, a 401 that survives refreshes, a server gone too long) reaches every waiter at
once, as the same typed error a sync call raises. The task stops, and closes its connections, when its last
waiter leaves; a waiter that subscribes meanwhile starts a new one. Registries are per event loop (an async
HTTP client cannot cross loops).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import importlib
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from trainflow.core.errors import BackendError, TrainJobNotFound
from trainflow.core.kube import calls
from trainflow.core.kube.aio import AsyncKubeApi
from trainflow.core.kube.apierrors import described
from trainflow.core.kube.http import Transport
from trainflow.core.kube.listwatch import WatchStats, beside, list_and_watch, list_pages, read_events
from trainflow.core.kube.pod_watch import watch_crashes
from trainflow.core.kube.queue_watch import QueueNews, watch_queue
from trainflow.core.kueue import QueueStatus

log = logging.getLogger(__name__)

WatchKey = tuple[str, str, str | None]  # (connection identity, namespace, one job's name or None)
Connect = Callable[[], AbstractAsyncContextManager[Transport]]  # a transport on a new session

WINDOW = 300
PAGE = 500
GRACE = 5.0  # how long a waiter whose job is not in the cache waits for its ADDED event before a GET
MAX_CRASHES = 8  # crashed pods a mailbox keeps until its waiter reads them
MAX_STARTS = 64  # pods started that a log-following waiter has not read yet
MAX_VERSIONS = 16  # versions of its job a mailbox keeps until its waiter reads them (then the newest ones)


class Update(NamedTuple):
    """What a waiter learns from ``next_update``: the versions of its job since the last update (oldest first,
    so no status a waiter reports is skipped), whether it was deleted, and the pods that crashed since."""

    objs: tuple[dict[str, Any], ...]
    deleted: bool
    crashed: tuple[dict[str, Any], ...] = ()
    queue: tuple[QueueStatus | None, ...] = ()  # Kueue's word on the job, when it changed: (the newest,)

    @property
    def obj(self) -> dict[str, Any] | None:
        return self.objs[-1] if self.objs else None


class Mailbox:
    """Latest news for one waiter: the newest object, whether it was deleted, crashed pods; bounded."""

    def __init__(self, name: str, watch: SharedWatch) -> None:
        self.name = name
        self.watch = watch
        self.obj: dict[str, Any] | None = None
        self.unread: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_VERSIONS)
        self.deleted = False
        self.error: BaseException | None = None
        self.changed = asyncio.Event()
        self.version = 0
        self.consumed = 0
        self.crashed: list[dict[str, Any]] = []
        self.started: asyncio.Queue[dict[str, Any]] | None = None  # see follow_pods
        self.queue: tuple[QueueStatus | None, ...] = ()  # unread news of the namespace's Workload watch

    def put(self, obj: dict[str, Any]) -> None:
        self.obj, self.deleted = obj, False
        self.unread.append(obj)
        self.version += 1
        self.changed.set()

    def put_deleted(self) -> None:
        self.deleted = True
        self.version += 1
        self.changed.set()

    def put_crash(self, pod: dict[str, Any]) -> None:
        if len(self.crashed) < MAX_CRASHES:
            self.crashed.append(pod)
        self.changed.set()

    def put_queue(self, status: QueueStatus | None) -> None:
        self.queue = (status,)
        self.changed.set()

    def put_started(self, pod: dict[str, Any]) -> None:
        """A container of this job's pods started (only for a waiter that follows logs)."""
        if self.started is not None and self.started.qsize() < MAX_STARTS:
            self.started.put_nowait(pod)

    def put_error(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self.changed.set()

    def pending(self) -> bool:
        return (
            bool(self.queue) or self.version != self.consumed or bool(self.crashed) or self.error is not None
        )


@dataclass
class SharedWatch:
    """The watch task of one key in one event loop."""

    key: WatchKey
    connect: Connect
    mailboxes: dict[str, set[Mailbox]] = field(default_factory=dict)
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    stats: WatchStats = field(default_factory=WatchStats)
    pod_stats: WatchStats = field(default_factory=WatchStats)
    queue_stats: WatchStats = field(default_factory=WatchStats)
    queue: QueueNews = field(init=False)
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # the first list answered, or it failed
    error: BaseException | None = None
    connected: bool = False  # the server answered the latest request
    pods_watched: bool = True  # False once the pod watch was refused (no RBAC): followers look for pods
    closing: bool = False
    task: asyncio.Task[None] | None = None
    api: AsyncKubeApi | None = None
    client_import: asyncio.Future[Any] | None = None  # the loop's one off-loop import of the HTTP client
    runtimes: dict[tuple[str, str, str], Any] = field(default_factory=dict)  # log followers' runtime reads

    def __post_init__(self) -> None:
        self.queue = QueueNews(self.mailboxes)  # hands each job's waiters its Workload's news

    @property
    def namespace(self) -> str:
        return self.key[1]

    @property
    def job(self) -> str | None:
        return self.key[2]

    @property
    def usable(self) -> bool:
        return not self.closing and self.error is None and self.task is not None and not self.task.done()

    @property
    def waiter_count(self) -> int:
        return sum(len(boxes) for boxes in self.mailboxes.values())

    def _dispatch(self, name: str, obj: dict[str, Any] | None) -> None:
        for box in self.mailboxes.get(name, ()):
            if obj is None:
                box.put_deleted()
            else:
                box.put(obj)

    def fail(self, exc: BaseException) -> None:
        """A fatal error: every waiter learns it now; later subscribers start a new watch."""
        if self.error is None:
            self.error = exc
            log.warning("TrainJob watch of %r stopped: %s", self.namespace, described(exc))
        for boxes in self.mailboxes.values():
            for box in boxes:
                box.put_error(exc)
        self.settled.set()

    def _crashed(self, name: str, pod: dict[str, Any]) -> None:
        for box in self.mailboxes.get(name, ()):
            box.put_crash(pod)

    def _started(self, name: str, pod: dict[str, Any]) -> None:
        for box in self.mailboxes.get(name, ()):
            box.put_started(pod)

    def _pods_refused(self) -> None:
        self.pods_watched = False

    def _contact(self, ok: bool) -> None:
        self.connected = ok

    async def _list(self, api: AsyncKubeApi) -> str:
        selector = f"metadata.name={self.job}" if self.job else None
        fresh: dict[str, dict[str, Any]] = {}

        def each(item: dict[str, Any]) -> None:
            fresh[str(item["metadata"].get("name"))] = item

        rv = await list_pages(
            lambda token: api.run(
                calls.list_trainjobs(
                    self.namespace, field_selector=selector, limit=PAGE, continue_token=token
                )
            ),
            each,
        )
        self.objects = fresh
        for name in list(self.mailboxes):
            self._dispatch(name, fresh.get(name))
        self.settled.set()
        return rv

    def _apply(self, kind: str, item: dict[str, Any]) -> None:
        name = str(item["metadata"].get("name"))
        if self.job and name != self.job:
            return
        if kind == "DELETED":
            self.objects.pop(name, None)
            self._dispatch(name, None)
        else:
            self.objects[name] = item
            self._dispatch(name, item)

    async def _watch_once(self, api: AsyncKubeApi, rv: str) -> tuple[str, bool]:
        selector = f"metadata.name={self.job}" if self.job else None
        resp = await api.run(calls.watch_trainjobs(self.namespace, rv, WINDOW, field_selector=selector))
        self.stats.watches += 1
        self.connected = True
        return await read_events(resp, rv, self.stats, self._apply)

    async def run(self) -> None:
        try:
            if self.client_import is not None:
                await asyncio.shield(
                    self.client_import
                )  # never import on the loop: it would block every waiter
            async with self.connect() as transport:
                self.api = api = AsyncKubeApi(transport)
                pods = watch_crashes(
                    api,
                    self.namespace,
                    self._crashed,
                    self.pod_stats,
                    self.job,
                    self._started,
                    self._pods_refused,
                )
                queue = None if self.job else watch_queue(api, self.namespace, self.queue, self.queue_stats)
                async with beside(pods, queue):
                    await list_and_watch(
                        functools.partial(self._list, api),
                        functools.partial(self._watch_once, api),
                        f"TrainJob watch of {self.namespace!r}",
                        self.stats,
                        self.fail,
                        self._contact,
                    )
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # credentials that cannot load, anything unexpected: never a silent end
            self.fail(exc if isinstance(exc, Exception) else BackendError(described(exc)))
        finally:
            if self.error is None and not self.closing:
                self.fail(BackendError(f"the TrainJob watch of {self.namespace!r} ended unexpectedly"))

    async def get(self, name: str) -> dict[str, Any] | None:
        """One GET through the watch's client (for a job not seen by the watch yet)."""
        if self.api is None:
            raise self.error or BackendError("the TrainJob watch has not connected")
        self.stats.gets += 1
        try:
            found: dict[str, Any] = await self.api.run(calls.get_trainjob(self.namespace, name))
            return found
        except TrainJobNotFound:
            return None


class WatchRegistry:
    """The shared watches of one event loop."""

    def __init__(self) -> None:
        self.watches: dict[WatchKey, SharedWatch] = {}
        self.key_stats: dict[WatchKey, WatchStats] = {}  # cumulative, survives watch restarts
        self.started = 0
        self._client_import: asyncio.Future[Any] | None = None

    @property
    def active_watches(self) -> int:
        return sum(1 for w in self.watches.values() if w.usable)

    def stats(self, key: WatchKey) -> WatchStats | None:
        """Cumulative counters of the watch of one key in this loop."""
        return self.key_stats.get(key)

    def _start(self, key: WatchKey, connect: Connect) -> SharedWatch:
        if self._client_import is None:
            # import the HTTP client once per loop, in a thread; watch tasks await that one import
            self._client_import = asyncio.ensure_future(asyncio.to_thread(importlib.import_module, "httpx"))
        stats = self.key_stats.setdefault(key, WatchStats())
        watch = SharedWatch(key=key, connect=connect, stats=stats, client_import=self._client_import)
        self.watches[key] = watch
        watch.task = asyncio.get_running_loop().create_task(watch.run(), name=f"trainflow-watch-{key[1]}")
        self.started += 1
        return watch

    @contextlib.asynccontextmanager
    async def subscribe(self, key: WatchKey, connect: Connect, name: str) -> AsyncIterator[Mailbox]:
        """Register a waiter for one TrainJob name; yields its Mailbox, pre-filled from the cache.

        Between here and the ``yield`` nothing awaits, and teardown removes the watch from the registry before
        it awaits anything, so a waiter never joins a watch that is stopping.
        """
        watch = self.watches.get(key)
        if watch is None or not watch.usable:
            watch = self._start(key, connect)
        box = Mailbox(name, watch)
        watch.mailboxes.setdefault(name, set()).add(box)
        if watch.settled.is_set() and name in watch.objects:
            box.put(watch.objects[name])
        if name in watch.queue.status:
            box.put_queue(watch.queue.status[name])
        try:
            yield box
        finally:
            boxes = watch.mailboxes.get(name)
            if boxes is not None:
                boxes.discard(box)
                if not boxes:
                    del watch.mailboxes[name]
            if not watch.mailboxes:
                watch.closing = True
                if self.watches.get(key) is watch:
                    del self.watches[key]
                task = watch.task
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task

    async def next_update(self, box: Mailbox, timeout: float | None) -> Update | None:
        """Wait for news about the job; None when ``timeout`` passes first.

        Raises TrainJobNotFound when the job does not exist, or the watch's fatal error.
        """
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout

        def left() -> float | None:
            return None if end is None else max(0.0, end - loop.time())

        watch = box.watch
        if box.version == 0 and box.error is None:
            try:  # the first list answers every waiter registered before it, or fails them all
                await asyncio.wait_for(watch.settled.wait(), left())
            except TimeoutError:
                return None
            if box.version == 0 and box.error is None:
                # not in the cache: give the watch a moment to deliver ADDED, then ask the server once
                grace = GRACE if end is None else min(GRACE, left() or 0.0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(box.changed.wait(), grace)
            if box.version == 0 and box.error is None:
                obj = await watch.get(box.name)
                if box.version == 0 and box.error is None:
                    if obj is None:
                        raise TrainJobNotFound(watch.namespace, box.name)
                    box.put(obj)
        if not box.pending():
            box.changed.clear()
            try:
                await asyncio.wait_for(box.changed.wait(), left())
            except TimeoutError:
                return None
        box.changed.clear()
        if box.error is not None:
            raise box.error
        box.consumed = box.version
        crashed, box.crashed = tuple(box.crashed), []
        objs = tuple(box.unread) or ((box.obj,) if box.obj is not None else ())
        box.unread.clear()
        news, box.queue = box.queue, ()
        return Update(objs, box.deleted, crashed, news)


_REGISTRIES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, WatchRegistry] = weakref.WeakKeyDictionary()


def registry() -> WatchRegistry:
    """The registry of the running event loop (created on first use)."""
    loop = asyncio.get_running_loop()
    reg = _REGISTRIES.get(loop)
    if reg is None:
        reg = WatchRegistry()
        _REGISTRIES[loop] = reg
    return reg


def active_watches() -> int:
    """Watches running in the current event loop (benchmarks and tests read this)."""
    return registry().active_watches
