#!/usr/bin/env python3
"""Supervisor for the trainflow e2e testbed.

Runs a real Kubernetes control plane plus the real Kubeflow Trainer and JobSet
controllers as local processes bound to 127.0.0.1 (no container engine):

  etcd -> kube-apiserver (RBAC) -> kube-controller-manager, kube-scheduler
       -> kwok (simulated nodes + pod lifecycle)
       -> JobSet controller + webhooks, Trainer controller manager + webhooks

Usage (normally through testbed/up.sh and testbed/down.sh):
  testbed.py up     --bin BIN_DIR [--dir RUN_DIR] [--trainer-upstream DIR]
  testbed.py down   [--dir RUN_DIR]
  testbed.py status [--dir RUN_DIR]
  testbed.py logs   [--dir RUN_DIR] [--lines N]

Only the standard library and PyYAML are used; certificates come from openssl.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import yaml
except ImportError:  # pragma: no cover - reported loudly
    sys.exit("testbed.py needs PyYAML (run it with the project's .venv python)")

CONTEXT = "trainflow-testbed"
INSTANCE_ENV = "TRAINFLOW_TESTBED_INSTANCE"
DEFAULT_DIR = "/tmp/trainflow-testbed"
DEFAULT_PORT_BASE = 26380

# Port layout relative to TRAINFLOW_TESTBED_PORT_BASE. Everything binds 127.0.0.1.
PORTS = {
    "etcd": 0,
    "etcd_peer": 1,
    "apiserver": 2,
    "kcm": 3,
    "scheduler": 4,
    "kwok": 5,
    "jobset_webhook": 6,
    "jobset_health": 7,
    "trainer_webhook": 8,
    "trainer_health": 9,
}

# Start order; down stops in reverse.
COMPONENTS = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "jobset-controller",
    "trainer-controller-manager",
]

# Pods mode: a real node (containerd, kubelet, kube-proxy, CoreDNS) instead of kwok, and the Trainer in cluster.
PODS_COMPONENTS = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "jobset-controller",
    "containerd",
    "kubelet",
    "kube-proxy",
    "coredns",
]


def components(L: Layout) -> list[str]:
    return PODS_COMPONENTS if L.pods else COMPONENTS


KWOK_NODES = ["kwok-node-0", "kwok-node-1"]
KWOK_NODE_IP = "127.0.0.1"  # kwok serves the nodes' kubelet API (logs) here
# What every simulated container "prints" (served by kwok for pods/log requests).
# CRI log format ("<RFC3339Nano> <stream> <F|P> <line>"), which kwok parses.
SIMULATED_LOG = (
    "2026-01-01T00:00:00.000000000Z stdout F [trainflow-testbed] simulated container log (kwok)\n"
    "2026-01-01T00:00:01.000000000Z stdout F step=1 loss=0.90\n"
    "2026-01-01T00:00:02.000000000Z stdout F step=2 loss=0.45\n"
    "2026-01-01T00:00:03.000000000Z stderr F training finished\n"
)
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"

# Readiness timeouts are multiplied by this (slow or heavily shared machines).
TS = float(os.environ.get("TRAINFLOW_TESTBED_TIMEOUT_SCALE", "2"))

# Trainer's TrainJobStatus feature gate is left off; see README.md for why.
TRAINER_FEATURE_GATES = os.environ.get("TRAINFLOW_TESTBED_TRAINER_FEATURE_GATES", "")


class TestbedError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[testbed {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- paths


class Layout:
    def __init__(self, run_dir: str, bin_dir: str | None = None) -> None:
        self.dir = Path(run_dir).resolve()
        self.pki = self.dir / "pki"
        self.logs = self.dir / "logs"
        self.pids = self.dir / "pids"
        self.etc = self.dir / "etc"
        self.data = self.dir / "data"
        self.kubeconfig = self.dir / "kubeconfig"
        self.env_file = self.dir / "env"
        self.state_file = self.dir / "state.json"
        self.bin = Path(bin_dir).resolve() if bin_dir else None
        base = int(os.environ.get("TRAINFLOW_TESTBED_PORT_BASE", DEFAULT_PORT_BASE))
        self.port_base = base
        self.ports = {k: base + v for k, v in PORTS.items()}
        # Pods mode (a real node, testbed/node/) records itself here at up; kwok mode has no file.
        self.mode_file = self.dir / "mode.json"
        mode = json.loads(self.mode_file.read_text()) if self.mode_file.exists() else {}
        self.pods = mode.get("mode") == "pods"
        self.api_host = str(mode.get("api_host", "127.0.0.1"))
        if self.pods:
            self.ports = {k: int(v) for k, v in mode["ports"].items()}

    def b(self, name: str) -> str:
        assert self.bin is not None
        p = self.bin / name
        if not os.access(p, os.X_OK):
            raise TestbedError(f"missing binary {p}; run testbed/build.sh")
        return str(p)


# --------------------------------------------------------------------------- pki


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


def write_kubeconfig(L: Layout, path: Path, user: str) -> None:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CONTEXT,
                "cluster": {
                    "server": f"https://{L.api_host}:{L.ports['apiserver']}",
                    "certificate-authority": str(L.pki / "ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(L.pki / f"{user}.crt"),
                    "client-key": str(L.pki / f"{user}.key"),
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


# --------------------------------------------------------------------------- processes


def _proc_env(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, _, v = item.partition(b"=")
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
        if st.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    except OSError:
        return False
    return True


def _ours(L: Layout, pid: int) -> bool:
    return _proc_env(pid).get(INSTANCE_ENV) == str(L.dir)


def instance_pids(L: Layout) -> list[int]:
    """All live processes tagged with this testbed instance (pid files or not)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            pid = int(d.name)
            if pid != os.getpid() and _ours(L, pid) and _alive(pid):
                pids.append(pid)
    return pids


