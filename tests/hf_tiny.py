"""The Hugging Face trainer the HF-callback tests run (local engine and real pods): shipped as source."""

from __future__ import annotations

from typing import Any

from bounds import HANG

STEPS, LOGGING_STEPS = 40, 4


def train_tiny(steps: int, logging_steps: int, step_seconds: float = 0.0) -> None:
    """A function trainer: a 1-layer GPT-2 built from a config (nothing downloaded) on random tokens, the HF
    Trainer, trainflow's callback. Checkpoints off, so its scratch directory only holds the Trainer's logs.
    ``step_seconds`` paces the steps (a pause after each), as real training is paced."""
    import tempfile
    import time

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from trainflow.core.hf import TrainflowCallback

    class Paced(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            time.sleep(step_seconds)

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    tokens = torch.randint(0, 64, (64, 16))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    with tempfile.TemporaryDirectory(prefix="hf-") as scratch:  # nothing left in /tmp after the job
        args = TrainingArguments(
            output_dir=scratch,
            max_steps=steps,
            logging_steps=logging_steps,
            per_device_train_batch_size=4,
            learning_rate=5e-3,
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=GPT2LMHeadModel(config),
            args=args,
            train_dataset=data,
            callbacks=[TrainflowCallback(), Paced()],
        )
        trainer.train()


def run_tiny(backend: Any, step_seconds: float = 0.0) -> tuple[Any, Any, list[float | None]]:
    """``train_tiny`` on torch-distributed, 2 nodes, waited for: its ref, its result and each ETA seen while
    it was Running."""
    from trainflow.core import JobState

    ref = backend.submit(
        {
            "name": "hf-tiny",
            "runtime": "torch-distributed",
            "function": train_tiny,  # its source is shipped
            "function_kwargs": {"steps": STEPS, "logging_steps": LOGGING_STEPS, "step_seconds": step_seconds},
            "num_nodes": 2,
        }
    )
    running: list[float | None] = []
    result = backend.wait(
        ref,
        timeout=HANG,
        on_update=lambda r: running.append(r.eta_seconds) if r.state is JobState.RUNNING else None,
    )
    return ref, result, running
