"""The local engine's wait: the job's state files read on a short poll through the rules a wait on a cluster
follows (``observe``, ``observe.tell``, ``report_lines.read_tail``), ending in the same ``Ending``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from trainflow.core.ending import Ending, EndKind
from trainflow.core.errors import QueueBudgetExceeded, TrainJobFailed, TrainJobNotFound, WaitTimeout
from trainflow.core.local import diagnostics, logs, reports, store
from trainflow.core.logsink import LogSink
from trainflow.core.observe import UpdateCallback, Waiter, observe, tell
from trainflow.core.report_lines import TAIL_LINES, read_tail
from trainflow.core.result import RETURNS_ANNOTATION, JobRef, JobState

# the job's state (its directory and its TrainJob object as the engine reads it); TrainJobNotFound when gone
Reader = Callable[[], tuple[store.JobDir, dict[str, Any]]]


class LocalWait:
    """One wait for one local job: ``look`` until it gives the ending."""

    def __init__(
        self,
        ref: JobRef,
        job: store.JobDir,
        read: Reader,
        *,
        deadline: float | None,
        diagnose: bool,
        on_update: UpdateCallback | None,
        sink: LogSink | None,
    ) -> None:
        self.ref, self.read, self.diagnose, self.on_update = ref, read, diagnose, on_update
        self.waiter = Waiter(deadline=deadline)
        self.started = time.time()
        self.cursor = reports.Cursor(job.root)  # the new reports and the followed logs, read between looks
        self.tails = logs.Tails(job, str(ref), sink) if sink is not None else None

    def look(self) -> Ending | None:
        """One look (small file reads, fine on an event loop): the ending, or None to look again later."""
        try:
            job, obj = self.read()
        except TrainJobNotFound as exc:
            return Ending(EndKind.NOT_FOUND, exc.namespace, exc.name, message=str(exc))
        reports.replay(self.cursor, self.waiter, obj, now := time.time())
        out = observe(self.waiter, obj, now)
        if self.tails is not None:
            self.tails.pump(final=out.done)
        if out.changed:
            tell(self.on_update, out.result)
        result = out.result
        assert result is not None
        if out.budget_expired:  # never admitted within its queue budget: the adapter deletes or keeps it
            return Ending.of_error(self.ref, QueueBudgetExceeded(result))
        if out.done:
            if result.state is JobState.FAILED and self.diagnose:
                failed = TrainJobFailed(result, diagnostics.diagnose(job, result.reason or ""))
                return Ending.of_error(self.ref, failed)
            returns = RETURNS_ANNOTATION in (obj["metadata"].get("annotations") or {})
            if result.succeeded and (returns or not result.metrics):
                tail = store.tail_lines(logs.log_path(job, str(self.ref), "node-0"), TAIL_LINES)
                result = read_tail(result, tail, returns)
            return Ending.complete(result)
        if out.timed_out:
            waited = time.time() - self.started
            timeout = WaitTimeout(result.namespace, result.name, result.state.value, waited)
            return Ending.of_error(self.ref, timeout)
        return None

    def next_look(self, poll: float) -> float:
        """Seconds until the next look."""
        return self.waiter.next_check(time.time(), poll)
