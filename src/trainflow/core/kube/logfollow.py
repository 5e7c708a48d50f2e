"""Following a step's log on an event loop, as part of a wait: the async driver of kube/logs.py's ``follow_plan``.

It shares the rules of kube/logs.py (which pod and container, when a reconnect resumes, when the log is
complete) and runs as a task of the wait that started it: no thread, and no request before the job runs (the
pod watch says when its container starts). An event loop streams at most ``FOLLOW_STREAMS`` logs at once, a
connection each; the logs beyond read what was written every ``POLL_SECONDS`` on the shared connections, and
take a stream slot when one frees (the shares and the pace: kube/follow_pace.py). A triggerer with a thousand running jobs thus holds tens of connections,
not a thousand. When the wait ends, every log is read once more and its follower stops. Lines go to a
``LogSink``.

The wait comes first: an event loop starts at most ``POLLS_PER_SECOND`` polled reads a second (with a thousand
polled logs, each is read every ~50 s instead of every 10), so copying logs cannot starve the watch that
detects the outcome; the last read of an ended wait's logs has slots of its own, never queued behind the
polls; and a follower yields to the loop after each chunk it copies. A follower continues where the sink's
``start`` says (a restarted trigger's saved position): its first read asks only for what came after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import httpx

from trainflow.core.errors import NotFound
from trainflow.core.kube import calls, follow_pace, retry
from trainflow.core.kube.aio import AsyncKubeApi
from trainflow.core.kube.apierrors import described
from trainflow.core.kube.diagnostics import JOBSET_NAME_LABEL, newest
from trainflow.core.kube.http import achunks, aclose
from trainflow.core.kube.lines import LineBuffer
from trainflow.core.kube.logs import (
    Copy,
    Look,
    Pause,
    Resume,
    StepTarget,
    follow_plan,
    not_started,
    pod_ready_for_logs,
    step_target,
)
from trainflow.core.kube.pod_watch import start_signature
from trainflow.core.kube.shared_watch import Mailbox
from trainflow.core.logsink import LogSink

log = logging.getLogger(__name__)
MAX_DRAIN_WINDOWS = 24  # a log still arriving after this many drain windows (2 minutes of 5 s) is cut there


async def _pod(api: AsyncKubeApi, namespace: str, target: StepTarget) -> dict[str, Any] | None:
    answer: Mapping[str, Any] = await follow_pace.read(
        api, calls.list_pods(namespace, target.selector, limit=20)
    )
    return newest(list(answer.get("items") or []))


def matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether labels satisfy one of trainflow's own selectors (``k=v``, ``k in (a,b)``, ``k``)."""
    for raw in re.split(r",(?![^()]*\))", selector):
        part = raw.strip()
        if " in (" in part:
            key, _, values = part.partition(" in (")
            if labels.get(key.strip()) not in {v.strip() for v in values.rstrip(")").split(",")}:
                return False
        elif "=" in part:
            key, _, value = part.partition("=")
            if labels.get(key.strip()) != value.strip():
                return False
        elif part and part not in labels:
            return False
    return True


class PodFeed:
    """The pods of one job whose containers started, as the pod watch reports them (one LIST at first, for the
    ones that started before); followers wait on it instead of polling. Without the pod watch (no RBAC to
    watch pods) a follower polls, bounded."""

    def __init__(self, api: AsyncKubeApi, namespace: str, job: str, box: Mailbox) -> None:
        self.api, self.namespace, self.job, self.box = api, namespace, job, box
        self.known: dict[str, dict[str, Any]] = {}
        self.changed = asyncio.Event()
        self.ending = asyncio.Event()  # the wait ended: polled logs take a last read
        self.listed = False
        self._lock = asyncio.Lock()

    async def run(self) -> None:
        """Take the started pods the watch hands this job's waiter (a task of ``Followers``)."""
        queue = self.box.started
        assert queue is not None
        while True:
            self._keep(await queue.get())

    def _keep(self, pod: dict[str, Any]) -> None:
        self.known[str((pod.get("metadata") or {}).get("uid"))] = pod
        self.changed.set()

    async def ready(self, target: StepTarget, pod_wait: float) -> dict[str, Any] | None:
        """The newest started pod of ``target``. It waits on the pod watch for as long as the follower runs;
        without it (or for a job that already ended: ``pod_wait`` 0) it polls for ``pod_wait`` seconds."""
        async with self._lock:
            if not self.listed:
                selector = f"{JOBSET_NAME_LABEL}={self.job}"
                answer = await follow_pace.read(
                    self.api, calls.list_pods(self.namespace, selector, limit=100)
                )
                for pod in answer.get("items") or []:
                    if start_signature(pod):
                        self._keep(pod)
                self.listed = True
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + pod_wait, 0.5
        while True:
            found = [
                p
                for p in self.known.values()
                if matches(target.selector, (p.get("metadata") or {}).get("labels") or {})
                and pod_ready_for_logs(p, target.container)
            ]
            if found:
                return newest(found)
            if self.ending.is_set():  # the wait ended before the pod started: no log to copy
                return None
            if self.box.watch.pods_watched and pod_wait > 0:
                self.changed.clear()
                await self.changed.wait()
                continue
            if loop.time() >= deadline:
                return None
            self.changed.clear()
            with contextlib.suppress(TimeoutError):  # woken early when the wait ends
                await asyncio.wait_for(self.changed.wait(), min(delay, max(0.0, deadline - loop.time())))
            delay = min(delay * 1.5, 5.0)
            pod = await _pod(self.api, self.namespace, target)
            if pod is not None:
                self._keep(pod)


