"""LocalBackend: the Backend interface over the embedded local engine (no Kubernetes).

Requests go through ``build_trainjob`` exactly as on the cluster; the engine then runs the *manifest*
(``spec.trainer`` command/args/env/numNodes/numProcPerNode, else the runtime container's command) under
the runtime's ML policy. ``image`` is ignored locally: the trainer runs with this machine's Python (its
bin directory first on PATH), so the image's contents must be installed here. Each job gets a detached
supervisor and a state directory under ``<home>/jobs/<namespace>/<name>/`` that any process can read.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from trainflow.core.backend import UpdateCallback, as_ref, resolve_deadline
from trainflow.core.errors import (
    Diagnostics,
    InvalidRequest,
    TrainJobConflict,
    TrainJobFailed,
    TrainJobNotFound,
    WaitTimeout,
)
from trainflow.core.local import policies, store, supervisor
from trainflow.core.manifest import build_trainjob
from trainflow.core.naming import ATTEMPT_LABEL, KEY_LABEL, MANAGED_BY_LABEL
from trainflow.core.request import TrainJobRequest
from trainflow.core.result import (
    OUTPUT_URI_ANNOTATION,
    JobRef,
    JobState,
    TrainJobResult,
    result_from_trainjob,
)
from trainflow.core.runtimes import Runtime, find_runtime, local_catalog
from trainflow.core.validation import immutable_differences, parse_request

NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
POLL_SECONDS = 0.05
SPAWN_GRACE_SECONDS = 30.0
CANCEL_GRACE_SECONDS = 10.0
LOG_TAIL_LINES = 30
IDENTITY_KEYS = (MANAGED_BY_LABEL, KEY_LABEL, ATTEMPT_LABEL)

_GLOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")


def _condense(lines: list[str], keep: int) -> list[str]:
    """A log tail without torchrun's own noise (agent warnings, the launcher's traceback), so the ranks'
    output and torchrun's failure report both fit."""
    out: list[str] = []
    skipping = False
    for index, line in enumerate(lines):
        if skipping:
            if "ChildFailedError" in line and not line.startswith(" "):
                skipping = False
            continue
        launcher_traceback = line.startswith("Traceback (most recent call last):") and any(
            "torch/distributed/run.py" in later for later in lines[index : index + 8]
        )
        if launcher_traceback:
            skipping = True
            continue
        if _GLOG.match(line):
            continue
        out.append(line)
    return out[-keep:]


