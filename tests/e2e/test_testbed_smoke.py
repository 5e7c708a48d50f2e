"""Smoke tests of the e2e testbed itself, with the plain ``kubernetes`` client.

They prove the testbed is a faithful Kubeflow Trainer v2.3.0 cluster:
TrainJob -> JobSet -> Jobs -> pods (kwok) -> TrainJob conditions, pod failure,
server-side rejection (CEL + admission webhooks), dry-run, suspend/resume.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
from kubernetes import client

from bounds import HANG
from conftest import (
    JOBSET_GROUP,
    JOBSET_VERSION,
    KWOK_COMPLETE_DELAY,
    KWOK_FAIL_LABEL,
    TRAINER_GROUP,
    TRAINER_VERSION,
    wait_until,
)


def condition(obj, ctype):
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return None


pytestmark = pytest.mark.e2e

TIMEOUT = 120

UPSTREAM_EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "upstream_trainer_examples"

# Shape of upstream examples/01-multi-node.yaml (v2.3.0), numNodes 2.
MULTI_NODE = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "multi-node"},
    "spec": {
        "runtimeRef": {
            "apiGroup": "trainer.kubeflow.org",
            "kind": "ClusterTrainingRuntime",
            "name": "torch-distributed",
        },
        "trainer": {
            "numNodes": 2,
            "command": ["torchrun", "--no-python", "python3", "-c", "print('hello')"],
        },
    },
}


def trainjob(name: str, **spec_overrides) -> dict:
    tj = copy.deepcopy(MULTI_NODE)
    tj["metadata"]["name"] = name
    tj["spec"].update(spec_overrides)
    return tj


def create(k8s, ns: str, body: dict, dry_run: str | None = None) -> dict:
    kw = {"dry_run": dry_run} if dry_run else {}
    return k8s.custom.create_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs", body, **kw
    )


def get_tj(k8s, ns: str, name: str) -> dict:
    return k8s.custom.get_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs", name)


def wait_condition(k8s, ns: str, name: str, ctype: str, status: str = "True", timeout: float = TIMEOUT):
    def check():
        c = condition(get_tj(k8s, ns, name), ctype)
        return c if c and c.get("status") == status else None

    return wait_until(check, timeout, f"TrainJob {ns}/{name} condition {ctype}={status}")


def node_pods(k8s, ns: str, name: str):
    return k8s.core.list_namespaced_pod(
        ns,
        label_selector=f"jobset.sigs.k8s.io/jobset-name={name},jobset.sigs.k8s.io/replicatedjob-name=node",
    ).items


def test_trainjob_runs_to_complete(k8s, namespace, testbed):
    ns, name = namespace, "torch-ok"
    created = create(k8s, ns, trainjob(name))
    # Mutating webhook / CRD defaults applied by the server
    assert created["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller"
    assert created["spec"]["suspend"] is False

    # TrainJob -> JobSet with the same name, owned by the TrainJob
    js = wait_until(
        lambda: _get_or_none(
            lambda: k8s.custom.get_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, ns, "jobsets", name)
        ),
        TIMEOUT,
        "JobSet",
    )
    owner = js["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("TrainJob", name, True)

    # JobSet -> Job(s) -> 2 pods, on kwok nodes
    jobs = wait_until(
        lambda: (
            k8s.batch.list_namespaced_job(ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}").items
        ),
        TIMEOUT,
        "Jobs",
    )
    assert [j.metadata.name for j in jobs] == [f"{name}-node-0"]
    assert jobs[0].metadata.labels["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
    pods = wait_until(
        lambda: len(node_pods(k8s, ns, name)) == 2 and node_pods(k8s, ns, name), TIMEOUT, "2 pods"
    )
    ranks = sorted(p.metadata.labels["batch.kubernetes.io/job-completion-index"] for p in pods)
    assert ranks == ["0", "1"]
    env = {e.name: e.value for e in pods[0].spec.containers[0].env or []}
    assert env["PET_NNODES"] == "2"
    assert env["PET_MASTER_ADDR"] == f"{name}-node-0-0.{name}"
    assert env["PET_MASTER_PORT"] == "29500"

    # -> Complete
    c = wait_condition(k8s, ns, name, "Complete")
    assert c["reason"] == "AllJobsCompleted", c
    tj = get_tj(k8s, ns, name)
    assert condition(tj, "Failed") is None
    pods = node_pods(k8s, ns, name)
    assert {p.status.phase for p in pods} == {"Succeeded"}
    assert {p.spec.node_name for p in pods} <= set(testbed.state["kwok_nodes"])
    js_status = {j["name"]: j for j in tj["status"]["jobsStatus"]}
    assert js_status["node"]["succeeded"] == 1, tj["status"]


def test_pod_failure_fails_trainjob(k8s, namespace, no_retry_runtime):
    ns, name = namespace, "torch-fail"
    tj = trainjob(name)
    tj["spec"]["runtimeRef"] = {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
        "name": no_retry_runtime,
    }
    tj["spec"]["runtimePatches"] = [
        {
            "manager": "trainflow.e2e/failure-injection",
            "trainingRuntimeSpec": {
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {
                                "name": "node",
                                "template": {
                                    "spec": {
                                        "template": {
                                            "metadata": {
                                                "labels": {KWOK_FAIL_LABEL: "true"},
                                                "annotations": {
                                                    "pod-container-running-failed.stage.kwok.x-k8s.io/exit-code": "3"
                                                },
                                            }
                                        }
                                    }
                                },
                            }
                        ]
                    }
                }
            },
        }
    ]
    create(k8s, ns, tj)
    c = wait_condition(k8s, ns, name, "Failed")
    assert c["reason"] == "FailedJobs", c
    # v2.3.0 + JobSet v0.12.0 append the first failed Job to the documented message
    assert (
        c["message"] == f"jobset failed due to one or more job failures (first failed job: {name}-node-0)"
    ), c
    assert condition(get_tj(k8s, ns, name), "Complete") is None
    failed = [p for p in node_pods(k8s, ns, name) if p.status.phase == "Failed"]
    assert failed, "no failed pod"
    term = failed[0].status.container_statuses[0].state.terminated
    assert term.exit_code == 3


@pytest.mark.parametrize(
    "case,mutate,expect",
    [
        # object-level CEL on metadata.name (RFC 1035; a leading digit is a valid DNS-1123 subdomain)
        ("name-cel", lambda tj: tj["metadata"].update(name="1-starts-with-digit"), "metadata.name"),
        # CEL pattern on initializer storageUri
        (
            "storage-uri-cel",
            lambda tj: tj["spec"].update(initializer={"dataset": {"storageUri": "not-a-uri"}}),
            "storageUri",
        ),
        # reserved env name: rejected by Trainer's validating webhook
        (
            "reserved-env-webhook",
            lambda tj: tj["spec"]["trainer"].update(env=[{"name": "PET_NNODES", "value": "5"}]),
            "PET_NNODES",
        ),
        # runtime that does not exist: webhook
        (
            "missing-runtime-webhook",
            lambda tj: tj["spec"]["runtimeRef"].update(name="no-such-runtime"),
            "no-such-runtime",
        ),
        # managedBy enum-by-CEL
        ("managed-by-cel", lambda tj: tj["spec"].update(managedBy="example.com/other"), "managedBy"),
    ],
)
def test_invalid_trainjob_rejected_by_server(k8s, namespace, case, mutate, expect):
    tj = trainjob("invalid")
    mutate(tj)
    with pytest.raises(client.ApiException) as ei:
        create(k8s, namespace, tj)
    e = ei.value
    msg = json.loads(e.body)["message"]
    if case.endswith("-webhook"):
        # controller-runtime webhooks deny with 403 Forbidden
        assert e.status == 403, (e.status, e.body)
        assert msg.startswith('admission webhook "validator.trainjob.trainer.kubeflow.org" denied'), msg
    else:
        # CRD schema / CEL: 422 Invalid
        assert e.status == 422, (e.status, e.body)
    assert expect in msg, msg
    # nothing was created
    listed = k8s.custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, namespace, "trainjobs")
    assert listed["items"] == []


def test_server_side_dry_run_create(k8s, namespace):
    tj = trainjob("dry-run")
    del tj["spec"]["runtimeRef"]["apiGroup"]
    del tj["spec"]["runtimeRef"]["kind"]
    out = create(k8s, namespace, tj, dry_run="All")
    # defaults filled by the server, nothing persisted
    assert out["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"
    assert out["spec"]["runtimeRef"]["apiGroup"] == "trainer.kubeflow.org"
    assert out["metadata"].get("uid")
    with pytest.raises(client.ApiException) as ei:
        get_tj(k8s, namespace, "dry-run")
    assert ei.value.status == 404
    # an invalid object is rejected in dry-run too (webhooks run for dry-run requests)
    bad = trainjob("dry-run-bad")
    bad["spec"]["trainer"]["env"] = [{"name": "PET_NNODES", "value": "1"}]
    with pytest.raises(client.ApiException):
        create(k8s, namespace, bad, dry_run="All")


@pytest.mark.parametrize(
    "example,rejected",
    [
        ("01-multi-node.yaml", None),
        ("02-runtime-patches.yaml", None),
        ("03-kueue-integration.yaml", None),
        ("04-volcano-integration.yaml", None),
        # Upstream's own example is refused by the v2.3.0 TrainJob webhook: its
        # TrainingRuntime's dataset-initializer container lacks the volumeMount
        # named "initializer" the webhook requires (see testbed/README.md).
        (
            "05-multi-step.yaml",
            "must have volumeMount with name - initializer in container dataset-initializer",
        ),
    ],
)
def test_upstream_examples_server_side_dry_run(k8s, namespace, testbed, example, rejected):
    """Upstream v2.3.0 examples: runtimes they define are created for real (dry-run
    does not persist them and the TrainJob webhook requires the runtime to exist),
    then each TrainJob goes through a server-side dry-run create (schema, CEL, webhooks)."""
    import yaml

    docs = [d for d in yaml.safe_load_all((UPSTREAM_EXAMPLES / example).read_text()) if d]
    cluster_runtimes = []
    try:
        for d in docs:
            if d["kind"] == "ClusterTrainingRuntime":
                k8s.custom.create_cluster_custom_object(
                    TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", d
                )
                cluster_runtimes.append(d["metadata"]["name"])
            elif d["kind"] == "TrainingRuntime":
                k8s.custom.create_namespaced_custom_object(
                    TRAINER_GROUP, TRAINER_VERSION, namespace, "trainingruntimes", d
                )
        trainjobs = [d for d in docs if d["kind"] == "TrainJob"]
        assert trainjobs
        for d in trainjobs:
            if rejected:
                with pytest.raises(client.ApiException) as ei:
                    create(k8s, namespace, d, dry_run="All")
                assert ei.value.status == 403 and rejected in json.loads(ei.value.body)["message"], (
                    ei.value.body
                )
                continue
            out = create(k8s, namespace, d, dry_run="All")
            assert out["metadata"]["name"] == d["metadata"]["name"]
    finally:
        for n in cluster_runtimes:
            k8s.custom.delete_cluster_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", n
            )


def test_suspend_then_resume_runs_to_complete(k8s, namespace):
    ns, name = namespace, "torch-suspend"
    tj = trainjob(name, suspend=True)
    create(k8s, ns, tj)
    c = wait_condition(k8s, ns, name, "Suspended")
    assert c["reason"] == "Suspended", c
    # Suspended: the JobSet (if any) is suspended and no pods run
    js = _get_or_none(
        lambda: k8s.custom.get_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, ns, "jobsets", name)
    )
    if js is not None:
        assert js["spec"].get("suspend") is True
    assert node_pods(k8s, ns, name) == []

    # resume (as Kueue does): patch spec.suspend=false
    k8s.custom.patch_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs", name, {"spec": {"suspend": False}}
    )
    c = wait_condition(k8s, ns, name, "Suspended", status="False")
    assert c["reason"] == "Resumed", c
    wait_condition(k8s, ns, name, "Complete")
    # the Suspended=False/Resumed condition stays after completion
    final = get_tj(k8s, ns, name)
    assert condition(final, "Suspended")["status"] == "False"


def test_pod_stays_running_with_kwok_delay(k8s, namespace):
    """Pods can be held Running (kwok delay annotation) and the TrainJob reports no terminal condition."""
    ns, name = namespace, "torch-slow"
    tj = trainjob(name)
    tj["spec"]["runtimePatches"] = [
        {
            "manager": "trainflow.e2e/slow",
            "trainingRuntimeSpec": {
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {
                                "name": "node",
                                "template": {
                                    "spec": {
                                        "template": {"metadata": {"annotations": {KWOK_COMPLETE_DELAY: "8s"}}}
                                    }
                                },
                            }
                        ]
                    }
                }
            },
        }
    ]
    create(k8s, ns, tj)
    wait_until(
        lambda: [p for p in node_pods(k8s, ns, name) if p.status.phase == "Running"].__len__() == 2,
        TIMEOUT,
        "2 Running pods",
    )
    st = get_tj(k8s, ns, name).get("status") or {}
    assert not [c for c in st.get("conditions") or [] if c["type"] in ("Complete", "Failed")]
    wait_condition(k8s, ns, name, "Complete")


def test_trainer_status_written_through_status_subresource(k8s, namespace):
    """TrainJobStatus (progress server) is off in the testbed; what it would write,
    status.trainerStatus, can be written through the status subresource and survives
    the controller's reconciles, so readers of metrics/progress can be tested."""
    ns, name = namespace, "torch-status"
    create(k8s, ns, trainjob(name))
    wait_condition(k8s, ns, name, "Complete")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {
        "status": {
            "trainerStatus": {
                "progressPercentage": 100,
                "estimatedRemainingSeconds": 0,
                "metrics": [{"name": "loss", "value": "0.45"}, {"name": "accuracy", "value": "0.91"}],
                "lastUpdatedTime": now,
            }
        }
    }
    k8s.custom.patch_namespaced_custom_object_status(
        TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs", name, body
    )
    # poke a reconcile (label change) and check the controller keeps it
    k8s.custom.patch_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs", name, {"metadata": {"labels": {"poke": "1"}}}
    )
    time.sleep(2)
    st = get_tj(k8s, ns, name)["status"]
    assert st["trainerStatus"]["metrics"] == body["status"]["trainerStatus"]["metrics"]
    assert condition({"status": st}, "Complete")["status"] == "True"
    # CEL on trainerStatus: lastUpdatedTime is required
    with pytest.raises(client.ApiException) as ei:
        k8s.custom.patch_namespaced_custom_object_status(
            TRAINER_GROUP,
            TRAINER_VERSION,
            ns,
            "trainjobs",
            name,
            {"status": {"trainerStatus": {"progressPercentage": 5, "lastUpdatedTime": None}}},
        )
    assert ei.value.status == 422


