"""Object-store mode of the testbed (``up.sh --objstore``): an S3-compatible store beside the cluster.

The store is the Versity S3 Gateway (versitygw, Apache-2.0), built from its released Go module
(testbed/objstore/build.sh), serving buckets as directories under the run dir (its posix backend). It was
chosen because it checks every request's SigV4 signature and access key as S3 does, so a wrong credential
fails as it would on a real store; gofakes3 accepts any signature, and MinIO's server is AGPL and a far larger
build. It runs as a host process bound to the address the API server binds (in pods mode the host end of node
0's veth, which every pod reaches), and pods reach it by a Service name: a Service without selector whose
EndpointSlice names that address, as the ``kubernetes`` Service names the API server. Its root credentials are
made per instance and kept in the run dir (mode 0600) and in the Secret ``objstore-credentials`` in
``default``; tests copy that Secret into their namespaces.
"""

from __future__ import annotations

import json
import os
import secrets
import string
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from layout import read_versions

NAME = "objstore"
PORT_OFFSET = 12  # after the control plane's ten ports and Kueue's two
SERVICE = "objstore"
SERVICE_NAMESPACE = "default"
SERVICE_PORT = 9000
SECRET = "objstore-credentials"
BUCKET = "trainflow"  # made at start; tests work under prefixes of their own
REGION = "us-east-1"
MANAGED_BY = {"app.kubernetes.io/managed-by": "trainflow-testbed"}


def port(L: Any) -> int:
    return int(L.port_base) + PORT_OFFSET


def _key(n: int, alphabet: str) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


def _credentials(L: Any) -> dict[str, str]:
    """The instance's root credentials, made once and kept private in the run dir."""
    f = Path(L.dir) / "objstore-credentials.json"
    if f.exists():
        data: dict[str, str] = json.loads(f.read_text())
        return data
    creds = {
        "access_key_id": "TF" + _key(18, string.ascii_uppercase + string.digits),
        "secret_access_key": _key(40, string.ascii_letters + string.digits),
    }
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(creds, out)
    return creds


def _answers(url: str) -> bool:
    """Any S3 answer (an anonymous request gets 403 AccessDenied) means the gateway serves."""
    try:
        urllib.request.urlopen(url, timeout=2).close()
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def _cluster_objects(L: Any, creds: dict[str, str]) -> list[dict[str, Any]]:
    meta = {"namespace": SERVICE_NAMESPACE, "labels": dict(MANAGED_BY)}
    objs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, **meta},
            "type": "Opaque",
            "stringData": {**creds, "region": REGION},
        }
    ]
    if L.pods:  # pods reach the host address; in kwok mode no pod runs code
        objs += [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": SERVICE, **meta},
                "spec": {"ports": [{"name": "s3", "port": SERVICE_PORT, "targetPort": port(L)}]},
            },
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": SERVICE,
                    "namespace": SERVICE_NAMESPACE,
                    "labels": {**MANAGED_BY, "kubernetes.io/service-name": SERVICE},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [L.api_host], "conditions": {"ready": True}}],
                "ports": [{"name": "s3", "port": port(L), "protocol": "TCP"}],
            },
        ]
    return objs


def up(tb: Any, L: Any, k: Any, objstore_bin: Path) -> dict[str, Any]:
    """Start the gateway, wait until it answers, publish its Service and Secret; returns what state.json
    records."""
    if not tb.port_free(port(L)):
        raise tb.TestbedError(f"object store port {port(L)} in use")
    data = Path(L.dir) / "objstore-data"
    data.mkdir(mode=0o700, exist_ok=True)
    (data / BUCKET).mkdir(exist_ok=True)  # the posix backend's buckets are the top directories
    creds = _credentials(L)
    L.objstore_file.write_text(json.dumps({"objstore_bin": str(objstore_bin), "port": port(L)}))
    argv = [
        str(objstore_bin / "versitygw"),
        "--port",
        f"{L.api_host}:{port(L)}",
        "--region",
        REGION,
        "--quiet",
        "posix",
        str(data),
    ]
    # the root credentials by env, so they are not in the process list or the .cmd file beside its log
    env = {"ROOT_ACCESS_KEY_ID": creds["access_key_id"], "ROOT_SECRET_ACCESS_KEY": creds["secret_access_key"]}
    tb.start(L, NAME, argv, extra_env=env)
    url = f"http://{L.api_host}:{port(L)}/"
    tb.wait_for("object store to answer", lambda: _answers(url), 30 * tb.TS, watch=[NAME], L=L)
    k.apply_objs(_cluster_objects(L, creds))
    tb.log(f"object store answering at {url} (Service {SERVICE}.{SERVICE_NAMESPACE}:{SERVICE_PORT})")
    return state(L)


def state(L: Any) -> dict[str, Any]:
    if not L.objstore_file.exists():
        return {"objstore": None}
    info = json.loads(L.objstore_file.read_text())
    pinned = read_versions(Path(info["objstore_bin"]))
    return {
        "objstore": {
            "server": "versitygw",
            "version": pinned.get("versitygw"),
            "endpoint": f"http://{L.api_host}:{info['port']}",
            "service_endpoint": f"http://{SERVICE}.{SERVICE_NAMESPACE}.svc.cluster.local:{SERVICE_PORT}"
            if L.pods
            else None,
            "region": REGION,
            "bucket": BUCKET,
            "secret": f"{SERVICE_NAMESPACE}/{SECRET}",
            "credentials_file": str(Path(L.dir) / "objstore-credentials.json"),
            "data_dir": str(Path(L.dir) / "objstore-data"),
        }
    }
