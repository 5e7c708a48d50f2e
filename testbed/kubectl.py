"""kubectl against the instance (every call logged to logs/setup.log), and reading YAML manifests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from layout import Layout, TestbedError


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


def load_yaml_docs(path: Path) -> list[dict]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]
