"""One namespace-wide TrainJob watch per (API server, namespace) per event loop, shared by every async waiter.

A ``NamespaceWatch`` task lists the namespace's TrainJobs, watches from that resourceVersion, re-lists on
410 Gone and reconnects with backoff on drops; each event goes to the waiters of that TrainJob's name. The
task stops (and closes its connection) when its last waiter leaves. Waiting on a thousand jobs costs one
TrainJob watch, plus the pod watch of kube/pod_watch.py that tells waiters of crashes. Registries are per
event loop (aiohttp sessions cannot cross loops).
"""

from __future__ import annotations

import asyncio
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
from trainflow.core.kube.aio import AsyncKubeApi
from trainflow.core.kube.listwatch import list_and_watch, read_events
from trainflow.core.kube.pod_watch import watch_crashes
from trainflow.core.kube.transport import Transport
from trainflow.core.kube.watch import WatchStats

log = logging.getLogger(__name__)

WatchKey = tuple[str, str]  # (server URL, namespace)
Connect = Callable[[], AbstractAsyncContextManager[Transport]]  # a transport with freshly loaded credentials
MAX_REAUTH = 3  # 401s in a row (an expired exec-plugin token): reload the credentials, then give up

WINDOW = 300
GRACE = 5.0  # how long a waiter whose job is not in the cache waits for its ADDED event before a GET


class Update(NamedTuple):
    """What a waiter learns from ``next_update``."""

    obj: dict[str, Any] | None
    deleted: bool
    crashed: bool  # a container of the job's pods failed: look at the pods now, before they are deleted