def start(L: Layout, name: str, argv: list[str], extra_env: dict[str, str] | None = None) -> int:
    L.logs.mkdir(parents=True, exist_ok=True)
    L.pids.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    env[INSTANCE_ENV] = str(L.dir)
    env.update(extra_env or {})
    (L.logs / f"{name}.cmd").write_text(" ".join(argv) + "\n")
    with open(L.logs / f"{name}.log", "ab") as logf:
        proc = subprocess.Popen(
            argv,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(L.dir),
            env=env,
            start_new_session=True,
        )
    (L.pids / f"{name}.pid").write_text(str(proc.pid))
    log(f"started {name} (pid {proc.pid})")
    return proc.pid


def pid_of(L: Layout, name: str) -> int | None:
    f = L.pids / f"{name}.pid"
    if not f.exists():
        return None
    try:
        return int(f.read_text().strip())
    except ValueError:
        return None


def running(L: Layout, name: str) -> bool:
    pid = pid_of(L, name)
    if pid is None or not _alive(pid):
        return False
    # Right after exec /proc/<pid>/environ can read empty; a reused pid would
    # show a non-empty environment without our instance tag.
    env = _proc_env(pid)
    return not env or env.get(INSTANCE_ENV) == str(L.dir)


def stop_all(L: Layout, timeout: float = 15.0) -> None:
    names = list(reversed(components(L)))
    for name in names:
        pid = pid_of(L, name)
        if pid and running(L, name):
            log(f"stopping {name} (pid {pid})")
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGTERM)
            deadline = time.time() + timeout
            while time.time() < deadline and _alive(pid):
                time.sleep(0.1)
        f = L.pids / f"{name}.pid"
        if f.exists():
            f.unlink()
    # Anything still tagged with this instance (children, lost pid files): kill.
    for _ in range(3):
        left = instance_pids(L)
        if not left:
            break
        for pid in left:
            log(f"killing leftover testbed process {pid}")
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    left = instance_pids(L)
    if left:
        raise TestbedError(f"processes still alive after down: {left}")


def tail_logs(L: Layout, lines: int = 40) -> str:
    out = []
    for name in [*components(L), "setup"]:
        f = L.logs / f"{name}.log"
        if not f.exists():
            out.append(f"===== {name}: no log =====")
            continue
        text = f.read_text(errors="replace").splitlines()
        state = "running" if running(L, name) else "NOT running"
        if name == "setup":
            state = "-"
        out.append(f"===== {name} ({state}) last {min(lines, len(text))} of {len(text)} lines: {f}")
        out.extend(text[-lines:])
    return "\n".join(out)


