"""Pipeline run terminated: SIGTERM/SIGINT cancel the TrainJob (bounded) and end the step with 143."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from trainflow.kfp.steplog import log

EXIT_CANCELLED = 143  # 128 + SIGTERM, what a shell reports for a terminated step
CANCEL_WAIT_SECONDS = (
    60.0  # a delete takes well under a second; KFP/Kubernetes SIGKILL after the grace period
)


@contextlib.contextmanager
def cancel_on_sigterm(cancel: Callable[[], None]) -> Iterator[None]:
    """While inside, SIGTERM/SIGINT (pipeline run terminated) runs ``cancel`` and exits with 143."""

    def cancel_and_report() -> None:
        try:
            cancel()
        except Exception as exc:
            with contextlib.suppress(Exception):
                log(f"could not cancel the TrainJob: {exc}")

    def handler(signum: int, _frame: Any) -> None:
        # stdout may be a pipe whose reader died with us: never let a log write stop the cancel.
        with contextlib.suppress(Exception):
            log(f"received signal {signum}: pipeline step is being terminated")
        # The signal interrupted this thread wherever it was, maybe holding a lock the cancel needs (a
        # connection pool's, stdout's): cancel on a thread of its own and wait for it, bounded.
        worker = threading.Thread(target=cancel_and_report, name="trainjob-cancel", daemon=True)
        try:
            worker.start()
            worker.join(CANCEL_WAIT_SECONDS)
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(EXIT_CANCELLED)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