async def follow(
    api: AsyncKubeApi, feed: PodFeed, target: StepTarget, sink: LogSink, *, pod_wait: float = 120.0
) -> None:
    """Copy one step's log into ``sink`` until its container's log is complete, the sink wants no more lines, or
    the task is cancelled. Never raises (a log is best effort; the wait decides the outcome)."""
    try:
        await _follow(api, feed, target, sink, pod_wait)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.info("log of step %s stopped: %s", target.step, described(exc))


async def _follow(
    api: AsyncKubeApi, feed: PodFeed, target: StepTarget, sink: LogSink, pod_wait: float
) -> None:
    pod = await feed.ready(target, pod_wait)
    if pod is None:
        if pod_wait > 0 and not feed.ending.is_set():
            sink.note(target.step, not_started(target, None, pod_wait) + "; its log is not copied")
        return
    name, resume = str(pod["metadata"]["name"]), Resume()
    resume.restore(sink.resume(target.step, lambda: resume.position(name)), name)
    slots = follow_pace.loop_state().slots  # FOLLOW_STREAMS logs streamed at once, the others polled
    while True:
        if slots.locked() or feed.ending.is_set():  # every stream slot taken: read new lines now and then
            if not await _poll(api, feed, name, target, sink, resume, slots):
                return
            continue
        async with slots:
            if not await _until_ending(feed, _stream(api, feed.namespace, name, target, sink, resume)):
                return


