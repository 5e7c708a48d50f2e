"""Issue 10 item 3, second half: a ``function=`` trainer on a runtime other than torch, on real pods.

``xgboost-distributed`` runs unmodified (Trainer v2.3.0: ``DMLC_*`` env from the XGBoost plugin, image
``ghcr.io/kubeflow/trainer/xgboost-runtime:v2.3.0``, which ``make pods-images`` imports from the trainer image).
Two workers: rank 0 starts the Rabit tracker at the port the Trainer gave, both join it through the headless
service's DNS name, allreduce, then train one booster on two data shards, each worker holding only its own.
"""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
import pytest
import xgboost as xgb

from conftest import TRAINER_GROUP, TRAINER_VERSION, pod_logs, record
from trainflow.core import JobState, TrainJobRequest

pytestmark = pytest.mark.e2e

XGB_RUNTIME = "xgboost-distributed"
PARAMS = {"objective": "reg:squarederror", "max_depth": 3, "eta": 0.3, "nthread": 1, "base_score": 0.0}


def shard(rank: int) -> tuple[Any, Any]:
    """Worker ``rank``'s own rows: y = 3 x0 - 2 x1 + 0.5 plus noise, drawn from its own seed."""
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(2000, 3))
    return x, x @ np.array([3.0, -2.0, 0.0]) + 0.5 + rng.normal(scale=0.1, size=2000)


def xgb_train(rounds: int, params: dict[str, Any]) -> None:
    """The function trainer: tracker on rank 0, a collective allreduce, one booster trained on both shards."""
    import os
    import socket

    import numpy as np
    import xgboost as xgb
    from xgboost import collective
    from xgboost.tracker import RabitTracker

    from trainflow.core.reporting import output_dir, report

    rank, workers = int(os.environ["DMLC_TASK_ID"]), int(os.environ["DMLC_NUM_WORKER"])
    uri, port = os.environ["DMLC_TRACKER_URI"], int(os.environ["DMLC_TRACKER_PORT"])
    tracker = None
    if rank == 0:
        tracker = RabitTracker(n_workers=workers, host_ip="0.0.0.0", port=port, sortby="task")
        tracker.start()
    # dmlc_retry: a worker may start before rank 0's tracker listens; the default 3 retries give up in ~6 s
    with collective.CommunicatorContext(
        dmlc_tracker_uri=uri, dmlc_tracker_port=port, dmlc_task_id=str(rank), dmlc_retry=10
    ):
        me, world = collective.get_rank(), collective.get_world_size()
        total = collective.allreduce(np.array([float(me + 1)]), collective.Op.SUM)[0]
        print(f"xgb rank={me} world_size={world} allreduce={total:g} host={socket.gethostname()}", flush=True)
        rng = np.random.default_rng(100 + rank)  # shard(rank): the function ships without the test module
        x = rng.normal(size=(2000, 3))
        y = x @ np.array([3.0, -2.0, 0.0]) + 0.5 + rng.normal(scale=0.1, size=2000)
        evals: dict[str, Any] = {}
        booster = xgb.train(
            params,
            xgb.DMatrix(x, label=y),
            num_boost_round=rounds,
            evals=[(xgb.DMatrix(x, label=y), "train")],
            evals_result=evals,
            verbose_eval=False,
        )
        rmse = evals["train"]["rmse"][-1]
        print(f"xgb rank={me} rounds={rounds} train_rmse={float(rmse)!r}", flush=True)
        if me == 0:
            booster.save_model(str(output_dir() / "model.json"))
            report(metrics={"train_rmse": rmse, "world_size": world}, progress=100)
    if tracker is not None:
        tracker.wait_for()


def test_xgboost_function_trainer_two_workers(
    backend: Any, k8s: Any, namespace: str, shared_volume: Any
) -> None:
    out = shared_volume.path / "xgb-out"
    request = TrainJobRequest(
        runtime=XGB_RUNTIME,
        function=xgb_train,
        function_kwargs={"rounds": 20, "params": PARAMS},
        num_nodes=2,
        volumes=[shared_volume.request_volume()],
        output_uri=f"file://{out}",
    )
    t0 = time.monotonic()
    ref = backend.submit(request)
    result = backend.wait(ref, timeout=300)
    elapsed = time.monotonic() - t0
    logs = pod_logs(k8s, namespace, f"jobset.sigs.k8s.io/jobset-name={ref.name}")
    assert result.state == JobState.COMPLETE, (result, logs)

    # both workers' logs: world size 2, ranks 0 and 1 on two pods, the allreduce summed both (1 + 2)
    assert len(logs) == 2, list(logs)
    seen = {
        int(m["rank"]): (int(m["world"]), float(m["sum"]), m["host"])
        for text in logs.values()
        for m in re.finditer(
            r"xgb rank=(?P<rank>\d) world_size=(?P<world>\d) allreduce=(?P<sum>\S+) host=(?P<host>\S+)", text
        )
    }
    assert {r: v[:2] for r, v in seen.items()} == {0: (2, 3.0), 1: (2, 3.0)}, logs
    assert seen[0][2] != seen[1][2], seen
    # the training metric is global: each worker printed the RMSE over both shards, the same value
    rmses = {
        int(m["rank"]): float(m["rmse"])
        for text in logs.values()
        for m in re.finditer(r"xgb rank=(?P<rank>\d) rounds=20 train_rmse=(?P<rmse>\S+)", text)
    }
    assert set(rmses) == {0, 1} and rmses[0] == rmses[1], logs

    # the model rank 0 wrote to the shared volume loads here; its RMSE over the union of both shards is the
    # one the workers printed, which a booster trained on one shard alone would not give
    booster = xgb.Booster(model_file=str(out / "model.json"))
    assert booster.num_boosted_rounds() == 20
    x, y = (np.concatenate(parts) for parts in zip(*(shard(0), shard(1)), strict=True))
    union = float(np.sqrt(np.mean((booster.predict(xgb.DMatrix(x)) - y) ** 2)))
    assert union == pytest.approx(rmses[0], rel=1e-3), (union, rmses)
    alone = xgb.train(PARAMS, xgb.DMatrix(shard(0)[0], label=shard(0)[1]), num_boost_round=20)
    assert alone.save_raw("json") != booster.save_raw("json")

    # report() from rank 0 -> the Trainer's status server -> status.trainerStatus -> TrainJobResult
    tj = k8s.custom.get_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, namespace, "trainjobs", ref.name
    )
    posted = {m["name"]: float(m["value"]) for m in tj["status"]["trainerStatus"]["metrics"]}
    assert posted == {"train_rmse": pytest.approx(rmses[0]), "world_size": 2.0}, tj["status"]
    assert result.runtime == XGB_RUNTIME and result.progress == 100
    assert result.metrics["world_size"] == 2.0 and result.metrics["train_rmse"] == pytest.approx(rmses[0])
    assert result.output_uri == f"file://{out}"
    assert not any("TRAINFLOW_REPORT" in text for text in logs.values())
    lines = [line for text in logs.values() for line in text.splitlines() if line.startswith("xgb rank=")]
    record("xgboost_function_2_workers", {"seconds": round(elapsed, 1), "rank_lines": sorted(lines)})
