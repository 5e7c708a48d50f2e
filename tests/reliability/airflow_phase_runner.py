"""Test-only wrapper: run tests/airflow/dag_runner.py in this process with the local backend patched to stop
at one phase, so a test can SIGKILL the task process exactly there. Product code is not touched.

``airflow_phase_runner.py PHASE MARKER DAG_ID LOGICAL RUN_AFTER [CONF]``; PHASE is one of
``before_create`` (hold just before ``LocalBackend.create``), ``after_create`` (hold right after it returned,
before launch returns, the XCom push and the state-store record), ``waiting`` (mark, then wait normally) or
``none``.
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
    """Stop the task at one phase through the backend's public primitives (the ones launch and wait use)."""
    from trainflow.core.local.engine import LocalBackend

    create = LocalBackend.create
    wait = LocalBackend.wait_ending  # the one wait every caller goes through (``wait`` returns its outcome)

    if phase == "before_create":

        def _create_before(self: Any, manifest: Any) -> Any:
            _hold(marker, phase)

        LocalBackend.create = _create_before  # type: ignore[method-assign]
    elif phase == "after_create":

        def _create_after(self: Any, manifest: Any) -> Any:
            obj = create(self, manifest)
            _hold(marker, phase, obj["metadata"]["name"])

        LocalBackend.create = _create_after  # type: ignore[method-assign]
    elif phase == "waiting":

        def _wait_marked(self: Any, ref: Any, *args: Any, **kwargs: Any) -> Any:
            _reached(marker, phase, getattr(ref, "name", str(ref)))
            return wait(self, ref, *args, **kwargs)

        LocalBackend.wait_ending = _wait_marked  # type: ignore[method-assign]


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
