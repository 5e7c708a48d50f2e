"""The one wait on a cluster: every waiter (the CLI, a KFP step, an Airflow task on a worker or deferred in the
triggerer, ``wait_async``) runs this loop, so the rules of docs/architecture.md "Wait" and "Finish" hold alike.

Each turn feeds the newest TrainJob (or a quiet window) to ``observe`` and acts on its outcome. A crashed pod,
handed over by the pod watch, has its failed container's exit code and log tail read at once, before anything
else is listed: the Job deletes it soon. Reads that explain an ending are plans (kube/plan.py). A waiter of
its own (``scope_job``) watches only its job and its job's pods; deferred tasks share one watch per namespace.
A sync caller runs this on a private event loop (``run_blocking``): one loop, one set of rules.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import random
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from trainflow.core.ending import Ending, EndKind
from trainflow.core.errors import (
    Diagnostics,
    QueueBudgetExceeded,
    StateUnknown,
    TrainJobFailed,
    TrainJobNotFound,
    WaitTimeout,
)
from trainflow.core.kube import diagnostics, kueue_reads
from trainflow.core.kube.auth import identity
from trainflow.core.kube.http import open_transport
from trainflow.core.kube.logfollow import Followers
from trainflow.core.kube.plan import Plan, arun
from trainflow.core.kube.shared_watch import Mailbox, WatchKey, registry
from trainflow.core.logsink import DRAIN_SECONDS, LogSink
from trainflow.core.observe import (
    Outcome,
    UpdateCallback,
    Waiter,
    ask_queue_later,
    observe,
    observe_queue,
    tell,
)
from trainflow.core.report_lines import read_tail
from trainflow.core.result import RETURNS_ANNOTATION, JobRef, JobState

if TYPE_CHECKING:
    from trainflow.core.kube.config import ClusterConfig
    from trainflow.core.kube.listwatch import WatchStats

log = logging.getLogger(__name__)
T = TypeVar("T")
WATCH_WINDOW = 300.0


@dataclasses.dataclass(frozen=True)
class WaitSettings:
    """What a wait needs of its connection: the cluster, its bounds, and the runtimes it already read (the
    wait never holds the backend)."""

    cluster: ClusterConfig
    submit_timeout: float
    pod_stuck_timeout: float
    log_tail_lines: int
    known_runtime: Callable[[str, str, str], Any] | None = None
    on_stats: Callable[[WatchStats], None] | None = None  # told the watch's counters as the wait starts

    def window(self) -> float:
        """How long a wait may go without news before it looks again (also bounds the stuck-in-Created check)."""
        return max(5.0, min(WATCH_WINDOW, self.submit_timeout / 4))


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to its end from sync code: on this thread, or on a helper thread when this thread
    already runs an event loop (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trainflow-wait") as pool:
        return pool.submit(asyncio.run, coro).result()


def finish(
    waiter: Waiter, diagnose: bool, log_tail_lines: int, captured: Diagnostics | None = None
) -> Plan[Ending]:
    """A waiter's terminal TrainJob -> its ending, with the waiter's history and Kueue's word (preemptions, time
    queued: one read) and what rank 0's log tail says (``report_lines.read_tail``); a Failed one with diagnostics
    (``diagnose``; with what the pods showed while they existed: ``captured``)."""
    obj, seen = waiter.obj, waiter.result
    assert obj is not None and seen is not None
    result = yield from kueue_reads.with_kueue(obj, seen)
    returns = RETURNS_ANNOTATION in ((obj.get("metadata") or {}).get("annotations") or {})
    if result.state is JobState.COMPLETE and (returns or not result.metrics):
        lines = yield from diagnostics.rank0_log_tail(result.namespace, result.name, log_tail_lines)
        result = read_tail(result, lines, returns)
    if result.state is JobState.FAILED and diagnose:
        # on a real cluster the Job deletes its pods before the TrainJob turns Failed: name what was captured
        diag = diagnostics.with_first_crash(
            (yield from diagnostics.collect(result.namespace, result.name)), captured
        )
        return Ending.of_error(result.ref, TrainJobFailed(result, diag))
    return Ending.complete(result)


def check_pods(
    waiter: Waiter, stuck_after: float, captured: list[Diagnostics]
) -> Plan[TrainJobFailed | None]:
    """Pods not ready: a TrainJobFailed when one is stuck (unschedulable, image or config it cannot get) for
    ``stuck_after`` seconds - the Trainer never fails such a job; else keep a crash's diagnostics."""
    assert waiter.result is not None
    result = waiter.result
    stuck, diag = yield from diagnostics.inspect_pods(result.namespace, result.name, time.time(), stuck_after)
    if stuck is not None:
        reason, detail = stuck
        message = f"{detail} (for over {stuck_after:.0f}s; the TrainJob was left as it is)"
        failed = result.replace(state=JobState.FAILED, reason=reason, message=message)
        return TrainJobFailed(failed, diag)
    diagnostics.keep_first_crash(captured, diag)
    return None