def test_pod_logs_served_through_apiserver(k8s, namespace, testbed):
    """kubectl-logs path: apiserver -> kwok's kubelet endpoint on 127.0.0.1."""
    ns, name = namespace, "torch-logs"
    create(k8s, ns, trainjob(name))
    wait_condition(k8s, ns, name, "Complete")
    rank0 = k8s.core.list_namespaced_pod(
        ns,
        label_selector=(
            f"jobset.sigs.k8s.io/jobset-name={name},jobset.sigs.k8s.io/replicatedjob-name=node,"
            "batch.kubernetes.io/job-completion-index=0"
        ),
    ).items
    assert len(rank0) == 1
    text = k8s.core.read_namespaced_pod_log(rank0[0].metadata.name, ns, container="node")
    assert text.splitlines() == testbed.state["simulated_log_lines"]

    # A node that missed its lease (Ready=Unknown, e.g. across an API server restart) is
    # re-initialized by kwok; it keeps its addresses, so logs are still served.
    node = rank0[0].spec.node_name
    unknown = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown", "message": "test"}
    k8s.core.patch_node_status(node, {"status": {"conditions": [unknown]}})

    def ready_again():
        status = k8s.core.read_node_status(node).status
        return [c.status for c in status.conditions if c.type == "Ready"] == ["True"] and status

    status = wait_until(ready_again, TIMEOUT, f"{node} Ready again")
    addresses = {a.type: a.address for a in status.addresses or []}
    assert addresses.get("InternalIP") == "127.0.0.1", addresses
    again = k8s.core.read_namespaced_pod_log(rank0[0].metadata.name, ns, container="node")
    assert again == text


