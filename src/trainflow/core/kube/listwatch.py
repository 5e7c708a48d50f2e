"""List, then watch from that resourceVersion: the one list-watch loop (TrainJobs and pods), as client-go's
reflector runs it.

* a watch that ends is opened again from the newest resourceVersion (bookmarks included);
* ``410 Gone`` (an HTTP answer or an ``ERROR`` event) lists again at once; a server that keeps answering 410 is
  not spun on;
* any other ``ERROR`` event ends that watch: after a backoff the loop lists again (a 429 watches again from the
  same version, after its Retry-After);
* a line that is not a watch event (bad JSON, a wrong shape, an unknown type, over 4 MiB) is skipped and
  counted, and the loop lists again when that watch ends, so nothing it carried is lost;
* connection failures and 5xx answers back off and try again; so do 401s, which refresh the credentials, up to
  ``MAX_UNAUTHORIZED`` in a row;
* fatal errors end the loop through ``on_fatal``: a 403, a 404 of the resource type, a 401 that survives the
  refreshes, a TLS verification failure, or no contact with the server for ``UNREACHABLE_LIMIT`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from trainflow.core.errors import BackendError, Transient, Unauthorized
from trainflow.core.kube import retry
from trainflow.core.kube.apierrors import Gone, described
from trainflow.core.kube.http import achunks, aclose
from trainflow.core.kube.lines import LineBuffer

log = logging.getLogger(__name__)

Apply = Callable[[str, dict[str, Any]], None]  # (event type, object)
EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})
MAX_UNAUTHORIZED = 4  # 401s in a row, each after a credential refresh
UNREACHABLE_LIMIT = 600.0  # seconds without any answer from the server before waiters are told
FIRST_CONTACT_LIMIT = 120.0  # the same, before the first answer (a wrong server fails sooner)


@dataclass
class WatchStats:
    """What a watch cost and met (tests and benchmarks read these), over its life."""

    lists: int = 0
    watches: int = 0
    relists_410: int = 0
    reconnects: int = 0
    events: int = 0
    gets: int = 0  # the shared watch's GETs of jobs it had not seen yet
    error_events: int = 0
    malformed: int = 0  # lines skipped: not a watch event, or over the line cap


class ErrorEvent(BackendError):
    """An ``ERROR`` watch event other than 410: the watch ends and the loop lists again after a backoff."""

    def __init__(self, code: int, message: str, retry_after: float | None) -> None:
        super().__init__(f"watch ERROR event {code}: {message[:300]}")
        self.code, self.retry_after = code, retry_after


def parse_event(raw: bytes) -> tuple[str, dict[str, Any]] | None:
    """(type, object) of one watch line; None when it is not a watch event. ERROR events raise."""
    try:
        event = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(event, dict):
        return None
    kind, obj = event.get("type"), event.get("object")
    if kind not in EVENT_TYPES or not isinstance(obj, dict):
        return None
    if kind == "ERROR":
        code = obj.get("code")
        message = str(obj.get("message") or obj.get("reason") or "")
        if code == 410 or obj.get("reason") in ("Expired", "Gone"):
            raise Gone(message)
        details = obj.get("details") if isinstance(obj.get("details"), dict) else {}
        after = details.get("retryAfterSeconds") if details else None
        raise ErrorEvent(
            int(code) if isinstance(code, int) else 0,
            message,
            float(after) if isinstance(after, int) else None,
        )
    if not isinstance(obj.get("metadata"), dict):
        return None
    return str(kind), obj


async def read_events(resp: Any, rv: str, stats: WatchStats, apply: Apply) -> tuple[str, bool]:
    """Apply each event of one watch response: (the newest resourceVersion, whether every line was an event)."""
    lines = LineBuffer()
    clean = True
    try:
        async for chunk in achunks(resp):
            for line in lines.feed(chunk):
                if not line.strip():
                    continue
                event = parse_event(line)
                if event is None:
                    stats.malformed += 1
                    clean = False
                    continue
                kind, item = event
                rv = str(item["metadata"].get("resourceVersion") or rv)
                if kind != "BOOKMARK":
                    stats.events += 1
                    apply(kind, item)
    finally:
        await aclose(resp)
    if lines.oversized:
        stats.malformed += lines.oversized
        clean = False
    return rv, clean


async def list_pages(
    fetch: Callable[[str | None], Awaitable[dict[str, Any]]], each: Callable[[dict[str, Any]], None]
) -> str:
    """List page by page (``fetch(continue token)``), calling ``each`` on every object, so a big namespace's list
    is never held at once; returns the list's resourceVersion, to watch from."""
    rv, token = "", None
    while True:
        page = await fetch(token)
        meta = page.get("metadata") or {}
        rv = rv or str(meta.get("resourceVersion") or "")
        for item in page.get("items") or []:
            if isinstance(item, dict) and isinstance(item.get("metadata"), dict):
                each(item)
        token = meta.get("continue")
        if not token:
            return rv


