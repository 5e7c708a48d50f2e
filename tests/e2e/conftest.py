"""Fixtures for end-to-end tests against the local testbed (testbed/up.sh).

The testbed is a real kube-apiserver/etcd/controller-manager/scheduler with kwok
nodes, the JobSet controller and the Kubeflow Trainer controller manager, all on
127.0.0.1. Start it with ``make testbed-up`` (or ``testbed/up.sh``); these
fixtures never start or skip it: if it is not up, every e2e test fails loudly
with the tail of each component log.

Env: ``TRAINFLOW_TESTBED_DIR`` (default ``/tmp/trainflow-testbed``).
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG

REPO_ROOT = Path(__file__).resolve().parents[2]
TESTBED_PY = REPO_ROOT / "testbed" / "testbed.py"

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"

# kwok Stage label (see testbed/kwok.py): a pod carrying it fails (exit 1)
# instead of completing.
KWOK_FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
# Upstream kwok per-pod annotation: how long a Running Job pod stays Running.
KWOK_COMPLETE_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"


def testbed_dir() -> Path:
    return Path(os.environ.get("TRAINFLOW_TESTBED_DIR", "/tmp/trainflow-testbed"))


def component_logs(lines: int = 60) -> str:
    r = subprocess.run(
        [sys.executable, str(TESTBED_PY), "logs", "--dir", str(testbed_dir()), "--lines", str(lines)],
        capture_output=True,
        text=True,
    )
    return r.stdout + r.stderr


@dataclass
class Testbed:
    dir: Path
    kubeconfig: Path
    context: str
    server: str
    state: dict[str, Any]
    api_client: Any = field(repr=False)

    @property
    def env(self) -> dict[str, str]:
        """Environment for subprocesses that should talk to the testbed."""
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "TRAINFLOW_TESTBED_DIR": str(self.dir),
        }


def _fail(msg: str) -> None:
    pytest.fail(
        f"{msg}\n\nThe e2e testbed must be running (make testbed-up). "
        f"Component logs from {testbed_dir()}:\n{component_logs()}",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    d = testbed_dir()
    state_file = d / "state.json"
    if not state_file.exists():
        _fail(f"no testbed state at {state_file}")
    st = subprocess.run(
        [sys.executable, str(TESTBED_PY), "status", "--dir", str(d)], capture_output=True, text=True
    )
    if st.returncode != 0:
        _fail(f"testbed processes not all running:\n{st.stdout}{st.stderr}")
    state = json.loads(state_file.read_text())

    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=state["kubeconfig"], context=state["context"])
    try:
        code = client.VersionApi(api_client).get_code()
    except Exception as e:
        _fail(f"kube-apiserver at {state['server']} not answering: {e!r}")
    assert code.git_version.startswith("v1."), code
    yield Testbed(
        dir=d,
        kubeconfig=Path(state["kubeconfig"]),
        context=state["context"],
        server=state["server"],
        state=state,
        api_client=api_client,
    )
    api_client.close()


@pytest.fixture
def k8s(testbed: Testbed):
    """Typed API handles bound to the testbed's admin credentials."""
    from kubernetes import client

    class _K:
        core = client.CoreV1Api(testbed.api_client)
        batch = client.BatchV1Api(testbed.api_client)
        custom = client.CustomObjectsApi(testbed.api_client)
        rbac = client.RbacAuthorizationV1Api(testbed.api_client)

    return _K


def _slug(name: str) -> str:
    s = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return s[:30].strip("-") or "t"


def create_namespace(testbed: Testbed, prefix: str = "e2e") -> str:
    """Create a fresh namespace and wait until its default ServiceAccount exists."""
    from kubernetes import client

    core = client.CoreV1Api(testbed.api_client)
    name = f"{_slug(prefix)}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"trainflow-e2e": "true"}))
    )

    def sa_ready() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
            return True
        except client.ApiException as e:
            if e.status == 404:
                return False
            raise

    wait_until(sa_ready, HANG, f"default ServiceAccount in {name}")
    return name


