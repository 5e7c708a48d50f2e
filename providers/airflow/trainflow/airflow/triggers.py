"""TrainJobTrigger: waits in the triggerer for a TrainJob to finish, on the core's shared per-namespace watch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent
from trainflow.airflow.callbacks import DEFAULT_TIMEOUT, LoopCallbacks, load
from trainflow.airflow.hooks import TrainJobHook
from trainflow.airflow.log_position import LogPosition, job_of
from trainflow.airflow.logstream import StatusLines, both, task_log_sink
from trainflow.airflow.version_compat import task_instance_state

if TYPE_CHECKING:
    from trainflow.core.backend import Backend
    from trainflow.core.ending import Ending
    from trainflow.core.logsink import LogSink
    from trainflow.core.result import JobRef

# Airflow >= 3.3 calls BaseTrigger.on_kill only when a user acts on the deferred task; before that the
# only hook is cleanup(), which also runs on triggerer restarts (so it must check the task state first).
HAS_TRIGGER_ON_KILL = "on_kill" in BaseTrigger.__dict__

__all__ = ["TrainJobTrigger"]


def _copied(start: Mapping[str, Mapping[str, Any]]) -> str:
    return ", ".join(f"{step}: {saved.get('lines', 0)}" for step, saved in sorted(start.items()))


class TrainJobTrigger(BaseTrigger):
    """Fires exactly one event when the TrainJob is Complete or Failed, the deadline passes, or it is gone.

    Event payload: the wait's ``Ending`` (``Ending.to_event``: ``status`` is its kind, with ``name``,
    ``namespace`` and the result, message, diagnostics and state it has). Waiting is the core's ``wait_async``: every
    trigger of one triggerer shares one watch per (cluster, namespace), which re-lists on 410 Gone.

    Cancelling the deferred task (user kill) deletes the TrainJob when ``on_kill_action="delete"``; a
    triggerer restart or redistribution never does. ``stream_logs`` copies the logs of ``log_steps``
    (``node-N``, initializers) into the task log as the wait follows them, on the triggerer's event loop (no
    thread). ``on_update_callback`` (a dotted path) is called with each update, as ``callbacks`` says.
    """

    def __init__(
        self,
        *,
        name: str,
        namespace: str,
        uid: str | None = None,
        conn_id: str | None = None,
        hook_params: dict[str, Any] | None = None,
        deadline: float | None = None,
        on_kill_action: str = "delete",
        wait_for_creation: bool = False,
        poll_interval: float = 10.0,
        stream_logs: bool = False,
        log_steps: Sequence[str] = ("node-0",),
        max_log_lines: int = 1000,
        log_step: str | None = None,  # serialized by earlier versions: one step
        on_update_callback: str | None = None,
        callback_timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.name = name
        self.namespace = namespace
        self.uid = uid
        self.conn_id = conn_id
        self.hook_params = dict(hook_params or {})
        self.deadline = deadline
        self.on_kill_action = on_kill_action
        self.wait_for_creation = wait_for_creation
        self.poll_interval = poll_interval
        self.stream_logs = stream_logs
        self.log_steps = [log_step] if log_step else list(log_steps)
        self.max_log_lines = max_log_lines
        self.on_update_callback = on_update_callback
        self.callback_timeout = callback_timeout
        self._fired = False
        self._backend: Backend | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid,
                "conn_id": self.conn_id,
                "hook_params": dict(self.hook_params),
                "deadline": self.deadline,
                "on_kill_action": self.on_kill_action,
                "wait_for_creation": self.wait_for_creation,
                "poll_interval": self.poll_interval,
                "stream_logs": self.stream_logs,
                "log_steps": list(self.log_steps),
                "max_log_lines": self.max_log_lines,
                "on_update_callback": self.on_update_callback,
                "callback_timeout": self.callback_timeout,
            },
        )

    def _hook(self) -> TrainJobHook:
        return TrainJobHook(self.conn_id, **self.hook_params)

    async def _get_backend(self) -> Backend:
        if self._backend is None:
            self._backend = await self._hook().aget_backend()
        return self._backend

    def _ref(self) -> JobRef:
        from trainflow.core.result import JobRef

        return JobRef(name=self.name, namespace=self.namespace, uid=self.uid)

    def _event(self, ending: Ending) -> TriggerEvent:
        return TriggerEvent(ending.to_event())  # type: ignore[no-untyped-call]

    async def _updates(self) -> LoopCallbacks | None:
        """The user's update callback, imported off the event loop; one that cannot be loaded is logged."""
        if not self.on_update_callback:
            return None
        try:
            fn = await asyncio.to_thread(load, self.on_update_callback)
        except Exception:
            self.log.exception(
                "on_update_callback %r cannot be loaded; waiting without it", self.on_update_callback
            )
            return None
        return LoopCallbacks(
            fn, self.log, self.callback_timeout, f"on_update_callback {self.on_update_callback}"
        )

    async def _wait(self, updates: LoopCallbacks | None) -> TriggerEvent:
        backend = await self._get_backend()
        ref = self._ref()
        status = StatusLines(str(ref), self.log.info)
        on_update = status if updates is None else both(status, updates.submit)
        sink = task_log_sink(self.log.info, self.log_steps, self.max_log_lines) if self.stream_logs else None
        if sink is None or self.task_instance is None:
            return await self._outcome(backend, ref, on_update, sink)
        position = LogPosition(self.task_instance, job_of(ref))  # continue where a replaced trigger stopped
        async with position.following(sink):
            if sink.start:
                self.log.info("Logs continue after the %s lines already copied", _copied(sink.start))
            return await self._outcome(backend, ref, on_update, sink)

    async def _outcome(
        self, backend: Backend, ref: JobRef, on_update: Any, sink: LogSink | None
    ) -> TriggerEvent:
        from trainflow.core.ending import Ending, EndKind

        while True:
            ending = await backend.wait_ending_async(
                ref, deadline=self.deadline, diagnose=True, on_update=on_update, logs=sink
            )
            if ending.kind is not EndKind.NOT_FOUND or not self.wait_for_creation:
                return self._event(ending)
            if self.deadline is not None and time.time() >= self.deadline:
                message = f"TrainJob {ref} was not created before the deadline"
                return self._event(Ending(EndKind.TIMED_OUT, ref.namespace, ref.name, message=message))
            self.log.info("TrainJob %s does not exist yet; checking again in %ss", ref, self.poll_interval)
            await asyncio.sleep(self.poll_interval)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        updates = await self._updates()
        try:
            event = await self._wait(updates)
        except Exception as exc:  # anything unexpected still ends in exactly one event
            from trainflow.core.ending import Ending

            self.log.exception("Waiting for TrainJob %s/%s failed", self.namespace, self.name)
            event = self._event(Ending.of_error(self._ref(), exc))
        if updates is not None:
            await updates.close()  # the updates are delivered before the task resumes (bounded)
        self._fired = True
        yield event

    async def on_kill(self) -> None:
        """User killed the deferred task (Airflow >= 3.3): delete the TrainJob unless told to keep it."""
        await self._delete_if_wanted("task killed while deferred")

    async def cleanup(self) -> None:
        """Airflow < 3.3 only: delete on user cancel, but never when the triggerer merely restarts."""
        if HAS_TRIGGER_ON_KILL or self._fired or self.on_kill_action != "delete":
            return
        if await self._safe_to_cancel():
            await self._delete_if_wanted("task is no longer deferred")

    async def _safe_to_cancel(self) -> bool:
        """True only when the task instance has left the DEFERRED state (a user acted on it)."""
        ti = self.task_instance
        if ti is None:
            return False
        try:
            state = await task_instance_state(ti)
        except Exception:
            return False
        return str(state) not in ("deferred", "TaskInstanceState.DEFERRED")

    async def _delete_if_wanted(self, why: str) -> None:
        if self._fired or self.on_kill_action != "delete":
            return
        backend = await self._get_backend()
        ref = self._ref()
        deleted = await backend.cancel_async(ref)
        self.log.info("Deleted TrainJob %s (%s): %s", ref, why, deleted)