class Mailbox:
    """Latest news for one waiter: the newest object, and whether the job was deleted; never grows."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.obj: dict[str, Any] | None = None
        self.deleted = False
        self.error: BaseException | None = None
        self.changed = asyncio.Event()
        self.version = 0
        self.consumed = 0
        self.crashes = 0  # pod watch: a container of this job's pods ended in failure
        self.crashes_seen = 0

    def put(self, obj: dict[str, Any]) -> None:
        self.obj, self.deleted = obj, False
        self.version += 1
        self.changed.set()

    def put_deleted(self) -> None:
        self.deleted = True
        self.version += 1
        self.changed.set()

    def put_crash(self) -> None:
        self.crashes += 1
        self.changed.set()

    def put_error(self, exc: BaseException) -> None:
        self.error = exc
        self.changed.set()


@dataclass
class NamespaceWatch:
    """The shared watch task of one (server, namespace) in one event loop."""

    key: WatchKey
    connect: Connect
    mailboxes: dict[str, set[Mailbox]] = field(default_factory=dict)
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    stats: WatchStats = field(default_factory=WatchStats)
    pod_stats: WatchStats = field(default_factory=WatchStats)  # the pod watch that reports crashes
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    api: AsyncKubeApi | None = None
    client_import: asyncio.Future[Any] | None = None  # the loop's one off-loop import of aiohttp

    @property
    def namespace(self) -> str:
        return self.key[1]

    @property
    def waiter_count(self) -> int:
        return sum(len(boxes) for boxes in self.mailboxes.values())

    def _dispatch(self, name: str, obj: dict[str, Any] | None) -> None:
        for box in self.mailboxes.get(name, ()):
            if obj is None:
                box.put_deleted()
            else:
                box.put(obj)

    def _fail_all(self, exc: BaseException) -> None:
        for boxes in self.mailboxes.values():
            for box in boxes:
                box.put_error(exc)

    def _crashed(self, name: str) -> None:
        for box in self.mailboxes.get(name, ()):
            box.put_crash()

    def _stopped(self, exc: BaseException) -> None:
        log.warning("shared TrainJob watch %s stopped: %r", self.key, exc)
        self._fail_all(exc)

    async def _list(self, api: AsyncKubeApi) -> str:
        listed = await api.list_trainjobs(self.namespace)
        fresh = {str(i["metadata"]["name"]): i for i in listed.get("items") or []}
        self.objects = fresh
        for name in list(self.mailboxes):
            self._dispatch(name, fresh.get(name))
        self.synced.set()
        return str((listed.get("metadata") or {}).get("resourceVersion") or "")

    def _apply(self, kind: str, item: dict[str, Any]) -> None:
        name = str((item.get("metadata") or {}).get("name"))
        if kind == "DELETED":
            self.objects.pop(name, None)
            self._dispatch(name, None)
        else:
            self.objects[name] = item
            self._dispatch(name, item)

    async def _watch_once(self, api: AsyncKubeApi, rv: str) -> str | None:
        """One watch request; returns the newest resourceVersion, or None when a re-list is needed."""
        resp = await api.watch_trainjobs(self.namespace, rv, WINDOW)
        self.stats.watches += 1
        return await read_events(resp, rv, f"TrainJobs in {self.namespace!r}", self.stats, self._apply)

    async def run(self) -> None:
        if self.client_import is not None:
            await asyncio.shield(self.client_import)  # never import on the loop: it would block every waiter

        reauth = 0
        while True:
            try:
                async with self.connect() as transport:
                    self.api = api = AsyncKubeApi(transport)
                    crashes = asyncio.get_running_loop().create_task(
                        watch_crashes(api, self.namespace, self._crashed, self.pod_stats),
                        name=f"trainflow-pod-watch-{self.namespace}",
                    )
                    try:
                        outcome = await list_and_watch(
                            functools.partial(self._list, api),
                            functools.partial(self._watch_once, api),
                            f"shared TrainJob watch {self.key}",
                            self.stats,
                            self._stopped,
                        )
                    finally:
                        crashes.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await crashes
            except Exception as exc:  # the credentials could not be loaded
                self._fail_all(exc)
                return
            if outcome == "reauth" and reauth < MAX_REAUTH:
                reauth += 1
                log.info("shared TrainJob watch %s: credentials rejected; reloading them", self.key)
                continue
            return

    async def get(self, name: str) -> dict[str, Any] | None:
        """One GET through the shared client (for a job not seen by the watch yet)."""
        await self.synced.wait()
        assert self.api is not None
        self.stats.gets += 1
        try:
            return await self.api.get_trainjob(self.namespace, name)
        except TrainJobNotFound:
            return None


class WatchRegistry:
    """The shared watches of one event loop."""

    def __init__(self) -> None:
        self.watches: dict[WatchKey, NamespaceWatch] = {}
        self.key_stats: dict[WatchKey, WatchStats] = {}  # cumulative, survives watch restarts
        self.started = 0
        self._client_import: asyncio.Future[Any] | None = None

    @property
    def active_watches(self) -> int:
        return sum(1 for w in self.watches.values() if w.task is not None and not w.task.done())

    def stats(self, key: WatchKey) -> WatchStats | None:
        """Cumulative counters of the shared watch for one (server, namespace) in this loop."""
        return self.key_stats.get(key)

    def api(self, key: WatchKey) -> AsyncKubeApi | NotConnected:
        """The shared watch's client, for a subscribed waiter's other reads (same connection pool)."""
        watch = self.watches.get(key)
        if watch is None or watch.api is None:
            return NotConnected()
        return watch.api

    @contextlib.asynccontextmanager
    async def subscribe(self, key: WatchKey, connect: Connect, name: str) -> AsyncIterator[Mailbox]:
        """Register a waiter for one TrainJob name; yields its Mailbox, pre-filled from the cache."""
        if self._client_import is None:
            # Import the HTTP client once per loop, in a thread; watch tasks await that one import
            # (checking sys.modules instead lets a second waiter block the loop on the import lock).
            self._client_import = asyncio.ensure_future(asyncio.to_thread(importlib.import_module, "aiohttp"))
        watch = self.watches.get(key)
        if watch is None or watch.task is None or watch.task.done():
            stats = self.key_stats.setdefault(key, WatchStats())
            watch = NamespaceWatch(key=key, connect=connect, stats=stats, client_import=self._client_import)
            self.watches[key] = watch
            watch.task = asyncio.get_running_loop().create_task(watch.run(), name=f"trainflow-watch-{key[1]}")
            self.started += 1
        box = Mailbox(name)
        watch.mailboxes.setdefault(name, set()).add(box)
        if watch.synced.is_set() and name in watch.objects:
            box.put(watch.objects[name])
        try:
            yield box
        finally:
            boxes = watch.mailboxes.get(name)
            if boxes is not None:
                boxes.discard(box)
                if not boxes:
                    del watch.mailboxes[name]
            if not watch.mailboxes and watch.task is not None:
                task = watch.task
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                if self.watches.get(key) is watch:
                    del self.watches[key]

    async def next_update(self, key: WatchKey, box: Mailbox, timeout: float | None) -> Update | None:
        """Wait for news about the job (newest object, deleted, a container crashed); None when ``timeout`` passes.

        Raises TrainJobNotFound when the job never existed, or the shared watch's fatal error.
        """
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        if box.version == 0 and box.error is None:
            watch = self.watches.get(key)
            if watch is None:
                raise BackendError("the shared TrainJob watch stopped")
            # the first list answers every waiter registered before it
            try:
                remaining = None if end is None else max(0.0, end - loop.time())
                await asyncio.wait_for(watch.synced.wait(), remaining)
            except TimeoutError:
                return None
            if box.version == 0 and box.error is None:
                # not in the cache: give the watch a moment to deliver ADDED, then ask the server once
                grace = GRACE if end is None else max(0.0, min(GRACE, end - loop.time()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(box.changed.wait(), grace)
            if box.version == 0 and box.error is None:
                obj = await watch.get(box.name)
                if box.version == 0:
                    if obj is None:
                        raise TrainJobNotFound(key[1], box.name)
                    box.put(obj)
        if box.version == box.consumed and box.crashes == box.crashes_seen and box.error is None:
            box.changed.clear()
            remaining = None if end is None else max(0.0, end - loop.time())
            try:
                await asyncio.wait_for(box.changed.wait(), remaining)
            except TimeoutError:
                return None
        box.changed.clear()
        if box.error is not None:
            raise box.error
        box.consumed = box.version
        crashed, box.crashes_seen = box.crashes != box.crashes_seen, box.crashes
        return Update(box.obj, box.deleted, crashed)


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
    """Shared watches running in the current event loop (benchmarks and tests read this)."""
    return registry().active_watches


class NotConnected:
    """Stands in for the client before the shared watch has one: every read fails (plans are best effort)."""

    def __getattr__(self, name: str) -> Any:
        async def fail(*args: Any, **kwargs: Any) -> Any:
            raise BackendError("the shared TrainJob watch has not connected yet")

        return fail
