"""Which process publishes a trainer's ``s3://`` output, and how the nodes of a multi-node job publish one model.

One node (or a job whose nodes the launcher does not number): global rank 0 publishes its ``output_dir()`` as one
transaction (``storage.upload``). Several torch nodes (``PET_NNODES`` > 1) publishing every node's output (the
function trainer's wrapper; ``every_node=True``): local rank 0 of each node writes its node's files under the
job attempt's shared sub-prefix and a part list (``trainflow-parts/<attempt>/node-<i>.json``); node 0 then waits
for every node's part, merges them into one file set (a sharded checkpoint's per-rank files side by side, as
torch DCP and DeepSpeed write them to a shared directory) and commits the manifest. docs/artifacts.md.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainflow.core import artifact, storage
from trainflow.core.reporting import OUTPUT_ENV, is_rank0, staging_dir

PARTS = "trainflow-parts"
WAIT_ENV = "TRAINFLOW_PUBLISH_WAIT_SECONDS"
DEFAULT_WAIT = 6 * 3600.0  # a hang detector: a node that died fails the job, which ends node 0's wait first
POLL = 1.0
LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def node_position(env: Mapping[str, str]) -> tuple[int, int]:
    """(this node's index, the job's node count) as the torch launcher numbers them; (0, 1) otherwise."""
    try:
        index, count = int(env.get("PET_NODE_RANK", "0")), int(env.get("PET_NNODES", "1"))
    except ValueError:
        return 0, 1
    return (index, count) if 0 <= index < count else (0, 1)


def is_local_rank0(env: Mapping[str, str]) -> bool:
    for name in LOCAL_RANK_VARS:
        value = (env.get(name) or "").strip()
        if value:
            return value == "0"
    return True


def job_attempt(env: Mapping[str, str]) -> str | None:
    """The attempt name every node of one run of the job derives alike: the job's uid and restart attempt."""
    job = artifact.job_identity(env)
    run = job["uid"] or job["name"]  # Kubernetes: the TrainJob's (JobSet's) name; the local engine: its uid
    if not run:
        return None
    name = _UNSAFE.sub("-", f"{run}-{job['attempt'] or '0'}")[:120]
    return name if artifact.ATTEMPT_ID.match(name) else None


def _part_key(prefix: str, attempt: str, index: int) -> str:
    return f"{prefix}/{PARTS}/{attempt}/node-{index}.json"


def _source(directory: Path | None) -> Path | None:
    source = staging_dir(create=False) if directory is None else directory
    return source if source is not None and source.is_dir() else None


def publish_output(
    env: Mapping[str, str] | None = None, directory: Path | None = None, *, every_node: bool = False
) -> list[str]:
    """Publish ``directory`` (default: what ``output_dir()`` staged) to the ``s3://`` output URI; returns the files
    this process published. Nothing to do for a local output URI or a process that does not publish.

    ``every_node``: every node of a multi-node job contributes its files (call it on every process; each node's
    local rank 0 publishes); otherwise rank 0 alone publishes, as for a checkpoint gathered on rank 0."""
    env = os.environ if env is None else env
    uri = env.get(OUTPUT_ENV, "")
    if not storage.is_object_uri(uri):
        return []
    index, count = node_position(env)
    if every_node and count > 1:
        return _publish_node(env, uri, directory, index, count) if is_local_rank0(env) else []
    if not is_rank0():
        return []
    source = _source(directory)
    if source is None:
        where = "trainflow.core.output_dir()" if directory is None else str(directory)
        raise storage.StorageError(f"{where} is missing: nothing to publish to {uri}; write the model there")
    t0 = time.monotonic()
    files = storage.upload(source, uri, env)
    print(f"trainflow: published {len(files)} file(s) to {uri} in {time.monotonic() - t0:.1f}s", flush=True)
    return files


def _publish_node(
    env: Mapping[str, str], uri: str, directory: Path | None, index: int, count: int
) -> list[str]:
    attempt = job_attempt(env)
    if attempt is None:
        raise storage.StorageError(
            f"node {index} of {count}: a multi-node s3:// output needs the job's identity "
            f"({artifact.JOB_ENV['name']}, {artifact.JOB_ENV['attempt']}), which trainflow sets on the trainer; "
            "publish from rank 0 instead"
        )
    bucket, prefix = storage.split(uri)
    op = storage.operator(bucket, env)
    source = _source(directory)
    files = storage.local_files(source) if source is not None else []
    entries = storage.put_files(op, uri, prefix, attempt, files, env)
    part = json.dumps({"node": index, "files": entries}).encode()
    try:
        op.write(_part_key(prefix, attempt, index), part)
    except Exception as e:
        storage.delete_quietly(op, [artifact.file_key(prefix, attempt, e["path"]) for e in entries])
        raise storage.StorageError(f"node {index}: writing its part list to {uri} failed: {e}") from None
    print(f"trainflow: node {index} of {count} wrote {len(entries)} file(s) under {uri}", flush=True)
    if index == 0:
        _commit_nodes(op, env, uri, prefix, attempt, count)
    return [e["path"] for e in entries]


def _commit_nodes(op: Any, env: Mapping[str, str], uri: str, prefix: str, attempt: str, count: int) -> None:
    """On node 0: wait for every node's part, merge them, commit the manifest."""
    wait = float(env.get(WAIT_ENV) or DEFAULT_WAIT)
    deadline, t0 = time.monotonic() + wait, time.monotonic()
    parts: dict[int, list[dict[str, Any]]] = {}
    while len(parts) < count:
        for i in range(count):
            if i not in parts:
                try:
                    data = json.loads(bytes(op.read(_part_key(prefix, attempt, i))))
                except Exception as e:
                    if not storage.not_found(e):
                        raise storage.StorageError(
                            f"reading node {i}'s part list under {uri} failed: {e}"
                        ) from None
                    continue
                parts[i] = list(data.get("files") or [])
        if len(parts) < count:
            if time.monotonic() > deadline:
                missing = sorted(set(range(count)) - set(parts))
                raise storage.StorageError(
                    f"{uri}: node(s) {missing} published no part within {wait:.0f}s ({WAIT_ENV}): nothing committed"
                )
            time.sleep(POLL)
    merged: dict[str, dict[str, Any]] = {}
    owner: dict[str, int] = {}
    for i in sorted(parts):
        for entry in parts[i]:
            path = str(entry.get("path"))
            if path in merged and merged[path]["sha256"] != entry.get("sha256"):
                storage.delete_quietly(op, storage.attempt_keys(op, prefix, attempt))
                raise storage.StorageError(
                    f"{uri}: nodes {owner[path]} and {i} both wrote {path!r} with different content: give each "
                    "node's files their own names (as sharded checkpoints do); nothing committed"
                )
            merged[path], owner[path] = dict(entry), i
    if not merged:  # as on one node: nothing staged, nothing published
        storage.delete_quietly(op, [_part_key(prefix, attempt, i) for i in range(count)])
        print(f"trainflow: no node wrote to output_dir(): nothing published to {uri}", flush=True)
        return
    storage.commit(op, uri, prefix, attempt, [merged[p] for p in sorted(merged)], env)
    storage.delete_quietly(op, [_part_key(prefix, attempt, i) for i in range(count)])
    print(
        f"trainflow: published {len(merged)} file(s) from {count} nodes to {uri} "
        f"({time.monotonic() - t0:.1f}s waiting for the other nodes)",
        flush=True,
    )
