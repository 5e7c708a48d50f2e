"""Kueue mode of the testbed (``up.sh --kueue``): Kueue's controller manager as a host process on loopback.

Called by testbed/instance.py (``up --kueue-bin``) with the testbed's toolkit as ``tb``, once the Trainer answers: Kueue's
CRDs (their conversion webhooks, as upstream's kustomization enables them), the controller manager
(only the ``trainer.kubeflow.org/trainjob`` integration), then its webhook configurations, rewritten to URL
client configs on 127.0.0.1 like JobSet's and the Trainer's. Everything comes from the pinned module
(testbed/kueue/build.sh stages it); ResourceFlavors, ClusterQueues and LocalQueues are the tests' to create.

Kueue has no option for where it reads its metrics certificate when its internal cert management is off
(``/etc/kueue/metrics/certs``, read at start even with metrics disabled), so the process runs in a private
mount namespace whose ``/etc`` is an overlay of the host's with that one directory added: nothing is written
outside the run dir, and the overlay goes away with the process.
"""

from __future__ import annotations

import copy
import json
import shutil
import socket
from pathlib import Path
from typing import Any

import yaml
from layout import read_versions

NAME = "kueue"
NAMESPACE = "kueue-system"
INTEGRATION = "trainer.kubeflow.org/trainjob"
PORT_OFFSETS = {"kueue_webhook": 10, "kueue_health": 11}  # after the control plane's ten ports
METRICS_CERTS = "etc/kueue/metrics/certs"  # under /, hard-coded in cmd/kueue/main.go
MANAGED_BY = {"app.kubernetes.io/managed-by": "trainflow-testbed"}
KUEUE_GROUP = "kueue.x-k8s.io"
PATCH_MANAGER = "kueue.x-k8s.io/manager"  # Kueue's webhook marks the runtimePatches entry it owns
QUEUED_ONLY = {"matchExpressions": [{"key": "kueue.x-k8s.io/queue-name", "operator": "Exists"}]}


def ports(L: Any) -> dict[str, int]:
    return {k: L.port_base + v for k, v in PORT_OFFSETS.items()}


_held: list[socket.socket] = []


def hold_ports(L: Any) -> None:
    """Listen on Kueue's ports from the start of ``up`` until Kueue starts: the kernel then never hands them
    out as the source port of the control plane's own connections (the testbed's ports are in the ephemeral
    range; the API server's connections to etcd took one once)."""
    for port in ports(L).values():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", port))
        s.listen(1)
        _held.append(s)


def _release_ports() -> None:
    while _held:
        _held.pop().close()


def configuration(L: Any) -> dict[str, Any]:
    """Kueue's Configuration: loopback only, no leader election, testbed certificates, the TrainJob integration."""
    P = ports(L)
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{P['kueue_health']}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": P["kueue_webhook"], "certDir": str(cert_dir(L))},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 100, "burst": 200},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": [INTEGRATION]},
        # the visibility API server binds its own port and reads certificates from /visibility: not needed
        "featureGates": {"VisibilityOnDemand": False},
    }


def cert_dir(L: Any) -> Path:
    return Path(L.dir) / "webhook-certs" / "kueue"


def _overlay(L: Any) -> Path:
    return Path(L.dir) / "kueue-etc"


def prepare_certs(L: Any) -> None:
    """The webhook serving certificate (the testbed's loopback one), and the same as the metrics certificate."""
    overlay = _overlay(L)
    if overlay.exists():
        shutil.rmtree(overlay)
    for d in (cert_dir(L), overlay / "upper" / Path(METRICS_CERTS).relative_to("etc"), overlay / "work"):
        d.mkdir(parents=True, exist_ok=True)
        for ext in ("crt", "key"):
            shutil.copy(Path(L.pki) / f"serving.{ext}", d / f"tls.{ext}")
            (d / f"tls.{ext}").chmod(0o600)


def argv(L: Any, kueue_bin: Path) -> list[str]:
    """The controller manager under ``unshare``: a private mount namespace with ``/etc`` overlaid (see above)."""
    o = _overlay(L)
    mount = f"mount -t overlay overlay -o lowerdir=/etc,upperdir={o / 'upper'},workdir={o / 'work'} /etc"
    cmd = [
        str(kueue_bin / "kueue"),
        "--kubeconfig",
        str(L.kubeconfig),
        "--config",
        str(Path(L.etc) / "kueue-config.yaml"),
        "--zap-log-level",
        "info",
    ]
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mount} && exec "$@"', "sh", *cmd]


def _manifests(kueue_bin: Path) -> Path:
    return kueue_bin / "manifests"


def crds(L: Any, kueue_bin: Path, ca_b64: str) -> list[dict[str, Any]]:
    """Kueue's CRDs with the conversion webhooks upstream's crd kustomization enables, served on loopback."""
    m = _manifests(kueue_bin)
    docs = [d for f in sorted((m / "crd").glob("*.yaml")) for d in _docs(f)]
    kust = yaml.safe_load((m / "crd-patches" / "kustomization.yaml").read_text())
    by_name = {d["metadata"]["name"]: d for d in docs}
    for entry in kust.get("patches") or []:
        patch = yaml.safe_load((m / "crd-patches" / Path(entry["path"]).name).read_text())
        crd = by_name.get(patch["metadata"]["name"])
        if crd is None:
            raise RuntimeError(f"Kueue conversion patch {entry['path']} names an unknown CRD")
        webhook = copy.deepcopy(patch["spec"]["conversion"]["webhook"])
        path = webhook["clientConfig"]["service"]["path"]
        webhook["clientConfig"] = {"url": _url(L, path), "caBundle": ca_b64}
        crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": webhook}
    for d in docs:
        d["metadata"].setdefault("labels", {}).update(MANAGED_BY)
    return docs


