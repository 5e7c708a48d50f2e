"""LocalBackend: the Backend interface over the embedded local engine (no Kubernetes).

Requests go through ``lifecycle`` and ``build_trainjob`` exactly as on the cluster; the engine then runs the
*manifest* (``spec.trainer`` command/args/env/numNodes/numProcPerNode, else the runtime container's command)
under the runtime's ML policy. ``image`` is ignored locally: the trainer runs with this machine's Python (its
bin directory first on PATH), so the image's contents must be installed here. Each job gets a detached
supervisor and a state directory under ``<home>/jobs/<namespace>/<name>/`` that any process can read.
"""

from __future__ import annotations

import asyncio
import logging
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

from trainflow.core import lifecycle
from trainflow.core.backend import WaitsByEnding
from trainflow.core.ending import Ending
from trainflow.core.errors import (
    AlreadyExists,
    CorruptState,
    InvalidRequest,
    PermissionDenied,
    TrainJobNotFound,
)
from trainflow.core.local import cleanup, diagnostics, logs, policies, store, trust
from trainflow.core.local.waiting import LocalWait
from trainflow.core.logsink import LogSink
from trainflow.core.observe import UpdateCallback, resolve_deadline
from trainflow.core.request import TrainJobRequest
from trainflow.core.result import (
    OUTPUT_URI_ANNOTATION,
    JobRef,
    TrainJobResult,
    result_from_trainjob,
)
from trainflow.core.runtimes import Runtime, find_runtime, local_catalog

NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
POLL_SECONDS = 0.05
SPAWN_GRACE_SECONDS = 30.0
CANCEL_GRACE_SECONDS = 10.0
log = logging.getLogger(__name__)


