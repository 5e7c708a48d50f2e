"""On-disk state of local TrainJobs: one directory per job, atomic JSON files, advisory locks, process facts.

Layout of ``<home>/jobs/<namespace>/<name>/``: ``trainjob.json`` (the TrainJob object, status in the Trainer's
shape), ``plan.json`` (what the supervisor launches; secret *references* only), ``nodes.json`` (pids, exit
codes), ``metrics.json`` (what training code reported), ``reports.jsonl`` (each report), ``logs/<step>.log``, ``output/``, ``workspace/``.
Kept free of pydantic so the supervisor starts fast.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainflow.core.errors import CorruptState
from trainflow.core.local import liveness, reaper, trust

TRAINJOB_FILE = "trainjob.json"
PLAN_FILE = "plan.json"
NODES_FILE = "nodes.json"
METRICS_FILE = "metrics.json"
REPORTS_FILE = "reports.jsonl"  # every report(), in order (core/local/reports.py reads it)
SUPERVISOR_FILE = "supervisor.json"
SPAWN_FILE = "spawn.json"
STATE_LOCK = ".state.lock"
METRICS_LOCK = ".metrics.lock"
SUPERVISOR_LOCK = ".supervisor.lock"
LOGS_DIR = "logs"

HOME_ENV = "TRAINFLOW_HOME"
JOB_UID_ENV = "TRAINFLOW_LOCAL_JOB_UID"


def default_home() -> Path:
    """``$TRAINFLOW_HOME``, else the user's data directory (e.g. ``~/.local/share/trainflow``)."""
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("trainflow"))


