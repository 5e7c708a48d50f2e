"""The TrainJob page of a task instance (``trainflow.core.job_page``), served by the provider's plugin.

A finished task's page is its XCom result: the state, the ETA and metrics as last reported, and the whole
metrics history its wait recorded. While the task runs, the page reads the task's own TrainJob from the cluster
(or the local engine) through the connection of the task's definition (``task_job``: never one an XCom names,
and only a job carrying the task instance's labels), live: state, progress and ETA, latest metrics, per-node state
and rank 0's log tail, and it reloads itself every few seconds. On a cluster that read needs the web server to
reach the API server with a connection whose account may ``get`` TrainJobs, ``list`` pods and ``get``
``pods/log`` in the job's namespace; without it the page shows what the task's XCom holds and why the live part
is missing. The live page's chart holds the reports the local engine kept, or on a cluster the current one:
the wait in the triggerer or worker records the full history, and the page shows it once the task ended.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from trainflow.airflow.task_job import Definition, TaskKey, owned
from trainflow.core.naming import JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL

LIVE_REFRESH_SECONDS = 5
LOG_TAIL_LINES = 60
XCOM_KEYS = ("return_value", "trainjob_result", "trainjob")


def page_path(base_path: str, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """Where a task instance's TrainJob page is (``base_path``: the web server's path prefix)."""
    parts = "/".join(quote(p, safe="") for p in (dag_id, run_id, task_id))
    return f"{base_path.rstrip('/')}/trainflow/jobs/{parts}?map_index={map_index}"


def task_label(dag_id: str, run_id: str, task_id: str, map_index: int) -> str:
    """How the page names its task instance: ``dag.task[3] of run``."""
    return f"{dag_id}.{task_id}" + (f"[{map_index}]" if map_index >= 0 else "") + f" of {run_id}"


def _final(xcoms: Mapping[str, Any]) -> dict[str, Any] | None:
    """The task's TrainJobResult dict when it ended (the decorator keeps it apart from the return value)."""
    for key in ("trainjob_result", "return_value"):
        value = xcoms.get(key)
        if isinstance(value, dict) and value.get("state") in ("Complete", "Failed") and "namespace" in value:
            return value
    return None


