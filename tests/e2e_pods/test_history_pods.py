"""Issue 24 on real pods: a trainer's report() calls, posted by rank 0 to the Trainer's status server and seen
as TrainJob status updates, become the waiter's history, with an ETA while it runs; the KFP step's HTML page
and the CLI's chart file (the CLI waiting beside the job, as a user runs it) draw every point, read by Chromium;
and the Hugging Face callback reporting from HF training code on two pods.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG
from browser import chart_points, chromium
from conftest import TRAINER_GROUP, TRAINER_VERSION, cli, pod_logs
from hf_tiny import run_tiny
from trainflow.core import JobState, TrainJobRequest, TrainJobResult, job_page
from trainflow.core.history import History

pytestmark = pytest.mark.e2e

REPORTS = 12


def paced(reports: int, pause: float) -> None:
    """The function trainer: loss and accuracy with progress, one report every ``pause`` seconds."""
    import time

    from trainflow.core import report

    for i in range(reports):
        report(
            metrics={"loss": round(2.0 / (i + 1), 6), "acc": round(i / reports, 4)},
            progress=(i + 1) * 100 // reports,
        )
        print(f"step {i + 1}/{reports}", flush=True)
        time.sleep(pause)


def drawn(history: History) -> dict[str, int]:
    """What the charts must draw: one point per history point that has the series."""
    out = {"progress": sum(p is not None for p in history.progress())}
    out.update({name: sum(v is not None for v in history.series(name)) for name in history.names()})
    return out


def test_reports_on_real_pods_become_a_history_page_and_chart(
    testbed: Any, backend: Any, k8s: Any, namespace: str, tmp_path: Path
) -> None:
    request = TrainJobRequest(
        runtime="xgboost-distributed",  # a Python image that starts fast; the trainer uses no framework
        function=paced,
        function_kwargs={"reports": REPORTS, "pause": 2.0},
        num_nodes=1,
        suspend=True,  # resumed once both waiters watch it: a waiter sees only the reports made while it watches
    )
    ref = backend.submit(request)
    svg = tmp_path / "chart.svg"
    waiter = subprocess.Popen(  # the CLI follows the job from the start, as a user's terminal does
        cli(testbed, namespace, "wait", ref.name, "--timeout", "240", "--chart", str(svg), "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert waiter.stderr is not None
    errors: list[str] = []

    def read_errors() -> None:
        for line in waiter.stderr or []:
            errors.append(line)

    reader = threading.Thread(target=read_errors, daemon=True)
    reader.start()  # the CLI's status lines (plain, not a terminal): its first one says it watches the job
    seen: list[TrainJobResult] = []
    try:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(backend.wait, ref, timeout=240, on_update=seen.append)
            t0 = time.monotonic()
            while not (seen and any(ref.name in line for line in errors)):
                assert time.monotonic() - t0 < 120 and waiter.poll() is None, ("waiters not watching", errors)
                time.sleep(0.2)
            backend.resume(ref)
            result = waiting.result()
        # until the CLI ends (its own --timeout bounds it)
        out = waiter.stdout.read() if waiter.stdout else ""
        waiter.wait(timeout=HANG)
        reader.join(10)
        err = "".join(errors)
    finally:
        waiter.kill()
    logs = pod_logs(k8s, namespace, f"jobset.sigs.k8s.io/jobset-name={ref.name}")
    assert result.state is JobState.COMPLETE, (result, logs)
    assert waiter.returncode == 0, err

    history = result.history
    progress = [p for p in history.progress() if p is not None]
    assert len(history) >= 10, (len(history), history.seen, logs)
    assert progress == sorted(progress) and progress[-1] == 100, progress
    assert set(history.names()) == {"loss", "acc"}, history.names()
    # an ETA while running: every point past the first progress and short of 100 % carries one
    running = [p for p in history if p.progress is not None and progress[0] < p.progress < 100]
    assert running and all(p.eta_seconds is not None and p.eta_seconds > 0 for p in running), list(history)
    assert any(r.state is JobState.RUNNING and r.eta_seconds is not None for r in seen), seen[-3:]

    cli_result = TrainJobResult.from_dict(json.loads(out))
    assert cli_result.state is JobState.COMPLETE and len(cli_result.history) >= 10, len(cli_result.history)

    page_file = tmp_path / "step.html"  # the KFP step's HTML artifact is this page (trainflow.kfp.runner)
    page_file.write_text(job_page.render(result), encoding="utf-8")
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.goto(page_file.as_uri())
        assert chart_points(page) == drawn(history), drawn(history)
        page.goto(svg.as_uri())
        assert chart_points(page) == drawn(cli_result.history), drawn(cli_result.history)


def test_the_hf_trainer_reports_from_rank0_on_real_pods(backend: Any, k8s: Any, namespace: str) -> None:
    """trainflow.core.hf.TrainflowCallback in Hugging Face training code on 2 real pods (torch-distributed, the
    runtimes image's Transformers): rank 0's reports reach ``trainerStatus`` through the Trainer's status
    server, and the wait's history holds the loss, the progress and an ETA while it ran."""
    # a step every 0.5 s, a report every 2 s: paced as training is, so the watch sees each report
    ref, result, running = run_tiny(backend, step_seconds=0.5)
    assert result.state is JobState.COMPLETE, result
    history = result.history
    # 10 logs, progress between them, then the Trainer's final train_* log and the end. The history keeps what
    # the watch saw of trainerStatus, and a report replaces the one before it there: 5 of the 10 losses were
    # seen in a run on 2 loaded cores, so the bound is loose; the loss falls, as a tiny model's does here
    losses = [v for v in history.series("loss") if v is not None]
    assert len(losses) >= 3 and losses[-1] < losses[0], list(history)
    assert {"loss", "learning_rate", "train_loss"} <= set(history.names()), history.names()
    assert history.progress()[-1] == 100 and result.progress == 100
    assert any(e is not None for e in running), running  # the ETA while it ran
    tj = k8s.custom.get_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, namespace, "trainjobs", ref.name
    )
    posted = {m["name"]: float(m["value"]) for m in tj["status"]["trainerStatus"]["metrics"]}
    assert result.metrics == pytest.approx(posted) and posted["train_loss"] > 0, (result.metrics, posted)
