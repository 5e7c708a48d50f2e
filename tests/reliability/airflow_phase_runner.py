"""Test-only wrapper: run tests/airflow/dag_runner.py in this process with TrainJobOperator patched to stop
at one phase, so a test can SIGKILL the task process exactly there. Product code is not touched.

``airflow_phase_runner.py PHASE MARKER DAG_ID LOGICAL RUN_AFTER [CONF]``; PHASE is one of
``before_create`` (hold just before ``backend.submit``), ``after_create`` (hold right after ``backend.submit``
returned, before the XCom push and the state-store record), ``waiting`` (mark, then wait normally) or ``none``.
The marker file is written when the phase is reached.
"""

from __future__ import annotations

import faulthandler
import runpy
import signal
import sys
import time
from pathlib import Path
from typing import Any

DAG_RUNNER = Path(__file__).resolve().parents[1] / "airflow" / "dag_runner.py"
PHASES = ("before_create", "after_create", "waiting", "none")


def _reached(marker: Path, phase: str, detail: str = "") -> None:
    marker.write_text(f"{phase} {detail}".strip())


def _hold(marker: Path, phase: str, detail: str = "") -> None:
    _reached(marker, phase, detail)
    while True:  # until SIGKILL
        time.sleep(3600)


def install(phase: str, marker: Path) -> None:
    from trainflow.airflow.operators import TrainJobOperator

    submit = TrainJobOperator._submit
    wait_sync = TrainJobOperator._wait_sync

    if phase == "before_create":

        def _submit_before(self: Any, backend: Any, request: Any, attempt: int) -> Any:
            _hold(marker, phase)

        TrainJobOperator._submit = _submit_before  # type: ignore[method-assign]
    elif phase == "after_create":

        def _submit_after(self: Any, backend: Any, request: Any, attempt: int) -> Any:
            ref = submit(self, backend, request, attempt)
            _hold(marker, phase, ref.name)

        TrainJobOperator._submit = _submit_after  # type: ignore[method-assign]
    elif phase == "waiting":

        def _wait_marked(self: Any, backend: Any, ref: Any, deadline: Any) -> Any:
            _reached(marker, phase, ref.name)
            return wait_sync(self, backend, ref, deadline)

        TrainJobOperator._wait_sync = _wait_marked  # type: ignore[method-assign]


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a test that times out dumps our stacks
    phase, marker = sys.argv[1], Path(sys.argv[2])
    if phase not in PHASES:
        raise SystemExit(f"phase {phase!r}: use one of {PHASES}")
    install(phase, marker)
    sys.argv = [str(DAG_RUNNER), *sys.argv[3:]]
    sys.path.insert(0, str(DAG_RUNNER.parent))
    runpy.run_path(str(DAG_RUNNER), run_name="__main__")


if __name__ == "__main__":
    main()
