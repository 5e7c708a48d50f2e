"""List, then watch from that resourceVersion, on an event loop: the loop both shared watches run.

It re-lists on 410 Gone (without spinning on a server that keeps answering 410), reconnects with backoff
when a watch drops or the server is away, and stops on a 401 (the caller reloads credentials) or on a
fatal error, which it hands to ``on_fatal``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from trainflow.core.errors import BackendError, Transient, Unauthorized
from trainflow.core.kube import retry
from trainflow.core.kube.apierrors import Gone
from trainflow.core.kube.watch import WatchStats, parse_event

log = logging.getLogger(__name__)

Apply = Callable[[str, dict[str, Any]], None]  # (event type, object)


async def read_events(resp: Any, rv: str, where: str, stats: WatchStats, apply: Apply) -> str | None:
    """Apply each event of one watch response; the newest resourceVersion, or None when a re-list is needed."""
    try:
        buf = b""
        async for chunk in resp.content.iter_any():
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                event = parse_event(line, where)
                if event is None:
                    continue
                kind, item = event
                rv = str((item.get("metadata") or {}).get("resourceVersion") or rv)
                if kind != "BOOKMARK":
                    stats.events += 1
                    apply(kind, item)
        return rv
    except Gone:  # an ERROR 410 event inside the stream
        return None
    finally:
        resp.release()


async def list_and_watch(
    list_fn: Callable[[], Awaitable[str]],
    watch_fn: Callable[[str], Awaitable[str | None]],
    what: str,
    stats: WatchStats,
    on_fatal: Callable[[BaseException], None],
) -> str:
    """Run until cancelled; returns "reauth" on a 401, "failed" after handing a fatal error to ``on_fatal``.

    ``list_fn`` lists and returns the list's resourceVersion; ``watch_fn`` watches from one and returns the
    newest, or None when the version is gone (410).
    """
    failures = gone_in_a_row = 0
    rv: str | None = None
    while True:
        try:
            try:
                if rv is None:
                    rv = await list_fn()
                    stats.lists += 1
                new_rv = await watch_fn(rv)
            except Gone:  # the watch's version, or a paged list's continue token, expired
                new_rv = None
            if new_rv is None:
                stats.relists_410 += 1
                gone_in_a_row += 1
                if gone_in_a_row > 1:  # a server that keeps answering 410: do not spin
                    await asyncio.sleep(retry.backoff(min(gone_in_a_row, 6)))
            else:
                gone_in_a_row = 0
            rv = new_rv
            failures = 0
        except asyncio.CancelledError:
            raise
        except Unauthorized:
            return "reauth"
        except Transient as exc:  # away longer than one call's retries: keep the waiters, keep trying
            failures += 1
            stats.reconnects += 1
            log.warning("%s: %s; trying again", what, exc)
            await asyncio.sleep(retry.backoff(min(failures, 6)))
        except BackendError as exc:
            on_fatal(exc)
            return "failed"
        except Exception as exc:
            if not retry.is_connection_error(exc) and not isinstance(exc, ValueError):
                on_fatal(exc)
                return "failed"
            failures += 1
            stats.reconnects += 1
            log.debug("%s dropped (%r); reconnecting", what, exc)
            await asyncio.sleep(retry.backoff(min(failures, 6)))
