"""JobSet's and the Trainer's admission webhooks: upstream configurations rewritten to loopback URLs, and
probes proving the API server calls each of them."""

from __future__ import annotations

import base64
import copy
import json
import subprocess
from typing import Any

import yaml
from kubectl import Kubectl, load_yaml_docs
from layout import Layout, TestbedError


def json_patch(obj: dict, ops: list[dict]) -> dict:
    """Minimal RFC 6902 add/replace (what the upstream kustomize patches use)."""
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        cur: Any = obj
        for p in parts[:-1]:
            cur = cur[int(p)] if isinstance(cur, list) else cur.setdefault(p, {})
        last = parts[-1]
        if op["op"] not in ("add", "replace"):
            raise TestbedError(f"unsupported patch op {op}")
        if isinstance(cur, list):
            if last == "-":
                cur.append(op["value"])
            elif op["op"] == "add":
                cur.insert(int(last), op["value"])
            else:
                cur[int(last)] = op["value"]
        else:
            cur[last] = op["value"]
    return obj


def webhook_configs(L: Layout) -> list[dict]:
    """Upstream webhook configurations, rewritten to URL client configs on loopback."""
    assert L.bin is not None
    ca_b64 = base64.b64encode((L.pki / "ca.crt").read_bytes()).decode()
    m = L.bin / "manifests"
    out = []

    # JobSet: config/components/webhook/manifests.yaml + patches (per kind).
    js_docs = load_yaml_docs(m / "jobset" / "webhook" / "manifests.yaml")
    js_patch = {
        "MutatingWebhookConfiguration": m / "jobset" / "webhook" / "mutating-patch.yaml",
        "ValidatingWebhookConfiguration": m / "jobset" / "webhook" / "validating-patch.yaml",
    }
    for d in js_docs:
        d = json_patch(copy.deepcopy(d), yaml.safe_load(js_patch[d["kind"]].read_text()))
        d["metadata"] = {
            "name": f"jobset-{d['kind'].replace('WebhookConfiguration', '').lower()}-webhook-configuration",
            "labels": {"app.kubernetes.io/managed-by": "trainflow-testbed"},
        }
        out.append((d, L.ports["jobset_webhook"]))

    # Trainer: manifests/base/webhook/manifests.yaml + patch_{mutating,validating}.yaml
    tr_docs = load_yaml_docs(m / "trainer" / "webhook" / "manifests.yaml")
    tr_patch = {
        "MutatingWebhookConfiguration": m / "trainer" / "webhook" / "patch_mutating.yaml",
        "ValidatingWebhookConfiguration": m / "trainer" / "webhook" / "patch_validating.yaml",
    }
    for d in tr_docs:
        d = json_patch(copy.deepcopy(d), yaml.safe_load(tr_patch[d["kind"]].read_text()))
        d["metadata"].setdefault("labels", {})["app.kubernetes.io/managed-by"] = "trainflow-testbed"
        out.append((d, L.ports["trainer_webhook"]))

    result = []
    for d, port in out:
        for wh in d["webhooks"]:
            svc = wh["clientConfig"].pop("service")
            wh["clientConfig"] = {"url": f"https://127.0.0.1:{port}{svc['path']}", "caBundle": ca_b64}
            wh.setdefault("timeoutSeconds", 10)
        result.append(d)
    return result


def _expect_denied(r: subprocess.CompletedProcess, webhook: str, marker: str) -> bool:
    """True iff the request was rejected by the webhook itself (its own message)."""
    msg = r.stderr + r.stdout
    if r.returncode == 0 or "failed calling webhook" in msg:
        return False
    return f'admission webhook "{webhook}" denied' in msg or marker in msg


def probe_jobset_webhook(k: Kubectl) -> bool:
    # dependsOn on the first replicatedJob is rejected only by JobSet's webhook.
    tmpl = {
        "spec": {
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}
            }
        }
    }
    js = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "testbed-webhook-probe", "namespace": "default"},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "a",
                    "replicas": 1,
                    "template": tmpl,
                    "dependsOn": [{"name": "b", "status": "Ready"}],
                },
                {"name": "b", "replicas": 1, "template": tmpl},
            ]
        },
    }
    r = k.run("create", "--dry-run=server", "-f", "-", stdin=json.dumps(js), check=False)
    # JobSet's webhook answers with apierrors.NewInvalid, so match its message.
    return _expect_denied(r, "vjobset.kb.io", "DependsOn can't be set for the first ReplicatedJob")


def probe_trainer_webhook(k: Kubectl) -> bool:
    # The torch-distributed runtime may not exist yet: a TrainJob naming a missing
    # runtime is rejected by the validating webhook (not by the CRD schema).
    tj = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "testbed-webhook-probe", "namespace": "default"},
        "spec": {"runtimeRef": {"name": "testbed-no-such-runtime"}},
    }
    r = k.run("create", "--dry-run=server", "-f", "-", stdin=json.dumps(tj), check=False)
    return _expect_denied(r, "validator.trainjob.trainer.kubeflow.org", "testbed-no-such-runtime")