def timed_out(ref: JobRef, waiter: Waiter, waited: float, diag: Diagnostics | None) -> Plan[WaitTimeout]:
    """The WaitTimeout for a wait that ended early; a job never started gets its creation-failure events, a
    queued one says why it waits (Kueue's word)."""
    result = waiter.result
    state = result.state if result is not None else None
    if diag is None and state in (JobState.CREATED, JobState.QUEUED):
        diag = yield from diagnostics.creation_failure(ref.namespace, ref.name)
    text = state.value if state else "unknown"
    if result is not None and state is JobState.QUEUED and result.message:
        text += f" ({result.message})"
    return WaitTimeout(ref.namespace, ref.name, text, waited, diagnostics=diag)


def _told(on_update: UpdateCallback | None, out: Outcome) -> None:
    if out.changed:
        tell(on_update, out.result)


def _look(
    waiter: Waiter, objs: tuple[dict[str, Any] | None, ...], on_update: UpdateCallback | None
) -> Outcome:
    """Fold each new version in order (each status change is reported), into one outcome: the last one's
    ending, and any check an earlier one asked for."""
    outs = [observe(waiter, obj, time.time()) for obj in objs]
    for out in outs:
        if out.changed:
            tell(on_update, out.result)
    last = outs[-1]
    return dataclasses.replace(
        last,
        check_pods=any(o.check_pods for o in outs),
        check_creation=any(o.check_creation for o in outs),
        check_queue=any(o.check_queue for o in outs),
    )


async def _confirm(box: Mailbox, ref: JobRef, started: float) -> dict[str, Any] | Ending:
    """At the deadline with the watch cut off from the server: read the job once, or say its state is unknown."""
    try:
        obj = await box.watch.get(ref.name)
    except Exception as exc:
        unknown = StateUnknown(
            f"the wait for TrainJob {ref} reached its deadline after {time.time() - started:.0f}s while the API "
            f"server could not be reached ({exc}); its state is unknown and it was left as it is"
        )
        return Ending.of_error(ref, unknown)
    return obj if obj is not None else Ending(EndKind.NOT_FOUND, ref.namespace, ref.name, message=_gone(ref))


def _gone(ref: JobRef) -> str:
    return str(TrainJobNotFound(ref.namespace, ref.name))


async def wait_for(
    settings: WaitSettings,
    ref: JobRef,
    *,
    deadline: float | None,
    diagnose: bool,
    on_update: UpdateCallback | None,
    scope_job: bool,
    logs: LogSink | None = None,
) -> Ending:
    """Watch until Complete/Failed, a stuck pod, the queue budget, the job's deletion or the deadline (the job
    keeps running); meanwhile copy the output of ``logs.steps`` as it is written. ``diagnose``: a Failed
    ending carries what the pods and events say (reads a caller that only wants the state does without)."""
    reg = registry()
    key: WatchKey = (identity(settings.cluster), ref.namespace, ref.name if scope_job else None)
    connect = functools.partial(open_transport, settings.cluster)
    async with reg.subscribe(key, connect, ref.name) as box:
        if settings.on_stats is not None:
            settings.on_stats(box.watch.stats)
        followers = Followers(logs, box, settings.known_runtime) if logs is not None else None
        try:
            own = kueue_reads.QUEUE_RECHECK_SECONDS if scope_job else None  # shared: when the job changes
            return await _wait(settings, ref, box, deadline, diagnose, on_update, followers, own)
        finally:
            if followers is not None:
                await followers.stop(DRAIN_SECONDS)


