"""make test's run graph (scripts/test_all.sh) with every step stubbed by a sleep: a step that deletes what
another lane still uses starts only after that lane's users ended (issue 39: the Go build cache was pruned
under the object store's build when the other Go builds were cached)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from bounds import HANG

REPO = Path(__file__).resolve().parents[2]


def run_graph(tmp_path: Path, seconds: dict[str, float], failing: frozenset[str] = frozenset()) -> list[str]:
    """The script's progress lines ("start X", "passed X in Ns", "FAILED X ...") in the order printed."""
    stub = tmp_path / "stub"
    stub.write_text("".join(f"{n} {s}{' fail' if n in failing else ''}\n" for n, s in seconds.items()))
    env = {
        **os.environ,
        "TRAINFLOW_TEST_ALL_STUB": str(stub),
        "TRAINFLOW_TEST_ALL_POLL": "0.1",
        "TRAINFLOW_TEST_LOGS": str(tmp_path / "logs"),
    }
    proc = subprocess.run(
        ["bash", "scripts/test_all.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG
    )
    lines = [m.group(1) for m in re.finditer(r"^\[make test [^\]]*\] (.*)$", proc.stdout, re.M)]
    assert lines, proc.stdout + proc.stderr
    assert (proc.returncode == 0) == (not failing), proc.stdout[-3000:]
    return lines


def index(lines: list[str], prefix: str) -> int:
    found = [i for i, line in enumerate(lines) if line.startswith(prefix)]
    assert len(found) == 1, (prefix, lines)
    return found[0]


def test_the_go_cache_is_pruned_only_after_the_object_store_build_ended(tmp_path: Path) -> None:
    # the control plane, Kueue and node builds cached (0 s), the object store's not: the scenario that failed
    lines = run_graph(tmp_path, {"build-objstore": 3})
    assert index(lines, "passed build-node") < index(lines, "passed build-objstore")
    assert index(lines, "passed build-objstore") < index(lines, "start prune-go-cache")
    assert lines[-1] == "all suites passed"


def test_a_failed_object_store_build_still_ends_before_the_prune(tmp_path: Path) -> None:
    lines = run_graph(tmp_path, {"build-objstore": 2}, failing=frozenset({"build-objstore"}))
    assert index(lines, "FAILED build-objstore") < index(lines, "start prune-go-cache")
    assert any(line.startswith("not running: objstore failed") for line in lines), lines


@pytest.mark.parametrize("slow", ["build-control-plane", "build-node"])
def test_the_prune_waits_for_the_go_chain_too(tmp_path: Path, slow: str) -> None:
    lines = run_graph(tmp_path, {slow: 2})
    assert index(lines, f"passed {slow}") < index(lines, "start prune-go-cache")
