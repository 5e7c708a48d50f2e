"""Issue 21, the local engine: an MPI runtime (``mlx-distributed``) runs a function trainer locally under Debian's
Open MPI ``mpirun`` with a local hostfile (``num_nodes`` slots), and the function's report and output land in the
local job. Runs as root here (CI), so the request sets Open MPI's own two opt-in switches; without them the
engine refuses before anything starts (tests/unit/test_local_policies.py checks that refusal).

It needs ``mpirun`` (Debian's openmpi-bin, which ``testbed/node/build.sh --deps`` installs with the node's
packages): a missing one fails here, loudly.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from trainflow.core import JobState, TrainJobRequest, get_backend

pytestmark = pytest.mark.e2e


def ranks() -> dict[str, int]:
    """Every rank writes its rank and the world size; rank 0 reports."""
    import os

    from trainflow.core.reporting import output_dir, report

    rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    (output_dir() / f"rank-{rank}").write_text(f"{rank}/{size} {os.environ['RUN_LABEL']}")
    report(metrics={"world_size": size}, progress=100)
    return {"rank": rank, "size": size}


def test_an_mpi_runtime_runs_locally_under_mpirun(tmp_path: Path) -> None:
    if shutil.which("mpirun") is None:
        pytest.fail(
            "mpirun not found: install Open MPI (bash testbed/node/build.sh --deps installs openmpi-bin)"
        )
    backend = get_backend("local", home=str(tmp_path / "home"))
    env = {"RUN_LABEL": "local-mpi"}
    if os.geteuid() == 0:
        env |= {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    out = tmp_path / "out"
    ref = backend.submit(
        TrainJobRequest(
            runtime="mlx-distributed", function=ranks, num_nodes=2, env=env, output_uri=f"file://{out}"
        )
    )
    result: Any = backend.wait(ref, timeout=300)
    assert result.state == JobState.COMPLETE, result
    assert sorted(p.read_text() for p in out.glob("rank-*")) == ["0/2 local-mpi", "1/2 local-mpi"]
    assert result.metrics["world_size"] == 2.0
    assert result.return_value == {"rank": 0, "size": 2}