def delete_namespace(testbed: Testbed, name: str) -> None:
    from kubernetes import client

    try:
        client.CoreV1Api(testbed.api_client).delete_namespace(
            name, body=client.V1DeleteOptions(propagation_policy="Background")
        )
    except client.ApiException as e:
        if e.status != 404:
            raise


def dump_namespace(testbed: Testbed, ns: str) -> str:
    """Human-readable state of a namespace (TrainJobs, JobSets, Jobs, pods, events)."""
    from kubernetes import client

    api = testbed.api_client
    custom = client.CustomObjectsApi(api)
    out = [f"--- namespace {ns}"]
    try:
        for tj in custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs")[
            "items"
        ]:
            out.append(f"TrainJob {tj['metadata']['name']} status={json.dumps(tj.get('status'))}")
        for js in custom.list_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, ns, "jobsets")["items"]:
            out.append(f"JobSet {js['metadata']['name']} status={json.dumps(js.get('status'))}")
        for job in client.BatchV1Api(api).list_namespaced_job(ns).items:
            out.append(f"Job {job.metadata.name} status={job.status.to_dict()}")
        for pod in client.CoreV1Api(api).list_namespaced_pod(ns).items:
            out.append(f"Pod {pod.metadata.name} node={pod.spec.node_name} phase={pod.status.phase}")
        for ev in client.CoreV1Api(api).list_namespaced_event(ns).items:
            out.append(
                f"Event {ev.involved_object.kind}/{ev.involved_object.name} {ev.type} {ev.reason}: {ev.message}"
            )
    except Exception as e:
        out.append(f"(dump failed: {e!r})")
    return "\n".join(out)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


@pytest.fixture
def namespace(request, testbed: Testbed) -> Iterator[str]:
    """A fresh namespace per test; on failure its objects and events are printed."""
    ns = create_namespace(testbed, request.node.name)
    yield ns
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(dump_namespace(testbed, ns))
    delete_namespace(testbed, ns)


def service_account_client(testbed: Testbed, namespace: str, name: str, create: bool = True):
    """An ApiClient authenticated as ServiceAccount ``namespace/name`` (bound token via
    the TokenRequest API), so RBAC is exercised for real. Creates the SA if asked."""
    from kubernetes import client

    core = client.CoreV1Api(testbed.api_client)
    if create:
        try:
            core.create_namespaced_service_account(
                namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
            )
        except client.ApiException as e:
            if e.status != 409:
                raise
    tr = core.create_namespaced_service_account_token(
        name,
        namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        ),
    )
    cfg = client.Configuration()
    cfg.host = testbed.server
    cfg.ssl_ca_cert = str(testbed.dir / "pki" / "ca.crt")
    cfg.api_key = {"authorization": "Bearer " + tr.status.token}
    return client.ApiClient(cfg)


def sa_kubeconfig(testbed: Testbed, namespace: str, name: str, path: Path) -> Path:
    """Write a kubeconfig for ServiceAccount ``namespace/name`` (token from TokenRequest)."""
    import yaml
    from kubernetes import client

    tr = client.CoreV1Api(testbed.api_client).create_namespaced_service_account_token(
        name,
        namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        ),
    )
    user = f"system:serviceaccount:{namespace}:{name}"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": testbed.context,
                        "cluster": {
                            "server": testbed.server,
                            "certificate-authority": str(testbed.dir / "pki" / "ca.crt"),
                        },
                    }
                ],
                "users": [{"name": user, "user": {"token": tr.status.token}}],
                "contexts": [
                    {
                        "name": user,
                        "context": {"cluster": testbed.context, "user": user, "namespace": namespace},
                    }
                ],
                "current-context": user,
            }
        )
    )
    return path


