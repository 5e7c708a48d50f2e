"""The two clients of the credential-parity suite (tests/e2e/test_credential_parity.py), run the same way for
every case: kubectl (``auth whoami``, ``create``, ``get``, ``logs``) and trainflow's public operations in a fresh
process (parity_driver.py); each outcome as ``ok`` or the kind of failure, and the rule by which they agree.
The ``World`` is what the cases share: a namespace, a completed reference job, identities with RBAC.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from credential_helpers import mint_client_cert, parked_trainjob

from bounds import HANG

DRIVER = Path(__file__).with_name("parity_driver.py")
PLAN = ["submit", "wait", "wait_async", "logs"]
KUBECTL_OF = {"submit": "create", "wait": "get", "wait_async": "get", "logs": "logs"}
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY")


@dataclass
class World:
    testbed: Any
    k8s: Any
    namespace: str
    kubectl: str
    ref_job: str
    ref_pod: str
    root: Path
    static_cert: tuple[Path, Path]
    bindings: list[str] = field(default_factory=list)

    @property
    def pki(self) -> Path:
        return Path(self.testbed.dir) / "pki"

    @property
    def port(self) -> int:
        return int(self.testbed.server.rsplit(":", 1)[1])

    def grant(self, subject: dict[str, Any]) -> str:
        """cluster-admin for one user, group or service account; returns the binding's name."""
        name = f"parity-{self.namespace}-{len(self.bindings)}"
        self.k8s.rbac.create_cluster_role_binding(
            {
                "metadata": {"name": name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "cluster-admin",
                },
                "subjects": [subject],
            }
        )
        self.bindings.append(name)
        return name

    def revoke(self, binding: str) -> None:
        self.k8s.rbac.delete_cluster_role_binding(binding)

    def service_account(self, name: str) -> tuple[str, str]:
        """A service account with cluster-admin: (bound token, user name)."""
        from kubernetes import client

        self.k8s.core.create_namespaced_service_account(self.namespace, {"metadata": {"name": name}})
        self.grant({"kind": "ServiceAccount", "name": name, "namespace": self.namespace})
        spec = client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        tr = self.k8s.core.create_namespaced_service_account_token(
            name, self.namespace, client.AuthenticationV1TokenRequest(spec=spec)
        )
        return str(tr.status.token), f"system:serviceaccount:{self.namespace}:{name}"

    def ca(self) -> Path:
        return self.pki / "ca.crt"

    def certs(self, name: str, cn: str, org: str) -> tuple[Path, Path]:
        return mint_client_cert(self.pki, self.root / "certs", name, cn, org)


def base_env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in PROXY_ENV and not k.startswith("KUBERNETES_SERVICE")
    }
    env.pop("KUBECONFIG", None)
    env["HOME"] = str(home)  # no ~/.kube/config, no shared discovery cache
    env.update(extra)
    return env


def kubectl_kind(stderr: str) -> str:
    low = stderr.lower()
    if "insecure flag is not allowed" in low:
        return "config"
    if "x509" in low or "tls:" in low or "certificate" in low:
        return "tls"
    if "unauthorized" in low or "must be logged in" in low:
        return "unauthorized"
    if "forbidden" in low:
        return "forbidden"
    if any(
        w in low
        for w in ("no such host", "dial tcp", "connection refused", "unable to connect", "proxyconnect")
    ):
        return "connect"
    if "error loading config" in low or "invalid configuration" in low:
        return "config"
    return f"other: {stderr.strip()[:200]}"


def kubectl_ops(
    world: World, env: dict[str, str], wrap: list[str] | None = None
) -> dict[str, dict[str, Any]]:
    """whoami, create, get and logs through kubectl; each ``{"kind", "value"}``."""
    manifest = world.root / f"kubectl-{uuid.uuid4().hex[:6]}.yaml"
    name = f"kubectl-{uuid.uuid4().hex[:8]}"
    manifest.write_text(yaml.safe_dump(parked_trainjob(name)))  # nothing runs it: a create is all it is for
    ops = {
        "whoami": ["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"],
        "create": ["create", "-f", str(manifest), "-o", "name"],
        "get": ["get", "trainjob", world.ref_job, "-o", "jsonpath={.status.conditions[*].type}"],
        "logs": ["logs", world.ref_pod, "-c", "node", "--tail=50"],
    }
    out = {}
    for op, args in ops.items():
        # no --request-timeout: any flag that changes kubectl's default config turns its in-cluster fallback off
        cmd = [*(wrap or []), world.kubectl, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=HANG)
        if proc.returncode == 0:
            value: Any = proc.stdout.splitlines() if op == "logs" else proc.stdout.strip()
            out[op] = {"kind": "ok", "value": value}
        else:
            out[op] = {"kind": kubectl_kind(proc.stderr), "detail": proc.stderr.strip()[:400]}
    return out


