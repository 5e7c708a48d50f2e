"""TrainJobTrigger against the real local engine: serialize round-trip, run() to its one event, kill vs restart."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from pathlib import Path

import pytest

from bounds import HANG
from trainflow.airflow.logstream import task_log_sink
from trainflow.airflow.triggers import TrainJobTrigger


def quick(seconds: float = 0.0, fail: bool = False, lines: int = 0) -> None:
    """Trainer for these tests: optional log lines and sleep, then report a metric or fail."""
    import time

    from trainflow.core.reporting import report

    for i in range(lines):
        print(f"line {i}", flush=True)
        time.sleep(0.05 if seconds < 10 else 1.0)
    time.sleep(seconds)
    if fail:
        raise SystemExit(3)
    report(metrics={"score": 1.5}, progress=100)


def submit(backend, key: str, **kwargs):
    from trainflow.core import TrainJobRequest

    request = TrainJobRequest(
        runtime="jax-distributed", function=quick, function_kwargs=kwargs, num_nodes=1, idempotency_key=key
    )
    return backend.submit(request)


def make_trigger(home: Path, ref, **kwargs) -> TrainJobTrigger:
    return TrainJobTrigger(
        name=ref.name,
        namespace=ref.namespace,
        uid=ref.uid,
        conn_id=None,
        hook_params={"backend": "local", "local_home": str(home)},
        **kwargs,
    )


async def first_and_only_event(trigger: TrainJobTrigger, timeout: float = HANG) -> dict:
    agen = trigger.run()
    event = await asyncio.wait_for(agen.__anext__(), timeout)
    with pytest.raises(StopAsyncIteration):
        await agen.__anext__()
    return event.payload


def test_serialize_round_trips_through_airflow_serialization(trainflow_home: Path) -> None:
    from airflow.serialization.serialized_objects import BaseSerialization

    from trainflow.airflow.version_compat import AIRFLOW_V_3_0_PLUS

    if AIRFLOW_V_3_0_PLUS and importlib.util.find_spec("airflow.sdk.module_loading"):
        from airflow.sdk.module_loading import import_string
    else:  # Airflow 2.11 and 3.0
        from airflow.utils.module_loading import import_string

    trigger = TrainJobTrigger(
        name="job-a",
        namespace="ml",
        uid="u-1",
        conn_id="kubeflow_trainer_default",
        hook_params={"backend": "local", "local_home": str(trainflow_home)},
        deadline=1_900_000_000.5,
        on_kill_action="keep",
        wait_for_creation=True,
        poll_interval=3.0,
        stream_logs=True,
        max_log_lines=50,
    )
    path, kwargs = trigger.serialize()
    assert path == "trainflow.airflow.triggers.TrainJobTrigger"
    stored = BaseSerialization.deserialize(BaseSerialization.serialize(kwargs))
    again = import_string(path)(**stored)
    assert again.serialize() == (path, kwargs)


async def test_run_yields_one_success_event_with_the_result(trainflow_home: Path, local_backend) -> None:
    ref = submit(local_backend, "trig/success", seconds=0.5)
    payload = await first_and_only_event(make_trigger(trainflow_home, ref))
    assert payload["status"] == "success", payload
    assert payload["name"] == ref.name
    assert payload["result"]["state"] == "Complete"
    assert payload["result"]["metrics"] == {"score": 1.5}
    assert payload["result"]["output_uri"].startswith("file://")


async def test_run_reports_failure_with_reason_and_diagnostics(trainflow_home: Path, local_backend) -> None:
    ref = submit(local_backend, "trig/fail", fail=True)
    payload = await first_and_only_event(make_trigger(trainflow_home, ref))
    assert payload["status"] == "failed", payload
    assert payload["result"]["state"] == "Failed"
    assert payload["result"]["reason"]
    assert payload["result"]["reason"] in payload["message"]
    assert payload["diagnostics"]["failed_ranks"][0]["exit_code"] == 3


async def test_run_honours_the_absolute_deadline_and_leaves_the_job(
    trainflow_home: Path, local_backend
) -> None:
    ref = submit(local_backend, "trig/deadline", seconds=HANG)  # runs until the fixture cancels it
    started = time.time()
    payload = await first_and_only_event(make_trigger(trainflow_home, ref, deadline=time.time() + 2))
    assert payload["status"] == "timeout", payload
    assert time.time() - started < HANG  # at its deadline, not with the job
    assert not local_backend.get(ref).state.terminal  # the trigger never deletes on its own timeout


async def test_missing_job_is_reported_or_waited_for(trainflow_home: Path, local_backend) -> None:
    from trainflow.core import JobRef

    gone = JobRef(name="never-created", namespace="default")
    payload = await first_and_only_event(make_trigger(trainflow_home, gone))
    assert payload["status"] == "not_found"
    payload = await first_and_only_event(
        make_trigger(
            trainflow_home, gone, wait_for_creation=True, poll_interval=0.2, deadline=time.time() + 1
        )
    )
    assert payload["status"] == "timeout"


async def _run_in_triggerer(trigger: TrainJobTrigger, cancel_msg: str | None) -> None:
    """Drive the trigger through Airflow's own TriggerRunner.run_trigger and cancel it as Airflow does."""
    from types import SimpleNamespace

    from airflow.jobs.triggerer_job_runner import TriggerRunner

    from trainflow.airflow.version_compat import AIRFLOW_V_3_0_PLUS

    # what the runner reads of a cancelled trigger, set by the triggerer before 3.1
    if not AIRFLOW_V_3_0_PLUS:
        trigger.task_instance = SimpleNamespace(trigger_timeout=None)  # type: ignore[assignment]
    elif not hasattr(trigger, "timeout_after"):
        trigger.timeout_after = None  # type: ignore[attr-defined]
    runner = TriggerRunner()
    task = asyncio.create_task(runner.run_trigger(1, trigger))
    runner.triggers[1] = {"task": task, "name": "trainjob-test", "events": 0, "is_watcher": False}
    await asyncio.sleep(2.0)  # the trigger is waiting on the job now
    assert not task.done()
    if cancel_msg is None:
        task.cancel()  # triggerer shutdown / redistribution: no message
    else:
        task.cancel(cancel_msg)  # what cancel_triggers() sends when a user acts on the task
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_user_cancel_of_deferred_task_deletes_the_trainjob(trainflow_home: Path, local_backend) -> None:
    from airflow.jobs.triggerer_job_runner import _USER_ACTION_CANCEL_MSG

    from trainflow.core import TrainJobNotFound

    ref = submit(local_backend, "trig/kill", seconds=120)
    await _run_in_triggerer(make_trigger(trainflow_home, ref), _USER_ACTION_CANCEL_MSG)
    with pytest.raises(TrainJobNotFound):
        local_backend.get(ref)