# --------------------------------------------------------------------------- waiting


def wait_for(
    desc: str,
    fn: Callable[[], Any],
    timeout: float,
    interval: float = 0.5,
    watch: list[str] | None = None,
    L: Layout | None = None,
) -> Any:
    deadline = time.time() + timeout
    last: Any = None
    while time.time() < deadline:
        if watch and L is not None:
            for name in watch:
                if not running(L, name):
                    raise TestbedError(f"{name} exited while waiting for {desc}")
        try:
            r = fn()
            if r:
                return r
            last = r
        except Exception as e:
            last = e
        time.sleep(interval)
    raise TestbedError(f"timed out after {timeout:.0f}s waiting for {desc} (last: {last!r})")


def http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3, context=ctx) as r:
            return r.status == 200
    except urllib.error.HTTPError:
        return False


def admin_ssl(L: Layout) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(L.pki / "ca.crt"))
    ctx.load_cert_chain(str(L.pki / "admin.crt"), str(L.pki / "admin.key"))
    return ctx


def insecure_ssl() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def port_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


# --------------------------------------------------------------------------- kubectl


class Kubectl:
    def __init__(self, L: Layout) -> None:
        self.L = L
        self.bin = L.b("kubectl")

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess:
        argv = [self.bin, "--kubeconfig", str(self.L.kubeconfig), *args]
        r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
        with open(self.L.logs / "setup.log", "a") as f:
            f.write(f"$ kubectl {' '.join(args)}\n{r.stdout}{r.stderr}")
        if check and r.returncode != 0:
            raise TestbedError(f"kubectl {' '.join(args)} failed: {r.stderr.strip() or r.stdout}")
        return r

    def apply_objs(self, objs: list[dict], server_side: bool = True) -> None:
        doc = {"apiVersion": "v1", "kind": "List", "items": objs}
        args = ["apply", "-f", "-"]
        if server_side:
            args += ["--server-side", "--force-conflicts", "--field-manager", "trainflow-testbed"]
        self.run(*args, stdin=json.dumps(doc))


# --------------------------------------------------------------------------- manifests


def load_yaml_docs(path: Path) -> list[dict]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


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
    ca_b64 = __import__("base64").b64encode((L.pki / "ca.crt").read_bytes()).decode()
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


def kwok_stages(L: Layout) -> list[dict]:
    """Upstream kwok Stages (node-fast + lease heartbeat, pod 'general', pod chaos failure).

    Tuned for tests: shorter default delays without default jitter (the upstream per-pod
    annotations such as pod-complete.stage.kwok.x-k8s.io/delay still override), and
    pod-complete never applies to pods labelled for failure, so a pod labelled
    pod-container-running-failed.stage.kwok.x-k8s.io=true deterministically fails
    (exit code 1; override via the upstream ...stage.kwok.x-k8s.io/exit-code annotation).
    """
    assert L.bin is not None
    delays_ms = {
        "pod-create": 200,
        "pod-init-container-running": 200,
        "pod-init-container-completed": 200,
        "pod-ready": 300,
        "pod-complete": 2000,
        "pod-delete": 0,
        "pod-container-running-failed": 2000,
    }
    stages = []
    for f in sorted((L.bin / "manifests" / "kwok").glob("*.yaml")):
        for d in load_yaml_docs(f):
            if d.get("kind") != "Stage":
                continue
            name = d["metadata"]["name"]
            spec = d["spec"]
            delay = spec.get("delay")
            if delay is not None and name in delays_ms:
                delay["durationMilliseconds"] = delays_ms[name]
                # kwok treats the jitter as an upper bound (jitter <= duration means
                # "use jitter"), so drop the default jitter; the per-pod
                # ...stage.kwok.x-k8s.io/jitter-delay annotation still works.
                delay.pop("jitterDurationMilliseconds", None)
            if name == "pod-complete":
                spec["selector"]["matchExpressions"].append(
                    {"key": f'.metadata.labels["{FAIL_LABEL}"]', "operator": "NotIn", "values": ["true"]}
                )
            stages.append(d)
    names = {s["metadata"]["name"] for s in stages}
    need = {
        "node-initialize",
        "node-heartbeat-with-lease",
        "pod-ready",
        "pod-complete",
        "pod-delete",
        "pod-container-running-failed",
    }
    if not need <= names:
        raise TestbedError(f"kwok stages missing: {sorted(need - names)}")
    return stages