@pytest.fixture
def sa_api_client(testbed: Testbed):
    """Factory fixture: ``sa_api_client(namespace, name)`` -> ApiClient acting as that
    ServiceAccount (created if missing). Clients are closed after the test."""
    made = []

    def make(namespace: str, name: str, create: bool = True):
        c = service_account_client(testbed, namespace, name, create=create)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def wait_until(fn: Callable[[], Any], timeout: float, desc: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {desc}; last={last!r}")


_REQUEST_METRIC = re.compile(r"^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$")


def request_totals(testbed: Testbed) -> collections.Counter[str]:
    """The API server's ``apiserver_request_total`` by ``"VERB resource"`` (every client, controllers too)."""
    from kubernetes import client

    resp = client.ApiClient.call_api(
        testbed.api_client, "/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False
    )[0]
    out: collections.Counter[str] = collections.Counter()
    for line in resp.data.decode().splitlines():
        m = _REQUEST_METRIC.match(line)
        if m:
            labels = dict(kv.split("=", 1) for kv in re.findall(r'(\w+="[^"]*")', m.group(1)))
            verb, resource = labels.get("verb", "").strip('"'), labels.get("resource", "").strip('"')
            out[f"{verb} {resource}"] += int(float(m.group(2)))
    return out


NO_RETRY_RUNTIME = "torch-no-retry"


def torch_training_runtime(k8s, namespace: str, name: str, backoff_limit: int) -> str:
    """Create a namespaced TrainingRuntime like torch-distributed whose Job allows ``backoff_limit`` retries."""
    image = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
    step = {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    node = {
        "backoffLimit": backoff_limit,
        "template": {"spec": {"containers": [{"name": "node", "image": image}]}},
    }
    runtime = {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "TrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {"name": "node", "template": {"metadata": {"labels": step}, "spec": node}}
                    ]
                }
            },
        },
    }
    k8s.custom.create_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, namespace, "trainingruntimes", runtime
    )
    return name


@pytest.fixture
def no_retry_runtime(k8s, namespace: str) -> str:
    """A namespaced TrainingRuntime like torch-distributed but without Job retries (backoffLimit 0), so one
    failed pod fails the Job, the JobSet and the TrainJob at once; returns its name."""
    return torch_training_runtime(k8s, namespace, NO_RETRY_RUNTIME, 0)


def condition(obj: dict, ctype: str) -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return None


def apply_rbac(testbed: Testbed, namespace: str, manifest: Path) -> list[str]:
    """Apply a shipped RBAC manifest with every subject moved to ``namespace``; namespaced objects go to
    ``namespace``, cluster-scoped bindings get a per-namespace name. Returns those bindings, to delete."""
    import copy

    import yaml
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(testbed.api_client)
    bindings = []
    for doc in yaml.safe_load_all(manifest.read_text()):
        doc = copy.deepcopy(doc)
        for subject in doc.get("subjects") or []:
            subject["namespace"] = namespace
        kind = doc["kind"]
        if kind == "Role":
            rbac.create_namespaced_role(namespace, doc)
        elif kind == "RoleBinding":
            rbac.create_namespaced_role_binding(namespace, doc)
        elif kind == "ClusterRole":
            try:
                rbac.create_cluster_role(doc)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
                rbac.replace_cluster_role(doc["metadata"]["name"], doc)
        elif kind == "ClusterRoleBinding":
            doc["metadata"]["name"] = f"{doc['metadata']['name']}-{namespace}"
            rbac.create_cluster_role_binding(doc)
            bindings.append(doc["metadata"]["name"])
        else:
            raise AssertionError(f"{manifest}: unexpected kind {kind}")
    return bindings


def delete_cluster_role_bindings(testbed: Testbed, names: list[str]) -> None:
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(testbed.api_client)
    for name in names:
        rbac.delete_cluster_role_binding(name)


@pytest.fixture(scope="module")
def store(testbed: Testbed) -> dict[str, str]:
    info = testbed.state.get("objstore")
    if not info:
        pytest.fail("the testbed has no object store: start it with `bash testbed/up.sh --objstore`")
    creds = json.loads(Path(info["credentials_file"]).read_text())
    return {
        "bucket": info["bucket"],
        "AWS_ENDPOINT_URL": info["endpoint"],
        "AWS_REGION": info["region"],
        "AWS_ACCESS_KEY_ID": creds["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": creds["secret_access_key"],
    }


def env_of(store: dict[str, str], **override: str) -> dict[str, str]:
    return {**{k: v for k, v in store.items() if k.startswith("AWS_")}, **override}