async def test_triggerer_restart_never_deletes_work(trainflow_home: Path, local_backend) -> None:
    ref = submit(local_backend, "trig/restart", seconds=120)
    await _run_in_triggerer(make_trigger(trainflow_home, ref), None)
    assert not local_backend.get(ref).state.terminal  # still running: the next triggerer picks it up
    payload = await first_and_only_event(make_trigger(trainflow_home, ref, deadline=time.time() + 1))
    assert payload["status"] == "timeout"  # and a new trigger reattaches to the same job


async def test_keep_action_survives_user_cancel(trainflow_home: Path, local_backend) -> None:
    from airflow.jobs.triggerer_job_runner import _USER_ACTION_CANCEL_MSG

    ref = submit(local_backend, "trig/keep", seconds=120)
    await _run_in_triggerer(make_trigger(trainflow_home, ref, on_kill_action="keep"), _USER_ACTION_CANCEL_MSG)
    assert not local_backend.get(ref).state.terminal


def test_log_streaming_is_incremental_and_bounded(local_backend) -> None:
    ref = submit(local_backend, "trig/logs", lines=40, seconds=3)
    seen: list[tuple[float, str]] = []
    sink = task_log_sink(lambda fmt, *args: seen.append((time.time(), fmt % args)), ["node-0"], 10)
    result = local_backend.wait(ref, timeout=HANG, logs=sink)
    lines = [line for _, line in seen]
    assert lines[:10] == [f"[node-0] line {i}" for i in range(10)]
    assert "log limit of 10 lines" in lines[10]
    assert len(lines) == 11
    # copied while the job ran, not replayed after it ended
    assert seen[0][0] < result.finished_at.timestamp()


async def test_streaming_triggers_leave_the_default_executor_alone(
    trainflow_home: Path, local_backend
) -> None:
    """More streaming triggers than the event loop's default executor has threads (2 here, 6 on a 2-core
    triggerer): a short job's lines and completion still arrive at once, and short work handed to
    ``asyncio.to_thread`` (by any trigger, of any provider) is not queued behind the log follows."""
    from concurrent.futures import ThreadPoolExecutor

    from trainflow.core.result import parse_time

    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
    # the long jobs run until cancelled (the fixture does): still following their logs when the short one ends
    longs = [submit(local_backend, f"trig/long-{i}", seconds=HANG, lines=60) for i in range(3)]
    short = submit(local_backend, "trig/short", seconds=2, lines=5)
    lines: dict[str, list[str]] = {}

    class Log:
        def __init__(self, name: str) -> None:
            self.name = name

        def info(self, msg: str, *args: object) -> None:
            lines.setdefault(self.name, []).append(msg % args)

        warning = exception = debug = info

    def streaming(ref) -> TrainJobTrigger:
        trigger = make_trigger(trainflow_home, ref, stream_logs=True, max_log_lines=100)
        trigger._log = Log(ref.name)  # LoggingMixin's logger, read through the ``log`` property
        return trigger

    waits = [asyncio.ensure_future(first_and_only_event(streaming(r))) for r in longs]
    await asyncio.sleep(3.0)  # every long trigger follows its log now
    assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 5.0) == "free"
    payload = await first_and_only_event(streaming(short))
    finished = parse_time(payload["result"]["finished_at"])
    # from the short job's own end: how long it took to start is the machine's load, not the triggers'
    took = time.time() - finished.timestamp() if finished else None
    assert payload["status"] == "success" and took is not None and took < 30, (payload, took)
    assert [ln for ln in lines[short.name] if ln.startswith("[node-0]")] == [
        f"[node-0] line {i}" for i in range(5)
    ]
    assert all(lines.get(r.name) for r in longs) and not any(w.done() for w in waits)
    for w in waits:
        w.cancel()
    for ref in longs:
        local_backend.cancel(ref)