def kwok_nodes() -> list[dict]:
    nodes = []
    for n in KWOK_NODES:
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": n,
                    "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "kubernetes.io/hostname": n,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                        "node-role.kubernetes.io/worker": "",
                    },
                },
                "spec": {},
                "status": {
                    # Both address kinds, as a kubelet registers them: kwok's node-initialize stage
                    # renders an empty "addresses:" (which clears them) when it re-initializes a
                    # node that lacks either, e.g. after a missed lease turned it Ready=Unknown.
                    "addresses": [
                        {"type": "InternalIP", "address": KWOK_NODE_IP},
                        {"type": "Hostname", "address": n},
                    ],
                    "allocatable": {
                        "cpu": "64",
                        "memory": "256Gi",
                        "pods": "110",
                        "nvidia.com/gpu": "8",
                        "ephemeral-storage": "1Ti",
                    },
                    "capacity": {
                        "cpu": "64",
                        "memory": "256Gi",
                        "pods": "110",
                        "nvidia.com/gpu": "8",
                        "ephemeral-storage": "1Ti",
                    },
                    "nodeInfo": {
                        "architecture": "amd64",
                        "operatingSystem": "linux",
                        "kubeletVersion": "fake",
                        "kubeProxyVersion": "fake",
                        "bootID": "",
                        "containerRuntimeVersion": "",
                        "kernelVersion": "",
                        "machineID": "",
                        "osImage": "",
                        "systemUUID": "",
                    },
                },
            }
        )
    return nodes


# --------------------------------------------------------------------------- up


def _start_kwok(L: Layout) -> None:
    P, pki = L.ports, L.pki
    # ---- kwok
    stages = kwok_stages(L)
    (L.etc / "kwok.yaml").write_text(
        yaml.safe_dump_all(
            [
                {
                    "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
                    "kind": "KwokConfiguration",
                    "options": {
                        "podPlayStageParallelism": 4,
                        "nodePlayStageParallelism": 2,
                        "nodeLeaseParallelism": 2,
                        "podsOnNodeSyncParallelism": 1,
                        "nodeLeaseDurationSeconds": 40,
                        "enablePodsOnNodeSyncListPager": True,
                        "enablePodsOnNodeSyncStreamWatch": False,
                        # kwok does not default options given in a config file
                        "enableDebuggingHandlers": True,
                        "enableProfilingHandler": False,
                        "enableContentionProfiling": False,
                    },
                },
                *stages,
            ],
            sort_keys=False,
        )
    )
    # Container logs served by kwok's "kubelet" endpoint (kubectl logs / read_namespaced_pod_log).
    (L.etc / "container.log").write_text(SIMULATED_LOG)
    (L.etc / "kwok.yaml").write_text(
        (L.etc / "kwok.yaml").read_text()
        + "---\n"
        + yaml.safe_dump(
            {
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "ClusterLogs",
                "metadata": {"name": "trainflow-testbed-logs"},
                "spec": {"logs": [{"logsFile": str(L.etc / "container.log"), "follow": False}]},
            }
        )
    )
    start(
        L,
        "kwok",
        [
            L.b("kwok"),
            "--kubeconfig",
            str(L.kubeconfig),
            "--config",
            str(L.etc / "kwok.yaml"),
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector",
            "kwok.x-k8s.io/node=fake",
            "--node-ip",
            KWOK_NODE_IP,
            "--node-port",
            str(P["kwok"]),
            "--server-address",
            f"127.0.0.1:{P['kwok']}",
            "--tls-cert-file",
            str(pki / "serving.crt"),
            "--tls-private-key-file",
            str(pki / "serving.key"),
            "--cidr",
            "10.244.0.0/16",
            "--node-lease-duration-seconds",
            "40",
        ],
        {"HOME": str(L.dir / "tmp")},
    )


