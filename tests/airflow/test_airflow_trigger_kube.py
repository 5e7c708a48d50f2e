"""Many TrainJobTriggers in one triggerer loop share one watch per (cluster, namespace) through the core.

Uses the kube backend over real HTTP against the loopback fake API server of the core's watch tests
(tests/unit/fake_apiserver.py); the connection carries an inline kubeconfig (the secret field).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from bounds import HANG
from trainflow.airflow.triggers import TrainJobTrigger

_HELPER = Path(__file__).resolve().parents[1] / "unit" / "fake_apiserver.py"


def _fake_module():
    spec = importlib.util.spec_from_file_location("_fake_apiserver_for_airflow", _HELPER)
    assert spec and spec.loader, f"{_HELPER} is needed for this test"
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    helper = _fake_module()
    server = helper.FakeApiServer()
    extra = {
        "backend": "kubernetes",
        "kubeconfig": json.dumps(helper.kubeconfig(server.url)),
        "namespace": "ns",
    }
    monkeypatch.setenv("AIRFLOW_CONN_TF_FAKE", json.dumps({"conn_type": "kubeflow_trainer", "extra": extra}))
    yield server
    server.close()


async def test_triggers_share_one_watch_and_each_fires_once(fake) -> None:
    import aiohttp  # noqa: F401  (imported up front: this test is about sharing, not import time)

    from trainflow.core.kube.shared_watch import registry

    names = [f"job-{i}" for i in range(20)]
    for name in names:
        fake.add(name)
    triggers = [TrainJobTrigger(name=n, namespace="ns", conn_id="tf_fake") for n in names]
    gens = [t.run() for t in triggers]
    tasks = [asyncio.create_task(g.__anext__()) for g in gens]
    # the watch streams (list, then watch), or the jobs could complete before it opens
    for _ in range(int(HANG / 0.1)):
        if fake.open_watches:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)
    assert registry().active_watches == 1 and fake.open_watches == 1
    fake.compact()
    fake.drop_watches()  # the shared watch reconnects, gets 410 Gone and re-lists
    await asyncio.sleep(1.0)
    for name in names[:-1]:
        await asyncio.to_thread(fake.set_condition, name, "Complete", "AllJobsCompleted")
    await asyncio.to_thread(fake.set_condition, names[-1], "Failed", "DeadlineExceeded")
    events = [e.payload for e in await asyncio.wait_for(asyncio.gather(*tasks), HANG)]
    assert [e["status"] for e in events] == ["success"] * 19 + ["failed"]
    assert events[-1]["result"]["reason"] == "DeadlineExceeded"
    assert "DeadlineExceeded" in events[-1]["message"]
    for gen in gens:  # exactly one event each
        with pytest.raises(StopAsyncIteration):
            await gen.__anext__()
    assert fake.max_open_watches == 1
    assert registry().active_watches == 0
