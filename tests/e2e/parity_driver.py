"""Run trainflow's public operations against the cluster the environment's kubeconfig names, one plan step at a
time, and print each outcome as a ``STEP {json}`` line (the credential-parity suite reads them).

    python parity_driver.py '<plan as JSON>'

Steps: ``{"op": "backend", ...get_backend kwargs}``; ``{"op": "submit", "key": K, "as": ALIAS, "hold": SECONDS}``;
``{"op": "wait" | "wait_async", "job": ALIAS_OR_NAME, "timeout": S}``; ``{"op": "waits", ...}`` (both at once,
printing ``WAITING`` once they are under way); ``{"op": "logs", "job": ...}``; ``{"op": "pause", "name": N}``
(prints ``PAUSE N`` and reads a line from stdin). An outcome is ``ok`` or the kind of failure (``kind_of``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any

IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
KWOK_COMPLETE_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"


def kind_of(exc: BaseException) -> str:
    """The kind of a failure, in the words the suite compares with kubectl's."""
    from trainflow.core import errors

    text = f"{type(exc).__name__}: {exc}".lower()
    if isinstance(exc, errors.Unauthorized):
        return "unauthorized"
    if isinstance(exc, errors.PermissionDenied):
        return "forbidden"
    if isinstance(exc, errors.WaitTimeout):
        return "timeout"
    if "insecure" in text:
        return "config"
    if any(w in text for w in ("certificate", "x509", "ssl", "tls", "hostname")):
        return "tls"
    unreachable = ("name or service not known", "name resolution", "nodename nor servname", "cannot connect",
                   "could not be reached", "connection refused", "proxy", "cannot reach")  # fmt: skip
    if any(w in text for w in unreachable):
        return "connect"
    if isinstance(exc, errors.BackendError) and ("kubeconfig" in text or "credentials" in text):
        return "config"
    return f"other: {type(exc).__name__}"


_SAY = threading.Lock()  # the two waits of ``waits`` report from two threads: one whole line at a time


def say(tag: str, payload: Any = None) -> None:
    line = tag if payload is None else f"{tag} {json.dumps(payload, default=str)}"
    with _SAY:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Driver:
    def __init__(self) -> None:
        self.backend: Any = None
        self.backend_error: BaseException | None = None
        self.jobs: dict[str, Any] = {}

    def ref(self, job: str) -> Any:
        return self.jobs.get(job, job)

    def run(self, step: dict[str, Any]) -> None:
        op = step["op"]
        if op == "pause":
            say("PAUSE", step["name"])
            sys.stdin.readline()
            return
        if op == "backend":
            from trainflow.core import get_backend

            kwargs = {k: v for k, v in step.items() if k != "op"}
            try:
                self.backend = get_backend("kubernetes", **kwargs)
                say("STEP", {"op": op, "kind": "ok"})
            except Exception as exc:
                self.backend_error = exc
                say("STEP", {"op": op, "kind": kind_of(exc), "detail": str(exc)[:400]})
            return
        if op == "waits":
            return self.waits(step)
        t0 = time.monotonic()
        try:
            if self.backend is None:
                raise self.backend_error or RuntimeError("no backend")
            value = self.call(op, step)
            out = {"op": op, "kind": "ok", "value": value}
        except Exception as exc:
            out = {"op": op, "kind": kind_of(exc), "detail": f"{type(exc).__name__}: {exc}"[:600]}
        out["seconds"] = round(time.monotonic() - t0, 2)
        say("STEP", out)

    def call(self, op: str, step: dict[str, Any]) -> Any:
        b = self.backend
        if op == "submit":
            request: dict[str, Any] = {
                "runtime": "torch-distributed",
                "idempotency_key": step["key"],
                "num_nodes": 1,
                "image": IMAGE,
                "command": ["torchrun", "train.py"],
            }
            if step.get("hold"):
                request["annotations"] = {KWOK_COMPLETE_DELAY: f"{step['hold']}s"}
            ref = b.submit(request)
            self.jobs[step.get("as", step["key"])] = ref
            return ref.name
        if op == "wait":
            return b.wait(self.ref(step["job"]), timeout=step.get("timeout", 60)).state.value
        if op == "wait_async":
            result = asyncio.run(b.wait_async(self.ref(step["job"]), timeout=step.get("timeout", 60)))
            return result.state.value
        if op == "logs":
            return list(b.logs(self.ref(step["job"]), tail_lines=step.get("tail", 50)))
        raise ValueError(f"unknown op {op}")

    def waits(self, step: dict[str, Any]) -> None:
        """The sync and the async wait on one job at the same time (a thread and an event loop)."""
        threads = [
            threading.Thread(target=self.run, args=({**step, "op": name},), daemon=True)
            for name in ("wait", "wait_async")
        ]
        for t in threads:
            t.start()
        time.sleep(step.get("settle", 2.0))  # both have listed and are watching
        say("WAITING")
        for t in threads:
            t.join()


def main() -> None:
    driver = Driver()
    for step in json.loads(sys.argv[1]):
        driver.run(step)
    say("DONE")


if __name__ == "__main__":
    main()
