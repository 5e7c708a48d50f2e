"""Why a TrainJob failed or is stuck, and rank 0's reported metrics, from its pods, events and log.

The reads are plans (``kube/plan.py``): the same steps run on the sync client or on an event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from trainflow.core.errors import Diagnostics
from trainflow.core.failure_lines import condense
from trainflow.core.kube import calls
from trainflow.core.kube.calls import Call
from trainflow.core.kube.plan import Plan
from trainflow.core.naming import (
    JOBSET_NAME_LABEL as JOBSET_NAME_LABEL,  # its home; the log modules read it here
)
from trainflow.core.naming import REPLICATED_JOB_LABEL

log = logging.getLogger(__name__)

COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
CREATION_FAILED_REASON = "TrainJobResourcesCreationFailed"
# The Trainer's initializer steps: each runs one container named as the step. A failed one is the job's root
# cause (the trainer never started), so its log tail is the one a failure shows.
INITIALIZER_STEPS = ("dataset-initializer", "model-initializer")

WAITING_REASONS = frozenset(
    {
        "ImagePullBackOff",
        "ErrImagePull",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "InvalidImageName",
        "RunContainerError",
    }
)
# Waiting states a pod does not leave by itself: the kubelet retries a pull that cannot succeed, a config
# that is missing. With Unschedulable they fail a wait after the backend's ``pod_stuck_timeout``.
STUCK_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
MAX_TEXT = 300
MAX_LINES = 20
# a failed rank's log is read this far back (bounded), then condensed to the tail the error shows
READ_LINES, READ_BYTES = 400, 65536
UNRETRIEVABLE = "unable to retrieve container logs for "  # the kubelet's answer for a log it no longer has


def _short(text: Any, limit: int = MAX_TEXT) -> str:
    s = " ".join(str(text or "").split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _statuses(pod: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    status = pod.get("status") or {}
    for key, kind in (("initContainerStatuses", "init container"), ("containerStatuses", "container")):
        for cs in status.get(key) or []:
            if isinstance(cs, Mapping):
                yield kind, cs


def pod_label(pod: Mapping[str, Any], key: str) -> str | None:
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(key)
    return str(value) if value is not None else None


def pod_problems(pods: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """(problem lines, failed containers) from pod dicts as the API returns them (camelCase)."""
    problems: list[str] = []
    failed: list[dict[str, Any]] = []
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name", "?"))
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and str(cond.get("status")) == "False":
                problems.append(
                    f"pod {name}: not scheduled ({cond.get('reason') or 'Unschedulable'}): {_short(cond.get('message'))}"
                )
        for kind, cs in _statuses(pod):
            cname = cs.get("name", "?")
            state = cs.get("state") or {}
            waiting = state.get("waiting") or {}
            if waiting.get("reason") in WAITING_REASONS:
                problems.append(
                    f"pod {name} {kind} {cname}: {waiting['reason']}: {_short(waiting.get('message'))}"
                )
            # restarted in place (restartPolicy OnFailure): the crash is the last state, its log the previous one
            restarted = not state.get("terminated") and bool((cs.get("lastState") or {}).get("terminated"))
            terminated = state.get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
            code = terminated.get("exitCode")
            if terminated and (code not in (0, None) or terminated.get("reason") == "OOMKilled"):
                entry: dict[str, Any] = {
                    "pod": name,
                    "container": cname,
                    "exit_code": code,
                    "reason": terminated.get("reason") or "Error",
                }
                rank = pod_label(pod, COMPLETION_INDEX_LABEL)
                if rank is not None:
                    entry["rank"] = rank
                job = pod_label(pod, REPLICATED_JOB_LABEL)
                if job is not None:
                    entry["step"] = job
                if terminated.get("message"):
                    entry["message"] = _short(terminated["message"])
                if restarted:
                    entry["restarted"] = True
                failed.append(entry)
                if terminated.get("reason") == "OOMKilled":
                    problems.append(
                        f"pod {name} {kind} {cname}: OOMKilled (exit code {code}); raise the memory limit"
                    )
        if status.get("phase") == "Failed" and status.get("reason"):
            problems.append(f"pod {name}: {status['reason']}: {_short(status.get('message'))}")
    return problems[:MAX_LINES], failed[:MAX_LINES]


def stuck_reason(pods: Iterable[Mapping[str, Any]], now: float, after: float) -> tuple[str, str] | None:
    """(reason, detail) of the first pod older than ``after`` s that is unschedulable or cannot start its
    containers (STUCK_WAITING_REASONS), else None."""
    for pod in pods:
        meta = pod.get("metadata") or {}
        try:
            created = datetime.fromisoformat(str(meta.get("creationTimestamp")).replace("Z", "+00:00"))
        except ValueError:
            continue
        if now - created.timestamp() < after:
            continue
        name = str(meta.get("name", "?"))
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if (
                cond.get("type") == "PodScheduled"
                and str(cond.get("status")) == "False"
                and cond.get("reason") == "Unschedulable"
            ):
                return "Unschedulable", f"pod {name} not scheduled: {_short(cond.get('message'))}"
        for kind, cs in _statuses(pod):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK_WAITING_REASONS:
                return (
                    str(waiting["reason"]),
                    f"pod {name} {kind} {cs.get('name', '?')}: {_short(waiting.get('message'))}",
                )
    return None


def event_lines(events: Iterable[Mapping[str, Any]], names: set[str] | None = None) -> list[str]:
    """Warning events (newest last) as ``Kind/name Reason: message`` lines, deduplicated and bounded."""
    rows: list[tuple[str, str]] = []
    seen: set[str] = set()
    for ev in events:
        if ev.get("type") != "Warning":
            continue
        obj = ev.get("involvedObject") or ev.get("regarding") or {}
        if names is not None and obj.get("name") not in names:
            continue
        when = str(ev.get("lastTimestamp") or ev.get("eventTime") or ev.get("firstTimestamp") or "")
        line = f"{obj.get('kind', '?')}/{obj.get('name', '?')} {ev.get('reason')}: {_short(ev.get('message') or ev.get('note'))}"
        count = ev.get("count")
        if isinstance(count, int) and count > 1:
            line += f" (x{count})"
        if line not in seen:
            seen.add(line)
            rows.append((when, line))
    rows.sort(key=lambda r: r[0])
    return [line for _, line in rows][-MAX_LINES:]


def has_creation_failure(events: Iterable[Mapping[str, Any]]) -> bool:
    return any(ev.get("type") == "Warning" and ev.get("reason") == CREATION_FAILED_REASON for ev in events)


def _trainjob_events(namespace: str, name: str) -> Call:
    return calls.list_events(namespace, f"involvedObject.kind=TrainJob,involvedObject.name={name}")


def items(answer: Any) -> list[dict[str, Any]]:
    """The items of a list answer."""
    return list((answer or {}).get("items") or []) if isinstance(answer, dict) else []


def creation_failure(namespace: str, name: str) -> Plan[Diagnostics | None]:
    """The TrainJob's creation-failure events (the JobSet could not be made), or None. One events LIST."""
    try:
        events = items((yield _trainjob_events(namespace, name)))
    except Exception as exc:
        log.debug("events of %s/%s: %r", namespace, name, exc)
        return None
    if not has_creation_failure(events):
        return None
    return Diagnostics(events=event_lines(events, {name}))


