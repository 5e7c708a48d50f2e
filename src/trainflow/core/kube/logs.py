"""Pick the pod/container of a step and read its log; following it is one plan (``follow_plan``) that reconnects
from the last timestamp, driven here on the sync client and by kube/logfollow.py on an event loop."""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from trainflow.core.errors import BackendError, InvalidRequest, NotFound
from trainflow.core.kube import calls, retry
from trainflow.core.kube.calls import Call
from trainflow.core.kube.client import KubeApi, iter_lines
from trainflow.core.kube.diagnostics import (
    COMPLETION_INDEX_LABEL,
    INITIALIZER_STEPS,
    newest,
)
from trainflow.core.kube.http import finish
from trainflow.core.naming import JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL, TRAINER_CONTAINER

if TYPE_CHECKING:
    from trainflow.core.runtimes import Runtime

log = logging.getLogger(__name__)

MAX_RECONNECTS = 50
_NODE_STEP = re.compile(r"^node(?:-(\d+))?$")
_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d) (.*)$", re.S)


@dataclass(frozen=True)
class StepTarget:
    """Which pods (label selector) and container hold one step's log."""

    step: str
    selector: str
    container: str


def step_target(job: str, step: str, runtime: Runtime | None) -> StepTarget:
    """``node-N`` -> rank N of the trainer job (``launcher`` for MPI rank 0); initializers by name."""
    base = f"{JOBSET_NAME_LABEL}={job}"
    if step in INITIALIZER_STEPS:
        return StepTarget(step, f"{base},{REPLICATED_JOB_LABEL}={step}", step)
    match = _NODE_STEP.match(step)
    if not match:
        raise InvalidRequest.one(
            "step", f"unknown step {step!r}", "use node-N (rank N), dataset-initializer or model-initializer"
        )
    rank = int(match.group(1) or 0)
    rank0_job = runtime.rank0_job_name if runtime is not None else "node"
    replicated, index = rank0_job, rank
    if runtime is not None and runtime.policy == "mpi" and rank0_job != "node" and rank > 0:
        launcher_is_node = bool((runtime.ml_policy.get("mpi") or {}).get("runLauncherAsNode"))
        replicated, index = "node", rank - 1 if launcher_is_node else rank
    selector = f"{base},{REPLICATED_JOB_LABEL}={replicated},{COMPLETION_INDEX_LABEL}={index}"
    return StepTarget(step, selector, TRAINER_CONTAINER)


def container_state(pod: Mapping[str, Any], container: str) -> str:
    """``waiting``, ``running`` or ``terminated`` for one container ('' when not reported yet)."""
    status = pod.get("status") or {}
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(key) or []:
            if cs.get("name") == container:
                state = cs.get("state") or {}
                for name in ("terminated", "running", "waiting"):
                    if state.get(name) is not None:
                        return name
    if status.get("phase") in ("Succeeded", "Failed"):
        return "terminated"
    return ""


def will_restart(pod: Mapping[str, Any], container: str) -> bool:
    """The kubelet restarts this terminated container in place: the pod is not finished and its
    restartPolicy is Always, or OnFailure after a non-zero exit (the Trainer's node pods use OnFailure)."""
    status = pod.get("status") or {}
    policy = (pod.get("spec") or {}).get("restartPolicy") or "Always"
    if status.get("phase") in ("Succeeded", "Failed") or policy == "Never":
        return False
    if policy == "Always":
        return True
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") == container:
            terminated = (cs.get("state") or {}).get("terminated") or {}
            return terminated.get("exitCode") not in (0, None)
    return False


def parse_timestamp(line: str) -> tuple[int | None, str]:
    """Split a ``timestamps=true`` log line into (epoch nanoseconds, text)."""
    match = _TS.match(line)
    if not match:
        return None, line
    base, frac, tz, text = match.groups()
    tz = "+00:00" if tz == "Z" else tz
    try:
        seconds = datetime.fromisoformat(base + tz).timestamp()
    except ValueError:
        return None, line
    nanos = int((frac or "0")[:9].ljust(9, "0"))
    return int(seconds) * 1_000_000_000 + nanos, text