async def _wait(
    settings: WaitSettings,
    ref: JobRef,
    box: Mailbox,
    deadline: float | None,
    diagnose: bool,
    on_update: UpdateCallback | None,
    followers: Followers | None,
    queue_recheck: float | None,
) -> Ending:
    started = time.time()
    waiter = Waiter(deadline, settings.submit_timeout, True, queue_reads=True, queue_recheck=queue_recheck)
    captured: list[Diagnostics] = []
    reg = registry()
    while True:
        # jittered, so waiters started together (triggerer restart, fan-out) do not wake together
        window = settings.window() * random.uniform(0.8, 1.2)
        update = await reg.next_update(box, waiter.next_check(time.time(), window))
        objs: tuple[dict[str, Any] | None, ...] = (None,)
        crashed: tuple[dict[str, Any], ...] = ()
        if update is not None:
            if update.deleted:
                return Ending(EndKind.NOT_FOUND, ref.namespace, ref.name, message=_gone(ref))
            objs, crashed = update.objs or (None,), update.crashed
        out = _look(waiter, objs, on_update)
        if update is not None and update.queue:  # Kueue's word changed (the namespace's Workload watch)
            _told(on_update, observe_queue(waiter, update.queue[-1], time.time()))
        if out.timed_out and not box.watch.connected:
            confirmed = await _confirm(box, ref, started)
            if isinstance(confirmed, Ending):
                return confirmed
            out = _look(waiter, (confirmed,), on_update)
        api = box.watch.api
        for pod in crashed:  # read the crashed container's log now: the Job deletes the pod soon
            diagnostics.keep_first_crash(captured, await arun(diagnostics.crash_of(ref.namespace, pod), api))
        if followers is not None and not followers.started and _running(waiter) and api is not None:
            assert waiter.obj is not None and waiter.result is not None
            await followers.start(api, waiter.obj, terminal=waiter.result.state.terminal)
        if out.check_queue:  # Kueue's word on a queued job: the Workload watch's, else a read
            queue = box.watch.queue
            if queue.synced:
                _told(on_update, observe_queue(waiter, queue.status.get(ref.name), time.time()))
            elif queue.off or box.watch.job is not None:
                _told(on_update, await arun(kueue_reads.look(waiter, time.time()), api))
            else:  # the namespace's Workload watch is starting: ask it in a moment, not the server now
                ask_queue_later(waiter, time.time())
        failure: TrainJobFailed | None = QueueBudgetExceeded(out.result) if out.budget_expired else None
        if out.check_pods and waiter.result is not None and failure is None:
            failure = await arun(check_pods(waiter, settings.pod_stuck_timeout, captured), api)
        if out.done:
            assert waiter.obj is not None
            tail = captured[0] if captured else None
            return await arun(finish(waiter, diagnose, settings.log_tail_lines, tail), api)
        if failure is not None:
            return Ending.of_error(ref, failure)
        diag = None
        if out.check_creation:
            diag = await arun(diagnostics.creation_failure(ref.namespace, ref.name), api)
        if out.timed_out or diag is not None:
            return Ending.of_error(ref, await arun(timed_out(ref, waiter, time.time() - started, diag), api))


def _running(waiter: Waiter) -> bool:
    """The job's pods run (or ran): time to follow their logs."""
    result = waiter.result
    if result is None:
        return False
    return waiter.ran or result.state.terminal or waiter.has_pods()
