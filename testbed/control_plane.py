"""The control plane of an instance: etcd, kube-apiserver (RBAC), kube-controller-manager, kube-scheduler, the
JobSet and Trainer CRDs, and the JobSet controller; each started as the upstream binaries run, on loopback."""

from __future__ import annotations

from pathlib import Path

import yaml
from kubectl import Kubectl, load_yaml_docs
from layout import TS, Layout, log
from procs import start
from ready import admin_ssl, http_ok, insecure_ssl, wait_for


def api_url(L: Layout) -> str:
    return f"https://{L.api_host}:{L.ports['apiserver']}"


def start_etcd(L: Layout) -> None:
    P = L.ports
    start(
        L,
        "etcd",
        [
            L.b("etcd"),
            "--name",
            "trainflow-testbed",
            "--data-dir",
            str(L.data / "etcd"),
            "--listen-client-urls",
            f"http://127.0.0.1:{P['etcd']}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{P['etcd']}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{P['etcd_peer']}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{P['etcd_peer']}",
            "--initial-cluster",
            f"trainflow-testbed=http://127.0.0.1:{P['etcd_peer']}",
            "--listen-metrics-urls",
            "",
            "--quota-backend-bytes",
            str(2 * 1024**3),
            "--unsafe-no-fsync",
            "--log-level",
            "warn",
        ],
    )
    wait_for(
        "etcd health", lambda: http_ok(f"http://127.0.0.1:{P['etcd']}/health"), 60 * TS, watch=["etcd"], L=L
    )


def start_apiserver(L: Layout) -> None:
    P, pki, api = L.ports, L.pki, api_url(L)
    start(
        L,
        "kube-apiserver",
        [
            L.b("kube-apiserver"),
            "--etcd-servers",
            f"http://127.0.0.1:{P['etcd']}",
            "--bind-address",
            L.api_host,
            "--advertise-address",
            L.api_host,
            "--secure-port",
            str(P["apiserver"]),
            "--cert-dir",
            str(L.dir / "tmp" / "apiserver"),
            "--tls-cert-file",
            str(pki / "apiserver.crt"),
            "--tls-private-key-file",
            str(pki / "apiserver.key"),
            "--client-ca-file",
            str(pki / "ca.crt"),
            "--authorization-mode",
            "Node,RBAC",
            "--service-account-issuer",
            api,
            "--service-account-key-file",
            str(pki / "sa.pub"),
            "--service-account-signing-key-file",
            str(pki / "sa.key"),
            "--service-cluster-ip-range",
            "10.96.0.0/16",
            "--endpoint-reconciler-type",
            # Pods reach the API server through the kubernetes Service (kube-proxy -> advertise address).
            "lease" if L.pods else "none",
            # Service-backed webhooks (the in-cluster Trainer) are called at their endpoint (pod) IPs.
            f"--enable-aggregator-routing={'true' if L.pods else 'false'}",
            "--kubelet-client-certificate",
            str(pki / "apiserver-kubelet-client.crt"),
            "--kubelet-client-key",
            str(pki / "apiserver-kubelet-client.key"),
            "--kubelet-certificate-authority",
            str(pki / "ca.crt"),
            "--kubelet-preferred-address-types",
            "InternalIP",
            "--allow-privileged=true",
            "--profiling=false",
            "--enable-admission-plugins",
            "NodeRestriction",
            "--v",
            "1",
        ],
    )
    wait_for(
        "kube-apiserver /readyz",
        lambda: http_ok(f"{api}/readyz", admin_ssl(L)),
        120 * TS,
        watch=["kube-apiserver"],
        L=L,
    )


