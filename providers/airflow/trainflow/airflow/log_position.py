"""Where a deferred task's followed logs got to, kept in the task's XCom so a restarted trigger continues there.

A triggerer that stops (a rollout, a crash, a rebalance) hands its triggers to another one, which builds each
trigger anew from its serialized arguments. Without a saved position the new trigger would copy every log from
its first line again, and read all of it. The trigger therefore saves ``LogSink.position()`` (per followed step:
the backend's cursor and the lines copied) in the XCom ``trainflow_log_position`` of its task instance, tagged
with the try and the TrainJob, and a trigger of the same try and job starts from it.

When the position is saved: whenever it moved, at most every ``SAVE_SECONDS`` per trigger and
``SAVES_PER_SECOND`` per triggerer (a triggerer with many streaming tasks saves each less often), and once more
when the trigger is cancelled (a triggerer stopped with SIGTERM, as rollouts do). A periodic save records where
the logs were one save earlier, never where they are: a line handed to the task log reaches its file through
the triggerer's log channel, the position through another (on 3.x the supervisor reads both sockets), so a
position saved at once could name lines a SIGKILL then kept from the file (on real pods two lines were lost so).
So after a graceful stop each line is in the task log once; after a SIGKILL no line is lost, and the lines
copied since the save before the last (at most two intervals) are copied again. The XCom is the store because
it is the one a trigger may write on every line (2.11 to 3.3); Airflow 3.3's task state store is not offered to
triggers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from trainflow.airflow.version_compat import AIRFLOW_V_3_0_PLUS
from trainflow.core.logsink import LogSink

if TYPE_CHECKING:
    from trainflow.core.result import JobRef

log = logging.getLogger(__name__)

XCOM_KEY = "trainflow_log_position"
SAVE_SECONDS = 2.0  # a trigger saves a moved position at most this often
SAVES_PER_SECOND = 2.0  # and a triggerer at most this many in all (each an API call through its supervisor)
FINAL_SAVE_SECONDS = 5.0  # the save of a cancelled trigger waits at most this long
_active = 0  # triggers of this process keeping a position


def job_of(ref: JobRef) -> str:
    """Which TrainJob a saved position belongs to: its uid, else namespace/name."""
    return ref.uid or str(ref)


def start_of(ti: Any, job: str) -> dict[str, Any]:
    """The position of a try's logs before anything was copied: what the operator writes before it defers (so
    a trigger's first read finds a value, not a missing XCom, which Airflow 3 logs as an error)."""
    return {"try": int(getattr(ti, "try_number", 0) or 0), "job": job, "steps": {}}


class LogPosition:
    """The saved log position of one task instance's try and TrainJob (``ti``: the trigger's task instance;
    ``job``: the TrainJob's uid, else its namespace/name)."""

    def __init__(self, ti: Any, job: str) -> None:
        self.ti = ti
        self.tag = {k: v for k, v in start_of(ti, job).items() if k != "steps"}
        self.saved: dict[str, Any] | None = None

    async def load(self) -> dict[str, Any]:
        """The steps' positions saved by an earlier trigger of this try and job; {} when none (or unreadable)."""
        try:
            value = await _read(self.ti)
        except Exception as exc:
            log.warning(
                "Could not read the saved log position (the logs start from their first line): %s", exc
            )
            return {}
        if not isinstance(value, dict) or any(value.get(k) != v for k, v in self.tag.items()):
            return {}
        steps = value.get("steps")
        self.saved = steps if isinstance(steps, dict) else None
        return dict(steps) if isinstance(steps, dict) else {}

    async def save(self, steps: dict[str, Any]) -> None:
        """Save ``steps`` (a sink's position), if it moved since the last save."""
        if not steps or steps == self.saved:
            return
        await _write(self.ti, {**self.tag, "steps": steps})
        self.saved = steps

    @contextlib.asynccontextmanager
    async def following(self, sink: LogSink) -> AsyncIterator[None]:
        """While a wait follows the sink's logs: start them where the last trigger stopped, keep the position
        saved, and save it once more at the end (the keeper is stopped by an event, see ``keep``)."""
        sink.start = await self.load()
        stop = asyncio.Event()
        keeper = asyncio.ensure_future(self.keep(sink, stop))
        try:
            yield
        finally:
            stop.set()
            await asyncio.wait({keeper})  # its last save runs to the end: asyncio.wait never cancels it

    async def keep(self, sink: LogSink, stop: asyncio.Event) -> None:
        """Save the position as it moves until ``stop`` is set or this task is cancelled, then once more
        (bounded). The trigger stops it with the event, never a second cancel: Airflow 2's triggerer cancels
        every task of its loop at once when it stops, and a cancel during the last save would lose it."""
        global _active
        _active += 1
        settled: dict[str, Any] = {}  # where the logs were one interval ago: in the task log's file by now
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(SAVE_SECONDS, _active / SAVES_PER_SECOND))
                if stop.is_set():
                    break
                try:
                    await self.save(settled)
                except Exception as exc:  # a position not saved costs repeated lines after a restart, no more
                    log.warning("Could not save the log position: %s", exc)
                settled = sink.position()
        finally:
            _active -= 1
            # a stopped trigger's lines are written out by the triggerer as it stops: the position as it is
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self.save(sink.position()), FINAL_SAVE_SECONDS)


def _where(ti: Any) -> dict[str, Any]:
    map_index = getattr(ti, "map_index", None)
    return {
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "map_index": -1 if map_index is None else int(map_index),
    }


async def _read(ti: Any) -> Any:
    """The position XCom of ``ti``: Airflow 3 asks through the triggerer's supervisor on this loop (its channel
    is safe only from the loop on 3.0/3.1), Airflow 2 reads the metadata database on a worker thread."""
    if AIRFLOW_V_3_0_PLUS:
        from airflow.sdk.execution_time import task_runner
        from airflow.sdk.execution_time.comms import GetXCom

        reply = await task_runner.SUPERVISOR_COMMS.asend(GetXCom(key=XCOM_KEY, **_where(ti)))
        return getattr(reply, "value", None)

    def read() -> Any:
        from airflow.models.xcom import XCom

        return XCom.get_one(key=XCOM_KEY, **_where(ti))

    return await asyncio.to_thread(read)


async def _write(ti: Any, value: dict[str, Any]) -> None:
    if AIRFLOW_V_3_0_PLUS:
        from airflow.sdk.execution_time import task_runner
        from airflow.sdk.execution_time.comms import SetXCom

        await task_runner.SUPERVISOR_COMMS.asend(SetXCom(key=XCOM_KEY, value=value, **_where(ti)))
        return

    def write() -> None:
        from airflow.models.xcom import XCom

        XCom.set(key=XCOM_KEY, value=value, **_where(ti))

    await asyncio.to_thread(write)