def _about_kueue_or_trainjobs(webhook: dict[str, Any]) -> bool:
    for rule in webhook.get("rules") or []:
        if KUEUE_GROUP in rule.get("apiGroups", []) or "trainjobs" in rule.get("resources", []):
            return True
    return False


def webhook_configs(L: Any, kueue_bin: Path, ca_b64: str) -> list[dict[str, Any]]:
    """Upstream's webhook configurations, named as its kustomization names them, on loopback URLs.

    Only the webhooks of Kueue's own kinds and of TrainJobs are kept: the testbed enables no other integration,
    and Kueue would answer the others with a no-op anyway. A kustomize patch aimed at a kept webhook would be
    lost, so it fails the start instead. The TrainJob webhooks see only TrainJobs that name a LocalQueue
    (``QUEUED_ONLY``): the other suites on this testbed meet the Trainer alone, as on a cluster without Kueue
    (Kueue's webhook re-serialises every TrainJob it sees: an invalid quantity such as "." comes back "0", which
    the Trainer then accepts). With ``manageJobsWithoutQueueName`` off and no LocalQueue named ``default``,
    Kueue manages exactly those jobs anyway.
    """
    m = _manifests(kueue_bin)
    kust = yaml.safe_load((m / "webhook" / "kustomization.yaml").read_text())
    out = []
    for doc in _docs(m / "webhook" / "manifests.yaml"):
        kept = [w for w in doc["webhooks"] if _about_kueue_or_trainjobs(w)]
        for patch in kust.get("patches") or []:
            target = yaml.safe_load(patch["patch"])
            if target.get("kind") != doc["kind"]:
                continue
            patched = {w["name"] for w in target.get("webhooks") or []} & {w["name"] for w in kept}
            if patched:
                raise RuntimeError(f"Kueue's webhook kustomization patches {sorted(patched)}: apply it here")
        for w in kept:
            path = w["clientConfig"]["service"]["path"]
            w["clientConfig"] = {"url": _url(L, path), "caBundle": ca_b64}
            w.setdefault("timeoutSeconds", 10)
            if any("trainjobs" in rule.get("resources", []) for rule in w.get("rules") or []):
                w["objectSelector"] = QUEUED_ONLY
        kind = doc["kind"].replace("WebhookConfiguration", "").lower()
        doc["metadata"] = {"name": f"kueue-{kind}-webhook-configuration", "labels": dict(MANAGED_BY)}
        doc["webhooks"] = kept
        out.append(doc)
    return out


def _url(L: Any, path: str) -> str:
    return f"https://127.0.0.1:{ports(L)['kueue_webhook']}{path}"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def probe_webhook(k: Any, runtime: str) -> bool:
    """True once Kueue's mutating webhook answers: a dry-run TrainJob with a queue name comes back suspended,
    with the runtimePatches entry Kueue's webhook owns."""
    tj = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "testbed-kueue-probe",
            "namespace": "default",
            "labels": {"kueue.x-k8s.io/queue-name": "testbed-probe"},
        },
        "spec": {"runtimeRef": {"name": runtime}},
    }
    r = k.run("create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(tj), check=False)
    if r.returncode != 0:
        return False
    spec = json.loads(r.stdout).get("spec") or {}
    managers = [p.get("manager") for p in spec.get("runtimePatches") or []]
    return bool(spec.get("suspend")) and PATCH_MANAGER in managers


def up(tb: Any, L: Any, k: Any, kueue_bin: Path, runtime: str) -> dict[str, Any]:
    """Start Kueue after the Trainer answers; returns what state.json records."""
    import base64

    if not _held:
        busy = [f"{n}={p}" for n, p in ports(L).items() if not tb.port_free(p)]
        if busy:
            raise tb.TestbedError(f"Kueue ports in use on 127.0.0.1: {', '.join(busy)}")
    ca_b64 = base64.b64encode((Path(L.pki) / "ca.crt").read_bytes()).decode()
    L.kueue_file.write_text(json.dumps({"kueue_bin": str(kueue_bin), "ports": ports(L)}))
    k.apply_objs([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
    kcrds = crds(L, kueue_bin, ca_b64)
    k.apply_objs(kcrds)
    k.run(
        "wait",
        "--for=condition=Established",
        f"--timeout={int(120 * tb.TS)}s",
        *[f"crd/{c['metadata']['name']}" for c in kcrds],
    )
    prepare_certs(L)
    (Path(L.etc) / "kueue-config.yaml").write_text(yaml.safe_dump(configuration(L)))
    _release_ports()
    tb.start(L, NAME, argv(L, kueue_bin))
    P = ports(L)
    tb.wait_for(
        "kueue /readyz",
        lambda: tb.http_ok(f"http://127.0.0.1:{P['kueue_health']}/readyz"),
        120 * tb.TS,
        watch=[NAME],
        L=L,
    )
    k.apply_objs(webhook_configs(L, kueue_bin, ca_b64))
    tb.wait_for(
        "Kueue mutating webhook to answer", lambda: probe_webhook(k, runtime), 60 * tb.TS, watch=[NAME], L=L
    )
    tb.log("Kueue answering (controller manager, TrainJob webhook)")
    return state(L)


def state(L: Any) -> dict[str, Any]:
    if not L.kueue_file.exists():
        return {"kueue": None}
    info = json.loads(L.kueue_file.read_text())
    pinned = read_versions(Path(info["kueue_bin"]))
    return {
        "kueue": {
            "version": pinned.get("kueue"),
            "bin": info["kueue_bin"],
            "ports": info["ports"],
            "integrations": [INTEGRATION],
            "namespace": NAMESPACE,
        }
    }