def kube_nodes(backend: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    """One row per pod of the TrainJob's JobSet: its step, phase, readiness, restarts, exit code."""
    from trainflow.core.kube import calls

    raw = backend.api.run(calls.list_pods(namespace, f"{JOBSET_NAME_LABEL}={name}"))
    rows = []
    for pod in (raw or {}).get("items") or []:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        containers = status.get("containerStatuses") or []
        terminated = [(c.get("state") or {}).get("terminated") or {} for c in containers]
        rows.append(
            {
                "name": meta.get("name"),
                "step": (meta.get("labels") or {}).get(REPLICATED_JOB_LABEL),
                "phase": status.get("phase"),
                "ready": f"{sum(bool(c.get('ready')) for c in containers)}/{len(containers)}",
                "restarts": sum(int(c.get("restartCount") or 0) for c in containers),
                "exit_code": next((t.get("exitCode") for t in terminated if t), None),
                "reason": next((t.get("reason") for t in terminated if t), None)
                or (status.get("reason") or None),
            }
        )
    return sorted(rows, key=lambda r: str(r["name"]))


def local_nodes(backend: Any, jref: Any) -> list[dict[str, Any]]:
    """One row per local node process of the job ``jref`` (its namespace's): its rank, whether it runs, its
    exit code."""
    from trainflow.core.local import store

    job = store.JobDir(backend.job_dir(jref))
    rows = []
    for node in store.read_aux(job.nodes) or []:
        if not isinstance(node, Mapping):
            continue
        code, step = node.get("exit_code"), str(node.get("step") or "")
        alive = code is None and store.pid_alive(int(node.get("pid") or 0), node.get("start_time"))
        phase = (
            "Running"
            if alive
            else ("Succeeded" if code == 0 else "Failed" if code is not None else "Pending")
        )
        rows.append(
            {
                "name": step,
                "step": "node" if step.startswith("node-") else step,
                "phase": phase,
                "exit_code": code,
                "reason": node.get("signal") or ("stopped" if node.get("stopped") else None),
            }
        )
    return rows


def live(backend: Any, jref: Any) -> tuple[Any, list[dict[str, Any]] | None, list[str], list[str]]:
    """(result, nodes, log tail, notes) of the task's own job (``task_job.owned``), read now; what fails is a
    note."""
    notes: list[str] = []
    if backend.is_local:  # the local engine keeps every report: one look replays them into a history
        seen: list[Any] = []
        ending = backend.wait_ending(jref, timeout=0.3, diagnose=False, on_update=seen.append)
        result = ending.result or (seen[-1] if seen else backend.get(jref))
    else:
        result = backend.get(jref)
        notes.append("Live from the cluster: the chart holds the current report; the wait records the rest.")
    nodes: list[dict[str, Any]] | None = None
    try:
        nodes = (
            local_nodes(backend, jref) if backend.is_local else kube_nodes(backend, jref.namespace, jref.name)
        )
    except Exception as exc:
        notes.append(f"Nodes not shown: {type(exc).__name__}: {exc}")
    tail: list[str] = []
    try:
        tail = list(backend.logs(jref, tail_lines=LOG_TAIL_LINES))
    except Exception as exc:
        notes.append(f"Rank 0's log not shown: {type(exc).__name__}: {exc}")
    return result, nodes, tail, notes


NOT_ITS_JOB = (
    "Task {task}: the TrainJob its XCom names is not this task instance's (it does not carry its labels, or "
    "its connection does not find it). Nothing of it is shown."
)
READ_FAILED = (
    "Task {task} is running. {what}; docs/airflow.md (The TrainJob page) says what the web server needs."
)


def render_page(
    key: TaskKey, xcoms: Mapping[str, Any], definition: Definition | None, now: float | None = None
) -> tuple[int, str]:
    """(HTTP status, HTML) of the page of one task instance: its XCom result once it ended; while it runs, its
    own TrainJob read live through its definition's connection (``task_job``), never one only an XCom names.
    ``definition``: ``task_job.task_connection``'s answer (None: no such task instance)."""
    from trainflow.airflow.hooks import TrainJobHook
    from trainflow.core import job_page
    from trainflow.core.result import TrainJobResult

    task = task_label(*key)
    if definition is None:
        return 404, _message(f"There is no task instance {task}.")
    final, ref = _final(xcoms), xcoms.get("trainjob")
    if final is not None:
        result = TrainJobResult.from_dict(final)
        note = f"Task {task}: the result its wait recorded (XCom)."
        return 200, job_page.render(result, notes=[note], now=now)
    if not isinstance(ref, dict) or not ref.get("name"):
        return 404, _message(f"Task {task} has no TrainJob (yet): it records one when it submits it.")
    if not definition.known:
        what = (
            "Its connection cannot be told from its definition (a template not rendered yet, or a task no longer "
            "in its DAG), so nothing is read live"
        )
        return 200, _message(READ_FAILED.format(task=task, what=what))
    try:  # the connection's own problems (no secret is in them): say which
        backend = TrainJobHook(definition.conn_id).get_backend()
    except Exception as exc:
        what = f"The web server could not use the task's connection ({type(exc).__name__}: {exc})"
        return 200, _message(READ_FAILED.format(task=task, what=what))
    try:  # before the job is known to be the task's, an error names only its kind
        jref = owned(backend, key, str(ref["name"]), str(ref.get("namespace") or backend.namespace))
        if jref is None:
            return 403, _message(NOT_ITS_JOB.format(task=task))
        result, nodes, tail, notes = live(backend, jref)
        if jref.uid and result.uid and result.uid != jref.uid:  # replaced since its labels were read
            return 403, _message(NOT_ITS_JOB.format(task=task))
    except Exception as exc:  # no RBAC, an unreachable server
        what = f"The web server could not read its TrainJob ({type(exc).__name__})"
        return 200, _message(READ_FAILED.format(task=task, what=what))
    refresh = None if result.state.terminal else LIVE_REFRESH_SECONDS
    notes = [f"Task {task} is running; read live at {time.strftime('%H:%M:%S')}.", *notes]
    return 200, job_page.render(
        result, nodes=nodes, log_tail=tail, notes=notes, refresh_seconds=refresh, now=now
    )


def _message(text: str) -> str:
    from html import escape

    return f'<!DOCTYPE html><html lang="en"><meta charset="utf-8"><title>TrainJob</title><p>{escape(text)}</p></html>'


def xcom_values(session: Any, dag_id: str, run_id: str, task_id: str, map_index: int) -> dict[str, Any]:
    """The task instance's XComs this page reads, straight from the metadata database (as the UI does)."""
    from airflow.models.xcom import XComModel

    out: dict[str, Any] = {}
    for key in XCOM_KEYS:
        query = XComModel.get_many(
            run_id=run_id, key=key, task_ids=task_id, dag_ids=dag_id, map_indexes=map_index, limit=1
        )
        row = session.scalars(query).first()
        if row is None:
            continue
        value = row[0].value if isinstance(row, tuple) else row.value
        try:
            out[key] = json.loads(value) if isinstance(value, str | bytes) else value
        except ValueError:
            out[key] = value
    return out
