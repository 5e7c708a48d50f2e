"""What benchmarks/triggerer_scale.py reads off one triggerer: its processes' PSS, CPU and threads, the trigger
runner, the event-loop stalls it logged, when each task instance left the deferred state, and when each marker
line of the rank-0 logs reached each task's log file."""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B


def pss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def group_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += B.cpu_seconds(pid)
        except OSError:
            continue
    return total


def threads(pids: list[int]) -> int:
    return sum(B.status_kib(pid, "Threads") for pid in pids if Path(f"/proc/{pid}").exists())


def runner_pid(pids: list[int]) -> int:
    """The trigger runner: the child the triggerer's supervisor (its process group leader) runs the triggers'
    event loop in. At rest the supervisor is the larger of the two, so size does not tell them apart."""
    children = []
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ppid, group = int(fields[1]), int(fields[2])
        if pid != group and ppid == group:
            children.append(pid)
    assert len(children) == 1, (
        f"expected one trigger runner among the triggerer's processes {pids}: {children}"
    )
    return children[0]


def loop_stalls(log: Path, offset: int) -> dict[str, float]:
    """What this triggerer reported: event-loop stalls of the runner, heartbeat gaps of the supervisor."""
    with open(log, "rb") as fh:
        fh.seek(offset)
        text = fh.read().decode(errors="replace")
    blocked = [float(x) for x in re.findall(r"async thread was blocked for ([0-9.]+) seconds", text)]
    gaps = [float(x) for x in re.findall(r"Heartbeat recovered after ([0-9.]+) seconds", text)]
    return {
        "loop_blocked_max_s": max(blocked, default=0.0),
        "loop_blocked_total_s": round(sum(blocked), 1),
        "heartbeat_gap_max_s": max(gaps, default=0.0),
    }


class Deferred:
    """Polls the metadata DB: when each task instance of a run left the deferred state (the trigger fired)."""

    def __init__(self, port: int, dag_id: str, run_id: str) -> None:
        import psycopg2

        self.db = psycopg2.connect(
            host="127.0.0.1", port=port, user="airflow", password="airflow", dbname="airflow"
        )
        self.db.autocommit = True
        self.dag_id, self.run_id = dag_id, run_id
        self.left: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        cur = self.db.cursor()
        while not self.stop.is_set():
            cur.execute(
                "SELECT map_index FROM task_instance WHERE dag_id=%s AND run_id=%s AND state <> 'deferred'",
                (self.dag_id, self.run_id),
            )
            t = time.time()
            for (index,) in cur.fetchall():
                self.left.setdefault(index, t)
            self.stop.wait(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.db.close()


class LogLines:
    """Polls the trigger log files of a run's N tasks (every ``every`` seconds, reading only what was appended):
    when each marker line (``<marker> <seq> ``) first appeared in each task's log."""

    def __init__(self, logs: Path, n: int, marker: str, every: float = 0.2) -> None:
        self.logs, self.n, self.every = logs, n, every
        self.pattern = re.compile(re.escape(marker).encode() + rb" (\d+) ")
        self.seen: dict[tuple[int, int], float] = {}  # (map index, seq) -> when it was first seen
        self.offsets: dict[Path, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _files(self) -> list[tuple[Path, int]]:
        found = self.logs.glob("task_id=wait/map_index=*/attempt=1.log.trigger.*.log")
        return [(f, int(f.parent.name.partition("=")[2])) for f in found]

    def _poll(self) -> None:
        files: list[tuple[Path, int]] = []
        while not self.stop.is_set():
            if len(files) < self.n:
                files = self._files()
            t = time.time()
            for path, index in files:
                try:
                    size = path.stat().st_size
                    offset = self.offsets.get(path, 0)
                    if size <= offset:
                        continue
                    with open(path, "rb") as fh:
                        fh.seek(offset)
                        data = fh.read(size - offset)
                except OSError:
                    continue
                end = data.rfind(b"\n") + 1  # whole lines only; a partial one is read again
                self.offsets[path] = offset + end
                for m in self.pattern.finditer(data, 0, end):
                    self.seen.setdefault((index, int(m.group(1))), t)
            self.stop.wait(self.every)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
