"""The CLI's live view of a wait, as users see it: a progress bar with the ETA and the latest metrics on a real
terminal (a pseudo-terminal this test reads), plain lines into a pipe, and the chart file, read by Chromium."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from bounds import HANG
from browser import chart_points, chromium
from trainflow.core.local.reports import REPORTS_FILE

pytestmark = pytest.mark.timeout(2 * HANG)  # a backstop above the waits' own hang detector

EXE = Path(sys.executable).parent / "trainflow"
PACED = str(Path(__file__).parent / "scripts" / "paced_reports.py")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def cli(home: Path, *args: str) -> list[str]:
    return [str(EXE), "--backend", "local", "--home", str(home), *args]


def submit(home: Path, name: str, reports: int = 12, pause: float = 0.6) -> Path:
    """Submit a paced trainer that starts reporting once the returned gate file exists: a loaded machine can take
    longer to start the watching CLI than the trainer takes to finish, and then no test would see it run."""
    gate = home / f"{name}.gate"
    proc = subprocess.run(
        cli(home, "submit", "--name", name, "--", "python3", PACED, str(reports), str(pause), str(gate)),
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert proc.returncode == 0, proc.stderr
    return gate


def in_terminal(argv: list[str], gate: Path, columns: int = 160, timeout: float = HANG) -> tuple[int, str]:
    """Run ``argv`` with stdin, stdout and stderr on a pseudo-terminal; everything it drew, and its exit code.
    Opens ``gate`` once it has drawn something."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns)}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    chunks: list[bytes] = []
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the terminal closed with the process
                    break
                if not data:
                    break
                chunks.append(data)
                gate.touch()
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=max(1.0, end - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return rc, b"".join(chunks).decode("utf-8", "replace")


def test_a_terminal_gets_a_live_bar_with_eta_and_metrics(tmp_path: Path) -> None:
    gate = submit(tmp_path, "live")
    rc, drawn = in_terminal(cli(tmp_path, "wait", "live"), gate)
    assert rc == 0, drawn[-3000:]
    assert "\x1b[?25l" in drawn  # rich's live display hides the cursor while it redraws
    text = ANSI.sub("", drawn)
    assert "default/live Running" in text and "━" in text  # the bar
    etas = re.findall(r"ETA (\d+s|\d+m(?: \d+s)?)", text)
    assert etas, text[-3000:]  # counted down from the trainer's estimate while it ran
    assert re.search(r"(acc|loss)=[0-9.]+ (acc|loss)=[0-9.]+", text), text[-3000:]  # the latest metrics
    assert re.search(r"\b(?:[1-9]\d|100)%", text)  # progress moved
    assert "Complete after" in text and "state: Complete" in text


def test_status_watch_follows_until_the_end(tmp_path: Path) -> None:
    gate = submit(tmp_path, "watched", reports=6, pause=0.3)
    rc, drawn = in_terminal(cli(tmp_path, "status", "watched", "--watch"), gate)
    text = ANSI.sub("", drawn)
    assert rc == 0, text[-3000:]
    assert "━" in text and re.search(r"State:\s+Complete", text)
    assert re.search(r"History:\s+6 points of 6 reports", text), text[-2000:]


def test_a_pipe_gets_plain_lines_and_the_chart_file_holds_every_point(tmp_path: Path) -> None:
    gate = submit(tmp_path, "piped")
    svg = tmp_path / "piped.svg"
    waiting = subprocess.Popen(
        cli(tmp_path, "wait", "piped", "--chart", str(svg), "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert waiting.stderr is not None
    first = waiting.stderr.readline()  # the wait's first line: the job is seen before it reports anything
    gate.touch()
    out, err = waiting.communicate(timeout=HANG)
    proc = subprocess.CompletedProcess(waiting.args, waiting.returncode, out, first + err)
    assert proc.returncode == 0, proc.stderr
    assert not ANSI.search(proc.stderr) and "━" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("default/piped")]
    assert any(re.search(r"Running  \d+%  ETA \S+.*loss=", ln) for ln in lines), proc.stderr
    # one line per (state, whole percentage), never one per refresh: Created, Running before the first report,
    # Running at each of the 12 percentages, Complete (a wait may see the end before the last percentage)
    keys = [re.sub(r"  (ETA \S+  )?(\S+=\S+ ?)*\s*\(elapsed [\d.]+s\)$", "", ln) for ln in lines]
    assert len(keys) == len(set(keys)), proc.stderr
    assert len(lines) <= 3 + 12, proc.stderr
    result = json.loads(proc.stdout)
    assert len(result["history"]["time"]) == 12

    reports = [
        json.loads(x) for x in (tmp_path / "jobs/default/piped" / REPORTS_FILE).read_text().splitlines()
    ]
    expected = {
        "progress": sum("progressPercentage" in r for r in reports),
        "loss": sum("loss" in r["metrics"] for r in reports),
        "acc": sum("acc" in r["metrics"] for r in reports),
    }
    saved = tmp_path / "result.json"
    saved.write_text(proc.stdout)
    again = tmp_path / "again.svg"
    later = tmp_path / "later.svg"
    for argv in (["chart", "--result", str(saved), "-o", str(again)], ["chart", "piped", "-o", str(later)]):
        done = subprocess.run(cli(tmp_path, *argv), capture_output=True, text=True, timeout=HANG)
        assert done.returncode == 0, done.stderr
    with chromium() as browser:
        page = browser.new_page()
        for path in (svg, again, later):  # while waiting, from the saved result, after the end
            page.goto(path.as_uri())
            assert chart_points(page) == expected == {"progress": 12, "loss": 12, "acc": 12}, path


def test_chart_refuses_what_it_cannot_write(tmp_path: Path) -> None:
    for argv, needle in (
        (["chart", "x", "-o", "x.png"], "SVG"),
        (["chart", "-o", "x.svg"], "NAME or --result"),
        (["wait", "x", "--chart", "x.pdf"], "SVG"),
        (["wait", "x", "--step", "dataset-initializer"], "--follow"),
        (["wait", "x", "--follow", "--step", "rank0"], "dataset-initializer"),
    ):
        proc = subprocess.run(cli(tmp_path, *argv), capture_output=True, text=True, timeout=HANG)
        assert proc.returncode == 2 and needle in proc.stderr, (argv, proc.stderr)


def test_follow_prints_the_initializer_steps_too(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    follow = ["--wait", "--follow", "--step", "dataset-initializer", "--step", "node-0"]
    trainer = ["--", "python3", "-c", "print('trained')"]
    proc = subprocess.run(
        cli(tmp_path, "submit", "--name", "init", "--dataset-uri", data.as_uri(), *follow, *trainer),
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"[dataset-initializer] dataset-initializer: linked {data}" in proc.stdout, proc.stdout
    assert "[node-0] trained" in proc.stdout, proc.stdout
