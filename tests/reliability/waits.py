"""Run one wait on one path with a bound, and check its outcome (the fault suites share these).

``wait`` runs ``backend.wait`` in a thread or ``backend.wait_async`` on a fresh event loop and fails the test,
naming the bound, when there is no outcome within it: a hang shows as a failure, never as a stuck run.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import pytest

from trainflow.core.errors import WaitTimeout
from trainflow.core.result import JobState

PATHS = ("sync", "async")


@dataclass
class Outcome:
    path: str
    result: Any = None
    error: BaseException | None = None
    seconds: float = 0.0

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.path}: {type(self.error).__name__}: {self.error}"
        return f"{self.path}: {self.result.state.value} ({self.result.reason})"


def wait(backend: Any, path: str, name: str, timeout: float | None, bound: float) -> Outcome:
    """One wait on one path; fails the test, naming the bound, when it has no outcome within ``bound``."""
    out = Outcome(path)
    t0 = time.monotonic()
    if path == "sync":

        def run() -> None:
            try:
                out.result = backend.wait(name, timeout=timeout)
            except BaseException as exc:  # the outcome under test
                out.error = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(bound)
        if thread.is_alive():
            pytest.fail(f"backend.wait(timeout={timeout}) had no outcome within {bound:.0f}s: it hangs")
    else:

        async def run_async() -> bool:
            task = asyncio.ensure_future(backend.wait_async(name, timeout=timeout))
            done, _ = await asyncio.wait({task}, timeout=bound)
            if not done:
                task.cancel()
                return False
            try:
                out.result = task.result()
            except BaseException as exc:  # the outcome under test
                out.error = exc
            return True

        if not asyncio.run(run_async()):
            pytest.fail(f"backend.wait_async(timeout={timeout}) had no outcome within {bound:.0f}s: it hangs")
    out.seconds = time.monotonic() - t0
    return out


def assert_no_secret(secret: str, outcome: Outcome, caplog: pytest.LogCaptureFixture) -> None:
    """``secret`` is in no log record and no text of the error (its chain and traceback included)."""
    assert secret not in caplog.text, "the secret is in the log:\n" + "\n".join(
        line for line in caplog.text.splitlines() if secret in line
    )
    if outcome.error is not None:
        text = "".join(traceback.format_exception(outcome.error)) + repr(outcome.error)
        assert secret not in text, f"the secret is in the error text: {outcome.describe()}"


def assert_fatal(
    outcome: Outcome, kind: type[BaseException], *words: str, within: float | None = None
) -> None:
    """A typed error naming ``words``, not a (false) WaitTimeout, and sooner than ``within`` seconds."""
    assert outcome.error is not None, f"expected {kind.__name__}, the wait ended {outcome.describe()}"
    assert not isinstance(outcome.error, WaitTimeout), f"a false WaitTimeout: {outcome.describe()}"
    assert isinstance(outcome.error, kind), f"expected {kind.__name__}: {outcome.describe()}"
    for word in words:
        assert word in str(outcome.error), f"the error does not name {word!r}: {outcome.describe()}"
    if within is not None:
        assert outcome.seconds < within, (
            f"took {outcome.seconds:.1f}s: a fatal error must end the wait at once"
        )


def assert_complete(outcome: Outcome) -> None:
    assert outcome.error is None, f"expected Complete: {outcome.describe()}"
    assert outcome.result.state is JobState.COMPLETE, outcome.describe()
