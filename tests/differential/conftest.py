"""The differential suite: the Kubeflow SDK and trainflow submit the same intents to the testbed; the pods
the real Trainer makes from each are compared. Reuses the e2e testbed fixtures (never skipped)."""

from __future__ import annotations

import importlib.util
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

_E2E_CONFTEST = Path(__file__).resolve().parents[1] / "e2e" / "conftest.py"


def _load_e2e_conftest() -> Any:
    name = "trainflow_e2e_fixtures"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _E2E_CONFTEST)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_e2e = _load_e2e_conftest()
testbed = _e2e.testbed
k8s = _e2e.k8s
namespace = _e2e.namespace
pytest_runtest_makereport = _e2e.pytest_runtest_makereport
GROUP, VERSION = _e2e.TRAINER_GROUP, _e2e.TRAINER_VERSION
WAIT_SECONDS = 300


@dataclass
class Side:
    namespace: str
    trainjob: dict[str, Any] | None = None
    pods: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


@dataclass
class Outcome:
    sdk: Side
    tf: Side


def _initializer_volume(core: Any, ns: str, job: str) -> str:
    """A PV reserved for the PVC JobSet will create for the job's TorchTune runtime (``initializer-<job>``)."""
    from kubernetes import client

    name = f"diff-{ns}-{job}"[:253]
    core.create_persistent_volume(
        client.V1PersistentVolume(
            metadata=client.V1ObjectMeta(name=name, labels={"trainflow-differential": "true"}),
            spec=client.V1PersistentVolumeSpec(
                capacity={"storage": "20Gi"},
                access_modes=["ReadWriteOnce"],
                host_path=client.V1HostPathVolumeSource(path=f"/tmp/{name}"),
                claim_ref=client.V1ObjectReference(namespace=ns, name=f"initializer-{job}"),
            ),
        )
    )
    return name


def _bind_claims(core: Any, ns: str) -> None:
    """Stand in for the volume binder (the testbed runs none): bind each new PVC to the PV reserved for it,
    as the PV controller does (volumeName set once, bind-completed, both Bound), so its pods get scheduled."""
    for pvc in core.list_namespaced_persistent_volume_claim(ns).items:
        if pvc.spec.volume_name:
            continue
        pv = f"diff-{ns}-{pvc.metadata.name.removeprefix('initializer-')}"[:253]
        core.patch_persistent_volume_status(pv, {"status": {"phase": "Bound"}})
        core.patch_namespaced_persistent_volume_claim(
            pvc.metadata.name,
            ns,
            {
                "metadata": {"annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
                "spec": {"volumeName": pv},
            },
        )
        core.patch_namespaced_persistent_volume_claim_status(
            pvc.metadata.name,
            ns,
            {"status": {"phase": "Bound", "capacity": {"storage": "20Gi"}, "accessModes": ["ReadWriteOnce"]}},
        )


def _terminal(trainjob: dict[str, Any]) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (trainjob.get("status") or {}).get("conditions") or []
    )


def _submit_sdk(client: Any, t: Any, intent: Any) -> None:
    kwargs = intent.sdk(t)
    options = [t.Name(name=intent.name), *kwargs.pop("options", [])]
    client.train(runtime=intent.runtime, options=options, **kwargs)


def _submit_tf(custom: Any, ns: str, intent: Any) -> None:
    from trainflow.core import build_trainjob
    from trainflow.core.runtimes import Runtime

    runtime = Runtime.from_object(
        custom.get_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", intent.runtime)
    )
    request = {**intent.tf, "name": intent.name, "runtime": intent.runtime}
    custom.create_namespaced_custom_object(
        GROUP, VERSION, ns, "trainjobs", build_trainjob(request, runtime, namespace=ns)
    )


