"""Case 7: N TrainJobs submitted and waited by one process through the full lifecycle on the testbed
(Trainer -> JobSet -> Job -> kwok pods), with no lost or duplicated completion.

``RELIABILITY_LOAD_JOBS`` (CI default 50; ``make reliability-long``: 500). Records the wall time and the
API server's ``apiserver_request_total`` delta by verb/resource (all clients: trainflow and the controllers).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import time
from pathlib import Path

import pytest

from conftest import held_request, request_totals, trainjobs
from trainflow.core.result import JobState

N = int(os.environ.get("RELIABILITY_LOAD_JOBS", "50"))
OUT = Path(os.environ.get("TRAINFLOW_RELIABILITY_OUT", "/tmp/trainflow-reliability"))
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(max(900, N * 12))]


def test_n_jobs_submitted_and_waited_by_one_process(testbed, k8s, namespace, kube_backend) -> None:
    before = request_totals(testbed)
    t0 = time.time()
    refs = [kube_backend.submit(held_request(f"rel/load-{i}", 2)) for i in range(N)]
    t_submit = time.time() - t0
    completions: collections.Counter[str] = collections.Counter()

    async def wait_all() -> list:
        def counter(name: str):
            def on_update(result) -> None:
                if result.state.terminal:
                    completions[name] += 1

            return on_update

        return await asyncio.gather(
            *(kube_backend.wait_async(r, timeout=max(600, N * 6), on_update=counter(r.name)) for r in refs),
            return_exceptions=True,
        )

    results = asyncio.run(wait_all())
    elapsed = time.time() - t0
    after = request_totals(testbed)
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    delta = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 0}
    top = dict(sorted(delta.items(), key=lambda kv: -kv[1])[:25])
    summary = {
        "jobs": N,
        "submit_seconds": round(t_submit, 1),
        "total_seconds": round(elapsed, 1),
        "complete": sum(
            1 for r in results if not isinstance(r, BaseException) and r.state is JobState.COMPLETE
        ),
        "errors": errors[:5],
        "completions_reported_per_job": sorted(set(completions.values())),
        "trainjobs_in_namespace": len(trainjobs(k8s, namespace)),
        "apiserver_request_total_delta_top": top,
        "trainjob_requests": {k: v for k, v in delta.items() if k.endswith(" trainjobs")},
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"load_{N}.json").write_text(json.dumps(summary, indent=2))
    print("\n" + json.dumps(summary, indent=2))
    assert not errors
    assert summary["complete"] == N
    assert summary["completions_reported_per_job"] == [1] and len(completions) == N
    assert summary["trainjobs_in_namespace"] == N