def test_pod_log_of_its_own_is_followed(k8s, namespace, testbed):
    """A kwok Logs object gives a pod its own log file; follow=true streams what is appended to it, to 100
    concurrent followers (an inotify instance each in kwok, within its own user's budget of 128: as root it
    would share root's with every other process of the machine)."""
    import datetime as dt
    import shutil
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    def cri(text: str) -> str:
        return f"{dt.datetime.now(dt.UTC).strftime('%Y-%m-%dT%H:%M:%S.%fZ')} stdout F {text}\n"

    ns, name, followers = namespace, "own-log", 100
    where = Path(tempfile.mkdtemp(prefix="tf-own-log-"))
    where.chmod(0o755)  # kwok reads it as a user of its own
    logfile = where / "rank0.log"
    logfile.write_text(cri("first"))
    logfile.chmod(0o644)
    container = {"name": "node", "image": "registry.invalid/own-log:0"}
    k8s.core.create_namespaced_pod(
        ns, {"metadata": {"name": name}, "spec": {"nodeName": testbed.state["kwok_nodes"][0],
                                                  "containers": [container]}}
    )  # fmt: skip
    logs = {"containers": ["node"], "logsFile": str(logfile)}
    k8s.custom.create_namespaced_custom_object(
        "kwok.x-k8s.io", "v1alpha1", ns, "logs",
        {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Logs", "metadata": {"name": name},
         "spec": {"logs": [logs]}},
    )  # fmt: skip

    def started():
        statuses = k8s.core.read_namespaced_pod(name, ns).status.container_statuses or []
        return any(c.state.running for c in statuses)

    wait_until(started, TIMEOUT, "pod running")
    wait_until(
        lambda: k8s.core.read_namespaced_pod_log(name, ns, container="node") == "first\n", TIMEOUT, "own log"
    )

    def follow(_: int) -> str:
        resp = k8s.core.read_namespaced_pod_log(
            name, ns, container="node", follow=True, _preload_content=False, _request_timeout=(10, 30)
        )
        seen = ""
        try:
            for chunk in resp.stream(1024):
                seen += chunk.decode()
                if "second" in seen:
                    break
        finally:
            resp.release_conn()
        return seen

    with ThreadPoolExecutor(followers) as pool:
        futures = [pool.submit(follow, i) for i in range(followers)]
        time.sleep(5)  # every follower is at the end of the file, waiting
        with open(logfile, "a") as fh:
            fh.write(cri("second"))
        seen = [f.result() for f in futures]
    shutil.rmtree(where)
    assert seen == ["first\nsecond\n"] * followers