@pytest.fixture(scope="session")
def outcomes(request: pytest.FixtureRequest, testbed: Any) -> Iterator[dict[str, Outcome]]:
    """Every selected intent submitted by both clients, waited for, and the pods the Trainer made for each."""
    import logging

    from diff_intents import INTENTS as ALL_INTENTS
    from diff_intents import sdk_namespace

    chosen = {
        item.callspec.params["intent"].id
        for item in request.session.items
        if hasattr(item, "callspec") and "intent" in item.callspec.params
    }
    INTENTS = [i for i in ALL_INTENTS if i.id in chosen]
    from kubeflow.trainer import KubernetesBackendConfig, TrainerClient
    from kubernetes import client

    logging.getLogger("kubeflow").setLevel(logging.ERROR)
    core, custom = client.CoreV1Api(testbed.api_client), client.CustomObjectsApi(testbed.api_client)
    namespaces = {side: _e2e.create_namespace(testbed, f"diff-{side}") for side in ("sdk", "tf")}
    volumes: list[str] = []
    result = {i.id: Outcome(Side(namespaces["sdk"]), Side(namespaces["tf"])) for i in INTENTS}
    t0 = time.monotonic()
    try:
        for ns in namespaces.values():
            core.create_namespaced_service_account(
                ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="trainer-sa"))
            )
            for intent in INTENTS:
                for secret, data in intent.secrets.items():
                    core.create_namespaced_secret(
                        ns, client.V1Secret(metadata=client.V1ObjectMeta(name=secret), string_data=data)
                    )
                if intent.runtime.startswith("torchtune-"):
                    volumes.append(_initializer_volume(core, ns, intent.name))
        sdk = TrainerClient(
            backend_config=KubernetesBackendConfig(
                namespace=namespaces["sdk"], config_file=str(testbed.kubeconfig), context=testbed.context
            )
        )
        t = sdk_namespace()
        for intent in INTENTS:
            for side in ("sdk", "tf"):
                try:
                    if side == "sdk":
                        _submit_sdk(sdk, t, intent)
                    else:
                        _submit_tf(custom, namespaces["tf"], intent)
                except Exception as exc:  # reported by the intent's test
                    getattr(result[intent.id], side).error = f"submit failed: {exc!r}"[:2000]
        t_submit = time.monotonic() - t0
        pending = {
            (side, i.id) for i in INTENTS for side in ("sdk", "tf") if not getattr(result[i.id], side).error
        }
        names = {i.id: i.name for i in INTENTS}
        # every pod seen while waiting, by namespace and name: once a launcher completes its job, the JobSet
        # stops the job's other pods, so a single list at the end can miss pods the Trainer did make
        seen: dict[str, dict[str, dict[str, Any]]] = {ns: {} for ns in namespaces.values()}

        def collect(ns: str) -> None:
            for pod in core.list_namespaced_pod(ns).items:
                seen[ns][pod.metadata.name] = testbed.api_client.sanitize_for_serialization(pod)

        while pending and time.monotonic() - t0 < WAIT_SECONDS:
            for side, ns in namespaces.items():
                _bind_claims(core, ns)
                collect(ns)
                jobs = {
                    j["metadata"]["name"]: j
                    for j in custom.list_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs")["items"]
                }
                for key in [k for k in pending if k[0] == side]:
                    job = jobs.get(names[key[1]])
                    if job is not None and _terminal(job):
                        pending.discard(key)
            time.sleep(1)
        for side, ns in namespaces.items():
            jobs = {
                j["metadata"]["name"]: j
                for j in custom.list_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs")["items"]
            }
            collect(ns)
            pods: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for raw in seen[ns].values():
                pods[(raw["metadata"].get("labels") or {}).get("jobset.sigs.k8s.io/jobset-name", "")].append(
                    raw
                )
            for intent in INTENTS:
                out = getattr(result[intent.id], side)
                out.trainjob, out.pods = jobs.get(intent.name), pods.get(intent.name, [])
                if (side, intent.id) in pending and not out.error:
                    out.error = f"not Complete/Failed within {WAIT_SECONDS}s:\n{_e2e.dump_namespace(testbed, ns)[-3000:]}"
        print(
            f"\ndifferential: {len(INTENTS)} intents x 2 clients; submit {t_submit:.1f}s, "
            f"all terminal {time.monotonic() - t0:.1f}s"
        )
        yield result
    finally:
        for ns in namespaces.values():
            _e2e.delete_namespace(testbed, ns)
        for pv in volumes:
            try:
                core.delete_persistent_volume(pv)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