async def watch_once(request: Awaitable[Any], rv: str, stats: WatchStats, apply: Apply) -> tuple[str, bool]:
    """Open one watch (``request``) and apply its events: (the newest resourceVersion, every line an event)."""
    resp = await request
    stats.watches += 1
    return await read_events(resp, rv, stats, apply)


class Contact:
    """When the server last answered; how long it has been away."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.last: float | None = None

    def ok(self) -> None:
        self.last = time.monotonic()

    def away_too_long(self) -> float | None:
        now = time.monotonic()
        if self.last is None:
            return now - self.started if now - self.started > FIRST_CONTACT_LIMIT else None
        return now - self.last if now - self.last > UNREACHABLE_LIMIT else None


@contextlib.asynccontextmanager
async def beside(*side: Coroutine[Any, Any, None] | None) -> AsyncIterator[None]:
    """Run the side watches (a pod watch, a Workload watch) while the body runs; cancel them when it ends."""
    tasks = [asyncio.get_running_loop().create_task(c) for c in side if c is not None]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def list_and_watch(
    list_fn: Callable[[], Awaitable[str]],
    watch_fn: Callable[[str], Awaitable[tuple[str, bool]]],
    what: str,
    stats: WatchStats,
    on_fatal: Callable[[BaseException], None],
    on_contact: Callable[[bool], None] = lambda ok: None,
) -> None:
    """Run until cancelled or a fatal error (handed to ``on_fatal``). ``list_fn`` lists and returns the list's
    resourceVersion; ``watch_fn`` watches from one: (the newest version, whether every line was an event).
    ``on_contact(True)`` after each answer of the server, ``on_contact(False)`` when it fails to answer."""
    failures = gone = unauthorized = 0
    rv: str | None = None
    contact = Contact()
    while True:
        delay: float = 0.0
        try:
            if rv is None:
                rv = await list_fn()
                stats.lists += 1
                contact.ok()
                on_contact(True)
            new_rv, clean = await watch_fn(rv)
            contact.ok()
            on_contact(True)
            failures = gone = unauthorized = 0
            rv = new_rv if clean else None  # a skipped line may have carried news: list again
            if not clean:
                delay = retry.backoff(1)
        except asyncio.CancelledError:
            raise
        except Gone:  # the version (or a paged list's continue token) expired
            stats.relists_410 += 1
            gone += 1
            rv = None
            delay = retry.backoff(min(gone, 6)) if gone > 1 else 0.0
        except ErrorEvent as exc:
            stats.error_events += 1
            failures += 1
            contact.ok()
            on_contact(True)
            log.info("%s: %s; %s", what, exc, "watching again" if exc.code == 429 else "listing again")
            if exc.code != 429:
                rv = None
            delay = exc.retry_after if exc.retry_after is not None else retry.backoff(min(failures, 6))
        except Unauthorized as exc:
            unauthorized += 1
            contact.ok()
            on_contact(True)
            if unauthorized >= MAX_UNAUTHORIZED:
                on_fatal(exc)
                return
            delay = retry.backoff(unauthorized)
        except Transient as exc:  # 5xx/429 or unreachable longer than one call's retries
            failures += 1
            backoff = _away(exc, contact, what, stats, failures, on_fatal, on_contact)
            if backoff is None:
                return
            delay = backoff
        except BackendError as exc:  # 403, 404 of the type, a refused request: retrying cannot help
            on_fatal(exc)
            return
        except Exception as exc:
            if not retry.is_connection_error(exc):
                on_fatal(exc if isinstance(exc, BackendError) else BackendError(f"{what}: {described(exc)}"))
                return
            failures += 1  # a watch stream that dropped mid-way
            backoff = _away(exc, contact, what, stats, failures, on_fatal, on_contact)
            if backoff is None:
                return
            delay = backoff
        if delay:
            await asyncio.sleep(delay)


def _away(
    exc: BaseException,
    contact: Contact,
    what: str,
    stats: WatchStats,
    failures: int,
    on_fatal: Callable[[BaseException], None],
    on_contact: Callable[[bool], None],
) -> float | None:
    """Backoff after a failed contact; None (after ``on_fatal``) once the server has been away too long."""
    stats.reconnects += 1
    on_contact(False)
    away = contact.away_too_long()
    if away is not None:
        on_fatal(Transient(f"{what}: no answer from the API server for {away:.0f}s ({described(exc)})"))
        return None
    log.debug("%s: %s; trying again", what, described(exc))
    return retry.backoff(min(failures, 6))
