"""A TrainJob task's callbacks: which callables a deferred task may take (checked at DAG parse), and that the
dispatchers deliver every update in order while a callback that raises or hangs neither fails nor holds up the
wait. The trigger runs against the real local engine; its update callback is imported by name, as the
triggerer does."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG
from trainflow.airflow.callbacks import LoopCallbacks, ThreadCallbacks, call_once, dotted_path, load
from trainflow.airflow.operators import TrainJobOperator
from trainflow.airflow.triggers import TrainJobTrigger
from trainflow.core.result import JobState, TrainJobResult

SEEN: list[tuple[str, int]] = []
ACKS: list[Path] = []  # where ``remember`` says which report it saw, for a trainer that waits for it
log = logging.getLogger("test.callbacks")


def remember(result: TrainJobResult) -> None:
    SEEN.append((result.state.value, result.history.seen))
    for acks in ACKS:
        (acks / str(result.history.seen)).touch()


def paced(reports: int = 8, seconds: float = 0.3, acks: str = "", hang: float = 600.0) -> None:
    """Trainer: ``reports`` reports, ``seconds`` apart; with ``acks``, each one only once the callback saw the
    one before (a file named by its number there), so no two reports fall between two looks of a slow wait."""
    import os
    import time

    from trainflow.core.reporting import report

    for i in range(reports):
        time.sleep(seconds)
        start = time.monotonic()
        while acks and i and not os.path.exists(os.path.join(acks, str(i))):
            if time.monotonic() - start > hang:
                raise SystemExit(f"the callback never saw report {i}")
            time.sleep(0.05)
        report(metrics={"loss": 1.0 / (i + 1)}, progress=(i + 1) * 100 // reports)


def result(n: int) -> TrainJobResult:
    return TrainJobResult(name=f"j{n}", namespace="n", state=JobState.RUNNING, progress=n)


def test_a_deferred_task_takes_only_callbacks_the_triggerer_can_import() -> None:
    assert dotted_path(remember, "cb") == f"{__name__}.remember"
    assert dotted_path("pkg.mod.fn", "cb") == "pkg.mod.fn"

    def nested(result: Any) -> None: ...

    for bad in (lambda r: None, nested, "fn", "pkg..fn", 42):
        with pytest.raises(ValueError, match="on_update_callback"):
            TrainJobOperator(task_id="t", function="m:f", deferrable=True, on_update_callback=bad)
    # on a worker the callable itself is called: anything callable does
    op = TrainJobOperator(task_id="t", function="m:f", deferrable=False, on_update_callback=nested)
    assert op.on_update_callback is nested
    assert load(f"{__name__}.remember") is remember and load("json.dumps") is not None


async def _deliver(callback: Any, timeout: float, count: int) -> tuple[LoopCallbacks, float]:
    runner = LoopCallbacks(callback, log, timeout, "cb")
    for i in range(count):
        runner.submit(result(i))  # from the wait, on the loop: never blocks
    started = time.monotonic()
    await runner.close()
    return runner, time.monotonic() - started


def test_on_the_event_loop_updates_arrive_in_order_and_bad_ones_are_bounded(caplog: Any) -> None:
    got: list[int] = []

    async def ok(r: TrainJobResult) -> None:
        got.append(r.progress or 0)

    asyncio.run(_deliver(ok, HANG, 20))
    assert got == list(range(20))
    got.clear()
    asyncio.run(_deliver(lambda r: got.append(r.progress) or 1 / 0, HANG, 3))  # a plain function, in a thread
    assert got == [0, 1, 2] and caplog.text.count("raised; the wait goes on") == 3

    async def hangs(r: TrainJobResult) -> None:
        await asyncio.sleep(3600)

    _, waited = asyncio.run(_deliver(hangs, 0.5, 4))
    assert (
        waited < 2.0 and "updates not delivered in time" in caplog.text
    )  # one timeout in all, then cancelled


def test_the_event_loop_stays_free_while_a_plain_callback_blocks() -> None:
    release = threading.Event()

    async def main() -> float:
        runner = LoopCallbacks(lambda r: release.wait(HANG), log, HANG, "cb")
        runner.submit(result(0))
        started = time.monotonic()
        await asyncio.sleep(0.05)  # the loop runs while the callback blocks in its thread
        lag = time.monotonic() - started
        release.set()
        await runner.close()
        return lag

    assert asyncio.run(main()) < HANG / 2  # a callback run on the loop would block it until released (HANG)


def test_on_a_worker_a_thread_delivers_and_close_is_bounded(caplog: Any) -> None:
    got: list[int] = []
    runner = ThreadCallbacks(lambda r: got.append(r.progress), log, 5, "cb")
    for i in range(10):
        runner.submit(result(i))
    runner.close()
    assert got == list(range(10))
    hung = threading.Event()
    slow = ThreadCallbacks(lambda r: hung.wait(HANG), log, 0.5, "slow")
    slow.submit(result(0))
    started = time.monotonic()
    slow.close()
    # its 0.5 s timeout, not the hung callback's end (HANG)
    assert time.monotonic() - started < HANG / 2 and "took over 0.5s" in caplog.text
    hung.set()
    call_once(lambda r: 1 / 0, result(1), log, 1.0)  # the result callback: logged, never raised
    call_once("no.such.module.fn", result(1), log, 1.0)
    assert "cannot be loaded" in caplog.text


def test_the_trigger_calls_the_update_callback_for_each_report(trainflow_home: Path) -> None:
    from trainflow.core import TrainJobRequest, get_backend

    backend = get_backend("local", home=str(trainflow_home))
    acks = trainflow_home / "acks"
    acks.mkdir()
    request = TrainJobRequest(
        runtime="jax-distributed",
        function=paced,
        function_kwargs={"acks": str(acks), "hang": HANG},
        num_nodes=1,
        idempotency_key="cb-trig",
    )
    ref = backend.submit(request)
    trigger = TrainJobTrigger(
        name=ref.name,
        namespace=ref.namespace,
        conn_id=None,
        hook_params={"backend": "local", "local_home": str(trainflow_home)},
        on_update_callback=f"{__name__}.remember",
    )
    _, kwargs = trigger.serialize()
    assert kwargs["on_update_callback"] == f"{__name__}.remember" and kwargs["callback_timeout"] == 30.0
    SEEN.clear()

    async def run() -> dict[str, Any]:
        agen = trigger.run()
        event = await asyncio.wait_for(agen.__anext__(), HANG)
        return dict(event.payload)

    ACKS.append(acks)
    try:
        payload = asyncio.run(run())
    finally:
        ACKS.clear()
    assert payload["status"] == "success", payload
    reports = sorted({seen for _, seen in SEEN if seen})
    assert reports == list(range(1, 9)), SEEN  # each of the 8 reports reached the callback
    assert SEEN[-1] == ("Complete", 8)  # delivered before the event fired
    assert len(payload["result"]["history"]["time"]) == 8


def test_task_trainjob_takes_the_callbacks() -> None:
    from datetime import datetime

    from airflow.sdk import DAG

    from trainflow.airflow.decorators import trainjob_task

    with DAG("cb_decorator", schedule=None, start_date=datetime(2026, 1, 1)):

        @trainjob_task(
            runtime="jax-distributed", deferrable=True, on_update_callback=remember, callback_timeout=7
        )
        def fit() -> None: ...

        op = fit().operator
    assert op.on_update_callback == f"{__name__}.remember" and op.callback_timeout == 7