def start_kcm_and_scheduler(L: Layout) -> None:
    """Started, not waited for: their /healthz is checked once the controllers are up too."""
    pki = L.pki
    start(
        L,
        "kube-controller-manager",
        [
            *_served_by_kube(L, "kube-controller-manager", "kcm"),
            "--use-service-account-credentials=true",
            "--service-account-private-key-file",
            str(pki / "sa.key"),
            "--root-ca-file",
            str(pki / "ca.crt"),
            "--cluster-signing-cert-file",
            str(pki / "ca.crt"),
            "--cluster-signing-key-file",
            str(pki / "ca.key"),
            "--service-cluster-ip-range",
            "10.96.0.0/16",
            "--controllers",
            # Pods mode binds PersistentVolumeClaims (the shared RWX hostPath volume of the tests).
            "*,-nodeipam,-cloud-node-lifecycle,-service,-route,-attachdetach"
            + ("" if L.pods else ",-persistentvolume-binder"),
            "--v",
            "1",
        ],
    )
    start(L, "kube-scheduler", [*_served_by_kube(L, "kube-scheduler", "scheduler"), "--v", "1"])


def _served_by_kube(L: Layout, name: str, port: str) -> list[str]:
    """The argv head of a component that authenticates with its own kubeconfig and serves /healthz on loopback
    with the testbed's serving certificate (kube-controller-manager, kube-scheduler)."""
    kubeconfig = str(L.etc / f"{name}.kubeconfig")
    return [
        L.b(name),
        "--kubeconfig",
        kubeconfig,
        "--authentication-kubeconfig",
        kubeconfig,
        "--authorization-kubeconfig",
        kubeconfig,
        "--bind-address",
        "127.0.0.1",
        "--secure-port",
        str(L.ports[port]),
        "--cert-dir",
        str(L.dir / "tmp" / port),
        "--tls-cert-file",
        str(L.pki / "serving.crt"),
        "--tls-private-key-file",
        str(L.pki / "serving.key"),
        "--leader-elect=false",
    ]


def install_crds(L: Layout, k: Kubectl, trainer_upstream: Path) -> None:
    """JobSet's CRDs from its module, the Trainer's from the core's vendored copy, kwok's Logs in kwok mode;
    waits until established."""
    assert L.bin is not None
    crd_files = sorted((L.bin / "manifests" / "jobset" / "crd").glob("*.yaml")) + sorted(
        (trainer_upstream / "crds").glob("*.yaml")
    )
    if not L.pods:
        crd_files += sorted((L.bin / "manifests" / "kwok-crd").glob("*.yaml"))
    crds = [d for f in crd_files for d in load_yaml_docs(f)]
    k.apply_objs(crds)
    k.run(
        "wait",
        "--for=condition=Established",
        f"--timeout={int(120 * TS)}s",
        *[f"crd/{c['metadata']['name']}" for c in crds],
    )
    log(f"CRDs established: {', '.join(c['metadata']['name'] for c in crds)}")


def start_jobset(L: Layout) -> None:
    """The JobSet controller: webhooks on loopback with the testbed's certificates, no certificate rotation."""
    P = L.ports
    js_cfg = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {
            "host": "127.0.0.1",
            "port": P["jobset_webhook"],
            "certDir": str(L.dir / "webhook-certs" / "jobset"),
        },
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{P['jobset_health']}"},
        "clientConnection": {"qps": 100, "burst": 200},
    }
    (L.etc / "jobset-config.yaml").write_text(yaml.safe_dump(js_cfg))
    start(
        L,
        "jobset-controller",
        [
            L.b("jobset-controller"),
            "--kubeconfig",
            str(L.kubeconfig),
            "--config",
            str(L.etc / "jobset-config.yaml"),
            "--metrics-bind-address",
            "0",
            "--health-probe-bind-address",
            f"127.0.0.1:{P['jobset_health']}",
            "--zap-devel=false",
            "--zap-log-level",
            "info",
        ],
    )


def wait_controllers(L: Layout, all_procs: list[str]) -> None:
    """kube-controller-manager and kube-scheduler healthy, the JobSet controller ready (in that order)."""
    P = L.ports
    insecure = insecure_ssl()
    for desc, url, ctx in (
        ("kube-controller-manager /healthz", f"https://127.0.0.1:{P['kcm']}/healthz", insecure),
        ("kube-scheduler /healthz", f"https://127.0.0.1:{P['scheduler']}/healthz", insecure),
        ("jobset-controller /readyz", f"http://127.0.0.1:{P['jobset_health']}/readyz", None),
    ):
        wait_for(desc, lambda url=url, ctx=ctx: http_ok(url, ctx), 90 * TS, watch=all_procs, L=L)
