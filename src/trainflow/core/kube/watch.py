"""Sync watch of one TrainJob: list for a resourceVersion, watch by name, re-list on 410 Gone, reconnect on drops."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainflow.core.errors import BackendError, TrainJobNotFound
from trainflow.core.kube import retry
from trainflow.core.kube.client import KubeApi, iter_lines

log = logging.getLogger(__name__)

WATCH_WINDOW = (
    300  # seconds per watch request; the server closes it, we re-open from the last resourceVersion
)


@dataclass
class WatchStats:
    """What one wait cost (tests and benchmarks read these)."""

    lists: int = 0
    watches: int = 0
    relists_410: int = 0
    reconnects: int = 0
    events: int = 0


class Gone(Exception):
    """The resourceVersion is too old (410): list again."""


def is_gone(exc: BaseException) -> bool:
    return retry.status_of(exc) == 410


def name_selector(name: str) -> str:
    return f"metadata.name={name}"


def watch_until(
    api: KubeApi,
    namespace: str,
    name: str,
    *,
    deadline: float | None,
    done: Callable[[dict[str, Any]], bool],
    window: float | Callable[[], float] = WATCH_WINDOW,
    resource_version: str | None = None,
    stats: WatchStats | None = None,
) -> tuple[dict[str, Any] | None, bool]:
    """Feed every version of the TrainJob to ``done`` until it returns True or the deadline passes.

    Returns (last object seen, finished). ``done`` is also called with the last object after each quiet
    watch window (a number, or a function asked before each watch), so time-based checks run without events. Raises TrainJobNotFound when the job does not
    exist or is deleted. ``resource_version`` lets a caller start from a known (possibly stale) version.
    """
    stats = stats or WatchStats()
    obj: dict[str, Any] | None = None
    rv = resource_version
    drops = 0
    gone_streak = 0
    while True:
        if rv is None:
            if gone_streak > 1:  # a server that keeps answering 410: do not spin
                time.sleep(min(retry.backoff(gone_streak), max(0.0, (deadline or math.inf) - time.time())))
            listed = api.list_trainjobs(namespace, field_selector=name_selector(name))
            stats.lists += 1
            items = listed.get("items") or []
            if not items:
                raise TrainJobNotFound(namespace, name)
            obj = items[0]
            rv = str((listed.get("metadata") or {}).get("resourceVersion") or "")
            if done(obj):
                return obj, True
        remaining = math.inf if deadline is None else deadline - time.time()
        if remaining <= 0:
            return obj, False
        seconds = max(1, math.ceil(min(remaining, window() if callable(window) else window)))
        try:
            resp = api.watch_trainjobs(namespace, rv, seconds, field_selector=name_selector(name))
        except Exception as exc:
            if is_gone(exc):
                stats.relists_410 += 1
                gone_streak += 1
                rv = None
                continue
            raise
        stats.watches += 1
        try:
            for raw in iter_lines(resp):
                if not raw.strip():
                    continue
                event = json.loads(raw)
                kind = event.get("type")
                item = event.get("object") or {}
                if kind == "ERROR":
                    if item.get("code") == 410:
                        raise Gone()
                    raise BackendError(f"watch of TrainJob {namespace}/{name} failed: {item.get('message')}")
                meta = item.get("metadata") or {}
                if meta.get("resourceVersion"):
                    rv = str(meta["resourceVersion"])
                if kind == "BOOKMARK":
                    continue
                stats.events += 1
                drops = gone_streak = 0
                if meta.get("name") != name:
                    continue
                if kind == "DELETED":
                    raise TrainJobNotFound(namespace, name)
                obj = item
                if done(obj):
                    return obj, True
        except Gone:
            stats.relists_410 += 1
            gone_streak += 1
            rv = None
            continue
        except (TrainJobNotFound, BackendError):
            raise
        except Exception as exc:
            if not retry.is_connection_error(exc) and not isinstance(exc, ValueError):
                raise
            drops += 1
            stats.reconnects += 1
            if drops > retry.DEFAULT_POLICY.attempts:
                raise BackendError(f"watch of TrainJob {namespace}/{name} keeps dropping: {exc!r}") from exc
            log.debug("watch of %s/%s dropped (%r); reconnecting from %s", namespace, name, exc, rv)
            pause = retry.backoff(drops)
            if deadline is not None:
                pause = min(pause, max(0.0, deadline - time.time()))
            time.sleep(pause)
        finally:
            resp.release_conn()
        if obj is not None and done(obj):
            return obj, True