async def _until_ending(feed: PodFeed, stream: Coroutine[Any, Any, bool]) -> bool:
    """A stream's outcome, or True when the wait ends first: the stream stops and the log is read once more
    (as a polled one is). The job has ended, so its container has exited, but its stream may stay open: a
    kubelet closes it within a second of the exit, kwok never does, and the end of a wait must not hang on it."""
    task = asyncio.ensure_future(stream)
    ending = asyncio.ensure_future(feed.ending.wait())
    try:
        await asyncio.wait({task, ending}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ending.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return True if task.cancelled() else task.result()


async def _stream(
    api: AsyncKubeApi, namespace: str, name: str, target: StepTarget, sink: LogSink, resume: Resume
) -> bool:
    """Follow the container's log (``follow_plan``) until it is complete, the sink wants no more lines or the
    stream keeps dropping (said in the sink): False, the follower is done."""
    plan = follow_plan(namespace, name, target.container, resume)
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            step = plan.send(answer) if error is None else plan.throw(error)
        except StopIteration as stop:
            if stop.value:
                sink.note(target.step, stop.value)
            return False
        answer, error = None, None
        try:
            if isinstance(step, Copy):
                answer = await _copy(step.response, target.step, sink, resume)
            elif isinstance(step, Look):
                answer = await _pod(api, namespace, target)
            elif isinstance(step, Pause):
                await asyncio.sleep(step.seconds)
            else:
                answer = await api.run(step)
        except Exception as exc:
            error = exc


async def _poll(
    api: AsyncKubeApi,
    feed: PodFeed,
    name: str,
    target: StepTarget,
    sink: LogSink,
    resume: Resume,
    slots: asyncio.Semaphore,
) -> bool:
    """Read the lines written since the last read every ``poll_interval``, on the shared connections, until a
    stream slot frees (True) or the wait ends (False, after a last read)."""
    state = follow_pace.loop_state()
    state.polled += 1
    try:
        while True:
            final = feed.ending.is_set()
            if not await _read_since(api, feed.namespace, name, target, sink, resume, final):
                return False
            if final:
                return False
            if not slots.locked():
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(feed.ending.wait(), state.poll_interval())
    finally:
        state.polled -= 1


async def _read_since(
    api: AsyncKubeApi,
    namespace: str,
    name: str,
    target: StepTarget,
    sink: LogSink,
    resume: Resume,
    final: bool = False,
) -> bool:
    """One read of what was written since the last line seen, line by line off the response (memory bounded by a
    line, however much was written; no limitBytes, whose cut inside a line would tear it). False when the pod
    is gone or the sink wants no more lines; a dropped connection ends this read and the next one resumes.
    ``final``: the wait ended; this read has slots of its own, so it never waits behind the polls."""
    state = follow_pace.loop_state()
    async with state.finals if final else state.reads:
        try:
            resp = await api.run(
                calls.pod_log(
                    namespace, name, target.container, timestamps=True,
                    since_seconds=resume.since_seconds(), stream=True,
                )
            )  # fmt: skip
        except NotFound:
            return False
        wanted, _, _ = await _copy(resp, target.step, sink, resume)
        return wanted


async def _copy(resp: httpx.Response, step: str, sink: LogSink, resume: Resume) -> tuple[bool, int, bool]:
    """Copy a log response's new lines into ``sink``, yielding to the loop after each chunk, then close it:
    (the sink wants more lines, lines copied, the connection dropped)."""
    lines, copied = LineBuffer(), 0
    try:
        async for chunk in achunks(resp):
            for raw in lines.feed(chunk):
                text = resume.fresh(raw.decode("utf-8", "replace"))
                if text is None:
                    continue
                copied += 1
                if not sink.line(step, text):
                    return False, copied, False
            await asyncio.sleep(0)  # a chunk of many lines does not hold the loop
    except Exception as exc:
        if not retry.is_connection_error(exc):
            raise
        return True, copied, True
    finally:
        await aclose(resp)
    return True, copied, False


class Followers:
    """The log followers of one wait: started once the job runs (never before: no request for a job that
    waits for quota), drained for a moment when the wait ends, then cancelled."""

    def __init__(
        self, sink: LogSink, box: Mailbox, known: Callable[[str, str, str], Any] | None = None
    ) -> None:
        self.sink = sink
        self.known = (
            known  # a runtime already read by this process (the launch's), looked up without a request
        )
        self.box = box
        self.namespace = box.watch.namespace
        self.runtimes = box.watch.runtimes  # the watch's cache of runtime objects, shared by its waiters
        self.tasks: list[asyncio.Task[None]] = []
        self.feeder: asyncio.Task[None] | None = None
        self.feed: PodFeed | None = None
        self.started = False
        box.started = asyncio.Queue()  # the pod watch hands this waiter its job's started pods from now on

    async def start(self, api: AsyncKubeApi, obj: Mapping[str, Any], terminal: bool) -> None:
        """Follow each step of the sink (``terminal``: the job already ended, copy what its pods still hold)."""
        self.started = True
        runtime = await self._runtime(api, obj)
        name = str(obj["metadata"]["name"])
        loop = asyncio.get_running_loop()
        feed = self.feed = PodFeed(api, self.namespace, name, self.box)
        self.feeder = loop.create_task(feed.run(), name=f"trainflow-pods-{name}")
        for step in self.sink.steps:
            target = step_target(name, step, runtime)
            coro = follow(api, feed, target, self.sink, pod_wait=0.0 if terminal else 120.0)
            self.tasks.append(loop.create_task(coro, name=f"trainflow-logs-{name}-{step}"))

    async def _runtime(self, api: AsyncKubeApi, obj: Mapping[str, Any]) -> Any:
        from trainflow.core.runtimes import Runtime

        ref = (obj.get("spec") or {}).get("runtimeRef") or {}
        kind = str(ref.get("kind") or "ClusterTrainingRuntime")
        key = (kind, str(ref.get("name")), self.namespace)
        if key not in self.runtimes and self.known is not None:
            found = self.known(key[1], kind, self.namespace)
            if found is not None:
                self.runtimes[key] = found
        if key not in self.runtimes:
            try:
                raw = await api.run(calls.get_runtime(key[1], kind, self.namespace))
                self.runtimes[key] = Runtime.from_object(dict(raw, kind=kind))
            except Exception as exc:  # rank 0 is then the node job's first pod, as for most runtimes
                log.debug("runtime %s of %s: %s", key[1], obj["metadata"].get("name"), described(exc))
                self.runtimes[key] = None
        return self.runtimes[key]

    async def stop(self, drain: float) -> None:
        """Let the last lines arrive for as long as they keep coming: the followers' last reads end when what was
        written is read, and one that copies nothing for ``drain`` seconds (or all of them, after
        ``MAX_DRAIN_WINDOWS`` such windows) is cancelled. A slow machine thus loses no line it was still copying."""
        self.box.started = None
        if self.feed is not None:
            self.feed.ending.set()
            self.feed.changed.set()  # a follower still waiting for its pod stops waiting
        pending: set[asyncio.Task[None]] = set(self.tasks)
        copied, windows = -1, 0
        while pending and windows < MAX_DRAIN_WINDOWS and self._copied() != copied:
            copied, windows = self._copied(), windows + 1
            _, pending = await asyncio.wait(pending, timeout=drain)
        rest = [*pending, *([self.feeder] if self.feeder is not None else [])]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def _copied(self) -> int:
        return sum(self.sink.counts.values())
