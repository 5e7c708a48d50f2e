"""A TrainJob task's own callbacks: ``on_update_callback(result)`` at each update of the wait (a state change,
each new report of the training code) and ``on_result_callback(result)`` once, with the final result.

Where they run, as Airflow's own callbacks do: the update callback where the wait runs, so in the triggerer for
a deferred task and on the worker otherwise; the result callback on the worker, when the task finishes (after
resuming from the triggerer, or after its own wait). Both get the ``TrainJobResult`` (with ``history``), not a
task context.

In the triggerer a callback must be importable by its dotted path (a function defined in a module on the
triggerer's path, not in the DAG file), and it shares one event loop with every deferred task: a plain function
runs in the loop's thread pool, never on the loop; an ``async def`` runs on the loop and must not block it.
Each call is bounded (``callback_timeout``, then the wait goes on without it), updates of one task are delivered
in order and one at a time, and an exception is logged, never raised: a callback can neither fail nor hang the
wait.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainflow.core.result import TrainJobResult

Callback = Callable[["TrainJobResult"], Any]
DEFAULT_TIMEOUT = 30.0
MAX_PENDING = 1000  # updates waiting for a slow callback; the oldest are dropped beyond this


def dotted_path(callback: Callback | str | None, arg: str) -> str | None:
    """The import path the triggerer loads ``callback`` from; a ValueError names ``arg`` when it has none."""
    if callback is None or isinstance(callback, str):
        if isinstance(callback, str) and ("." not in callback or not all(callback.split("."))):
            raise ValueError(
                f"{arg}={callback!r}: give a callable or its dotted path, e.g. 'mypkg.callbacks.fn'"
            )
        return callback
    if not callable(callback):
        raise ValueError(f"{arg}: {callback!r} is not callable")
    module, qualname = getattr(callback, "__module__", None), getattr(callback, "__qualname__", "")
    if not module or "<" in qualname or module.startswith("unusual_prefix_") or module == "__main__":
        raise ValueError(
            f"{arg}={callback!r}: a deferred task's callback runs in the triggerer, which imports it by "
            "name; define it at module level in a module on the triggerer's path (not in the DAG file), "
            "e.g. dags/callbacks.py, and pass it or its dotted path"
        )
    return f"{module}.{qualname}"


def load(path: str) -> Callback:
    """Import ``mod.sub.fn`` (or ``mod.Class.method``)."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            target = getattr(target, attr)
        if not callable(target):
            raise TypeError(f"{path} is not callable")
        return target  # type: ignore[no-any-return]
    raise ModuleNotFoundError(f"no module of {path!r} can be imported")


class LoopCallbacks:
    """Calls ``callback`` for each submitted result, in order, on the running event loop (the triggerer):
    ``submit`` never blocks; ``close`` waits, bounded, for what is pending."""

    def __init__(
        self, callback: Callback, log: Any, timeout: float = DEFAULT_TIMEOUT, what: str = ""
    ) -> None:
        self.callback, self.log, self.timeout, self.what = callback, log, timeout, what or name(callback)
        self.pending: asyncio.Queue[TrainJobResult] = asyncio.Queue(MAX_PENDING)
        self.worker: asyncio.Task[None] | None = None
        self.calls = 0

    def submit(self, result: TrainJobResult) -> None:
        if self.pending.full():
            self.pending.get_nowait()
            self.log.warning("%s: over %d updates pending; the oldest is dropped", self.what, MAX_PENDING)
        self.pending.put_nowait(result)
        if self.worker is None:
            self.worker = asyncio.get_running_loop().create_task(self._work(), name=f"trainflow-{self.what}")

    async def _work(self) -> None:
        while True:
            result = await self.pending.get()
            await self._call(result)
            self.pending.task_done()

    async def _call(self, result: TrainJobResult) -> None:
        self.calls += 1
        try:
            if inspect.iscoroutinefunction(self.callback):
                await asyncio.wait_for(self.callback(result), self.timeout)
            else:
                await asyncio.wait_for(asyncio.to_thread(self.callback, result), self.timeout)
        except TimeoutError:
            self.log.warning("%s took over %ss; the wait goes on without it", self.what, self.timeout)
        except Exception:
            self.log.exception("%s raised; the wait goes on", self.what)

    async def close(self) -> None:
        """Deliver what is pending (at most ``timeout`` seconds for all), then stop."""
        if self.worker is None:
            return
        try:
            await asyncio.wait_for(self.pending.join(), self.timeout)
        except TimeoutError:
            self.log.warning("%s: %d updates not delivered in time", self.what, self.pending.qsize())
        self.worker.cancel()
        await asyncio.gather(self.worker, return_exceptions=True)


class ThreadCallbacks:
    """The same on a worker: a daemon thread of its own calls ``callback`` in order (a sync wait is never held
    up by it); ``close`` waits, bounded, for what is pending."""

    def __init__(
        self, callback: Callback, log: Any, timeout: float = DEFAULT_TIMEOUT, what: str = ""
    ) -> None:
        self.callback, self.log, self.timeout, self.what = callback, log, timeout, what or name(callback)
        self.pending: queue.Queue[TrainJobResult | None] = queue.Queue(MAX_PENDING)
        self.thread: threading.Thread | None = None
        self.calls = 0

    def submit(self, result: TrainJobResult) -> None:
        try:
            self.pending.put_nowait(result)
        except queue.Full:
            self.log.warning("%s: over %d updates pending; this one is dropped", self.what, MAX_PENDING)
            return
        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name=f"trainflow-{self.what}", daemon=True)
            self.thread.start()

    def _work(self) -> None:
        while (result := self.pending.get()) is not None:
            self.calls += 1
            try:
                value = self.callback(result)
                if inspect.isawaitable(value):
                    asyncio.run(asyncio.wait_for(_awaited(value), self.timeout))
            except Exception:
                self.log.exception("%s raised; the wait goes on", self.what)

    def close(self) -> None:
        """Deliver what is pending, waiting at most ``timeout`` seconds for the callback thread."""
        if self.thread is None:
            return
        self.pending.put(None)
        self.thread.join(self.timeout)
        if self.thread.is_alive():
            self.log.warning("%s took over %ss; the task goes on without it", self.what, self.timeout)


async def _awaited(value: Any) -> Any:
    return await value


def name(callback: Callback | str) -> str:
    return callback if isinstance(callback, str) else str(getattr(callback, "__qualname__", callback))


def worker_updates(callback: Callback | str | None, log: Any, timeout: float) -> ThreadCallbacks | None:
    """The update callback of a wait on the worker (None without one, or when it cannot be loaded)."""
    if callback is None:
        return None
    try:
        fn = load(callback) if isinstance(callback, str) else callback
    except Exception:
        log.exception("on_update_callback %r cannot be loaded; the wait goes on without it", callback)
        return None
    return ThreadCallbacks(fn, log, timeout, what=f"on_update_callback {name(fn)}")


def call_once(callback: Callback | str | None, result: TrainJobResult, log: Any, timeout: float) -> None:
    """The result callback, on the worker: once, bounded, an exception logged."""
    if callback is None:
        return
    try:
        fn = load(callback) if isinstance(callback, str) else callback
    except Exception:
        log.exception("on_result_callback %r cannot be loaded; the task goes on", callback)
        return
    runner = ThreadCallbacks(fn, log, timeout, what=f"on_result_callback {name(fn)}")
    runner.submit(result)
    runner.close()
