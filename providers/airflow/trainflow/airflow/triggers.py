"""TrainJobTrigger: waits in the triggerer for a TrainJob to finish, on the core's shared per-namespace watch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent
from trainflow.airflow.hooks import TrainJobHook
from trainflow.airflow.logstream import LogPumps, StatusLines, pump_logs

if TYPE_CHECKING:
    from trainflow.core.backend import Backend
    from trainflow.core.result import JobRef, TrainJobResult

# Airflow >= 3.3 calls BaseTrigger.on_kill only when a user acts on the deferred task; before that the
# only hook is cleanup(), which also runs on triggerer restarts (so it must check the task state first).
HAS_TRIGGER_ON_KILL = "on_kill" in BaseTrigger.__dict__

__all__ = ["TrainJobTrigger", "pump_logs"]


class TrainJobTrigger(BaseTrigger):
    """Fires exactly one event when the TrainJob is Complete or Failed, the deadline passes, or it is gone.

    Event payload: ``{"status": "success"|"failed"|"timeout"|"not_found"|"error", "name", "namespace",
    "result": TrainJobResult dict, "message", "diagnostics"}``. Waiting is the core's ``wait_async``: every
    trigger of one triggerer shares one watch per (cluster, namespace), which re-lists on 410 Gone.

    Cancelling the deferred task (user kill) deletes the TrainJob when ``on_kill_action="delete"``; a
    triggerer restart or redistribution never does. ``stream_logs`` copies the logs of ``log_steps``
    (``node-N``) into the task log, each on a thread of its own (``logstream``).
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

    def _event(self, status: str, result: TrainJobResult | None = None, **extra: Any) -> TriggerEvent:
        payload: dict[str, Any] = {"status": status, "name": self.name, "namespace": self.namespace}
        if result is not None:
            payload["result"] = result.to_dict()
        payload.update(extra)
        return TriggerEvent(payload)  # type: ignore[no-untyped-call]

    async def _wait(self) -> TriggerEvent:
        from trainflow.core.errors import TrainJobFailed, TrainJobNotFound, WaitTimeout

        backend = await self._get_backend()
        ref = self._ref()
        status = StatusLines(str(ref), self.log.info)
        while True:
            try:
                result = await backend.wait_async(
                    ref, deadline=self.deadline, raise_on_failure=True, on_update=status
                )
                return self._event("success", result)
            except TrainJobFailed as exc:
                return self._event(
                    "failed", exc.result, message=str(exc), diagnostics=exc.diagnostics.to_dict()
                )
            except WaitTimeout as exc:
                return self._event("timeout", message=str(exc), state=exc.state)
            except TrainJobNotFound as exc:
                if not self.wait_for_creation:
                    return self._event("not_found", message=str(exc))
                if self.deadline is not None and time.time() >= self.deadline:
                    return self._event(
                        "timeout", message=f"TrainJob {ref} was not created before the deadline"
                    )
                self.log.info(
                    "TrainJob %s does not exist yet; checking again in %ss", ref, self.poll_interval
                )
                await asyncio.sleep(self.poll_interval)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        pumps: LogPumps | None = None
        try:
            if self.stream_logs:
                backend = await self._get_backend()
                pumps = LogPumps(backend, self._ref(), self.log_steps, self.log.info, self.max_log_lines)
                pumps.start()
            try:
                event = await self._wait()
            except Exception as exc:  # anything unexpected still ends in exactly one event
                self.log.exception("Waiting for TrainJob %s/%s failed", self.namespace, self.name)
                event = self._event("error", message=f"{type(exc).__name__}: {exc}")
            if pumps is not None:
                await pumps.drain()  # the last lines, bounded: never hold the event back for long
        finally:
            if pumps is not None:
                pumps.stop()
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
            from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

            states = await asyncio.to_thread(
                RuntimeTaskInstance.get_task_states,
                dag_id=ti.dag_id,
                task_ids=[ti.task_id],
                run_ids=[ti.run_id],
                map_index=ti.map_index,
            )
            state = states[ti.run_id][ti.task_id]
        except Exception:
            return False
        return str(state) not in ("deferred", "TaskInstanceState.DEFERRED")

    async def _delete_if_wanted(self, why: str) -> None:
        if self._fired or self.on_kill_action != "delete":
            return
        backend = await self._get_backend()
        ref = self._ref()
        deleted = await asyncio.to_thread(backend.cancel, ref)
        self.log.info("Deleted TrainJob %s (%s): %s", ref, why, deleted)