def _start_local_trainer(L: Layout) -> None:
    P = L.ports
    # ---- Trainer controller manager
    tr_cfg = {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "webhook": {"host": "127.0.0.1", "port": P["trainer_webhook"]},
        "metrics": {"bindAddress": "0", "secureServing": False},
        "health": {
            "healthProbeBindAddress": f"127.0.0.1:{P['trainer_health']}",
            "readinessEndpointName": "readyz",
            "livenessEndpointName": "healthz",
        },
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": False},
        "controller": {
            "groupKindConcurrency": {
                "TrainJob.trainer.kubeflow.org": 5,
                "TrainingRuntime.trainer.kubeflow.org": 1,
                "ClusterTrainingRuntime.trainer.kubeflow.org": 1,
            }
        },
    }
    (L.etc / "trainer-config.yaml").write_text(yaml.safe_dump(tr_cfg))
    tr_argv = [
        L.b("trainer-controller-manager"),
        "--kubeconfig",
        str(L.kubeconfig),
        "--config",
        str(L.etc / "trainer-config.yaml"),
        "--zap-log-level",
        "info",
    ]
    if TRAINER_FEATURE_GATES:
        tr_argv += ["--feature-gates", TRAINER_FEATURE_GATES]
    start(L, "trainer-controller-manager", tr_argv, {"TMPDIR": str(L.dir / "tmp" / "trainer")})


def _kwok_trainer_ready(L: Layout, k: Kubectl, trainer_upstream: Path) -> list[dict]:
    """kwok mode: wait for the local Trainer, wire both webhooks, install the runtimes, kwok nodes Ready."""
    P, all_procs = L.ports, components(L)
    wait_for(
        "trainer-controller-manager /readyz",
        lambda: http_ok(f"http://127.0.0.1:{P['trainer_health']}/readyz"),
        90 * TS,
        watch=all_procs,
        L=L,
    )

    # ---- webhooks (URL client configs) and proof that admission calls them
    k.apply_objs(webhook_configs(L))
    wait_for(
        "JobSet validating webhook to answer", lambda: probe_jobset_webhook(k), 60 * TS, watch=all_procs, L=L
    )
    wait_for(
        "Trainer validating webhook to answer",
        lambda: probe_trainer_webhook(k),
        60 * TS,
        watch=all_procs,
        L=L,
    )
    log("admission webhooks answering (JobSet + Trainer)")

    # ---- default ClusterTrainingRuntimes (validated by the Trainer webhook)
    rt_files = sorted((trainer_upstream / "runtimes").rglob("*.yaml"))
    runtimes = [d for f in rt_files for d in load_yaml_docs(f)]
    k.apply_objs(runtimes)
    log(f"ClusterTrainingRuntimes: {', '.join(r['metadata']['name'] for r in runtimes)}")

    # ---- kwok nodes Ready
    k.apply_objs(kwok_nodes(), server_side=False)
    k.run("wait", "--for=condition=Ready", f"--timeout={int(120 * TS)}s", *[f"node/{n}" for n in KWOK_NODES])
    return runtimes


