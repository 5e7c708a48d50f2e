"""trainflow.core.hf.TrainflowCallback in a real Hugging Face Trainer run on the local engine: a tiny GPT-2
built from a config (nothing downloaded), trained under torchrun on 2 nodes with DDP over gloo; rank 0 reports
the Trainer's logs, progress and ETA, and the wait's history holds each of them."""

from __future__ import annotations

import json

import pytest

from hf_tiny import LOGGING_STEPS, STEPS, run_tiny
from trainflow.core import JobState
from trainflow.core.local.engine import LocalBackend
from trainflow.core.local.reports import REPORTS_FILE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def backend(tests_backend: LocalBackend) -> LocalBackend:
    return tests_backend


def test_the_hf_trainer_reports_loss_progress_and_eta_from_rank0(backend: LocalBackend) -> None:
    ref, result, running = run_tiny(backend)
    assert result.state is JobState.COMPLETE, result
    lines = [json.loads(x) for x in (backend.job_dir(ref) / REPORTS_FILE).read_text().splitlines()]
    history = result.history
    # one report at the start, one per log (STEPS / LOGGING_STEPS, then the Trainer's final train_* log), one
    # at the end: rank 0's only (2 nodes ran; a rank-1 report would double them)
    assert len(lines) == history.seen == 1 + STEPS // LOGGING_STEPS + 1 + 1, [r["metrics"] for r in lines]
    assert len(history) == history.seen  # under the bound: all kept
    losses = [v for v in history.series("loss") if v is not None]
    assert len(losses) >= STEPS // LOGGING_STEPS  # the loss of every logging step (and carried after)
    assert {"loss", "learning_rate", "grad_norm", "epoch", "train_loss"} <= set(history.names())
    assert history.progress()[0] == 0 and history.progress()[-1] == 100
    assert max(p for p in history.progress()[:-1] if p is not None) <= 99  # 100 only once it ended
    etas = [p.eta_seconds for p in history][1:-1]
    assert all(e is not None and e >= 0 for e in etas)  # an ETA with every report while it ran
    assert history.latest is not None and history.latest.eta_seconds == 0
    assert any(e is not None for e in running)  # the wait saw the ETA while the job was Running
    assert result.metrics["train_loss"] > 0 and result.progress == 100