def collect(
    namespace: str, name: str, *, log_container: str = "node", tail_lines: int = 20
) -> Plan[Diagnostics]:
    """Diagnostics for one TrainJob: one pod list, at most one log tail, two event lists. Never raises.

    The log comes right after the pod list: a failed Job's pods (and their logs) are deleted within seconds,
    events stay."""
    diag = Diagnostics()
    pods: list[dict[str, Any]] = []
    try:
        pods = items((yield calls.list_pods(namespace, f"{JOBSET_NAME_LABEL}={name}")))
        diag.pod_problems, diag.failed_ranks = pod_problems(pods)
    except Exception as exc:  # diagnostics are best effort
        log.debug("listing pods of %s/%s failed: %r", namespace, name, exc)
    diag.log_tail = yield from _failed_log_tail(namespace, diag.failed_ranks, log_container, tail_lines)
    try:
        events = items((yield _trainjob_events(namespace, name)))
        pod_names = {str((p.get("metadata") or {}).get("name")) for p in pods}
        if pod_names:
            events += items((yield calls.list_events(namespace, "involvedObject.kind=Pod,type=Warning")))
        diag.events = event_lines(events, {name, *pod_names})
    except Exception as exc:
        log.debug("listing events of %s/%s failed: %r", namespace, name, exc)
    return diag


