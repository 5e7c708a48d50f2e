"""Issue 21 items 6 and 7: MPI and JAX failures on real pods across the two nodes end as a clear
``TrainJobFailed`` within a bound (the step, the rank, the log tail), and cancelling an MPI job leaves no
launcher, node pod, CRI container, SSH Secret or hostfile ConfigMap.

Failures run on namespaced copies of the default runtimes with ``backoffLimit: 0`` (the defaults retry a failed
pod 6 times, with the kubelet's restart back-off: minutes), so one failure fails the TrainJob at once.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import pytest

from bounds import HANG
from conftest import (
    TRAINER_GROUP,
    TRAINER_VERSION,
    assert_all_gone,
    cri_containers,
    poll,
    record,
    spread_over_nodes,
)
from trainflow.core import JobState, TrainJobFailed, TrainJobRequest

pytestmark = pytest.mark.e2e

BOUND = (
    240  # seconds from submit to TrainJobFailed, on a loaded 2-core machine (two pods start, sshd, mpirun)
)


def no_retry_copy(k8s: Any, namespace: str, cluster_runtime: str) -> str:
    """A namespaced TrainingRuntime with the default ClusterTrainingRuntime's spec and no Job retries."""
    source = k8s.custom.get_cluster_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", cluster_runtime
    )
    spec = copy.deepcopy(source["spec"])
    for rj in spec["template"]["spec"]["replicatedJobs"]:
        rj["template"].setdefault("spec", {})["backoffLimit"] = 0
    name = f"{cluster_runtime}-no-retry"
    labels = {
        k: v for k, v in source["metadata"].get("labels", {}).items() if k.startswith("trainer.kubeflow.org/")
    }
    runtime = {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "TrainingRuntime",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }
    k8s.custom.create_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, namespace, "trainingruntimes", runtime
    )
    return name


def fails(backend: Any, request: TrainJobRequest) -> tuple[TrainJobFailed, float]:
    """Submit, then wait as a deferred Airflow task does (the async wait and its pod watch): these pods fail and
    are deleted within seconds of being ready, which the sync wait's pod checks (while pods are not ready) can
    miss; the pod watch sees the crash and reads its log first."""
    t0 = time.monotonic()
    ref = backend.submit(request)
    with pytest.raises(TrainJobFailed) as info:
        asyncio.run(backend.wait_async(ref, timeout=BOUND + 60))
    elapsed = time.monotonic() - t0
    assert elapsed < BOUND, f"took {elapsed:.0f}s (bound {BOUND}s): {info.value}"
    assert info.value.result.state == JobState.FAILED
    return info.value, elapsed


def launcher_fails(backend: Any, request: TrainJobRequest) -> tuple[TrainJobFailed, float, str, list[Any]]:
    """fails(), and the failure names the launcher's pod first: (error, seconds, its text, failed ranks)."""
    err, elapsed = fails(backend, request)
    ranks = err.diagnostics.failed_ranks
    assert ranks and ranks[0]["pod"].startswith(f"{err.result.name}-launcher-0-0-"), str(err)
    return err, elapsed, str(err), ranks


def test_ssh_that_cannot_authenticate_names_the_launcher_and_mpiruns_error(
    backend: Any, k8s: Any, namespace: str
) -> None:
    """mpirun reaches the other node's sshd with an identity the Trainer did not authorize: the daemon never
    starts, mpirun exits non-zero, the failure names the launcher and carries mpirun's own words."""
    runtime = no_retry_copy(k8s, namespace, "deepspeed-distributed")
    request = TrainJobRequest(
        runtime=runtime,
        runtime_kind="TrainingRuntime",
        command=[
            "mpirun",
            "--hostfile",
            "/etc/mpi/hostfile",
            "--mca",
            "plm_rsh_args",
            "-o IdentityFile=/dev/null -o IdentitiesOnly=yes -o BatchMode=yes",
            "python3",
            "-c",
            "print('never runs')",
        ],
        num_nodes=2,
        runtime_patches=spread_over_nodes("node", "launcher"),
    )
    err, elapsed, text, ranks = launcher_fails(backend, request)
    assert (ranks[0]["step"], ranks[0]["rank"], ranks[0]["exit_code"]) == ("launcher", "0", 255), text
    # Open MPI's own explanation (the daemon on the other node never started: ssh was refused). Which of its
    # lines end the tail varies: under load mpirun may add ORTE's routing message after the list of causes
    causes = ("lack of authority to execute on one or more specified nodes",
              "an inability to create a connection back to mpirun")  # fmt: skip
    assert any(c in err.diagnostics.log_tail for c in causes), text
    assert "never runs" not in err.diagnostics.log_tail
    record("mpi_failure_ssh", {"seconds": round(elapsed, 1)})


