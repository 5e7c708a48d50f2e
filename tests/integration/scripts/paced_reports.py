"""A trainer that reports loss and progress at a steady pace: ``paced_reports.py REPORTS SECONDS [GATE]``.

With GATE, it reports nothing until that file exists (at most 600 s, tests/bounds.py's HANG: this script runs
in the job, outside the tests' sys.path), so a test can start watching first."""

import sys
import time
from pathlib import Path

from trainflow.core import report

reports, pause = int(sys.argv[1]), float(sys.argv[2])
gate = Path(sys.argv[3]) if len(sys.argv) > 3 else None
deadline = time.monotonic() + 600.0
while gate is not None and not gate.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
for i in range(reports):
    report(
        metrics={"loss": round(2.0 / (i + 1), 6), "acc": round(i / reports, 4)},
        progress=(i + 1) * 100 // reports,
    )
    print(f"step {i + 1}/{reports}", flush=True)
    time.sleep(pause)