def now_iso() -> str:
    """RFC 3339 UTC timestamp with milliseconds, as Kubernetes clients parse it."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def write_json(path: Path, data: Any) -> None:
    """Write atomically: readers see the old file or the new one, never a torn one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def append_line(path: Path, data: Any) -> None:
    """One JSON line in one ``write`` (O_APPEND): a reader sees whole lines, or waits for the newline."""
    line = (json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_json(path: Path) -> Any:
    """The parsed file, or None when it does not exist (or vanished with a deleted job).

    Never through a symbolic link, and only a file of this user (``trust.read_json``).
    """
    return trust.read_json(path)


def read_aux(path: Path) -> Any:
    """An auxiliary file (pids, metrics) whose damage must not stop cancel or status: None when unreadable."""
    try:
        return read_json(path)
    except ValueError:
        return None


def _shape_problem(data: Any) -> str | None:
    """What makes ``data`` no TrainJob object the engine wrote, or None."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    meta = data.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return "metadata.name is missing"
    for key in ("labels", "annotations"):
        if not isinstance(meta.get(key) or {}, dict):
            return f"metadata.{key} is not an object"
    for key in ("spec", "status"):
        if not isinstance(data.get(key) or {}, dict):
            return f"{key} is not an object"
    conditions = (data.get("status") or {}).get("conditions") or []
    if not isinstance(conditions, list) or not all(isinstance(c, dict) for c in conditions):
        return "status.conditions is not a list of objects"
    return None


@contextlib.contextmanager
def locked(path: Path, *, shared: bool = False) -> Iterator[None]:
    """Hold an advisory flock on ``path`` (created if missing) for the duration of the block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class JobDir:
    """Paths and state operations of one local job directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def trainjob(self) -> Path:
        return self.root / TRAINJOB_FILE

    @property
    def plan(self) -> Path:
        return self.root / PLAN_FILE

    @property
    def nodes(self) -> Path:
        return self.root / NODES_FILE

    @property
    def metrics(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def supervisor(self) -> Path:
        return self.root / SUPERVISOR_FILE

    @property
    def spawn(self) -> Path:
        return self.root / SPAWN_FILE

    @property
    def supervisor_lock(self) -> Path:
        return self.root / SUPERVISOR_LOCK

    @property
    def logs(self) -> Path:
        return self.root / LOGS_DIR

    def log(self, step: str) -> Path:
        return self.logs / f"{step}.log"

    def exists(self) -> bool:
        return self.trainjob.is_file()

    def read(self) -> dict[str, Any] | None:
        """The TrainJob object, None when the job is gone; CorruptState when the file is damaged."""
        try:
            data = read_json(self.trainjob)
        except ValueError as exc:
            problem: str | None = f"{type(exc).__name__}: {str(exc)[:200]}"
        else:
            if data is None:
                return None
            problem = _shape_problem(data)
        if problem:
            raise CorruptState(
                f"the local state of this job is corrupt ({self.trainjob}: {problem}); cancel the job to "
                "remove it (its processes are stopped too)"
            )
        assert isinstance(data, dict)
        return data

    @contextlib.contextmanager
    def update(self) -> Iterator[dict[str, Any]]:
        """Read-modify-write ``trainjob.json`` under the state lock; a vanished job raises FileNotFoundError."""
        with locked(self.root / STATE_LOCK):
            obj = self.read()
            if obj is None:
                raise FileNotFoundError(self.trainjob)
            yield obj
            write_json(self.trainjob, obj)

    def read_metrics(self) -> dict[str, Any]:
        data = read_aux(self.metrics)
        return data if isinstance(data, dict) else {}

    def supervisor_alive(self) -> bool:
        """The supervisor holds its liveness lock, or the pid and start time it recorded are a live process.

        So False, the lost verdict, needs evidence that it is gone, never a lock state alone (a supervisor
        between writing ``supervisor.json`` and exiting, or a lock its exiting threads still hold).
        """
        if liveness.lock_held(self.supervisor_lock):
            return True
        sup = read_aux(self.supervisor)
        pid = sup.get("pid") if isinstance(sup, dict) else None
        return isinstance(pid, int) and pid > 0 and pid_alive(pid, sup.get("start_time"))


def set_condition(status: dict[str, Any], kind: str, value: bool, reason: str, message: str) -> None:
    """Upsert one metav1.Condition (list-map keyed by type); the transition time moves only on change."""
    conditions: list[dict[str, Any]] = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    text = "True" if value else "False"
    for cond in conditions:
        if cond.get("type") == kind:
            if cond.get("status") != text:
                cond["lastTransitionTime"] = now_iso()
            cond.update(status=text, reason=reason, message=message)
            break
    else:
        conditions.append(
            {
                "type": kind,
                "status": text,
                "reason": reason,
                "message": message,
                "lastTransitionTime": now_iso(),
            }
        )
    status["conditions"] = conditions


def is_terminal(obj: dict[str, Any]) -> bool:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if (
            isinstance(cond, dict)
            and cond.get("type") in ("Complete", "Failed")
            and cond.get("status") == "True"
        ):
            return True
    return False


def trainer_status(metrics: dict[str, Any]) -> dict[str, Any] | None:
    """The Trainer's ``status.trainerStatus`` shape from a local ``metrics.json``."""
    if not metrics:
        return None
    out: dict[str, Any] = {"lastUpdatedTime": metrics.get("lastUpdatedTime") or now_iso()}
    items = metrics.get("metrics") or {}
    if isinstance(items, dict) and items:
        out["metrics"] = [{"name": str(k), "value": str(v)} for k, v in items.items()]
    for key in ("progressPercentage", "estimatedRemainingSeconds"):
        if isinstance(metrics.get(key), int):
            out[key] = metrics[key]
    return out


# --- logs ------------------------------------------------------------------------------------------

_TORCHRUN_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(-?\d+)(?:\s*\((?:local_rank|pid):\s*(\d+)\))?")


def tail_lines(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of a log (reads at most its last 256 KiB)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(size - 256 * 1024, 0))
            data = fh.read()
    except FileNotFoundError:
        return []
    text = data.decode("utf-8", errors="replace").splitlines()
    return text[-lines:] if lines else []


def torchrun_failure(lines: list[str]) -> dict[str, int]:
    """rank / local_rank / worker exit code from torchrun's "Root Cause" block in a node log, if any."""
    found: dict[str, int] = {}
    starts = [i for i, line in enumerate(lines) if line.startswith("Root Cause")]
    if starts:
        lines = lines[starts[-1] :]
    for line in lines:
        match = _TORCHRUN_FIELD.match(line)
        if not match:
            continue
        key, value, extra = match.groups()
        if key == "rank" and "rank" not in found:
            found["rank"] = int(value)
            if extra is not None:
                found["local_rank"] = int(extra)
        elif key == "exitcode" and "worker_exit_code" not in found:
            found["worker_exit_code"] = int(value)
    return found


# --- processes -------------------------------------------------------------------------------------


HAVE_PROC = os.path.isdir("/proc/self")


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) from /proc, or None if no such process.

    Without /proc (macOS) it only knows whether the pid exists: ("R", 0).
    """
    if not HAVE_PROC:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "R", 0
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def proc_start_time(pid: int) -> int | None:
    stat = proc_stat(pid)
    return stat[1] if stat else None


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    """True when ``pid`` runs (not a zombie) and, if given, started at ``start_time`` (guards pid reuse)."""
    stat = proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return start_time is None or not HAVE_PROC or stat[1] == start_time


def marked_processes(uid: str) -> list[int]:
    """Pids of live processes whose environment carries this job's marker (children, grandchildren, ...).

    torchrun starts its workers in new sessions, so process groups alone cannot find every rank.
    """
    needle = f"{JOB_UID_ENV}={uid}".encode()
    me = os.getpid()
    found: list[int] = []
    if not HAVE_PROC:
        return found  # no portable way to read other processes' env; process groups must do
    for pid, environ in reaper.proc_files("environ"):
        if pid != me and needle in environ.split(b"\0") and pid_alive(pid):
            found.append(pid)
    return found


def signal_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def kill_marked(uid: str, *, rounds: int = 20) -> int:
    """SIGKILL every process carrying the job marker until none is left; returns how many were killed."""
    killed = 0
    for _ in range(rounds):
        pids = marked_processes(uid)
        if not pids:
            break
        for pid in pids:
            signal_pid(pid, signal.SIGKILL)
        killed += len(pids)
        time.sleep(0.02)
    return killed