def test_a_rank_exiting_non_zero_under_mpirun_names_the_rank_and_its_log(
    backend: Any, k8s: Any, namespace: str
) -> None:
    runtime = no_retry_copy(k8s, namespace, "deepspeed-distributed")
    fail_rank_1 = 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then echo "rank 1: loss is nan at step 3" >&2; exit 7; fi; sleep 600'
    request = TrainJobRequest(
        runtime=runtime,
        runtime_kind="TrainingRuntime",
        command=["mpirun", "--hostfile", "/etc/mpi/hostfile", "sh", "-c", fail_rank_1],
        num_nodes=2,
        runtime_patches=spread_over_nodes("node", "launcher"),
    )
    err, elapsed, text, ranks = launcher_fails(backend, request)
    assert ranks[0]["exit_code"] == 7, text
    tail = err.diagnostics.log_tail
    # the rank's own stderr (forwarded by mpirun), then mpirun's account of it
    assert "rank 1: loss is nan at step 3" in tail, text
    # mpirun's own words follow (how much of them the tail holds depends on when it was read)
    assert "returned\na non-zero exit code" in tail or "Exit code:    7" in tail, text
    record("mpi_failure_rank_exit", {"seconds": round(elapsed, 1)})


def jax_without_coordinator() -> None:
    """Process 0 never starts the coordinator; the others give up after their initialization timeout."""
    import os
    import time

    import jax

    if os.environ["JAX_PROCESS_ID"] == "0":
        time.sleep(600)
    jax.distributed.initialize(
        coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]),
        initialization_timeout=20,
    )


def test_a_jax_coordinator_that_never_comes_up_fails_the_waiting_process(
    backend: Any, k8s: Any, namespace: str
) -> None:
    runtime = no_retry_copy(k8s, namespace, "jax-distributed")
    request = TrainJobRequest(
        runtime=runtime,
        runtime_kind="TrainingRuntime",
        function=jax_without_coordinator,
        num_nodes=2,
        runtime_patches=spread_over_nodes("node"),
    )
    err, elapsed = fails(backend, request)
    text = str(err)
    ranks = err.diagnostics.failed_ranks
    assert ranks and ranks[0]["rank"] == "1" and ranks[0]["exit_code"] not in (0, None), text
    assert ranks[0]["pod"].startswith(f"{err.result.name}-node-0-1-"), text
    tail = err.diagnostics.log_tail
    assert "DEADLINE_EXCEEDED" in tail or "coordination service" in tail.lower() or "Barrier" in tail, text
    record("jax_failure_no_coordinator", {"seconds": round(elapsed, 1)})


def test_cancel_of_an_mpi_job_leaves_no_launcher_node_pod_container_or_secret(
    backend: Any, k8s: Any, namespace: str, testbed: Any
) -> None:
    request = TrainJobRequest(
        runtime="deepspeed-distributed",
        command=[
            "mpirun",
            "--hostfile",
            "/etc/mpi/hostfile",
            "sh",
            "-c",
            "trap 'exit 0' TERM; sleep 600 & wait",
        ],
        num_nodes=2,
        runtime_patches=spread_over_nodes("node", "launcher"),
    )
    ref = backend.submit(request)
    # launcher and node pod running on the two nodes: 2 sandboxes + 2 containers in the CRIs
    poll(lambda: len(cri_containers(testbed, namespace)) >= 4, 300, "launcher and node pod containers")
    assert (
        k8s.core.read_namespaced_secret(f"{ref.name}-mpi-ssh-auth", namespace).type
        == "kubernetes.io/ssh-auth"
    )
    t0 = time.monotonic()
    backend.cancel(ref)
    gone = assert_all_gone(testbed, k8s, namespace)

    def owned_left() -> list[str]:
        names = [s.metadata.name for s in k8s.core.list_namespaced_secret(namespace).items]
        names += [c.metadata.name for c in k8s.core.list_namespaced_config_map(namespace).items]
        return [n for n in names if n.startswith(ref.name)]

    poll(
        lambda: owned_left() == [], HANG, "the TrainJob's SSH Secret and hostfile ConfigMap garbage-collected"
    )
    record("mpi_cancel", {"seconds": round(time.monotonic() - t0, 1), "all_gone_seconds": round(gone, 1)})