class LocalBackend:
    """Runs TrainJobs on this machine; state lives in files, so any process can get/wait/logs/cancel by name."""

    name = "local"

    def __init__(
        self,
        home: str | os.PathLike[str] | None = None,
        namespace: str | None = None,
        *,
        poll_interval: float = POLL_SECONDS,
        cancel_grace_seconds: float = CANCEL_GRACE_SECONDS,
    ) -> None:
        self.home = Path(home).expanduser() if home is not None else store.default_home()
        self.namespace = namespace or "default"
        if not NAME.match(self.namespace) or len(self.namespace) > 63:
            raise InvalidRequest.one(
                "namespace", f"{self.namespace!r} is not a valid namespace", "lowercase a-z, 0-9, '-'"
            )
        self.poll_interval = min(max(poll_interval, 0.01), 0.2)
        self.cancel_grace_seconds = cancel_grace_seconds

    # --- runtimes and rendering -------------------------------------------------------------------

    def runtimes(self) -> list[Runtime]:
        return list(local_catalog())

    def get_runtime(self, name: str, kind: str = "ClusterTrainingRuntime") -> Runtime:
        return find_runtime(local_catalog(), name, kind)

    def _render(
        self, request: TrainJobRequest | Mapping[str, Any], attempt: int = 1
    ) -> tuple[dict[str, Any], Runtime]:
        req = parse_request(request)
        runtime = self.get_runtime(req.runtime, req.runtime_kind)
        local_init: dict[str, str] = {}
        update: dict[str, Any] = {}
        for key in ("dataset", "model"):
            uri = getattr(req, f"{key}_uri")
            if uri and uri.lower().startswith("file://"):
                if policies.local_path(uri) is None:
                    raise InvalidRequest.one(
                        f"{key}_uri", f"{uri!r} is not file:///absolute/path", "use file:///abs/path"
                    )
                if getattr(req, f"{key}_secret"):
                    raise InvalidRequest.one(f"{key}_secret", "is not used for file:// URIs", "remove it")
                local_init[key] = uri
                update[f"{key}_uri"] = None
        if update:
            req = req.model_copy(update=update)
        manifest = build_trainjob(req, runtime, namespace=self.namespace, attempt=attempt)
        if local_init:  # file:// initializers exist only locally; the cluster validation path rejects them
            init = manifest["spec"].setdefault("initializer", {})
            for key, uri in local_init.items():
                init[key] = {"storageUri": uri}
        return manifest, runtime

    def render(self, request: TrainJobRequest | Mapping[str, Any], *, attempt: int = 1) -> dict[str, Any]:
        return self._render(request, attempt)[0]

    # --- paths ------------------------------------------------------------------------------------

    def _ref(self, ref: JobRef | str) -> JobRef:
        jref = as_ref(ref, self.namespace)
        if not (NAME.match(jref.name) and NAME.match(jref.namespace)):
            raise TrainJobNotFound(jref.namespace, jref.name)
        return jref

    def _job(self, ref: JobRef | str) -> tuple[JobRef, store.JobDir]:
        jref = self._ref(ref)
        return jref, store.JobDir(self.home / "jobs" / jref.namespace / jref.name)

    def job_dir(self, ref: JobRef | str) -> Path:
        """The state directory of one job (for tools and tests; its layout is described in ``store``)."""
        return self._job(ref)[1].root

    # --- submit -----------------------------------------------------------------------------------

    def submit(
        self, request: TrainJobRequest | Mapping[str, Any], *, dry_run: bool = False, attempt: int = 1
    ) -> JobRef:
        manifest, runtime = self._render(request, attempt)
        meta = manifest["metadata"]
        namespace = meta.get("namespace") or self.namespace
        meta["namespace"] = namespace
        jref, job = self._job(JobRef(name=meta["name"], namespace=namespace))
        try:
            cwd: str | None = os.getcwd()  # the trainer runs where the caller is (relative paths work)
        except FileNotFoundError:
            cwd = str(job.root / "workspace")
        plan = policies.make_plan(manifest, runtime, home=self.home, jobdir=job.root, cwd=cwd)
        if dry_run:
            return jref
        existing = job.read()
        if existing is not None:
            return self._adopt(existing, manifest, jref)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = store.now_iso()
        meta.setdefault("annotations", {})[OUTPUT_URI_ANNOTATION] = plan["output_uri"]
        manifest["status"] = {}
        job.root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{jref.name}.", dir=job.root.parent))
        try:
            (staging / store.LOGS_DIR).mkdir()
            store.write_json(staging / store.PLAN_FILE, plan)
            store.write_json(staging / store.TRAINJOB_FILE, manifest)
            try:
                os.rename(staging, job.root)  # atomic publish; fails if the name is taken meanwhile
            except OSError:
                existing = job.read()
                if existing is None:
                    raise
                return self._adopt(existing, manifest, jref)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        self._spawn(job)
        return JobRef(name=jref.name, namespace=namespace, uid=meta["uid"])

    def _adopt(self, existing: dict[str, Any], wanted: dict[str, Any], jref: JobRef) -> JobRef:
        old_labels = (existing.get("metadata") or {}).get("labels") or {}
        new_labels = (wanted.get("metadata") or {}).get("labels") or {}
        old_id = {k: old_labels.get(k) for k in IDENTITY_KEYS}
        new_id = {k: new_labels.get(k) for k in IDENTITY_KEYS}
        if old_id != new_id:
            raise TrainJobConflict(
                f"TrainJob {jref} already exists with identity {old_id}, not {new_id}; "
                "choose another name or idempotency_key, or cancel the existing job"
            )
        if not new_labels.get(KEY_LABEL):
            differences = immutable_differences(existing, wanted)
            if differences:
                raise TrainJobConflict(
                    f"TrainJob {jref} already exists with a different {', '.join(differences)}; "
                    "choose another name, or cancel the existing job first"
                )
        uid = (existing.get("metadata") or {}).get("uid")
        job = self._job(jref)[1]
        never_started = (
            not job.supervisor.exists() and not self._spawn_alive(job) and not job.supervisor_alive()
        )
        if never_started and not store.is_terminal(existing) and not job.spawn.exists():
            self._spawn(job)  # the first submitter died between creating the job and starting it
        return JobRef(name=jref.name, namespace=jref.namespace, uid=uid)

    def _spawn(self, job: store.JobDir) -> None:
        env = policies.base_env(dict(os.environ))
        with open(job.log("supervisor"), "ab") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    supervisor.BOOTSTRAP,
                    str(job.root),
                    str(Path(store.__file__).parents[1]),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        store.write_json(job.spawn, {"pid": proc.pid, "start_time": store.proc_start_time(proc.pid)})
        # reap it when it exits (it is our child until we exit), so it never lingers as a zombie
        threading.Thread(target=proc.wait, name=f"trainflow-reap-{proc.pid}", daemon=True).start()

    # --- state ------------------------------------------------------------------------------------

    def _starting(self, job: store.JobDir, obj: dict[str, Any]) -> bool:
        """The supervisor was spawned but has not taken its lock yet."""
        if job.supervisor.exists():
            return False
        spawn = store.read_json(job.spawn)
        if isinstance(spawn, dict):
            return store.pid_alive(int(spawn["pid"]), spawn.get("start_time"))
        created = result_from_trainjob(obj).created_at
        return created is None or time.time() - created.timestamp() < SPAWN_GRACE_SECONDS

    def _read(self, job: store.JobDir, jref: JobRef) -> dict[str, Any]:
        obj = job.read()
        if obj is None:
            raise TrainJobNotFound(jref.namespace, jref.name)
        if not store.is_terminal(obj) and not job.supervisor_alive() and not self._starting(job, obj):
            obj = self._mark_lost(job, jref)
        metrics = job.read_metrics()
        trainer_status = store.trainer_status(metrics)
        if trainer_status:
            obj.setdefault("status", {})["trainerStatus"] = trainer_status
        return obj

    def _mark_lost(self, job: store.JobDir, jref: JobRef) -> dict[str, Any]:
        """The supervisor died without finishing: stop what it left running and record the failure."""
        try:
            with job.update() as obj:
                if store.is_terminal(obj) or job.supervisor_alive():
                    return obj  # it finished (or started) between our two looks
                uid = str(obj["metadata"].get("uid", ""))
                self._kill_nodes(job, uid)
                tail = " | ".join(store.tail_lines(job.log("supervisor"), 3))
                message = "the local supervisor process died; its nodes were stopped"
                if tail:
                    message += f" (supervisor log: {tail[-500:]})"
                store.set_condition(obj.setdefault("status", {}), "Failed", True, "SupervisorLost", message)
                for item in obj["status"].get("jobsStatus") or []:
                    item["active"] = item["ready"] = 0
                return obj
        except FileNotFoundError:
            raise TrainJobNotFound(jref.namespace, jref.name) from None

    def _kill_nodes(self, job: store.JobDir, uid: str) -> None:
        nodes = store.read_json(job.nodes) or []
        for node in nodes:
            pid = int(node.get("pid") or 0)
            if not pid or (store.pid_alive(pid) and not store.pid_alive(pid, node.get("start_time"))):
                continue  # never recorded, or the pid now belongs to another process
            if store.group_alive(pid):  # a dead leader's group keeps its id while any member lives
                store.signal_group(pid, signal.SIGKILL)
        if uid:
            store.kill_marked(uid)

    def get(self, ref: JobRef | str) -> TrainJobResult:
        jref, job = self._job(ref)
        return result_from_trainjob(self._read(job, jref))

    def diagnostics(self, ref: JobRef | str) -> Diagnostics:
        """Failed nodes (index, exit code, signal, torchrun's failing rank) and the failing node's log tail."""
        jref, job = self._job(ref)
        obj = self._read(job, jref)
        diag = Diagnostics()
        nodes = store.read_json(job.nodes) or []
        failed = [n for n in nodes if n.get("exit_code") not in (None, 0) and not n.get("stopped")]
        for node in failed:
            entry = {
                k: node[k] for k in ("node", "step", "exit_code", "signal", "pid") if node.get(k) is not None
            }
            entry.update(store.torchrun_failure(store.tail_lines(job.log(str(node.get("step"))), 200)))
            diag.failed_ranks.append(entry)
        reason = result_from_trainjob(obj).reason or ""
        if failed:
            step = str(failed[0].get("step"))
        elif reason in ("SupervisorLost", "LocalEngineError", "StartError"):
            step = "supervisor"
        else:
            step = (
                "node-0"
                if any(n.get("step") == "node-0" for n in nodes)
                else str(nodes[0].get("step") if nodes else "node-0")
            )
        lines = _condense(store.tail_lines(job.log(step), 400), LOG_TAIL_LINES)
        if lines:
            diag.log_tail = f"[{step}]\n" + "\n".join(lines)
        return diag

    def _finish(self, result: TrainJobResult, raise_on_failure: bool) -> TrainJobResult:
        if result.state is JobState.FAILED and raise_on_failure:
            raise TrainJobFailed(result, self.diagnostics(result.ref))
        return result

    def _look(
        self,
        ref: JobRef | str,
        end: float | None,
        started: float,
        last: dict[str, Any] | None,
        on_update: UpdateCallback | None,
        raise_on_failure: bool,
    ) -> tuple[TrainJobResult | None, dict[str, Any], float]:
        """One look for ``wait``/``wait_async``: (the final result or None, what was seen, seconds to pause)."""
        result = self.get(ref)  # a few small local file reads: fine on an event loop too
        snapshot = result.to_dict()
        if on_update is not None and snapshot != last:
            on_update(result)
        if result.state.terminal:
            return self._finish(result, raise_on_failure), snapshot, 0.0
        now = time.time()
        if end is not None and now >= end:
            raise WaitTimeout(result.namespace, result.name, result.state.value, now - started)
        pause = min(self.poll_interval, max(end - now, 0.0)) if end is not None else self.poll_interval
        return None, snapshot, pause

    def wait(
        self,
        ref: JobRef | str,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        raise_on_failure: bool = True,
        on_update: UpdateCallback | None = None,
    ) -> TrainJobResult:
        end, started = resolve_deadline(timeout, deadline), time.time()
        last: dict[str, Any] | None = None
        while True:
            done, last, pause = self._look(ref, end, started, last, on_update, raise_on_failure)
            if done is not None:
                return done
            time.sleep(pause)

    async def wait_async(
        self,
        ref: JobRef | str,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        raise_on_failure: bool = True,
        on_update: UpdateCallback | None = None,
    ) -> TrainJobResult:
        end, started = resolve_deadline(timeout, deadline), time.time()
        last: dict[str, Any] | None = None
        while True:
            done, last, pause = self._look(ref, end, started, last, on_update, raise_on_failure)
            if done is not None:
                return done
            await asyncio.sleep(pause)

    # --- logs -------------------------------------------------------------------------------------

    def _log_path(self, job: store.JobDir, jref: JobRef, step: str) -> Path:
        plan = store.read_json(job.plan)
        if plan is None:
            raise TrainJobNotFound(jref.namespace, jref.name)
        run_step = str(plan.get("step", "node"))
        nodes = int(plan.get("launched_nodes", 1))
        steps = [f"node-{i}" for i in range(nodes)] if run_step == "node" else [run_step]
        steps += [str(i["step"]) for i in plan.get("initializers") or []] + ["supervisor"]
        if step == "node-0" and run_step != "node":
            step = run_step  # MPI: rank 0's output is the launcher's
        if step not in steps:
            raise InvalidRequest.one(
                "step", f"{step!r} is not a step of {jref}", f"use one of: {', '.join(steps)}"
            )
        return job.log(step)

    def logs(
        self,
        ref: JobRef | str,
        *,
        follow: bool = False,
        step: str = "node-0",
        tail_lines: int | None = None,
    ) -> Iterator[str]:
        jref, job = self._job(ref)
        path = self._log_path(job, jref, step)
        if not follow:
            return iter(
                store.tail_lines(path, tail_lines) if tail_lines is not None else self._all_lines(path)
            )
        return self._follow(jref, job, path, tail_lines)

    @staticmethod
    def _all_lines(path: Path) -> list[str]:
        try:
            return path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return []

    def _follow(self, jref: JobRef, job: store.JobDir, path: Path, tail_lines: int | None) -> Iterator[str]:
        """Yield lines as they are written until the job is terminal (or deleted) and the log is drained."""
        fh = None
        buffer = b""
        try:
            while fh is None:
                try:
                    fh = open(path, "rb")  # noqa: SIM115 - closed in finally
                except FileNotFoundError:
                    if self._done(jref):
                        return
                    time.sleep(self.poll_interval)
            if tail_lines is not None:
                lines = store.tail_lines(path, tail_lines)
                fh.seek(0, os.SEEK_END)
                yield from lines
            while True:
                chunk = fh.read(65536)
                if chunk:
                    buffer += chunk
                    *complete, buffer = buffer.split(b"\n")
                    for line in complete:
                        yield line.decode("utf-8", errors="replace")
                    continue
                if self._done(jref):
                    rest = fh.read()
                    buffer += rest
                    for line in buffer.split(b"\n"):
                        if line:
                            yield line.decode("utf-8", errors="replace")
                    buffer = b""
                    return
                time.sleep(self.poll_interval)
        finally:
            if fh is not None:
                fh.close()

    def _done(self, jref: JobRef) -> bool:
        try:
            return self.get(jref).state.terminal
        except TrainJobNotFound:
            return True

    # --- control ----------------------------------------------------------------------------------

    def cancel(self, ref: JobRef | str) -> bool:
        """Stop every process of the job (SIGTERM, then SIGKILL after a grace period) and delete it."""
        jref, job = self._job(ref)
        try:
            with job.update() as obj:
                obj["metadata"].setdefault("deletionTimestamp", store.now_iso())
                uid = str(obj["metadata"].get("uid", ""))
        except FileNotFoundError:
            return False
        sup = store.read_json(job.supervisor) or store.read_json(job.spawn)
        if isinstance(sup, dict) and store.pid_alive(int(sup["pid"]), sup.get("start_time")):
            store.signal_pid(int(sup["pid"]), signal.SIGTERM)
        end = time.monotonic() + self.cancel_grace_seconds
        while time.monotonic() < end and (job.supervisor_alive() or self._spawn_alive(job)):
            time.sleep(0.05)
        if isinstance(sup, dict) and store.pid_alive(int(sup["pid"]), sup.get("start_time")):
            store.signal_pid(int(sup["pid"]), signal.SIGKILL)
        self._kill_nodes(job, uid)
        trash = self.home / "jobs" / ".trash"
        trash.mkdir(parents=True, exist_ok=True)
        target = trash / f"{jref.namespace}.{jref.name}.{uuid.uuid4().hex[:8]}"
        try:
            os.rename(job.root, target)
        except FileNotFoundError:
            return False
        shutil.rmtree(target, ignore_errors=True)
        return True

    @staticmethod
    def _spawn_alive(job: store.JobDir) -> bool:
        spawn = store.read_json(job.spawn)
        return isinstance(spawn, dict) and store.pid_alive(int(spawn["pid"]), spawn.get("start_time"))

    def list(self, labels: Mapping[str, str] | None = None) -> list[TrainJobResult]:
        folder = self.home / "jobs" / self.namespace
        out: list[TrainJobResult] = []
        if not folder.is_dir():
            return out
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            job = store.JobDir(entry)
            jref = JobRef(name=entry.name, namespace=self.namespace)
            try:
                obj = self._read(job, jref)
            except TrainJobNotFound:
                continue
            job_labels = (obj.get("metadata") or {}).get("labels") or {}
            if labels and any(job_labels.get(k) != v for k, v in labels.items()):
                continue
            out.append(result_from_trainjob(obj))
        out.sort(key=lambda r: r.created_at.timestamp() if r.created_at else 0.0)
        return out

    def _set_suspend(self, ref: JobRef | str, value: bool) -> TrainJobResult:
        jref, job = self._job(ref)
        try:
            with job.update() as obj:
                if not store.is_terminal(obj):
                    obj.setdefault("spec", {})["suspend"] = value
        except FileNotFoundError:
            raise TrainJobNotFound(jref.namespace, jref.name) from None
        return self.get(jref)

    def suspend(self, ref: JobRef | str) -> TrainJobResult:
        """Set spec.suspend: running nodes are stopped; the job waits (Queued) until ``resume``."""
        return self._set_suspend(ref, True)

    def resume(self, ref: JobRef | str) -> TrainJobResult:
        """Clear spec.suspend: the nodes start again from the beginning, like a resumed JobSet."""
        return self._set_suspend(ref, False)

    def __repr__(self) -> str:
        return f"LocalBackend(home={str(self.home)!r}, namespace={self.namespace!r})"