def _pods() -> Any:
    """testbed/node/ (pods mode), imported only when used."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "node"))
    import pods

    return pods


def up(L: Layout, trainer_upstream: Path, node_bin: Path | None = None) -> None:
    want_pods = node_bin is not None
    if L.state_file.exists() and L.pods == want_pods and all(running(L, n) for n in components(L)):
        try:
            if http_ok(f"https://{L.api_host}:{L.ports['apiserver']}/readyz", admin_ssl(L)):
                log(f"testbed already up in {L.dir}")
                return
        except Exception:
            pass
    if instance_pids(L) or L.pods:
        log("stale testbed found; stopping it first")
        down(L)
    t0 = time.time()
    for d in (L.pki, L.logs, L.pids, L.etc, L.data, L.dir / "tmp", L.dir / "webhook-certs"):
        if d.exists():
            shutil.rmtree(d)
    for f in (L.state_file, L.env_file, L.kubeconfig, L.mode_file):
        if f.exists():
            f.unlink()
    for d in (L.pki, L.logs, L.pids, L.etc, L.data, L.dir / "tmp" / "trainer"):
        d.mkdir(parents=True, exist_ok=True)
    busy = [f"{k}={p}" for k, p in L.ports.items() if not port_free(p)]
    if busy:
        raise TestbedError(
            f"ports in use on 127.0.0.1: {', '.join(busy)} "
            "(set TRAINFLOW_TESTBED_PORT_BASE to move the testbed)"
        )
    pods = _pods() if want_pods else None
    if pods is not None:
        # The node's network first: the API server binds the host end of the node's veth.
        pods.prepare(sys.modules[__name__], L)
    make_pki(L, (f"IP:{L.api_host}",) if L.pods else ())
    write_kubeconfig(L, L.kubeconfig, "admin")
    write_kubeconfig(L, L.etc / "kube-controller-manager.kubeconfig", "kube-controller-manager")
    write_kubeconfig(L, L.etc / "kube-scheduler.kubeconfig", "kube-scheduler")
    P = L.ports
    pki = L.pki
    api = f"https://{L.api_host}:{P['apiserver']}"

    # ---- etcd
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

    # ---- kube-apiserver
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
    k = Kubectl(L)

    # ---- kube-controller-manager, kube-scheduler
    kcm_kc = str(L.etc / "kube-controller-manager.kubeconfig")
    start(
        L,
        "kube-controller-manager",
        [
            L.b("kube-controller-manager"),
            "--kubeconfig",
            kcm_kc,
            "--authentication-kubeconfig",
            kcm_kc,
            "--authorization-kubeconfig",
            kcm_kc,
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            str(P["kcm"]),
            "--cert-dir",
            str(L.dir / "tmp" / "kcm"),
            "--tls-cert-file",
            str(pki / "serving.crt"),
            "--tls-private-key-file",
            str(pki / "serving.key"),
            "--leader-elect=false",
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
    sch_kc = str(L.etc / "kube-scheduler.kubeconfig")
    start(
        L,
        "kube-scheduler",
        [
            L.b("kube-scheduler"),
            "--kubeconfig",
            sch_kc,
            "--authentication-kubeconfig",
            sch_kc,
            "--authorization-kubeconfig",
            sch_kc,
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            str(P["scheduler"]),
            "--cert-dir",
            str(L.dir / "tmp" / "scheduler"),
            "--tls-cert-file",
            str(pki / "serving.crt"),
            "--tls-private-key-file",
            str(pki / "serving.key"),
            "--leader-elect=false",
            "--v",
            "1",
        ],
    )

    # ---- CRDs (JobSet from its module, Trainer from the core's vendored copy) - established
    crd_files = sorted((L.bin / "manifests" / "jobset" / "crd").glob("*.yaml")) + sorted(
        (trainer_upstream / "crds").glob("*.yaml")
    )
    crds = [d for f in crd_files for d in load_yaml_docs(f)]
    k.apply_objs(crds)
    k.run(
        "wait",
        "--for=condition=Established",
        f"--timeout={int(120 * TS)}s",
        *[f"crd/{c['metadata']['name']}" for c in crds],
    )
    log(f"CRDs established: {', '.join(c['metadata']['name'] for c in crds)}")

    # ---- JobSet controller (webhooks on loopback with testbed certs, no cert rotation)
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

    if not L.pods:
        _start_kwok(L)
        _start_local_trainer(L)
    all_procs = [n for n in components(L) if pid_of(L, n)]  # started so far
    insecure = insecure_ssl()
    wait_for(
        "kube-controller-manager /healthz",
        lambda: http_ok(f"https://127.0.0.1:{P['kcm']}/healthz", insecure),
        90 * TS,
        watch=all_procs,
        L=L,
    )
    wait_for(
        "kube-scheduler /healthz",
        lambda: http_ok(f"https://127.0.0.1:{P['scheduler']}/healthz", insecure),
        90 * TS,
        watch=all_procs,
        L=L,
    )
    wait_for(
        "jobset-controller /readyz",
        lambda: http_ok(f"http://127.0.0.1:{P['jobset_health']}/readyz"),
        90 * TS,
        watch=all_procs,
        L=L,
    )
    if L.pods:
        assert pods is not None and node_bin is not None
        runtimes = pods.up_node(sys.modules[__name__], L, k, Path(node_bin), trainer_upstream)
    else:
        runtimes = _kwok_trainer_ready(L, k, trainer_upstream)
    wait_for(
        "ServiceAccount default/default",
        lambda: k.run("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0,
        60 * TS,
        watch=all_procs,
        L=L,
    )

    elapsed = time.time() - t0
    state = {
        "dir": str(L.dir),
        "bin": str(L.bin),
        "kubeconfig": str(L.kubeconfig),
        "context": CONTEXT,
        "server": api,
        "ports": P,
        "versions": dict(
            line.split("=", 1) for line in (L.bin / "VERSIONS").read_text().split() if "=" in line
        ),
        "webhooks": True,
        "mode": "pods" if L.pods else "kwok",
        "trainer_feature_gates": TRAINER_FEATURE_GATES,
        "kwok_nodes": [] if L.pods else KWOK_NODES,
        "kwok_fail_label": FAIL_LABEL,
        "simulated_log_lines": [ln.split(" ", 3)[3] for ln in SIMULATED_LOG.splitlines()],
        "runtimes": [r["metadata"]["name"] for r in runtimes],
        "trainer_upstream": str(trainer_upstream),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "start_seconds": round(elapsed, 1),
        **(pods.state(L) if pods is not None else {}),
    }
    L.state_file.write_text(json.dumps(state, indent=2) + "\n")
    L.env_file.write_text(
        "".join(
            f"export {k_}={v}\n"
            for k_, v in {
                "TRAINFLOW_TESTBED_DIR": L.dir,
                "TRAINFLOW_TESTBED_KUBECONFIG": L.kubeconfig,
                "TRAINFLOW_TESTBED_CONTEXT": CONTEXT,
                "TRAINFLOW_TESTBED_SERVER": api,
                "TRAINFLOW_TESTBED_BIN": L.bin,
                "KUBECONFIG": L.kubeconfig,
            }.items()
        )
    )
    log(f"testbed up in {elapsed:.1f}s: kubeconfig {L.kubeconfig} (source {L.env_file})")


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


# --------------------------------------------------------------------------- status


def down(L: Layout) -> None:
    """Stop every process of the instance; in pods mode also undo the node's host changes."""
    if L.pods:
        _pods().down(sys.modules[__name__], L)
    else:
        stop_all(L)
    if L.state_file.exists():
        L.state_file.unlink()


