"""The instance's certificates (openssl) and kubeconfigs: one CA, a leaf per identity, serving certificates."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml
from layout import CONTEXT, Layout, TestbedError


def _openssl(*args: str) -> None:
    r = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise TestbedError(f"openssl {' '.join(args)} failed: {r.stderr}")


def leaf(L: Layout, name: str, cn: str, org: str | None, sans: list[str], usage: str) -> None:
    """A key and a certificate signed by the testbed CA, in L.pki/<name>.{key,crt}."""
    p = L.pki
    subj = (f"/O={org}" if org else "") + f"/CN={cn}"
    _openssl(
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-sha256",
        "-keyout",
        str(p / f"{name}.key"),
        "-out",
        str(p / f"{name}.csr"),
        "-subj",
        subj,
    )
    ext = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
    ]
    if sans:
        ext.append("subjectAltName=" + ",".join(sans))
    (p / f"{name}.ext").write_text("\n".join(ext) + "\n")
    _openssl(
        "x509",
        "-req",
        "-sha256",
        "-days",
        "3650",
        "-in",
        str(p / f"{name}.csr"),
        "-CA",
        str(p / "ca.crt"),
        "-CAkey",
        str(p / "ca.key"),
        "-CAcreateserial",
        "-out",
        str(p / f"{name}.crt"),
        "-extfile",
        str(p / f"{name}.ext"),
    )


def make_pki(L: Layout, extra_apiserver_sans: tuple[str, ...] = ()) -> None:
    p = L.pki
    p.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-sha256",
        "-days",
        "3650",
        "-keyout",
        str(p / "ca.key"),
        "-out",
        str(p / "ca.crt"),
        "-subj",
        "/CN=trainflow-testbed-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )

    loop = ["IP:127.0.0.1", "DNS:localhost"]
    leaf(
        L,
        "apiserver",
        "kube-apiserver",
        None,
        [
            *loop,
            *extra_apiserver_sans,
            "IP:10.96.0.1",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ],
        "serverAuth",
    )
    leaf(L, "admin", "trainflow-testbed-admin", "system:masters", [], "clientAuth")
    leaf(L, "kube-controller-manager", "system:kube-controller-manager", None, [], "clientAuth")
    leaf(L, "kube-scheduler", "system:kube-scheduler", None, [], "clientAuth")
    # apiserver -> kwok "kubelet" (logs/exec) client identity
    leaf(
        L,
        "apiserver-kubelet-client",
        "kube-apiserver-kubelet-client",
        "kubeadm:cluster-admins",
        [],
        "clientAuth",
    )
    # serving certs for everything else listening on loopback
    leaf(L, "serving", "trainflow-testbed-loopback", None, loop, "serverAuth")
    # service-account token signing key
    _openssl("genrsa", "-out", str(p / "sa.key"), "2048")
    _openssl("rsa", "-in", str(p / "sa.key"), "-pubout", "-out", str(p / "sa.pub"))
    # controller-runtime webhook servers read tls.crt / tls.key from a cert dir
    for comp in ("jobset", "trainer"):
        d = L.dir / "webhook-certs" / comp
        if comp == "trainer":
            # Trainer has no certDir option: controller-runtime's default is
            # $TMPDIR/k8s-webhook-server/serving-certs, so the process gets TMPDIR.
            d = L.dir / "tmp" / "trainer" / "k8s-webhook-server" / "serving-certs"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(p / "serving.crt", d / "tls.crt")
        shutil.copy(p / "serving.key", d / "tls.key")
    for f in p.glob("*.key"):
        f.chmod(0o600)


def write_kubeconfig(L: Layout, path: Path, user: str, pki: Path | None = None) -> None:
    """A kubeconfig for ``user`` whose certificate, key and CA are read from ``pki`` (the instance's own)."""
    pki = pki or L.pki
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CONTEXT,
                "cluster": {
                    "server": f"https://{L.api_host}:{L.ports['apiserver']}",
                    "certificate-authority": str(pki / "ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki / f"{user}.crt"),
                    "client-key": str(pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [
            {"name": CONTEXT, "context": {"cluster": CONTEXT, "user": user, "namespace": "default"}}
        ],
        "current-context": CONTEXT,
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    path.chmod(0o600)
