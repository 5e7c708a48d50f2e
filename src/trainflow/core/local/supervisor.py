"""The detached per-job supervisor: ``python -m trainflow.core.local.supervisor <jobdir>``.

It holds the liveness lock on ``.supervisor.lock`` for its whole life (so any process can tell it is alive,
even after pid reuse, without disturbing it: ``liveness.take_lock``), launches one process per local
node in its own session under a lifeline wrapper (``lifeline``), writes the TrainJob status in the Trainer's
shape, enforces the deadline, suspend/resume and fail-fast, and on exit leaves no process of the job behind.
Secret values are read from ``<home>/secrets`` into the children's env only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from trainflow.core.errors import CorruptState, PermissionDenied
from trainflow.core.local import cleanup, lifeline, liveness, output_publish, policies, reaper, store
from trainflow.core.local.nodes import Node, jobs_status
from trainflow.core.reporting import LOCAL_JOB_ENV

POLL_SECONDS = 0.02  # node exits are noticed within this; a poll is a few syscalls

STOP_GRACE_SECONDS = 5.0
METRICS_FOLD_SECONDS = 1.0


class _Stop(Exception):
    """The job is being cancelled (SIGTERM) or deleted."""


class StartError(Exception):
    """A node's command could not be started (not installed, not executable, bad working directory)."""

    reason = "StartError"


class SecretMissing(StartError):
    """A secret file the plan refers to is gone (deleted after submit): named, never blamed on the command."""

    reason = "SecretNotFound"