def status(L: Layout) -> int:
    ok = True
    for name in components(L):
        r = running(L, name)
        ok &= r
        print(f"{name:28s} {'running pid ' + str(pid_of(L, name)) if r else 'NOT RUNNING'}")
    if L.state_file.exists():
        print(L.state_file.read_text())
    else:
        ok = False
        print(f"no state file {L.state_file}")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("command", choices=["up", "down", "status", "logs"])
    ap.add_argument("--dir", default=os.environ.get("TRAINFLOW_TESTBED_DIR", DEFAULT_DIR))
    ap.add_argument("--bin")
    ap.add_argument("--trainer-upstream")
    ap.add_argument("--node-bin", help="pods mode: the node build (testbed/node/build.sh output)")
    ap.add_argument("--lines", type=int, default=40)
    a = ap.parse_args()
    L = Layout(a.dir, a.bin)
    if a.command == "up":
        if not a.bin or not a.trainer_upstream:
            ap.error("up needs --bin and --trainer-upstream")
        L.dir.mkdir(parents=True, exist_ok=True)
        try:
            up(L, Path(a.trainer_upstream), Path(a.node_bin) if a.node_bin else None)
        except Exception as e:
            log(f"FAILED to start testbed: {e}")
            print(tail_logs(L, a.lines), file=sys.stderr)
            try:
                down(Layout(a.dir, a.bin))
            except Exception as e2:
                log(f"cleanup after failure: {e2}")
            return 1
        return 0
    if a.command == "down":
        down(L)
        log(f"testbed in {L.dir} stopped")
        return 0
    if a.command == "status":
        return status(L)
    print(tail_logs(L, a.lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
