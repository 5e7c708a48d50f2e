"""TorchTune recipes: ``TrainflowLogger`` reports a recipe's logged metrics and progress through ``report()``,
and publishes its output to an ``s3://`` ``output_uri`` once training ends.

    tune run ... metric_logger._component_=trainflow.core.torchtune_logger.TrainflowLogger

A TorchTune runtime fixes the recipe's ``output_dir`` (``/workspace/output``, on the runtime's volume) and its
command (``tune run``), so the metric logger is the one hook a TrainJob's args can plug in. Each ``log_dict`` is
one report (its numeric values: ``loss``, ``lr``, ``tokens_per_second_per_gpu``, ...), with progress as
``step / (epochs * max_steps_per_epoch)`` when the config bounds the steps (99 % at most until the recipe
closes the logger). ``close()``, which a recipe calls only after its last checkpoint is saved, reports 100 %
and, when ``TRAINFLOW_OUTPUT_URI`` is ``s3://``, uploads ``output_dir`` under it from rank 0 (credentials from
``secret_env``, as ``trainflow.core.storage`` reads them). A failed upload raises: the job fails, not the model.
Duck-typed to TorchTune's ``MetricLoggerInterface``: importing this module does not import torchtune.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainflow.core import publish, storage
from trainflow.core.reporting import OUTPUT_ENV, is_rank0, numeric_metrics, report


def _config_value(config: Any, key: str) -> Any:
    getter = getattr(config, "get", None)
    return getter(key) if callable(getter) else getattr(config, key, None)


class TrainflowLogger:
    """A TorchTune metric logger (``metric_logger._component_``) that reports through trainflow."""

    def __init__(self, **_: Any) -> None:
        self.total_steps: int | None = None
        self.output_dir: Path | None = None
        self.step = 0

    def log_config(self, config: Any) -> None:
        """Read the step budget and ``output_dir`` of the resolved recipe config."""
        epochs, per_epoch = _config_value(config, "epochs"), _config_value(config, "max_steps_per_epoch")
        if isinstance(epochs, int) and isinstance(per_epoch, int) and epochs > 0 and per_epoch > 0:
            self.total_steps = epochs * per_epoch
        output_dir = _config_value(config, "output_dir")
        self.output_dir = Path(str(output_dir)) if output_dir else None

    def _progress(self, step: int) -> int | None:
        if not self.total_steps:
            return None
        return min(99, step * 100 // self.total_steps)

    def log(self, name: str, data: Any, step: int) -> None:
        self.log_dict({name: data}, step)

    def log_dict(self, payload: Mapping[str, Any], step: int) -> None:
        self.step = max(self.step, step)
        metrics = numeric_metrics(payload)
        if metrics:
            report(metrics=metrics, progress=self._progress(step))

    def close(self) -> None:
        """Training ended and its checkpoint is saved: report 100 % and publish ``output_dir`` if asked."""
        report(progress=100)
        if self.output_dir is not None:
            publish.publish_output(directory=self.output_dir)
        elif storage.is_object_uri(os.environ.get(OUTPUT_ENV)) and is_rank0():
            raise storage.StorageError("the recipe config has no output_dir: nothing to publish")
