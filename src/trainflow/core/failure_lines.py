"""Which lines of a failed trainer's log say why it failed: the same rule for the local engine and real pods."""

from __future__ import annotations

import re

_GLOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")


def _agent_line(line: str) -> bool:
    """A log line of torchrun's own agent (glog format, from torch/distributed); a rank's own glog lines, such
    as JAX's fatal check failures, are not."""
    return bool(_GLOG.match(line)) and "torch/distributed" in line


def condense(lines: list[str], keep: int) -> list[str]:
    """A log tail without torchrun's own noise (its agent's log lines, the launcher's traceback), so the ranks'
    output (a rank's own traceback above all) and torchrun's failure report both fit in ``keep`` lines."""
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
        if _agent_line(line):
            continue
        out.append(line)
    return out[-keep:]
