"""hostPath volumes for the suites on the pods testbed (``from shared_volumes import ...``): a PersistentVolume
on a host directory, pre-bound to a claim, so pods and the test see the same files at once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bounds import HANG


def hostpath_pv(core: Any, name: str, path: Path, size: str, mode: str, namespace: str, claim: str) -> None:
    """A hostPath PersistentVolume (``path``, created here) pre-bound to the claim ``namespace/claim``."""
    from kubernetes import client

    path.mkdir(parents=True, exist_ok=True)
    core.create_persistent_volume(
        client.V1PersistentVolume(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PersistentVolumeSpec(
                capacity={"storage": size},
                access_modes=[mode],
                persistent_volume_reclaim_policy="Retain",
                storage_class_name="",
                host_path=client.V1HostPathVolumeSource(path=str(path), type="Directory"),
                claim_ref=client.V1ObjectReference(namespace=namespace, name=claim),
            ),
        )
    )


def delete_pv(core: Any, name: str) -> None:
    from kubernetes import client

    try:
        core.delete_persistent_volume(name)
    except client.ApiException as exc:
        if exc.status != 404:
            raise


def shared_claim(core: Any, namespace: str, path: Path, pv: str, claim: str = "shared") -> None:
    """A ReadWriteMany claim ``claim`` in ``namespace`` on the host directory ``path`` (the PV ``pv``), Bound."""
    from kubernetes import client

    hostpath_pv(core, pv, path, "1Gi", "ReadWriteMany", namespace, claim)
    core.create_namespaced_persistent_volume_claim(
        namespace,
        client.V1PersistentVolumeClaim(
            metadata=client.V1ObjectMeta(name=claim),
            spec=client.V1PersistentVolumeClaimSpec(
                access_modes=["ReadWriteMany"],
                storage_class_name="",
                volume_name=pv,
                resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
            ),
        ),
    )
    end = time.monotonic() + HANG
    while core.read_namespaced_persistent_volume_claim(claim, namespace).status.phase != "Bound":
        assert time.monotonic() < end, f"the claim {namespace}/{claim} was not Bound after {HANG:.0f} s"
        time.sleep(0.5)