class Resume:
    """Where a followed log got to, so a reconnect neither replays nor skips lines: the newest timestamp seen
    and digests of the lines already copied at that timestamp (``timestamps=true`` lines, resumed with
    sinceSeconds). ``position``/``restore`` carry it across processes (a restarted trigger continues there)."""

    def __init__(self) -> None:
        self.last_ts: int | None = None
        self.at_last_ts: set[str] = set()

    def position(self, pod: str) -> dict[str, Any]:
        """Where this log of ``pod`` got to, as JSON."""
        return {"pod": pod, "ts": self.last_ts, "at": sorted(self.at_last_ts)}

    def restore(self, saved: Mapping[str, Any] | None, pod: str) -> None:
        """Continue where ``position`` said, when it is this pod's log (from the start otherwise)."""
        if saved and saved.get("pod") == pod and isinstance(saved.get("ts"), int):
            self.last_ts = int(saved["ts"])
            self.at_last_ts = {str(d) for d in saved.get("at") or ()}

    def since_seconds(self) -> int | None:
        """Whole seconds back from now to ask for on a reconnect (with margin for clock skew); None at first."""
        if self.last_ts is None:
            return None
        return max(1, math.ceil(time.time() - self.last_ts / 1e9) + 2)

    def fresh(self, raw: str) -> str | None:
        """The text of a new line; None for one copied before the reconnect."""
        ts, text = parse_timestamp(raw)
        if ts is None:
            return text
        digest = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8).hexdigest()
        if self.last_ts is not None and (
            ts < self.last_ts or (ts == self.last_ts and digest in self.at_last_ts)
        ):
            return None
        if ts != self.last_ts:
            self.last_ts, self.at_last_ts = ts, set()
        self.at_last_ts.add(digest)
        return text


def ended(pod: Mapping[str, Any] | None, name: str, container: str, dropped: bool) -> bool:
    """After a followed stream closed: is that container's log complete (no reconnect)?"""
    if pod is None or str((pod.get("metadata") or {}).get("name")) != name:
        return True  # the pod is gone or was replaced: that container's log is complete
    state = container_state(pod, container)
    return not dropped and state == "terminated" and not will_restart(pod, container)


def pod_ready_for_logs(pod: Mapping[str, Any] | None, container: str) -> bool:
    return pod is not None and container_state(pod, container) in ("running", "terminated")


def not_started(target: StepTarget, pod: Mapping[str, Any] | None, waited: float) -> str:
    found = "exists but its container has not started" if pod else "does not exist yet"
    return f"pod for step {target.step!r} ({target.selector}) {found} after {waited:.0f}s"


@dataclass(frozen=True)
class Copy:
    """A follow step: copy the new lines of this open log response; answered (the reader wants more lines,
    lines copied, the connection dropped)."""

    response: Any


@dataclass(frozen=True)
class Look:
    """A follow step: the step's newest pod now; answered with it, or None."""


@dataclass(frozen=True)
class Pause:
    """A follow step: wait this long before the next try."""

    seconds: float


FollowStep = Call | Copy | Look | Pause


def follow_plan(
    namespace: str,
    name: str,
    container: str,
    resume: Resume,
    *,
    tail_lines: int | None = None,
    max_reconnects: int = MAX_RECONNECTS,
) -> Generator[FollowStep, Any, str | None]:
    """Follow one container's log until it is complete: a dropped stream or a pod missing at the open reconnects
    from where ``resume`` got to (no line twice, none skipped), backing off while nothing new arrives. Returns
    None when the log is complete or the reader wants no more lines, or why it gave up."""
    attempt = 0
    while True:
        dropped, resp = False, None
        try:
            resp = yield calls.pod_log(
                namespace, name, container, follow=True, timestamps=True,
                tail_lines=tail_lines if resume.last_ts is None else None,
                since_seconds=resume.since_seconds(),
            )  # fmt: skip
        except NotFound:  # the pod went away between the look and the open: checked below
            dropped = True
        if resp is not None:
            wanted, copied, dropped = yield Copy(resp)
            if not wanted:
                return None
            if copied:
                attempt = 0
        if ended((yield Look()), name, container, dropped):
            return None
        attempt += 1
        if attempt > max_reconnects:
            return f"log stream of {name} kept dropping; gave up after {max_reconnects} reconnects"
        yield Pause(retry.backoff(attempt))