def test_rbac_is_enforced(k8s, namespace, sa_api_client):
    """The API server authorizes with RBAC: a ServiceAccount can do only what a Role grants."""
    ns = namespace
    sa = sa_api_client(ns, "submitter")
    sa_custom = client.CustomObjectsApi(sa)
    with pytest.raises(client.ApiException) as ei:
        sa_custom.create_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs", trainjob("rbac-denied")
        )
    assert ei.value.status == 403
    assert "system:serviceaccount:" + ns + ":submitter" in json.loads(ei.value.body)["message"]

    k8s.rbac.create_namespaced_role(
        ns,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="trainjob-submitter"),
            rules=[
                client.V1PolicyRule(
                    api_groups=[TRAINER_GROUP],
                    resources=["trainjobs"],
                    verbs=["create", "get", "list", "watch"],
                )
            ],
        ),
    )
    k8s.rbac.create_namespaced_role_binding(
        ns,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="trainjob-submitter"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="trainjob-submitter"
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="submitter", namespace=ns)],
        ),
    )
    created = wait_until(
        lambda: _try(
            lambda: sa_custom.create_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs", trainjob("rbac-allowed")
            )
        ),
        HANG,
        "RBAC grant to take effect",
    )
    assert created["metadata"]["name"] == "rbac-allowed"
    # still no delete, and nothing in another namespace
    with pytest.raises(client.ApiException) as ei:
        sa_custom.delete_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs", "rbac-allowed"
        )
    assert ei.value.status == 403
    with pytest.raises(client.ApiException) as ei:
        sa_custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, "default", "trainjobs")
    assert ei.value.status == 403


def _try(fn):
    try:
        return fn()
    except client.ApiException as e:
        if e.status == 403:
            return None
        raise


def _get_or_none(fn):
    try:
        return fn()
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise
