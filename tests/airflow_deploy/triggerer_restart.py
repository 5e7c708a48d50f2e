"""The triggerer-restart scenario shared by the local-engine and the real-pods deployment tests: many deferred
tasks stream numbered log lines while the triggerer is stopped (SIGTERM) and started, then killed (SIGKILL) and
started; then every task log is checked line by line against the positions the triggers saved."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from typing import Any

from airflow_deployment import Deployment
from airflow_rest import Airflow, wait_for
from airflow_stack import start_component, stop_component

from bounds import HANG


def rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as fh:
                total += next((int(line.split()[1]) for line in fh if line.startswith("VmRSS:")), 0)
        except OSError:
            pass
    return total


def numbered_lines(log: str) -> list[int]:
    """The trainer's numbered lines in a task log, in order (``line i of an open-ended log``)."""
    return [int(m) for m in re.findall(r"line (\d+) of an open-ended log", log)]


def restart_while_streaming(
    deployment: Deployment,
    api: Airflow,
    dag_id: str,
    runs: list[str],
    conf: dict[str, Any],
    release: Callable[[], None],
    *,
    graceful: bool,
) -> None:
    """Run the scenario on ``runs`` of ``dag_id`` (triggered with ``conf``; ``release()`` lets the trainers end)
    and check each task log. ``graceful``: the stopped triggerer's triggers save their position on the way out
    (2.11, 3.3; 3.0.6's trigger runner exits at once on the SIGTERM sent to its process group). Prints the
    lines each task log repeats (copied after the last save before the kill) and the triggerer's RSS."""
    for rid in runs:
        api.trigger(dag_id, rid, conf)
    for rid in runs:
        assert (
            api.wait_ti_state(dag_id, rid, "train", {"deferred", "success", "failed"})["state"] == "deferred"
        )

    def saved() -> dict[str, int]:
        """The lines each task's saved position counts (the XCom the triggers write)."""
        values = {rid: api.xcom(dag_id, rid, "train", key="trainflow_log_position") for rid in runs}
        return {rid: v["steps"].get("node-0", {}).get("lines", 0) for rid, v in values.items()}

    def moved_past(lines: dict[str, int]) -> dict[str, int] | None:
        now = saved()
        return now if all(now[r] >= lines[r] + 5 for r in runs) else None

    try:
        first = wait_for(lambda: moved_past(dict.fromkeys(runs, 0)), HANG, "every trigger to save a position")
        rss_first = rss_kib(deployment.pids("triggerer"))
        stop_component(deployment.root, "triggerer", sig=signal.SIGTERM, timeout=HANG)
        at_stop = saved()  # what the stopped triggerer saved last (on its way out)
        assert all(at_stop[r] >= first[r] for r in runs), (first, at_stop)
        start_component(deployment.root, "triggerer")
        # the restarted triggerer streams and saves further: its own saves, past the position it started from
        wait_for(lambda: moved_past(at_stop), HANG, "the restarted triggerer to save positions")
        rss_second = rss_kib(deployment.pids("triggerer"))
        at_kill = saved()
        stop_component(deployment.root, "triggerer", sig=signal.SIGKILL, timeout=0)
        # the new triggerer takes the triggers once the killed one's heartbeat ages
        start_component(deployment.root, "triggerer")
        wait_for(lambda: moved_past(at_kill), HANG, "the triggerer started after the kill to save positions")
    finally:
        release()  # the trainers end (their last line says how many they wrote)
    repeated = {}
    for rid in runs:
        assert api.wait_run(dag_id, rid, timeout=HANG)["state"] == "success", api.why(dag_id, rid)
        log = api.log(dag_id, rid, "train", 1)
        total = int(re.findall(r"released after (\d+) lines", log)[-1])
        lines = numbered_lines(log)
        assert sorted(set(lines)) == list(range(1, total + 1)), (rid, lines)  # no line lost
        once_up_to = at_kill[rid] if graceful else at_stop[rid]
        committed = [n for n in lines if n <= once_up_to]
        assert committed == list(range(1, once_up_to + 1)), (rid, committed)  # each once, in order
        twice = sorted({n for n in lines if lines.count(n) > 1})
        assert all(n > at_stop[rid] for n in twice), (rid, at_stop[rid], twice)  # only what no save covered
        continued = [int(n) for n in re.findall(r"Logs continue after the node-0: (\d+) lines", log)]
        assert len(continued) == 2 and continued[-1] >= at_kill[rid], (rid, continued, at_kill[rid])
        repeated[rid] = len(lines) - total
    print(f"triggerer RSS {rss_first} KiB, after a restart {rss_second} KiB; lines repeated: {repeated}")
    assert rss_second <= 1.1 * rss_first, (rss_first, rss_second)
