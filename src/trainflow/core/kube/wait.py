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
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

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
from trainflow.core.kube.reportlog import last_report
from trainflow.core.kube.shared_watch import Mailbox, WatchKey, registry
from trainflow.core.logsink import DRAIN_SECONDS, LogSink
from trainflow.core.observe import Outcome, UpdateCallback, Waiter, ask_queue_later, observe, observe_queue
from trainflow.core.reporting import return_value
from trainflow.core.result import RETURNS_ANNOTATION, JobRef, JobState, TrainJobResult

if TYPE_CHECKING:
    from trainflow.core.kube.backend import KubernetesBackend

log = logging.getLogger(__name__)
T = TypeVar("T")
WATCH_WINDOW = 300.0


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
    waiter: Waiter, raise_on_failure: bool, log_tail_lines: int, captured: Diagnostics | None = None
) -> Plan[TrainJobResult]:
    """A waiter's terminal TrainJob -> its result, with the waiter's history and Kueue's word (preemptions, time
    queued: one read): metrics from rank 0's log only when trainerStatus has none (and a function trainer's return
    value from the same read); raise TrainJobFailed with diagnostics on Failed (with what the pods showed while
    they existed: ``captured``)."""
    obj, seen = waiter.obj, waiter.result
    assert obj is not None and seen is not None
    result = yield from kueue_reads.with_kueue(obj, seen)
    returns = RETURNS_ANNOTATION in ((obj.get("metadata") or {}).get("annotations") or {})
    if result.state is JobState.COMPLETE and (returns or not result.metrics):
        lines = yield from diagnostics.rank0_log_tail(result.namespace, result.name, log_tail_lines)
        metrics, progress = last_report(lines) if not result.metrics else ({}, None)
        if metrics or progress is not None:
            update = {"metrics": metrics, "progress": progress if progress is not None else result.progress}
            result = result.replace(**update)
        if returns:
            result = result.replace(return_value=return_value(lines))
    if result.state is JobState.FAILED and raise_on_failure:
        # on a real cluster the Job deletes its pods before the TrainJob turns Failed: name what was captured
        diag = diagnostics.with_first_crash(
            (yield from diagnostics.collect(result.namespace, result.name)), captured
        )
        raise TrainJobFailed(result, diag)
    return result


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
        _tell(on_update, out.result)


def _tell(on_update: UpdateCallback | None, result: TrainJobResult | None) -> None:
    """A caller's callback; its failure is logged and never ends the wait."""
    if on_update is None or result is None:
        return
    try:
        on_update(result)
    except Exception:
        log.exception("the on_update callback failed for TrainJob %s/%s", result.namespace, result.name)


def _look(
    waiter: Waiter, objs: tuple[dict[str, Any] | None, ...], on_update: UpdateCallback | None
) -> Outcome:
    """Fold each new version in order (each status change is reported), into one outcome: the last one's
    ending, and any check an earlier one asked for."""
    outs = [observe(waiter, obj, time.time()) for obj in objs]
    for out in outs:
        if out.changed:
            _tell(on_update, out.result)
    last = outs[-1]
    return dataclasses.replace(
        last,
        check_pods=any(o.check_pods for o in outs),
        check_creation=any(o.check_creation for o in outs),
        check_queue=any(o.check_queue for o in outs),
    )


async def _confirm(box: Mailbox, ref: JobRef, started: float) -> dict[str, Any]:
    """At the deadline with the watch cut off from the server: read the job once, or say its state is unknown."""
    try:
        obj = await box.watch.get(ref.name)
    except Exception as exc:
        raise StateUnknown(
            f"the wait for TrainJob {ref} reached its deadline after {time.time() - started:.0f}s while the API "
            f"server could not be reached ({exc}); its state is unknown and it was left as it is"
        ) from None
    if obj is None:
        raise TrainJobNotFound(ref.namespace, ref.name)
    return obj


async def wait_for(
    backend: KubernetesBackend,
    ref: JobRef,
    *,
    deadline: float | None,
    raise_on_failure: bool,
    on_update: UpdateCallback | None,
    scope_job: bool,
    logs: LogSink | None = None,
) -> TrainJobResult:
    """Watch until Complete/Failed, a stuck pod, or the deadline (WaitTimeout; the job keeps running); meanwhile
    copy the output of ``logs.steps`` as it is written."""
    reg = registry()
    key: WatchKey = (identity(backend.cluster), ref.namespace, ref.name if scope_job else None)
    connect = functools.partial(open_transport, backend.cluster)
    async with reg.subscribe(key, connect, ref.name) as box:
        backend.last_wait_stats = box.watch.stats
        followers = Followers(logs, box, backend.cached_runtime) if logs is not None else None
        try:
            own = kueue_reads.QUEUE_RECHECK_SECONDS if scope_job else None  # shared: when the job changes
            return await _wait(backend, ref, box, deadline, raise_on_failure, on_update, followers, own)
        finally:
            if followers is not None:
                await followers.stop(DRAIN_SECONDS)


async def _wait(
    backend: KubernetesBackend,
    ref: JobRef,
    box: Mailbox,
    deadline: float | None,
    raise_on_failure: bool,
    on_update: UpdateCallback | None,
    followers: Followers | None,
    queue_recheck: float | None,
) -> TrainJobResult:
    started = time.time()
    waiter = Waiter(deadline, backend.submit_timeout, True, queue_reads=True, queue_recheck=queue_recheck)
    captured: list[Diagnostics] = []
    reg = registry()
    while True:
        # jittered, so waiters started together (triggerer restart, fan-out) do not wake together
        window = backend.window() * random.uniform(0.8, 1.2)
        update = await reg.next_update(box, waiter.next_check(time.time(), window))
        objs: tuple[dict[str, Any] | None, ...] = (None,)
        crashed: tuple[dict[str, Any], ...] = ()
        if update is not None:
            if update.deleted:
                raise TrainJobNotFound(ref.namespace, ref.name)
            objs, crashed = update.objs or (None,), update.crashed
        out = _look(waiter, objs, on_update)
        if update is not None and update.queue:  # Kueue's word changed (the namespace's Workload watch)
            _told(on_update, observe_queue(waiter, update.queue[-1], time.time()))
        if out.timed_out and not box.watch.connected:
            out = _look(waiter, (await _confirm(box, ref, started),), on_update)
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
            failure = await arun(check_pods(waiter, backend.pod_stuck_timeout, captured), api)
        if out.done:
            assert waiter.obj is not None
            tail = captured[0] if captured else None
            return await arun(finish(waiter, raise_on_failure, backend.log_tail_lines, tail), api)
        if failure is not None:
            if raise_on_failure:
                raise failure
            return failure.result  # type: ignore[no-any-return]
        diag = None
        if out.check_creation:
            diag = await arun(diagnostics.creation_failure(ref.namespace, ref.name), api)
        if out.timed_out or diag is not None:
            raise await arun(timed_out(ref, waiter, time.time() - started, diag), api)


def _running(waiter: Waiter) -> bool:
    """The job's pods run (or ran): time to follow their logs."""
    result = waiter.result
    if result is None:
        return False
    return waiter.ran or result.state.terminal or waiter.has_pods()