def _failed_log_tail(
    namespace: str, failed_ranks: list[dict[str, Any]], log_container: str, tail_lines: int
) -> Plan[str]:
    """The log tail of the first failed trainer or initializer container ("" when there is none or it is gone), read
    long enough that a rank's traceback survives torchrun's own report below it (``condense``)."""
    logged = (log_container, *INITIALIZER_STEPS)
    failed = next((r for r in failed_ranks if r.get("container") in logged), None)
    if failed is None:
        return ""
    # a container seen terminated may be restarted in place before its log is read: the crash is then the
    # previous instance's, and the kubelet answers for the new one "unable to retrieve container logs"
    for previous in (True,) if failed.get("restarted") else (False, True):
        try:
            text = yield calls.pod_log(
                namespace,
                failed["pod"],
                str(failed["container"]),
                tail_lines=READ_LINES,
                limit_bytes=READ_BYTES,
                previous=previous,
            )
        except Exception as exc:
            log.debug("log tail of %s (previous=%s) failed: %r", failed["pod"], previous, exc)
            continue
        if not str(text).startswith(UNRETRIEVABLE):
            return "\n".join(condense(str(text).splitlines(), tail_lines))
    return ""


def crash_of(namespace: str, pod: Mapping[str, Any], tail_lines: int = 20) -> Plan[Diagnostics]:
    """What a crashed pod shows (handed over by the pod watch): its failed containers, and the trainer's log
    tail, read now with one request, before the Job deletes the pod."""
    diag = Diagnostics()
    diag.pod_problems, diag.failed_ranks = pod_problems([pod])
    diag.log_tail = yield from _failed_log_tail(namespace, diag.failed_ranks, "node", tail_lines)
    return diag


def keep_first_crash(captured: list[Diagnostics], diag: Diagnostics | None) -> None:
    """Remember the first crash seen while the job ran: its root cause (ranks failing after it were often killed
    by the teardown it set off). A later look may only add that same pod's log tail."""
    if diag is None or not diag.failed_ranks:
        return
    if not captured:
        captured.append(diag)
    elif not captured[0].log_tail and diag.log_tail and _first_pod(diag) == _first_pod(captured[0]):
        captured[0].log_tail = diag.log_tail


def with_first_crash(diag: Diagnostics, captured: Diagnostics | None) -> Diagnostics:
    """The look after the end, with the crash captured while the job ran named first (its pod may be gone)."""
    if captured is None or not captured.failed_ranks:
        return diag
    known = {(r.get("pod"), r.get("container")) for r in captured.failed_ranks}
    later = [r for r in diag.failed_ranks if (r.get("pod"), r.get("container")) not in known]
    same_pod = _first_pod(diag) == _first_pod(captured)
    diag.log_tail = captured.log_tail or (diag.log_tail if same_pod else "")
    diag.failed_ranks = [*captured.failed_ranks, *later]
    return diag


def _first_pod(diag: Diagnostics) -> Any:
    return diag.failed_ranks[0].get("pod") if diag.failed_ranks else None


def inspect_pods(
    namespace: str, name: str, now: float, stuck_after: float
) -> Plan[tuple[tuple[str, str] | None, Diagnostics | None]]:
    """One look at a job's pods while some are not ready: (stuck reason and detail, diagnostics).

    Stuck: a pod unschedulable or unable to start its containers for ``stuck_after`` seconds. Diagnostics are
    collected now when a pod is stuck or a container crashed, while the pods and their logs still exist.
    """
    try:
        pods = items((yield calls.list_pods(namespace, f"{JOBSET_NAME_LABEL}={name}")))
    except Exception as exc:
        log.debug("pods of %s/%s: %r", namespace, name, exc)
        return None, None
    stuck = stuck_reason(pods, now, stuck_after)
    if stuck is None and not pod_problems(pods)[1]:
        return None, None
    return stuck, (yield from collect(namespace, name))


def rank0_log_tail(namespace: str, name: str, tail_lines: int) -> Plan[list[str]]:
    """Best effort: the tail of rank 0's log (a pod LIST and a log read; [] when there is none)."""
    selector = (
        f"{JOBSET_NAME_LABEL}={name},{REPLICATED_JOB_LABEL} in (launcher,node),{COMPLETION_INDEX_LABEL}=0"
    )
    try:
        pods = items((yield calls.list_pods(namespace, selector, limit=10)))
        launcher = [p for p in pods if pod_label(p, REPLICATED_JOB_LABEL) == "launcher"]
        pod = newest(launcher or pods)  # MPI: rank 0 is the launcher
        if pod is None:
            return []
        text = yield calls.pod_log(
            namespace, str(pod["metadata"]["name"]), "node", tail_lines=tail_lines, limit_bytes=1 << 20
        )
    except Exception as exc:
        log.debug("no log tail of %s/%s: %r", namespace, name, exc)
        return []
    return str(text).splitlines()


def newest(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """After restarts several pods match a step: the newest one holds the current log."""
    if not pods:
        return None
    return max(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