class Supervisor:
    def __init__(self, root: Path, lifeline_fd: int) -> None:
        self.job = store.JobDir(root)
        self.lifeline = lifeline_fd  # passed to every node's wrapper (core/local/lifeline.py)
        self.broken = ""  # a damaged plan.json or trainjob.json: the job is marked Failed, nothing runs
        try:
            self.plan: dict[str, Any] = store.read_json(self.job.plan) or {}
            obj = self.job.read() or {}
        except (ValueError, CorruptState) as exc:
            self.plan, obj, self.broken = {}, {}, f"{self.job.plan}: {exc}"
        self.last = obj  # the last good TrainJob object, to record a failure over a corrupted file
        self.uid = str((obj.get("metadata") or {}).get("uid", ""))
        self.identity = {k: str((obj.get("metadata") or {}).get(k) or "") for k in ("namespace", "name")}
        self.nodes: list[Node] = []
        self.launch_id = ""
        self.stop = False
        self._spec_key: tuple[int, int] | None = None
        self._spec: dict[str, Any] = obj.get("spec") or {}

    # --- plumbing ---------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop = True

    def log(self, text: str) -> None:
        with contextlib.suppress(OSError):  # a full disk must not stop the supervisor
            print(f"{store.now_iso()} {text}", flush=True)

    def spec(self) -> dict[str, Any]:
        """The job's spec, re-read only when trainjob.json changed (suspend/resume/delete come this way)."""
        try:
            st = os.stat(self.job.trainjob)
        except FileNotFoundError as exc:
            raise _Stop from exc
        key = (st.st_ino, st.st_mtime_ns)
        if key != self._spec_key:
            obj = self.job.read()
            if obj is None:
                raise _Stop
            self._spec_key, self.last = key, obj
            self._spec = obj.get("spec") or {}
            if (obj.get("metadata") or {}).get("deletionTimestamp"):
                raise _Stop
        return self._spec

    def check(self) -> None:
        if self.stop:
            raise _Stop
        self.spec()

    def update_status(self, **changes: Any) -> None:
        with self.job.update() as obj:
            status = obj.setdefault("status", {})
            for kind, value, reason, message in changes.pop("conditions", []):
                store.set_condition(status, kind, value, reason, message)
            if "jobs" in changes:
                status["jobsStatus"] = changes.pop("jobs")
            trainer_status = store.trainer_status(self.job.read_metrics())
            if trainer_status:
                status["trainerStatus"] = trainer_status
            self._spec, self.last = obj.get("spec") or {}, obj

    def jobs_status(self, *, suspended: bool = False) -> list[dict[str, Any]]:
        return jobs_status(self.plan, self.nodes, suspended=suspended)

    def write_nodes(self) -> None:
        store.write_json(self.job.nodes, [n.describe() for n in self.nodes])

    # --- lifecycle --------------------------------------------------------------------------------

    def prepare(self) -> None:
        Path(self.plan["output_dir"]).mkdir(parents=True, exist_ok=True)
        (self.job.root / "workspace").mkdir(exist_ok=True)
        for init in self.plan.get("initializers") or []:
            target = Path(init["target"])
            with open(self.job.log(init["step"]), "a", encoding="utf-8") as fh:
                if not target.is_symlink() and not target.exists():
                    target.symlink_to(init["source"], target_is_directory=Path(init["source"]).is_dir())
                fh.write(f"{init['step']}: linked {init['source']} -> {target}\n")
        if self.plan.get("policy") == "mpi":
            slots = int(self.plan["nproc_per_node"]) * int(self.plan["num_nodes"])
            (self.job.root / "hostfile").write_text(f"localhost slots={slots}\n", encoding="utf-8")

    def child_env(self, index: int, port: int) -> dict[str, str]:
        env = policies.base_env(dict(os.environ))
        secrets = Path(self.plan["secrets_dir"])
        for item in self.plan.get("env") or []:
            if "secret" in item:
                ref = item["secret"]
                path = secrets / ref["name"] / ref["key"]
                try:
                    env[item["name"]] = path.read_text(encoding="utf-8").rstrip("\n")
                except (OSError, UnicodeDecodeError) as exc:
                    raise SecretMissing(
                        f"secret_env.{item['name']}: secret {ref['name']}/{ref['key']} is not available "
                        f"locally ({path}: {getattr(exc, 'strerror', None) or exc}); create the file holding "
                        "the value (like a mounted Secret) and submit again"
                    ) from None
            else:
                env[item["name"]] = item["value"]
        env.update(policies.policy_env(self.plan, index, port))
        for init in self.plan.get("initializers") or []:
            env[init["env"]] = init["target"]
        identity = {**self.identity, "uid": self.uid, "attempt": self.launch_id}
        env.update(policies.output_env(self.plan, index, identity))
        env[policies.NODE_RANK_ENV] = str(index)
        env[policies.WORKSPACE_ENV] = str(self.job.root / "workspace")
        env[LOCAL_JOB_ENV] = str(self.job.root)  # where reporting writes metrics
        env[store.JOB_UID_ENV] = self.uid
        return env

    def launch(self) -> None:
        self.launch_id = secrets.token_hex(6)
        self.job.logs.mkdir(exist_ok=True)
        port = policies.free_port()
        step = str(self.plan.get("step", "node"))
        self.nodes = []
        reports: list[int] = []  # each wrapper tells whether its rank started (all start side by side)
        try:
            for index in range(int(self.plan.get("launched_nodes", 1))):
                name = f"node-{index}" if step == "node" else step
                env = self.child_env(index, port)
                log = open(self.job.log(name), "ab", buffering=0)  # noqa: SIM115 - closed by the node's copier
                try:
                    proc, report = lifeline.start(
                        self.plan["argv"], self.lifeline, env=env, cwd=self.plan.get("cwd") or None
                    )
                except OSError as exc:
                    log.close()
                    raise self._start_error(index, exc.strerror or str(exc)) from exc
                reports.append(report)
                self.nodes.append(
                    Node(index, step, proc, log, int(self.plan.get("log_max_bytes") or 1 << 30))
                )
            for index, report in enumerate(reports):
                reports[index] = -1
                if error := lifeline.start_error(report):
                    raise self._start_error(index, error)
        finally:
            for report in reports:
                if report >= 0:
                    os.close(report)
        self.write_nodes()
        self.log(f"launched {len(self.nodes)} node(s) {[n.proc.pid for n in self.nodes]} port={port}")

    def _start_error(self, index: int, error: str) -> StartError:
        return StartError(
            f"cannot start node {index} ({self.plan['argv'][0]!r}): {error}; "
            "is it installed here and on PATH (this Python's bin directory is searched first)?"
        )

    def stop_nodes(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM every node's process group, SIGKILL after ``grace``, then sweep the job's marked processes."""
        live = [n for n in self.nodes if n.poll() is None]
        for node in live:
            node.stopped = True
            store.signal_group(node.proc.pid, signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end and any(n.poll() is None for n in live):
            time.sleep(POLL_SECONDS)
        for node in live:
            store.signal_group(node.proc.pid, signal.SIGKILL)
        for node in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=2)
            node.poll()
        if self.uid:
            store.kill_marked(self.uid)
        reaper.stop_descendants(STOP_GRACE_SECONDS / 5)  # what escaped the groups (new sessions, no marker)

    def wait_resumed(self) -> None:
        """Hold a suspended job (Kueue-style) until spec.suspend is cleared."""
        self.update_status(
            conditions=[("Suspended", True, "Suspended", "TrainJob is suspended")],
            jobs=self.jobs_status(suspended=True),
        )
        self.log("suspended")
        while self.spec().get("suspend"):
            if self.stop:
                raise _Stop
            time.sleep(0.1)
        self.update_status(conditions=[("Suspended", False, "Resumed", "TrainJob is resumed")])
        self.log("resumed")

    def run_once(self) -> bool:
        """Run the nodes until they all end, one fails, the deadline passes or the job is suspended.

        Returns True when the job reached a terminal state, False when it was suspended.
        """
        deadline_s = self.plan.get("deadline_seconds")
        deadline = time.monotonic() + float(deadline_s) if deadline_s else None
        self.launch()
        self.update_status(jobs=self.jobs_status())
        metrics_key: tuple[int, int] | None = None
        metrics_folded = 0.0
        while True:
            time.sleep(POLL_SECONDS)
            self.check()
            if self.spec().get("suspend"):
                self.stop_nodes()
                self.write_nodes()
                return False
            codes = [n.poll() for n in self.nodes]
            failed = [n for n in self.nodes if n.exit_code not in (None, 0)]
            if failed and (cleanup.disk_full(self.job.root) or any(n.log_error_no_space for n in failed)):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # the node failed on a full disk
            if failed:
                first = min(failed, key=lambda n: n.index)
                self.stop_nodes()
                self.write_nodes()
                how = f"was killed by {first.describe()['signal']}" if first.signal else "exited"
                step = str(first.describe()["step"])
                message = f"node {first.index} ({step}) {how} with code {first.exit_code}"
                cause = store.torchrun_failure(store.tail_lines(self.job.log(step), 200))
                if "rank" in cause:
                    message += (
                        f" (torchrun: rank {cause['rank']} exited with code {cause.get('worker_exit_code')})"
                    )
                message += "; the other nodes were stopped"
                self.update_status(
                    conditions=[("Failed", True, "NodeFailed", message)], jobs=self.jobs_status()
                )
                self.log(message)
                return True
            if all(code == 0 for code in codes):
                reaper.stop_descendants(STOP_GRACE_SECONDS / 5)  # nothing of the job outlives it
                self.write_nodes()
                self.log(output_publish.publish_planned(self.plan))  # a failure fails the job (fail())
                self.update_status(
                    conditions=[
                        (
                            "Complete",
                            True,
                            "AllJobsCompleted",
                            f"all {len(self.nodes)} node(s) exited successfully",
                        )
                    ],
                    jobs=self.jobs_status(),
                )
                self.log("complete")
                return True
            if deadline is not None and time.monotonic() > deadline:
                self.stop_nodes()
                self.write_nodes()
                self.update_status(
                    conditions=[
                        ("Failed", True, "DeadlineExceeded", "TrainJob exceeded its active deadline")
                    ],
                    jobs=self.jobs_status(),
                )
                self.log("deadline exceeded")
                return True
            try:
                st = os.stat(self.job.metrics)
                key = (st.st_ino, st.st_mtime_ns)
            except FileNotFoundError:
                key = None
            if key != metrics_key and time.monotonic() - metrics_folded >= METRICS_FOLD_SECONDS:
                # readers overlay metrics.json live; folding it into the status file is for its own sake
                metrics_key, metrics_folded = key, time.monotonic()
                self.update_status(jobs=self.jobs_status())

    def fail(self, exc: Exception) -> None:
        """Record the failure; over a corrupted trainjob.json, from the last good object the supervisor read."""
        if isinstance(exc, StartError | CorruptState | output_publish.OutputPublishFailed):
            reason, text = exc.reason, str(exc)
        elif isinstance(exc, OSError) and cleanup.no_space(exc):
            cleanup.release(self.job.root)  # room for this last status write
            reason = "DiskFull"
            text = (
                f"no space left on device (ENOSPC) under {self.job.root}; free space there and submit again"
            )
        else:
            reason, text = "LocalEngineError", f"{type(exc).__name__}: {exc}"
        condition = ("Failed", True, reason, text[:1000])
        try:
            self.update_status(conditions=[condition], jobs=self.jobs_status())
        except FileNotFoundError:
            pass
        except CorruptState:
            if self.last:
                with store.locked(self.job.root / store.STATE_LOCK):
                    obj = self.last
                    store.set_condition(obj.setdefault("status", {}), *condition)
                    obj["status"]["jobsStatus"] = self.jobs_status()
                    store.write_json(self.job.trainjob, obj)

    def run(self) -> int:
        if liveness.take_lock(self.job.supervisor_lock) is None:  # held (never closed) until exit
            owner = store.read_aux(self.job.supervisor)
            pid = owner.get("pid", "?") if isinstance(owner, dict) else "?"
            self.log(f"another supervisor (pid {pid}) owns this job; exiting")
            return 0
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        cleanup.reserve(self.job.root)
        store.write_json(
            self.job.supervisor,
            {
                "pid": os.getpid(),
                "start_time": store.proc_start_time(os.getpid()),
                "started": store.now_iso(),
            },
        )
        try:
            if self.broken:
                raise CorruptState(self.broken)
            obj = self.job.read()
            if obj is None or store.is_terminal(obj):
                return 0
            self.prepare()
            while True:
                if self.spec().get("suspend"):
                    self.wait_resumed()
                self.check()
                if self.run_once():
                    break
        except _Stop:
            self.log("stopping: job cancelled or deleted")
            self.stop_nodes()
        except Exception as exc:
            self.stop_nodes()
            self.fail(exc)
            self.log(f"error: {type(exc).__name__}: {exc}")
            return 1
        finally:
            if self.uid:
                store.kill_marked(self.uid)
            reaper.stop_descendants(0.0)
        return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m trainflow.core.local.supervisor <jobdir>", file=sys.stderr)
        return 2
    return reaper.guard(lambda lifeline_fd: _run(Path(args[0]), lifeline_fd))


def _run(root: Path, lifeline_fd: int) -> int:
    try:
        return Supervisor(root, lifeline_fd).run()
    except PermissionDenied as exc:  # a planted or linked job directory: refuse it, run nothing
        print(f"{store.now_iso()} refused: {exc}", flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
