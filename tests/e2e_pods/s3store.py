"""The testbed's object store (``up.sh --objstore``) and a runtime whose initializers read from it, for the pods
suite: the store's endpoints and credentials, the Secret pods get them from, and the objects a test seeds.

The runtime is a namespaced TrainingRuntime as a user would write one: torch-distributed's trainer after the
Trainer's own dataset and model initializers (images built from its v2.3.0 sources), all three mounting
``/workspace`` from the test's shared volume.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from conftest import TRAINER_GROUP, TRAINER_VERSION
from trainflow.core import storage

RUNTIME = "torch-with-initializers"
INITIALIZER_IMAGES = {
    "dataset": "ghcr.io/kubeflow/trainer/dataset-initializer:v2.3.0",
    "model": "ghcr.io/kubeflow/trainer/model-initializer:v2.3.0",
}
TORCH_IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
SECRET = "store"


@dataclass(frozen=True)
class Store:
    endpoint: str  # from this host
    service_endpoint: str  # from pods
    region: str
    bucket: str
    access_key_id: str
    secret_access_key: str

    def uri(self, *parts: str) -> str:
        return "s3://" + "/".join([self.bucket, *parts])

    def host_env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": self.region,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
        }

    def seed(self, uri: str, files: dict[str, bytes], tmp: Path) -> None:
        """Put ``files`` (relative path -> content) under ``uri`` as plain objects (what the Trainer's
        initializers read), through the store's S3 API."""
        bucket, prefix = storage.split(uri)
        op = storage.operator(bucket, self.host_env())
        for rel, data in files.items():
            op.write(f"{prefix}/{rel}", data)


def store_of(testbed: Any) -> Store:
    info = testbed.state.get("objstore")
    if not info:
        pytest.fail("the testbed has no object store: start it with `bash testbed/up.sh --objstore`")
    creds = json.loads(Path(info["credentials_file"]).read_text())
    return Store(
        info["endpoint"],
        info["service_endpoint"],
        info["region"],
        info["bucket"],
        creds["access_key_id"],
        creds["secret_access_key"],
    )


def make_secret(k8s: Any, namespace: str, name: str, access_key_id: str, secret_access_key: str) -> None:
    k8s.core.create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": name},
            "stringData": {"access_key_id": access_key_id, "secret_access_key": secret_access_key},
        },
    )


def _initializer_job(kind: str, claim: str) -> dict[str, Any]:
    step = f"{kind}-initializer"
    return {
        "name": step,
        "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": step}},
            "spec": {
                "backoffLimit": 0,  # a failed download fails the job at once (the default retries 6 times)
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": step,
                                "image": INITIALIZER_IMAGES[kind],
                                "volumeMounts": [{"name": "initializer", "mountPath": "/workspace"}],
                            }
                        ],
                        "volumes": [{"name": "initializer", "persistentVolumeClaim": {"claimName": claim}}],
                    }
                },
            },
        },
    }


def runtime_with_initializers(k8s: Any, namespace: str, claim: str) -> str:
    """The TrainingRuntime: dataset and model initializers, then torch's ``node`` step once both completed."""
    node = {
        "name": "node",
        "dependsOn": [
            {"name": "dataset-initializer", "status": "Complete"},
            {"name": "model-initializer", "status": "Complete"},
        ],
        "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {
                "backoffLimit": 0,  # a failed trainer fails the job at once (the kubelet's restart back-off
                # would take minutes over the default 6 retries)
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "node",
                                "image": TORCH_IMAGE,
                                "volumeMounts": [{"name": "initializer", "mountPath": "/workspace"}],
                            }
                        ],
                        "volumes": [{"name": "initializer", "persistentVolumeClaim": {"claimName": claim}}],
                    }
                },
            },
        },
    }
    body = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {"name": RUNTIME, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        _initializer_job("dataset", claim),
                        _initializer_job("model", claim),
                        node,
                    ]
                }
            },
        },
    }
    k8s.custom.create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainingruntimes", body
    )
    return RUNTIME


def initializer_fields(
    store: Store, kind: str, uri: str, secret: str = SECRET, **options: Any
) -> dict[str, Any]:
    """The request fields of one initializer reading ``uri`` from the store with the credentials of ``secret``
    (references only). The Trainer's S3 initializer signs for region "auto" unless told: the store checks it."""
    return {
        f"{kind}_uri": uri,
        f"{kind}_options": {"endpoint": store.service_endpoint, "region": store.region, **options},
        f"{kind}_secret_env": {
            "access_key_id": f"{secret}/access_key_id",
            "secret_access_key": f"{secret}/secret_access_key",
        },
    }


def trainer_store_fields(store: Store, secret: str = SECRET) -> dict[str, Any]:
    """What a trainer needs to publish an s3:// output: the endpoint as env, the credentials as references."""
    return {
        "env": {"AWS_ENDPOINT_URL": store.service_endpoint, "AWS_REGION": store.region},
        "secret_env": {
            "AWS_ACCESS_KEY_ID": f"{secret}/access_key_id",
            "AWS_SECRET_ACCESS_KEY": f"{secret}/secret_access_key",
        },
    }


def everything(k8s: Any, ns: str) -> str:
    """The namespace's TrainJobs, JobSets, Jobs, Pods and events, and every container's log, as text."""
    api = k8s.core.api_client
    parts = [
        json.dumps(k8s.custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs")),
        json.dumps(k8s.custom.list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets")),
        json.dumps(api.sanitize_for_serialization(k8s.batch.list_namespaced_job(ns))),
        json.dumps(api.sanitize_for_serialization(k8s.core.list_namespaced_event(ns))),
    ]
    for pod in k8s.core.list_namespaced_pod(ns).items:
        parts.append(json.dumps(api.sanitize_for_serialization(pod)))
        statuses = (pod.status.init_container_statuses or []) + (pod.status.container_statuses or [])
        for c in statuses:
            # a container that never started has no log (the API answers 400 "waiting to start", as the
            # product's own log reader treats as "not yet"); every one that ran is read
            if c.state.running or c.state.terminated or (c.last_state and c.last_state.terminated):
                try:
                    parts.append(k8s.core.read_namespaced_pod_log(pod.metadata.name, ns, container=c.name))
                except ApiException as exc:
                    # deleted since the list (a failed Job's controller removes its pods): no log is left to
                    # hold anything; every pod still there is read
                    if exc.status != 404:
                        raise
    return "\n".join(parts)
