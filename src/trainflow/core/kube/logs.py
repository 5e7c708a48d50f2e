"""Pick the pod/container of a step and read its log; ``follow`` reconnects from the last timestamp."""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from trainflow.core.errors import BackendError, InvalidRequest, NotFound
from trainflow.core.kube import retry
from trainflow.core.kube.client import KubeApi, iter_lines
from trainflow.core.kube.diagnostics import (
    COMPLETION_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    REPLICATED_JOB_LABEL,
    newest,
)
from trainflow.core.naming import TRAINER_CONTAINER

if TYPE_CHECKING:
    from trainflow.core.runtimes import Runtime

log = logging.getLogger(__name__)

INITIALIZER_STEPS = ("dataset-initializer", "model-initializer")
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


class LogReader:
    """Reads one step's log through a KubeApi; bounded waits, reconnects without replaying."""

    def __init__(self, api: KubeApi, namespace: str, target: StepTarget, *, pod_wait: float = 120.0) -> None:
        self.api = api
        self.namespace = namespace
        self.target = target
        self.pod_wait = pod_wait
        self.reconnects = 0

    def find_pod(self) -> dict[str, Any] | None:
        return newest(self.api.list_pods(self.namespace, self.target.selector, limit=20))

    def wait_for_pod(self, deadline: float) -> dict[str, Any]:
        """Wait (bounded) until the step's pod exists and its container has started."""
        delay = 0.5
        while True:
            pod = self.find_pod()
            if pod is not None and container_state(pod, self.target.container) in ("running", "terminated"):
                return pod
            if time.time() >= deadline:
                where = f"pod for step {self.target.step!r} ({self.target.selector})"
                found = "exists but its container has not started" if pod else "does not exist yet"
                raise BackendError(f"{where} {found} after {self.pod_wait:.0f}s")
            time.sleep(min(delay, max(0.0, deadline - time.time())))
            delay = min(delay * 1.5, 5.0)

    def read(self, tail_lines: int | None = None) -> Iterator[str]:
        pod = self.find_pod()
        if pod is None:
            raise BackendError(f"no pod for step {self.target.step!r} yet ({self.target.selector})")
        name = str(pod["metadata"]["name"])
        resp = self.api.pod_log(self.namespace, name, self.target.container, tail_lines=tail_lines)
        try:
            for raw in iter_lines(resp):
                yield raw.decode("utf-8", "replace")
        finally:
            resp.release_conn()

    def follow(self, tail_lines: int | None = None, max_reconnects: int = 50) -> Iterator[str]:
        pod = self.wait_for_pod(time.time() + self.pod_wait)
        name = str(pod["metadata"]["name"])
        last_ts: int | None = None
        at_last_ts: set[str] = set()
        attempt = 0
        while True:
            since = None
            if last_ts is not None:
                # whole seconds back from now, with margin for clock skew; older lines are dropped below
                since = max(1, math.ceil(time.time() - last_ts / 1e9) + 2)
            dropped = False
            try:
                resp = self.api.pod_log(
                    self.namespace,
                    name,
                    self.target.container,
                    follow=True,
                    timestamps=True,
                    tail_lines=tail_lines if last_ts is None else None,
                    since_seconds=since,
                )
            except NotFound:  # the pod went away between the look and the open: checked below
                dropped = True
                resp = None
            if resp is not None:
                try:
                    for raw in iter_lines(resp):
                        ts, text = parse_timestamp(raw.decode("utf-8", "replace"))
                        if (
                            ts is not None
                            and last_ts is not None
                            and (ts < last_ts or (ts == last_ts and text in at_last_ts))
                        ):
                            continue
                        if ts is not None:
                            if ts != last_ts:
                                last_ts, at_last_ts = ts, set()
                            at_last_ts.add(text)
                        attempt = 0
                        yield text
                except Exception as exc:
                    if not retry.is_connection_error(exc):
                        raise
                    dropped = True
                finally:
                    resp.release_conn()
            current = self.find_pod()
            if current is None or str(current["metadata"]["name"]) != name:
                return  # pod gone or replaced: that container's log is complete
            if not dropped and container_state(current, self.target.container) == "terminated":
                return
            attempt += 1
            self.reconnects += 1
            if attempt > max_reconnects:
                raise BackendError(
                    f"log stream of {name} kept dropping; gave up after {max_reconnects} reconnects"
                )
            time.sleep(retry.backoff(attempt))