class DriverRun:
    """tests/e2e/parity_driver.py running one plan in a fresh process."""

    def __init__(
        self, plan: list[dict[str, Any]], env: dict[str, str], wrap: list[str] | None = None
    ) -> None:
        cmd = [*(wrap or []), sys.executable, str(DRIVER), json.dumps(plan)]
        self.proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.steps: list[dict[str, Any]] = []

    def until(self, marker: str, timeout: float = 240) -> None:
        """Read steps until a line starting with ``marker`` (``PAUSE``, ``WAITING`` or ``DONE``)."""
        end = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < end:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("STEP "):
                self.steps.append(json.loads(line[5:]))
            elif line.startswith(marker):
                return
        self.proc.kill()
        err = self.proc.stderr.read() if self.proc.stderr else ""
        pytest.fail(
            f"the trainflow driver did not reach {marker} within {timeout:.0f}s: {self.steps}\n{err[-3000:]}"
        )

    def resume(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 240) -> dict[str, dict[str, Any]]:
        self.until("DONE", timeout)
        self.proc.wait(HANG)
        return {s["op"]: s for s in self.steps}


def plan(
    key: str, *, backend: dict[str, Any] | None = None, ops: list[str] = PLAN, wait_timeout: float = 30
) -> list[dict[str, Any]]:
    """Submit a job; wait (both ways) on, and read the log of, the completed reference job: a wait on it lists,
    reads the job and its pods and rank 0's log (every request a wait's end makes) without waiting for kwok."""
    steps: list[dict[str, Any]] = [{"op": "backend", **(backend or {})}]
    for op in ops:
        if op == "submit":
            steps.append({"op": "submit", "key": key, "as": "job"})
        elif op == "logs":
            steps.append({"op": "logs", "job": "parity-ref"})
        else:
            steps.append({"op": op, "job": "parity-ref", "timeout": wait_timeout})
    return steps


def agree(
    trainflow: dict[str, dict[str, Any]], kubectl: dict[str, dict[str, Any]], ops: list[str] = PLAN
) -> None:
    """Each trainflow operation ends as kubectl's counterpart does (a wait with no server reachable keeps trying
    until its timeout: ``timeout`` agrees with kubectl's ``connect``); successful logs have kubectl's lines."""
    problems = []
    for op in ops:
        mine, theirs = trainflow[op], kubectl[KUBECTL_OF[op]]
        same = mine["kind"] == theirs["kind"]
        if not same and op.startswith("wait") and (mine["kind"], theirs["kind"]) == ("timeout", "connect"):
            same = True
        if not same:
            problems.append(
                f"{op}: trainflow {mine['kind']} ({mine.get('detail', mine.get('value'))}) but kubectl "
                f"{KUBECTL_OF[op]} {theirs['kind']} ({theirs.get('detail', theirs.get('value'))})"
            )
    logs_ok = not problems and "logs" in ops and trainflow["logs"]["kind"] == "ok"
    if logs_ok and trainflow["logs"]["value"] != kubectl["logs"]["value"]:
        problems.append(f"logs differ: {trainflow['logs']['value'][:5]} vs {kubectl['logs']['value'][:5]}")
    assert not problems, "trainflow and kubectl disagree:\n" + "\n".join(problems)


def expect_kubectl(kubectl: dict[str, dict[str, Any]], kind: str) -> None:
    """The case is what it claims: kubectl's own outcome (so a broken setup cannot pass as parity)."""
    kinds = {op: r["kind"] for op, r in kubectl.items()}
    assert set(kinds.values()) == {kind}, f"kubectl itself: {kinds} ({kubectl})"


def case_dir(world: World, name: str) -> Path:
    d = world.root / f"{name}-{uuid.uuid4().hex[:4]}"
    d.mkdir(parents=True)
    return d


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()
