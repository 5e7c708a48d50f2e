"""Why a local job failed: the failed nodes (exit code, signal, torchrun's failing rank) and a log tail."""

from __future__ import annotations

from typing import Any

from trainflow.core.errors import Diagnostics
from trainflow.core.failure_lines import condense
from trainflow.core.local import store

LOG_TAIL_LINES = 30
ENGINE_REASONS = ("SupervisorLost", "LocalEngineError", "StartError", "SecretNotFound")


def diagnose(job: store.JobDir, reason: str) -> Diagnostics:
    """Diagnostics of one local job from its nodes file and logs; ``reason`` is the Failed condition's."""
    diag = Diagnostics()
    nodes: list[dict[str, Any]] = store.read_aux(job.nodes) or []
    failed = [n for n in nodes if n.get("exit_code") not in (None, 0) and not n.get("stopped")]
    for node in failed:
        entry = {
            k: node[k] for k in ("node", "step", "exit_code", "signal", "pid") if node.get(k) is not None
        }
        entry.update(store.torchrun_failure(store.tail_lines(job.log(str(node.get("step"))), 200)))
        diag.failed_ranks.append(entry)
    if failed:
        step = str(failed[0].get("step"))
    elif reason in ENGINE_REASONS:
        step = "supervisor"
    elif any(n.get("step") == "node-0" for n in nodes) or not nodes:
        step = "node-0"
    else:
        step = str(nodes[0].get("step"))
    lines = condense(store.tail_lines(job.log(step), 400), LOG_TAIL_LINES)
    if lines:
        diag.log_tail = f"[{step}]\n" + "\n".join(lines)
    return diag
