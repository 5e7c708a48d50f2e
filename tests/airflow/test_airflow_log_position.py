"""The saved log position's rules (one function each, the XCom read and write replaced by a dict): a trigger
continues only from its own try's and TrainJob's position, saves only when it moved, and saves once more when it
is cancelled. The position through a real triggerer restart: tests/airflow_deploy/test_deploy_local.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from trainflow.airflow import log_position
from trainflow.core.logsink import LogSink

TI = SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1, try_number=2)


@pytest.fixture
def xcom(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    store: dict[str, Any] = {}

    async def read(ti: Any) -> Any:
        return store.get("value")

    async def write(ti: Any, value: Any) -> None:
        await asyncio.sleep(0.05)  # a round trip: a cancel may arrive during it
        store["value"] = value
        store["writes"] = store.get("writes", 0) + 1

    monkeypatch.setattr(log_position, "_read", read)
    monkeypatch.setattr(log_position, "_write", write)
    return store


def sink_at(lines: int) -> LogSink:
    sink = LogSink(lambda _s, _t: None)
    sink.resume("node-0", lambda: {"offset": lines * 10})
    sink.counts["node-0"] = lines
    return sink


def test_only_this_try_and_trainjob_position_is_continued(xcom: dict[str, Any]) -> None:
    saved = {"node-0": {"offset": 50, "lines": 5}}
    for tag, expected in (
        ({"try": 2, "job": "uid-1"}, saved),
        ({"try": 1, "job": "uid-1"}, {}),  # an earlier try: a retry copies its log from the start
        ({"try": 2, "job": "uid-0"}, {}),  # another TrainJob (a new attempt)
    ):
        xcom["value"] = {**tag, "steps": saved}
        assert asyncio.run(log_position.LogPosition(TI, "uid-1").load()) == expected, tag
    xcom["value"] = log_position.start_of(TI, "uid-1")  # what the operator writes before it defers
    assert asyncio.run(log_position.LogPosition(TI, "uid-1").load()) == {}


def test_a_position_is_saved_when_it_moved_and_once_more_on_cancel(
    xcom: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_position, "SAVE_SECONDS", 0.01)
    monkeypatch.setattr(log_position, "SAVES_PER_SECOND", 1000.0)

    async def run() -> None:
        sink = sink_at(3)
        stop = asyncio.Event()
        keeper = asyncio.ensure_future(log_position.LogPosition(TI, "uid-1").keep(sink, stop))
        await asyncio.sleep(0.3)
        assert xcom["writes"] == 1  # saved once: it did not move since
        sink.counts["node-0"] = 4
        keeper.cancel()  # Airflow 2's triggerer stopping cancels every task of its loop, the keeper too
        await asyncio.sleep(0)
        stop.set()  # then the trigger's own ending stops it, without a second cancel
        await asyncio.wait({keeper})

    asyncio.run(run())
    assert xcom["writes"] == 2 and xcom["value"]["steps"]["node-0"]["lines"] == 4, xcom
    assert {k: xcom["value"][k] for k in ("try", "job")} == {"try": 2, "job": "uid-1"}


def test_a_periodic_save_names_where_the_logs_were_one_interval_earlier(
    xcom: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines handed to the task log reach its file through another channel than the saved position: a save
    names only lines handed over a whole interval before it is sent (a SIGKILL then cannot drop a line the
    position covers; on real pods two lines were lost when the position was saved as it was)."""
    interval = 0.1
    monkeypatch.setattr(log_position, "SAVE_SECONDS", interval)
    monkeypatch.setattr(log_position, "SAVES_PER_SECOND", 1000.0)
    handed: dict[int, float] = {}  # lines copied -> when the sink got there
    sent: list[tuple[float, int]] = []  # (when a save was sent, the lines it names)

    async def write(ti: Any, value: Any) -> None:
        sent.append((asyncio.get_running_loop().time(), value["steps"]["node-0"]["lines"]))
        await asyncio.sleep(0.02)

    monkeypatch.setattr(log_position, "_write", write)

    async def run() -> None:
        sink = sink_at(0)
        stop = asyncio.Event()
        keeper = asyncio.ensure_future(log_position.LogPosition(TI, "uid-1").keep(sink, stop))
        for lines in range(1, 101):  # a line every 10 ms: always one just before a save
            sink.counts["node-0"] = lines
            handed[lines] = asyncio.get_running_loop().time()
            await asyncio.sleep(0.01)
        keeper.cancel()
        await asyncio.wait({keeper})

    asyncio.run(run())
    periodic = sent[:-1]  # the last is the save on cancel: the position as it is
    assert len(periodic) >= 2, sent
    assert all(when - handed[lines] >= interval for when, lines in periodic), (handed, sent)
    assert sent[-1][1] == 100, sent
