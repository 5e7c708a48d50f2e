"""Credentials for the fault and credential-parity suites: exec plugins that count their runs and rotate what
they return, client certificates minted with the testbed CA, kubeconfig files; and a parked TrainJob to read.

An exec plugin here is a Python script run by whichever client reads the kubeconfig (trainflow's sync and
async paths, kubectl). Each run appends a line to a file (with ``$PARITY_CALLER``), so a test counts runs
exactly. It returns ``prefix-<run>`` tokens, or the first of two credentials (tokens or key pairs) until the
test calls ``rotate()`` and the second after, as a real issuer does; each expires ``lifetime`` seconds after the
run that issued it (the second lasts an hour).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bounds import HANG

EXEC_V1 = "client.authentication.k8s.io/v1"
EXEC_V1BETA1 = "client.authentication.k8s.io/v1beta1"

_PLUGIN = r"""
import datetime, fcntl, json, math, os, sys, time

spec = json.load(open(sys.argv[1]))
now = time.time()
with open(spec["runs"], "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    n = len(f.read().splitlines()) + 1
    f.write(f"{n} {now:.3f} {os.environ.get('PARITY_CALLER', '-')}\n")
if spec.get("sleep"):
    time.sleep(spec["sleep"])
creds = spec.get("certs") or spec.get("tokens")
if creds:  # the first credential until the test rotates, then the second (lasting an hour)
    rotated = os.path.exists(spec["rotated"])
    cred = creds[1] if rotated else creds[0]
    lifetime = 3600 if rotated else spec.get("lifetime")
else:  # a fresh token each run
    cred = f"{spec['prefix']}-{n}"
    lifetime = spec.get("lifetime") if n == 1 else spec.get("later_lifetime", spec.get("lifetime"))
status = {}
if spec.get("certs"):
    status["clientCertificateData"] = open(cred[0]).read()
    status["clientKeyData"] = open(cred[1]).read()
else:
    status["token"] = cred
if lifetime:
    end = datetime.datetime.fromtimestamp(math.ceil(now + lifetime), datetime.timezone.utc)
    status["expirationTimestamp"] = end.strftime("%Y-%m-%dT%H:%M:%SZ")
api = json.loads(os.environ.get("KUBERNETES_EXEC_INFO") or "{}").get("apiVersion") or spec["api_version"]
print(json.dumps({"apiVersion": api, "kind": "ExecCredential", "status": status}))
"""


@dataclass
class ExecPlugin:
    """A counting exec plugin; ``entry`` is the kubeconfig ``user.exec`` that runs it."""

    script: Path
    spec: Path
    runs_file: Path
    api_version: str
    rotated: Path

    @property
    def entry(self) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "command": sys.executable,
            "args": [str(self.script), str(self.spec)],
            "interactiveMode": "Never",
        }

    def rotate(self) -> None:
        """From now on the plugin issues the second credential."""
        self.rotated.touch()

    def log(self) -> str:
        return self.runs_file.read_text() if self.runs_file.exists() else ""

    def _lines(self, caller: str | None) -> list[list[str]]:
        text = self.runs_file.read_text() if self.runs_file.exists() else ""
        rows = [line.split() for line in text.splitlines()]
        return [r for r in rows if caller is None or r[2] == caller]

    def runs(self, caller: str | None = None) -> int:
        """How many times it ran (for ``caller``: a process whose environment had that ``PARITY_CALLER``)."""
        return len(self._lines(caller))

    def run_times(self, caller: str | None = None) -> list[float]:
        return [float(r[1]) for r in self._lines(caller)]


def exec_plugin(
    folder: Path,
    *,
    prefix: str | None = None,
    tokens: list[str] | None = None,
    certs: list[tuple[Path, Path]] | None = None,
    lifetime: float | None = None,
    later_lifetime: float | None = None,
    api_version: str = EXEC_V1,
    sleep: float = 0.0,
) -> ExecPlugin:
    """Write a plugin returning ``prefix-<run>`` tokens, or the first then (after ``rotate``) the second of the
    given tokens or key pairs. ``later_lifetime``: the lifetime of the prefix tokens after the first (default
    ``lifetime``)."""
    assert prefix or len(tokens or certs or []) == 2, "a prefix, or two tokens or key pairs"
    folder.mkdir(parents=True, exist_ok=True)
    script, spec, runs = folder / "plugin.py", folder / "plugin.json", folder / "runs"
    script.write_text(_PLUGIN)
    spec.write_text(
        json.dumps(
            {
                "runs": str(runs),
                "rotated": str(folder / "rotated"),
                "prefix": prefix,
                "tokens": tokens,
                "certs": [[str(c), str(k)] for c, k in certs or []],
                "lifetime": lifetime,
                **({"later_lifetime": later_lifetime} if later_lifetime is not None else {}),
                "api_version": api_version,
                "sleep": sleep,
            }
        )
    )
    return ExecPlugin(script, spec, runs, api_version, folder / "rotated")


def mint_client_cert(
    pki: Path, out: Path, name: str, cn: str, org: str = "system:masters"
) -> tuple[Path, Path]:
    """A client certificate and key signed by the testbed CA (``pki/ca.{crt,key}``): the API server
    authenticates it as user ``cn`` in group ``org``."""
    out.mkdir(parents=True, exist_ok=True)
    key, csr, crt, ext = (out / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n"
    )
    for args in (
        ["req", "-new", "-newkey", "rsa:2048", "-nodes", "-sha256", "-keyout", str(key), "-out", str(csr),
         "-subj", f"/O={org}/CN={cn}"],
        ["x509", "-req", "-sha256", "-days", "1", "-in", str(csr), "-CA", str(pki / "ca.crt"),
         "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-CAserial", str(out / "ca.srl"),
         "-out", str(crt), "-extfile", str(ext)],
    ):  # fmt: skip
        proc = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=HANG)
        assert proc.returncode == 0, proc.stderr
    return crt, key


def write_kubeconfig(
    path: Path,
    server: str,
    user: dict[str, Any],
    *,
    cluster: dict[str, Any] | None = None,
    namespace: str = "default",
    name: str = "parity",
) -> Path:
    """A one-context kubeconfig (cluster, user and context all named ``name``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def parked_trainjob(name: str) -> dict[str, Any]:
    """A TrainJob ``managedBy`` another controller: the Trainer leaves it alone, so nothing runs and its status
    changes only when a test writes it."""
    group = "trainer.kubeflow.org"
    return {
        "apiVersion": f"{group}/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": "torch-distributed", "kind": "ClusterTrainingRuntime", "apiGroup": group},
            "trainer": {"numNodes": 1, "image": "registry.invalid/parked:0", "command": ["true"]},
            "managedBy": "kueue.x-k8s.io/multikueue",
        },
    }
