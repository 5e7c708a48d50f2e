"""Sync watch of one TrainJob: list for a resourceVersion, watch by name, re-list on 410 Gone, reconnect on drops.

The watch only delivers versions; what they mean is decided by the caller's ``feed`` (``observe``).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainflow.core.errors import BackendError, TrainJobNotFound, Transient
from trainflow.core.kube import retry
from trainflow.core.kube.apierrors import Gone
from trainflow.core.kube.client import KubeApi, iter_lines

log = logging.getLogger(__name__)

WATCH_WINDOW = 300.0  # seconds per watch request; the server closes it, we re-open from the last version


@dataclass
class WatchStats:
    """What a watch cost (tests and benchmarks read these): one wait's, or a shared watch's over its life."""

    lists: int = 0
    watches: int = 0
    relists_410: int = 0
    reconnects: int = 0
    events: int = 0
    gets: int = 0  # the shared watch's GETs of jobs it had not seen yet


def name_selector(name: str) -> str:
    return f"metadata.name={name}"


def parse_event(raw: bytes, where: str) -> tuple[str, dict[str, Any]] | None:
    """(type, object) of one watch event line (None for a blank line); ERROR events raise Gone or BackendError.

    Both watches read events with this: the sync one of one TrainJob and the shared one of a namespace.
    """
    if not raw.strip():
        return None
    event = json.loads(raw)
    kind, item = str(event.get("type")), event.get("object") or {}
    if kind == "ERROR":
        if item.get("code") == 410:
            raise Gone(str(item.get("message")))
        raise BackendError(f"watch of {where} failed: {item.get('message')}")
    return kind, item


def _events(resp: Any, namespace: str, name: str) -> Any:
    for raw in iter_lines(resp):
        event = parse_event(raw, f"TrainJob {namespace}/{name}")
        if event is not None:
            yield event


def watch_until(
    api: KubeApi,
    namespace: str,
    name: str,
    *,
    feed: Callable[[dict[str, Any] | None], bool],
    window: Callable[[], float],
    resource_version: str | None = None,
    stats: WatchStats | None = None,
) -> None:
    """Feed every version of the TrainJob to ``feed`` (and None after each quiet window) until it returns True.

    ``window()`` says how long the next watch request may stay quiet. Raises TrainJobNotFound when the job
    does not exist or is deleted. ``resource_version`` starts from a known (possibly stale) version. Drops and
    a server that stays away (``Transient``) are retried with backoff for as long as ``feed`` wants to wait.
    """
    stats = stats or WatchStats()
    rv = resource_version
    drops = gone_streak = 0
    while True:
        if rv is None:
            if gone_streak > 1:  # a server that keeps answering 410: do not spin
                time.sleep(min(retry.backoff(gone_streak), window()))
            try:
                listed = api.list_trainjobs(namespace, field_selector=name_selector(name))
            except Transient as exc:  # the server is away longer than one call's retries: keep waiting
                drops += 1
                stats.reconnects += 1
                log.warning("listing TrainJob %s/%s: %s; trying again", namespace, name, exc)
                time.sleep(min(retry.backoff(drops), window()))
                if feed(None):
                    return
                continue
            stats.lists += 1
            items = listed.get("items") or []
            if not items:
                raise TrainJobNotFound(namespace, name)
            rv = str((listed.get("metadata") or {}).get("resourceVersion") or "")
            if feed(items[0]):
                return
        seconds = window()
        if seconds <= 0:
            if feed(None):
                return
            continue
        try:
            resp = api.watch_trainjobs(
                namespace, rv, max(1, math.ceil(seconds)), field_selector=name_selector(name)
            )
        except Gone:
            stats.relists_410 += 1
            gone_streak += 1
            rv = None
            continue
        stats.watches += 1
        try:
            for kind, item in _events(resp, namespace, name):
                meta = item.get("metadata") or {}
                rv = str(meta.get("resourceVersion") or rv)
                if kind == "BOOKMARK":
                    continue
                stats.events += 1
                drops = gone_streak = 0
                if meta.get("name") != name:
                    continue
                if kind == "DELETED":
                    raise TrainJobNotFound(namespace, name)
                if feed(item):
                    return
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
            log.debug("watch of %s/%s dropped (%r); reconnecting from %s", namespace, name, exc, rv)
            time.sleep(min(retry.backoff(drops), window()))
        finally:
            resp.release_conn()
        if feed(None):
            return
