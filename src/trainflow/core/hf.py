"""Hugging Face Transformers: ``TrainflowCallback`` reports the Trainer's loss, metrics, progress and ETA
through ``report()``, from the world's process zero only.

    from trainflow.core.hf import TrainflowCallback
    Trainer(model=model, args=args, train_dataset=data, callbacks=[TrainflowCallback()])

Each ``on_log`` (every ``logging_steps``, and evaluations) is one report: its numeric values (``loss``,
``learning_rate``, ``grad_norm``, ``epoch``, ``eval_*``, the final ``train_*``), progress as
``global_step / max_steps`` (99 % at most until training ends), and the time remaining at the pace so far.
Between logs, progress and ETA are reported at most every ``progress_every`` seconds.

Transformers >= 5 turns on its own ``KubeflowCallback`` inside a TrainJob whose Trainer runs the
``TrainJobStatus`` feature gate (it sees ``KUBEFLOW_TRAINER_SERVER_URL``). The status server keeps one
``trainerStatus``, replaced whole by each report, so two writers would overwrite each other: there this callback
steps aside and Transformers' reports reach trainflow's history. Everywhere else (the local engine, clusters
without the gate) this callback is what reports. Importing this module imports transformers.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from trainflow.core.reporting import numeric_metrics, report

log = logging.getLogger("trainflow.report")


class TrainflowCallback(TrainerCallback):
    """Reports the Hugging Face Trainer's logs and progress through ``trainflow.core.report``."""

    def __init__(self, progress_every: float = 10.0) -> None:
        self.progress_every = progress_every
        self._started: float | None = None
        self._last_report = 0.0
        self._active = False

    def _progress(self, state: TrainerState, done: bool = False) -> tuple[int | None, float | None]:
        if done:
            return 100, 0.0
        if not state.max_steps or state.max_steps <= 0:
            return None, None
        progress = min(99, int(100 * state.global_step / state.max_steps))
        eta = None
        if self._started is not None and state.global_step > 0:
            per_step = (time.monotonic() - self._started) / state.global_step
            eta = per_step * max(0, state.max_steps - state.global_step)
        return progress, eta

    def _report(self, state: TrainerState, metrics: dict[str, float], done: bool = False) -> None:
        progress, eta = self._progress(state, done)
        report(metrics=metrics, progress=progress, eta_seconds=eta)
        self._last_report = time.monotonic()

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._active = bool(state.is_world_process_zero)
        if self._active and "kubeflow" in (args.report_to or []):
            log.info(
                "Transformers' KubeflowCallback reports to the Trainer's status server; TrainflowCallback "
                "steps aside so trainerStatus has one writer (its reports still reach trainflow's history)"
            )
            self._active = False
        if self._active:
            self._started = time.monotonic()
            self._report(state, {})

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if self._active:
            self._report(state, numeric_metrics(logs))

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._active and time.monotonic() - self._last_report >= self.progress_every:
            self._report(state, {})

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._active:
            self._report(state, {}, done=True)
            self._active = False