class LogReader:
    """Reads one step's log through a KubeApi; bounded waits, reconnects without replaying."""

    def __init__(self, api: KubeApi, namespace: str, target: StepTarget, *, pod_wait: float = 120.0) -> None:
        self.api = api
        self.namespace = namespace
        self.target = target
        self.pod_wait = pod_wait
        self.reconnects = 0

    def find_pod(self) -> dict[str, Any] | None:
        answer = self.api.run(calls.list_pods(self.namespace, self.target.selector, limit=20))
        return newest(list(answer.get("items") or []))

    def wait_for_pod(self, deadline: float) -> dict[str, Any]:
        """Wait (bounded) until the step's pod exists and its container has started."""
        delay = 0.5
        while True:
            pod = self.find_pod()
            if pod is not None and pod_ready_for_logs(pod, self.target.container):
                return pod
            if time.time() >= deadline:
                raise BackendError(not_started(self.target, pod, self.pod_wait))
            time.sleep(min(delay, max(0.0, deadline - time.time())))
            delay = min(delay * 1.5, 5.0)

    def read(self, tail_lines: int | None = None) -> Iterator[str]:
        pod = self.find_pod()
        if pod is None:
            raise BackendError(f"no pod for step {self.target.step!r} yet ({self.target.selector})")
        name = str(pod["metadata"]["name"])
        resp = self.api.run(
            calls.pod_log(self.namespace, name, self.target.container, tail_lines=tail_lines, stream=True)
        )
        try:
            for raw in iter_lines(resp):
                yield raw.decode("utf-8", "replace")
        finally:
            finish(resp)

    def follow(self, tail_lines: int | None = None, max_reconnects: int = MAX_RECONNECTS) -> Iterator[str]:
        """The step's log lines as they are written, until its container's log is complete (``follow_plan``)."""
        pod = self.wait_for_pod(time.time() + self.pod_wait)
        resume = Resume()
        plan = follow_plan(
            self.namespace, str(pod["metadata"]["name"]), self.target.container, resume,
            tail_lines=tail_lines, max_reconnects=max_reconnects,
        )  # fmt: skip
        answer: Any = None
        error: Exception | None = None
        while True:
            try:
                step = plan.send(answer) if error is None else plan.throw(error)
            except StopIteration as stop:
                if stop.value:
                    raise BackendError(stop.value) from None
                return
            answer, error = None, None
            try:
                if isinstance(step, Copy):
                    answer = yield from _copy(step.response, resume)
                elif isinstance(step, Look):
                    answer = self.find_pod()
                elif isinstance(step, Pause):
                    self.reconnects += 1
                    time.sleep(step.seconds)
                else:
                    answer = self.api.run(step)
            except Exception as exc:
                error = exc


def _copy(resp: Any, resume: Resume) -> Generator[str, None, tuple[bool, int, bool]]:
    """Yield a log response's new lines, then close it: (more lines wanted, lines copied, the connection dropped)."""
    copied = 0
    try:
        for raw in iter_lines(resp):
            text = resume.fresh(raw.decode("utf-8", "replace"))
            if text is not None:
                copied += 1
                yield text
    except Exception as exc:
        if not retry.is_connection_error(exc):
            raise
        return True, copied, True
    finally:
        finish(resp)
    return True, copied, False
