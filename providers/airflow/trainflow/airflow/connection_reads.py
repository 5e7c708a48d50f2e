"""A connection and its extra read on an event loop (the triggerer's, an async task's) without blocking it or
deadlocking its channel to the supervisor, on every Airflow line.

These are common-compat 1.23's ``get_async_connection``/``get_async_extra_dejson``, kept here because the
constraints files users install under pin older common-compat releases (2.11.2: 1.14.1, 3.0.6: 1.7.3, 3.3.2:
1.19.0), which lack them or still call the masking ``aget_connection`` of a line older than 3.3.2. From 3.3.2
(``Connection.aextra_dejson``) Airflow's own async reads mask secrets asynchronously; before it, the synchronous
reads run on a worker thread, where blocking on the supervisor is safe.
"""

from __future__ import annotations

from typing import Any

from trainflow.airflow import compat_sdk


def _masks_asynchronously() -> bool:
    return hasattr(compat_sdk.Connection, "aextra_dejson")


async def get_async_connection(conn_id: str, hook: Any) -> Any:
    """The connection ``conn_id`` through ``hook`` (so a hook's own ``get_connection`` is honoured)."""
    from asgiref.sync import sync_to_async

    if _masks_asynchronously() and hasattr(hook, "aget_connection"):
        return await hook.aget_connection(conn_id=conn_id)
    return await sync_to_async(hook.get_connection)(conn_id=conn_id)


async def get_async_extra_dejson(conn: Any) -> dict[str, Any]:
    """The connection's extra as a dict, its secrets masked."""
    if hasattr(conn, "aextra_dejson"):
        extra: dict[str, Any] = await conn.aextra_dejson()
        return extra
    from asgiref.sync import sync_to_async

    return dict(await sync_to_async(lambda: conn.extra_dejson)())
