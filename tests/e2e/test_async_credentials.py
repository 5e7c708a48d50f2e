"""The async waiter's own transport authenticates to the real kube-apiserver with each credential kind it
reads itself: inline certificate data, an exec plugin (client.authentication.k8s.io/v1) and a token file of a
service account whose RBAC allows only reading TrainJobs. Each waits on a TrainJob through the shared watch
until the API server's status write reaches it, in a process that never imports a Kubernetes client library.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from bounds import HANG

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"

WAITER = textwrap.dedent(
    """
    import asyncio, json, sys
    from trainflow.core.kube.backend import KubernetesBackend

    async def main():
        backend = KubernetesBackend(kubeconfig=sys.argv[1])
        print("WAITING", flush=True)
        result = await backend.wait_async(sys.argv[2], timeout=float(sys.argv[3]))
        heavy = sorted({m.split(".")[0] for m in sys.modules} & {"kubernetes", "kubernetes_asyncio"})
        print(json.dumps({"state": result.state.value, "metrics": result.metrics, "heavy": heavy}))

    asyncio.run(main())
    """
)


def pem(path: Path) -> str:
    return path.read_text()


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig(
    testbed: Any, namespace: str, cluster: dict[str, Any], user: dict[str, Any], path: Path
) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "tb", "cluster": {"server": testbed.server, **cluster}}],
                "users": [{"name": "me", "user": user}],
                "contexts": [
                    {"name": "me", "context": {"cluster": "tb", "user": "me", "namespace": namespace}}
                ],
                "current-context": "me",
            }
        )
    )
    return path


def reader_token(k8s: Any, namespace: str) -> str:
    """A bound token of a service account that may only get, list and watch TrainJobs in ``namespace``."""
    from kubernetes import client

    k8s.core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    rule = {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch"]}
    k8s.rbac.create_namespaced_role(namespace, {"metadata": {"name": "reader"}, "rules": [rule]})
    k8s.rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    tr = k8s.core.create_namespaced_service_account_token(
        "reader", namespace, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    )
    return str(tr.status.token)


def credentials(kind: str, testbed: Any, k8s: Any, namespace: str, tmp: Path) -> Path:
    pki = testbed.dir / "pki"
    if kind == "inline-data":
        cluster = {"certificate-authority-data": b64(pki / "ca.crt")}
        user = {"client-certificate-data": b64(pki / "admin.crt"), "client-key-data": b64(pki / "admin.key")}
    elif kind == "exec-plugin":
        plugin = tmp / "auth-plugin.py"
        status = {"clientCertificateData": pem(pki / "admin.crt"), "clientKeyData": pem(pki / "admin.key")}
        plugin.write_text(
            f"#!{sys.executable}\nimport json, os\n"
            "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
            f"open({str(tmp / 'runs')!r}, 'a').write(info['spec']['cluster']['server'] + '\\n')\n"
            f"print(json.dumps({{'apiVersion': info['apiVersion'], 'kind': 'ExecCredential', 'status': {status!r}}}))\n"
        )
        plugin.chmod(0o755)
        cluster = {"certificate-authority": str(pki / "ca.crt")}
        user = {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": "./auth-plugin.py",  # relative to the kubeconfig's directory, as kubectl resolves it
                "provideClusterInfo": True,
                "interactiveMode": "Never",
            }
        }
    else:
        (tmp / "token").write_text(reader_token(k8s, namespace))
        cluster = {"certificate-authority": str(pki / "ca.crt")}
        user = {"tokenFile": "token"}
    return kubeconfig(testbed, namespace, cluster, user, tmp / "config")


def complete_when_watched(k8s: Any, namespace: str, name: str) -> None:
    time.sleep(3)  # the shared watch lists and opens its stream; a later write arrives as an event
    status = {
        "conditions": [
            {
                "type": "Complete",
                "status": "True",
                "reason": "JobsCompleted",
                "message": "done",
                "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        ],
        "trainerStatus": {
            "progressPercentage": 100,
            "metrics": [{"name": "loss", "value": "0.5"}],
            "lastUpdatedTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }
    k8s.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": status}
    )


@pytest.mark.parametrize("kind", ["inline-data", "exec-plugin", "token-file"])
def test_the_async_waiter_authenticates_with_its_own_transport(kind, testbed, k8s, namespace, tmp_path):
    config = credentials(kind, testbed, k8s, namespace, tmp_path)
    name = f"cred-{kind}"
    job = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        # managed elsewhere: the Trainer leaves it alone, so the status written below is the only change
        "spec": {
            "runtimeRef": {"name": "torch-distributed", "kind": "ClusterTrainingRuntime", "apiGroup": GROUP},
            "trainer": {"numNodes": 1, "image": "registry.invalid/cred:0", "command": ["true"]},
            "managedBy": "kueue.x-k8s.io/multikueue",
        },
    }
    k8s.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
    proc = subprocess.Popen(
        [sys.executable, "-c", WAITER, str(config), name, str(HANG)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "WAITING", proc.stderr.read() if proc.stderr else ""
        complete_when_watched(k8s, namespace, name)
        out, err = proc.communicate(timeout=HANG + 60)  # above the waiter's own bound (HANG)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"state": "Complete", "metrics": {"loss": 0.5}, "heavy": []}
    if kind == "exec-plugin":
        assert (tmp_path / "runs").read_text() == testbed.server + "\n"  # ran once, told the cluster's server