class LocalBackend(WaitsByEnding):
    """Runs TrainJobs on this machine; state lives in files, so any process can get/wait/logs/cancel by name."""

    name = "local"
    is_local = True

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

    def __repr__(self) -> str:
        return f"LocalBackend(home={str(self.home)!r}, namespace={self.namespace!r})"

    # --- runtimes and paths ---------------------------------------------------------------------------
    def runtimes(self) -> list[Runtime]:
        return list(local_catalog())

    def get_runtime(
        self, name: str, kind: str = "ClusterTrainingRuntime", namespace: str | None = None
    ) -> Runtime:
        return find_runtime(local_catalog(), name, kind)

    def schema_picture(self) -> None:
        return None  # the engine runs what the vendored Trainer schema describes

    def _ref(self, ref: JobRef | str) -> JobRef:
        jref = JobRef.parse(ref, self.namespace)
        if not (NAME.match(jref.name) and NAME.match(jref.namespace)):
            raise TrainJobNotFound(jref.namespace, jref.name)
        return jref

    def _job(self, ref: JobRef | str) -> tuple[JobRef, store.JobDir]:
        jref = self._ref(ref)
        return jref, store.JobDir(self.home / "jobs" / jref.namespace / jref.name)

    def job_dir(self, ref: JobRef | str) -> Path:
        """The state directory of one job (for tools and tests; its layout is described in ``store``)."""
        return self._job(ref)[1].root

    # --- launch primitives ----------------------------------------------------------------------------
    def _plan(self, manifest: dict[str, Any], job: store.JobDir) -> dict[str, Any]:
        ref = (manifest.get("spec") or {}).get("runtimeRef") or {}
        runtime = self.get_runtime(str(ref.get("name")), str(ref.get("kind") or "ClusterTrainingRuntime"))
        try:
            cwd: str | None = os.getcwd()  # the trainer runs where the caller is (relative paths work)
        except FileNotFoundError:
            cwd = str(job.root / "workspace")
        return policies.make_plan(manifest, runtime, home=self.home, jobdir=job.root, cwd=cwd)

    def dry_run(self, manifest: dict[str, Any]) -> None:
        """Everything but the start: the launch plan is made (commands resolved, ports, paths), nothing written."""
        meta = manifest["metadata"]
        job = self._job(JobRef(name=meta["name"], namespace=meta.get("namespace") or self.namespace))[1]
        self._plan(manifest, job)

    def find(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        folder = self.home / "jobs" / namespace
        if not folder.is_dir():
            return []
        out = []
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            try:
                obj = self.read(namespace, entry.name)
            except (PermissionDenied, CorruptState) as exc:
                log.warning("skipping %s/%s: %s", namespace, entry.name, exc)
                continue
            job_labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
            if obj is not None and all(job_labels.get(k) == v for k, v in labels.items()):
                out.append(obj)
        return out

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            jref, job = self._job(JobRef(name=name, namespace=namespace))
            return self._read(job, jref)
        except TrainJobNotFound:
            return None

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Publish the job directory atomically (``AlreadyExists`` when the name is taken), then start it."""
        manifest = dict(manifest)
        meta = manifest["metadata"] = dict(manifest["metadata"])
        meta["namespace"] = meta.get("namespace") or self.namespace
        jref, job = self._job(JobRef(name=meta["name"], namespace=meta["namespace"]))
        plan = self._plan(manifest, job)
        trust.jobs_dir(self.home, jref.namespace)  # private (0700) before anything in it is trusted
        if trust.check_job(job.root) and job.exists():
            raise AlreadyExists(f"TrainJob {jref} already exists")
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = store.now_iso()
        meta["annotations"] = {**(meta.get("annotations") or {}), OUTPUT_URI_ANNOTATION: plan["output_uri"]}
        manifest["status"] = {}
        staging = Path(tempfile.mkdtemp(prefix=f".{jref.name}.", dir=job.root.parent))
        try:
            (staging / store.LOGS_DIR).mkdir()
            store.write_json(staging / store.PLAN_FILE, plan)
            store.write_json(staging / store.TRAINJOB_FILE, manifest)
            try:
                os.rename(staging, job.root)  # atomic publish; fails if the name was taken meanwhile
            except OSError:
                if job.exists():
                    raise AlreadyExists(f"TrainJob {jref} already exists") from None
                raise
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        self._spawn(job)
        return manifest

    def adopt(self, obj: Mapping[str, Any]) -> None:
        """Start a job whose creator died between publishing it and starting its supervisor."""
        meta = obj.get("metadata") or {}
        _, job = self._job(
            JobRef(name=str(meta.get("name")), namespace=str(meta.get("namespace") or self.namespace))
        )
        trust.check_job(job.root)
        never_started = not job.supervisor.exists() and not job.spawn.exists() and not job.supervisor_alive()
        if never_started and not store.is_terminal(dict(obj)):
            self._spawn(job)

    def submit(self, request: TrainJobRequest | Mapping[str, Any], *, dry_run: bool = False) -> JobRef:
        return lifecycle.launch(self, request, dry_run=dry_run).ref

    def render(self, request: TrainJobRequest | Mapping[str, Any], *, attempt: int = 1) -> dict[str, Any]:
        return lifecycle.render(self, request, attempt=attempt)

    def _spawn(self, job: store.JobDir) -> None:
        env = policies.base_env(dict(os.environ))
        with open(job.log("supervisor"), "ab") as log:
            proc = subprocess.Popen(  # -P: the caller's cwd is not put on the supervisor's sys.path
                [sys.executable, "-P", "-m", "trainflow.core.local.supervisor", str(job.root)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        store.write_json(job.spawn, {"pid": proc.pid, "start_time": store.proc_start_time(proc.pid)})
        # reap it when it exits (it is our child until we exit), so it never lingers as a zombie
        threading.Thread(target=proc.wait, name=f"trainflow-reap-{proc.pid}", daemon=True).start()

    # --- state ----------------------------------------------------------------------------------------
    @staticmethod
    def _spawn_alive(job: store.JobDir) -> bool:
        spawn = store.read_aux(job.spawn)
        return isinstance(spawn, dict) and store.pid_alive(int(spawn["pid"]), spawn.get("start_time"))

    def _starting(self, job: store.JobDir, obj: dict[str, Any]) -> bool:
        """The supervisor was spawned but has not taken its lock yet."""
        if job.supervisor.exists():
            return False
        if job.spawn.exists():
            return self._spawn_alive(job)
        created = result_from_trainjob(obj).created_at
        return created is None or time.time() - created.timestamp() < SPAWN_GRACE_SECONDS

    def _read(self, job: store.JobDir, jref: JobRef) -> dict[str, Any]:
        trust.check_job(job.root)
        obj = job.read()
        if obj is None:
            raise TrainJobNotFound(jref.namespace, jref.name)
        if not store.is_terminal(obj) and not job.supervisor_alive() and not self._starting(job, obj):
            lost = cleanup.mark_lost(job)
            if lost is None:
                raise TrainJobNotFound(jref.namespace, jref.name)
            obj = lost
        trainer_status = store.trainer_status(job.read_metrics())
        if trainer_status:
            obj.setdefault("status", {})["trainerStatus"] = trainer_status
        return obj

    def get(self, ref: JobRef | str) -> TrainJobResult:
        jref, job = self._job(ref)
        return result_from_trainjob(self._read(job, jref))

    def diagnostics(self, ref: JobRef | str) -> Any:
        """Failed nodes (index, exit code, signal, torchrun's failing rank) and the failing node's log tail."""
        jref, job = self._job(ref)
        return diagnostics.diagnose(job, result_from_trainjob(self._read(job, jref)).reason or "")

    # --- wait -----------------------------------------------------------------------------------------
    def _wait(
        self, ref: JobRef | str, timeout: float | None, deadline: float | None, **how: Any
    ) -> LocalWait:
        jref, job = self._job(ref)

        def read() -> tuple[store.JobDir, dict[str, Any]]:
            return job, self._read(job, jref)

        return LocalWait(jref, job, read, deadline=resolve_deadline(timeout, deadline), **how)

    def wait_ending(
        self,
        ref: JobRef | str,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        diagnose: bool = True,
        on_update: UpdateCallback | None = None,
        logs: LogSink | None = None,
    ) -> Ending:
        wait = self._wait(ref, timeout, deadline, diagnose=diagnose, on_update=on_update, sink=logs)
        while (ending := wait.look()) is None:
            time.sleep(wait.next_look(self.poll_interval))
        return ending

    async def wait_ending_async(
        self,
        ref: JobRef | str,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        diagnose: bool = True,
        on_update: UpdateCallback | None = None,
        logs: LogSink | None = None,
    ) -> Ending:
        wait = self._wait(ref, timeout, deadline, diagnose=diagnose, on_update=on_update, sink=logs)
        while (ending := wait.look()) is None:
            await asyncio.sleep(wait.next_look(self.poll_interval))
        return ending

    # --- logs -----------------------------------------------------------------------------------------
    def logs(
        self,
        ref: JobRef | str,
        *,
        follow: bool = False,
        step: str = "node-0",
        tail_lines: int | None = None,
    ) -> Iterator[str]:
        jref, job = self._job(ref)
        path = logs.log_path(job, str(jref), step)
        if follow:
            return logs.follow(path, tail_lines, lambda: self._done(jref), self.poll_interval)
        return iter(store.tail_lines(path, tail_lines) if tail_lines is not None else logs.read_all(path))

    def _done(self, jref: JobRef) -> bool:
        try:
            return self.get(jref).state.terminal
        except TrainJobNotFound:
            return True

    # --- control --------------------------------------------------------------------------------------
    async def cancel_async(self, ref: JobRef | str) -> bool:
        """``cancel`` in a thread: stopping processes waits for their grace period."""
        return await asyncio.to_thread(self.cancel, ref)

    def cancel(self, ref: JobRef | str) -> bool:
        """Stop every process of the job (SIGTERM, then SIGKILL after a grace period) and delete it."""
        jref, job = self._job(ref)
        trust.check_job(job.root)  # never signal pids a planted nodes.json names
        try:
            with job.update() as obj:
                obj["metadata"].setdefault("deletionTimestamp", store.now_iso())
                uid = str(obj["metadata"].get("uid", ""))
        except FileNotFoundError:
            return False
        except CorruptState:
            uid = ""  # the supervisor (told below) and the recorded process groups still stop every node
        except OSError as exc:
            if not cleanup.no_space(exc):
                raise
            # full disk: SIGTERM tells it
            uid = str(((job.read() or {}).get("metadata") or {}).get("uid", ""))
        sup = store.read_aux(job.supervisor) or store.read_aux(job.spawn)
        if isinstance(sup, dict) and store.pid_alive(int(sup["pid"]), sup.get("start_time")):
            store.signal_pid(int(sup["pid"]), signal.SIGTERM)
        end = time.monotonic() + self.cancel_grace_seconds
        while time.monotonic() < end and (job.supervisor_alive() or self._spawn_alive(job)):
            time.sleep(0.05)
        if isinstance(sup, dict) and store.pid_alive(int(sup["pid"]), sup.get("start_time")):
            store.signal_pid(int(sup["pid"]), signal.SIGKILL)
        cleanup.kill_nodes(job, uid)
        return cleanup.remove(self.home, job, f"{jref.namespace}.{jref.name}")

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

    # last, so that ``list`` in the annotations above is the builtin
    def list(self, labels: Mapping[str, str] | None = None) -> list[TrainJobResult]:
        results = [result_from_trainjob(o) for o in self.find(self.namespace, labels or {})]
        return sorted(results, key=lambda r: r.created_at.timestamp() if r.created_at else 0.0)
