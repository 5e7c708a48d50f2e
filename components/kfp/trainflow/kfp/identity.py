"""The identity of a KFP step's TrainJob: the same on every retry of one task execution, distinct across executions.

What a step sees, per KFP backend version (docs/kfp.md, "What holds on which KFP backend"):

* its output artifacts under ``<root>/<pipeline>/<run id>/<task>/<uuid>/<artifact>`` from KFP 2.4 on: the driver
  draws the uuid once per task execution (a ``ParallelFor`` iteration, each use of a sub-pipeline) and every
  retry of the step's pod, and a retried run, reuses the driver's executor input;
* ``<root>/<pipeline>/<run id>/<task>/<artifact>`` before 2.4: one folder for every iteration of a loop, every
  use of a sub-pipeline and every task of the same display name;
* kfp.local: ``<root>/<pipeline>-<time>/[<loop>-iteration-<i>/]<task>/<artifact>``, kept across its retries;
* ``{{$.pipeline_job_uuid}}`` / ``{{$.pipeline_task_name}}`` resolved from KFP 2.5 on (verbatim before): the run
  id and the task's key in its DAG, the same for every iteration of a loop and every use of a sub-pipeline.

So the run id and task name never identify a step alone: the folder is combined with them, and a folder that is
not per execution (KFP before 2.4) is never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainflow.kfp.params import resolved

# Set on every step container by KFP's v2 Argo compiler (backend/src/v2/compiler/argocompiler/common.go, since
# 2.0); kfp.local sets neither.
POD_NAME_ENV = "KFP_POD_NAME"
POD_UID_ENV = "KFP_POD_UID"
RUN_ENV, TASK_ENV = "KFP_RUN_ID", "KFP_TASK_NAME"
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass(frozen=True)
class Identity:
    """The identity key (None: none can be formed) and, when the step must say why it is weaker, a warning."""

    key: str | None
    warning: str | None = None


def task_root(artifact_uri: str | None) -> str | None:
    """The folder KFP gives this step's outputs (the parent of one output artifact's URI), or None."""
    uri = resolved(artifact_uri)
    if not uri:
        return None
    parent = uri.rstrip("/").rpartition("/")[0]
    return None if not parent.strip("/") or parent.endswith(":/") else parent


def per_execution(root: str, environ: Mapping[str, str]) -> bool:
    """Is this folder distinct for every task execution? On a KFP backend only with the driver's uuid (2.4+);
    outside one (kfp.local, which lays out loop iterations apart) the folder is taken as it is."""
    return bool(_UUID.match(root.rpartition("/")[2])) or not environ.get(POD_NAME_ENV)


def _label(root: str) -> str:
    """A readable name for the key: the task's folder, above the driver's per-execution uuid."""
    parts = [p for p in root.split("/") if p]
    if len(parts) > 1 and _UUID.match(parts[-1]):
        return parts[-2]
    return parts[-1] if parts else "kfp"


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def step_identity(
    *,
    idempotency_key: str | None,
    run_id: str | None,
    task_name: str | None,
    params: Mapping[str, Any],
    artifact_uri: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Identity:
    """The TrainJob identity of one step execution.

    An ``idempotency_key`` is taken as given. Otherwise the key is a digest of the step's arguments and of its
    output folder, labelled with ``task_name``/``run_id`` (parameters, or ``KFP_TASK_NAME``/``KFP_RUN_ID``) when
    given, else with the task's folder name; without a folder (a call outside KFP) the run id and task name alone.
    A KFP backend before 2.4 gives no per-execution folder: the step's pod then identifies it (a warning says a
    retried run trains again), so two loop iterations never share a TrainJob.
    """
    explicit = resolved(idempotency_key)
    if explicit:
        return Identity(explicit)
    env = os.environ if environ is None else environ
    run = resolved(run_id) or resolved(env.get(RUN_ENV))
    task = resolved(task_name) or resolved(env.get(TASK_ENV))
    root = task_root(artifact_uri)
    if root is None:
        return Identity(f"{task}/{run}/{_digest(params)}" if run and task else None)
    prefix = f"{task}/{run}" if run and task else _label(root)
    if per_execution(root, env):
        return Identity(f"{prefix}/{_digest(params, root)}")
    pod = resolved(env.get(POD_UID_ENV)) or resolved(env.get(POD_NAME_ENV))
    return Identity(
        f"{prefix}/{_digest(params, root, pod)}",
        f"the output folder {root} is not per task execution (a KFP backend before 2.4): loop iterations and "
        "sub-pipelines would share it, so this step's TrainJob is identified by its pod. A retried run trains "
        "again instead of reattaching; upgrade to KFP 2.4 or later, or pass an idempotency_key that is "
        "unique per task execution",
    )
