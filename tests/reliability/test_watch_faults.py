"""Faults at the cluster boundary (issue 19): every wait ends with the right outcome within a bound.

Each fault is scripted on the loopback API server (tests/unit/fake_apiserver.py) and met by the sync path
(``backend.wait``, run in a thread) and the async path (``backend.wait_async``), through the public API only
(``get_backend("kubernetes", kubeconfig=...)``), and the fatal ones through ``trainflow wait`` too:

- fatal (a typed error from ``trainflow.core.errors`` naming the cause, the same type on both paths, for a
  waiter with ``timeout=None`` and one with a timeout; never a hang or a false ``WaitTimeout``):
  403 on the wait's list (no RBAC: ``PermissionDenied``), 404 of the resource type (no Trainer CRD:
  ``NotFound`` naming ``trainer.kubeflow.org``), 401 that re-authentication does not cure
  (``Unauthorized``), a redirect loop (a ``BackendError``);
- survivable (the job's real final state, Complete): ``ERROR`` events (500 "etcdserver: request timed out",
  429), JSON lines of the wrong shape (``null``, ``[]``, ``"object": "x"``, an unknown event type carrying a
  false state), occasional 401s separated by successes, and a 64 MiB line (bounded memory and time: the
  waiter runs in a subprocess whose peak RSS is read from /proc);
- the bearer token (a canary) is in no log record (DEBUG), no exception text and no repr of any trainflow
  object alive during a wait.

The real kube-apiserver cases are test_watch_faults_real.py; a deferred Airflow task meeting the same faults
is tests/airflow_deploy/test_deploy_faults.py. Run (no testbed needed; 83 s on a loaded 2-core machine, load ~20):

    uv run --frozen --extra dev --no-sync pytest tests/reliability/test_watch_faults.py
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import waits
import yaml
from fake_apiserver import (
    FakeApiServer,
    Rule,
    error_event,
    event_line,
    huge_line,
    kubeconfig,
    trainjob_watch,
    wait_reads,
    when,
)
from waits import PATHS, Outcome, assert_complete, assert_fatal, assert_no_secret

from trainflow.core import get_backend
from trainflow.core.errors import (
    BackendError,
    NotFound,
    PermissionDenied,
    TrainJobNotFound,
    Unauthorized,
)
from trainflow.core.result import JobState

pytestmark = pytest.mark.timeout(120)  # a backstop only: each wait has its own bound below, named on failure

CANARY = "canary-bearer-5f0c7e1a9d3b"  # the bearer token: it must show up nowhere
BOUND = 30.0  # seconds within which every wait below must have an outcome
# the waits whose job completes after survivable faults run with no timeout: their end is the completion the
# fake server scripts after the faults, so the bound is a hang detector only, far above the measured worst
# (1-5 s idle; a 401 series ran past 25 s at load 17 in a cold CI run, which failed it with a WaitTimeout)
SURVIVE = 600.0
TIMEOUT = 10.0  # the waiters that have a timeout: a fatal fault must end them before it, not with it
BIG_LINE = 64 << 20
RSS_GROWTH_LIMIT_KIB = 32 << 10


@pytest.fixture
def fake():
    server = FakeApiServer()
    yield server
    server.close()


@pytest.fixture
def config(fake: FakeApiServer, tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig(fake.url, CANARY)))
    return path


@pytest.fixture
def backend(config: Path):
    b = get_backend("kubernetes", kubeconfig=str(config), namespace="ns")
    yield b
    b.close()


@pytest.fixture(autouse=True)
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


def wait(backend: Any, path: str, name: str, timeout: float | None, bound: float = BOUND) -> Outcome:
    return waits.wait(backend, path, name, timeout, bound)


def assert_clean(outcome: Outcome, caplog: pytest.LogCaptureFixture) -> None:
    assert_no_secret(CANARY, outcome, caplog)


def running_job(fake: FakeApiServer, name: str = "a") -> None:
    fake.add(name)
    fake.set_running(name)


def complete_after(
    fake: FakeApiServer, rule: Rule, fired: int = 1, name: str = "a", settle: float = 1.0
) -> None:
    """The job completes once the fault was delivered and the client reacted to it (it listed or watched
    again) or had ``settle`` seconds to act on it: a client that wrongly applied a bad event has done so."""
    state: dict[str, Any] = {}

    def reacted() -> bool:
        if rule.fired < fired:
            return False
        if "at" not in state:
            state.update(at=time.monotonic(), lists=fake.list_requests, watches=fake.watch_requests)
        again = fake.list_requests > state["lists"] or fake.watch_requests > state["watches"]
        return again or time.monotonic() - state["at"] >= settle

    when(reacted, (fake.set_condition, name, "Complete", "AllJobsCompleted"))


# --- the fault-free baseline ---------------------------------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
def test_baseline_a_job_runs_to_complete(fake, backend, debug_logs, path):
    fake.add("a")
    when(lambda: fake.open_watches, (fake.set_running, "a"), (fake.set_condition, "a", "Complete", "Done"))
    outcome = wait(backend, path, "a", None)
    assert_complete(outcome)
    assert_clean(outcome, debug_logs)


# --- fatal faults: a typed error at once, on both paths, with or without a timeout ---------------------------
@pytest.mark.parametrize("timeout", [None, TIMEOUT], ids=["no-timeout", "timeout"])
@pytest.mark.parametrize("path", PATHS)
def test_403_on_the_first_list_is_permission_denied(fake, backend, debug_logs, path, timeout):
    running_job(fake)
    fake.forbid(wait_reads)
    outcome = wait(backend, path, "a", timeout)
    assert_fatal(outcome, PermissionDenied, "trainjobs", within=TIMEOUT)
    assert_clean(outcome, debug_logs)


@pytest.mark.parametrize("timeout", [None, TIMEOUT], ids=["no-timeout", "timeout"])
@pytest.mark.parametrize("path", PATHS)
def test_404_of_the_resource_type_is_not_found_naming_the_trainjob_api(
    fake, backend, debug_logs, path, timeout
):
    running_job(fake)
    fake.no_crd(wait_reads)
    outcome = wait(backend, path, "a", timeout)
    assert_fatal(outcome, NotFound, "trainer.kubeflow.org", within=TIMEOUT)
    assert not isinstance(outcome.error, TrainJobNotFound), (
        f"the API is missing, not the job: {outcome.describe()}"
    )
    assert_clean(outcome, debug_logs)


@pytest.mark.parametrize("timeout", [None, TIMEOUT], ids=["no-timeout", "timeout"])
@pytest.mark.parametrize("path", PATHS)
def test_401_after_reauthentication_is_unauthorized(fake, backend, debug_logs, path, timeout):
    running_job(fake)
    fake.tokens = set()  # every token is rejected, a reloaded one too
    outcome = wait(backend, path, "a", timeout)
    assert_fatal(outcome, Unauthorized, within=TIMEOUT)
    # every watch (TrainJobs, and on the shared watch the pods and Workloads beside it) gives up after 4
    # rejected tries in a row, each re-authenticated once at most: at most 8 rejections per resource
    per_path = Counter(r.path for r, status in fake.requests if status == 401)
    assert per_path, "no request was rejected"
    assert max(per_path.values()) <= 8, f"re-authentication must be bounded: {dict(per_path)}"
    assert_clean(outcome, debug_logs)


@pytest.mark.parametrize("path", PATHS)
def test_a_redirect_loop_is_a_backend_error_that_leaks_no_token(fake, backend, debug_logs, path):
    running_job(fake)
    fake.redirect(wait_reads)
    outcome = wait(backend, path, "a", None)
    assert_fatal(outcome, BackendError)
    assert_clean(outcome, debug_logs)


@pytest.mark.timeout(1800)  # a backstop only: the CLI's start at this load is measured below
def test_cli_wait_reports_a_fatal_fault_and_exits(fake, config):
    running_job(fake)
    env = {**os.environ, "KUBECONFIG": str(config), "TRAINFLOW_DEBUG": ""}
    cli = [str(Path(sys.executable).parent / "trainflow"), "--backend", "kubernetes", "-n", "ns"]
    # One read first, unbounded but for a hang detector: a CLI process's start (interpreter, imports, in a
    # fresh venv their byte code) took over 30 s and once over 60 s at load 15-33 on cold CI machines. Its
    # measured time, start included, is what this machine needs now to run the CLI at all; the wait's bound is
    # BOUND beyond twice that, so it bounds the wait and not the machine's speed.
    started = time.monotonic()
    warm = subprocess.run([*cli, "status", "a"], capture_output=True, text=True, env=env, timeout=900)
    start_cost = time.monotonic() - started
    assert warm.returncode == 0 and "Running" in warm.stdout, warm.stdout + warm.stderr
    fake.forbid(wait_reads)
    cmd = [*cli, "wait", "a"]
    bound = BOUND + 2 * start_cost
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=bound)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"trainflow wait (no --timeout) had no outcome within {bound:.0f}s ({BOUND:.0f}s beyond twice the"
            f" {start_cost:.1f}s a status read took): it hangs"
        )
    assert proc.returncode != 0, proc.stdout
    assert "permission denied" in proc.stderr.lower() and "trainjobs" in proc.stderr, proc.stderr
    assert CANARY not in proc.stdout + proc.stderr


# --- survivable faults: the job's real final state ------------------------------------------------------------
ERROR_EVENTS = {
    "500-etcd-timeout": error_event(500, "InternalError", "etcdserver: request timed out"),
    "429": error_event(
        429,
        "TooManyRequests",
        "the server has received too many requests and has asked us to try again later",
    ),
}


@pytest.mark.parametrize("event", sorted(ERROR_EVENTS))
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.timeout(SURVIVE + 60)
def test_an_error_event_rewatches_and_the_job_completes(fake, backend, debug_logs, path, event):
    running_job(fake)
    rule = fake.inject([ERROR_EVENTS[event]], trainjob_watch)
    complete_after(fake, rule)
    outcome = wait(backend, path, "a", None, SURVIVE)
    assert_complete(outcome)
    assert rule.fired == 1
    assert_clean(outcome, debug_logs)


@pytest.mark.timeout(SURVIVE + 60)
def test_an_error_event_fails_no_other_async_waiter(fake, backend, debug_logs):
    names = [f"j{i}" for i in range(5)]
    for name in names:
        running_job(fake, name)
    rule = fake.inject([ERROR_EVENTS["500-etcd-timeout"]], trainjob_watch)

    def complete_all() -> None:
        for name in names:
            fake.set_condition(name, "Complete", "AllJobsCompleted")

    when(lambda: rule.fired, (complete_all,))

    async def all_waiters() -> list[Any]:
        waits = [backend.wait_async(n, timeout=None) for n in names]
        return await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), SURVIVE)

    outcomes = asyncio.run(all_waiters())
    assert [getattr(o, "state", o) for o in outcomes] == [JobState.COMPLETE] * len(names), outcomes


def _failed_copy(fake: FakeApiServer, rv: int) -> dict[str, Any]:
    obj = fake.get("a") or {}
    obj["metadata"]["resourceVersion"] = str(rv)
    obj["status"] = {
        "conditions": [{"type": "Failed", "status": "True", "reason": "NotTrue", "message": "x"}]
    }
    return obj


MALFORMED = {
    "null": lambda fake: [b"null\n"],
    "list": lambda fake: [b"[]\n"],
    "object-is-a-string": lambda fake: [event_line({"type": "MODIFIED", "object": "x"})],
    # an event type the API does not have, carrying a false Failed state: a decode error, never applied
    "unknown-type": lambda fake: [event_line({"type": "SURPRISE", "object": _failed_copy(fake, fake.rv)})],
}


@pytest.mark.parametrize("shape", sorted(MALFORMED))
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.timeout(SURVIVE + 60)
def test_a_malformed_line_is_skipped_and_the_job_completes(fake, backend, debug_logs, path, shape):
    running_job(fake)
    rule = fake.inject(MALFORMED[shape](fake), trainjob_watch, then="stream")
    complete_after(fake, rule)
    outcome = wait(backend, path, "a", None, SURVIVE)
    assert_complete(outcome)
    assert_clean(outcome, debug_logs)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.timeout(SURVIVE + 60)
def test_occasional_401s_between_successes_do_not_end_the_wait(fake, backend, debug_logs, path):
    running_job(fake)
    fake.watch_seconds = 0.3  # each watch ends soon (as timeoutSeconds does), so a wait makes many
    rule = fake.answer(401, trainjob_watch, times=5, every=2, reason="Unauthorized", message="Unauthorized")
    complete_after(fake, rule, fired=5)
    outcome = wait(backend, path, "a", None, SURVIVE)
    assert_complete(outcome)
    assert rule.fired == 5, f"only {rule.fired} of the 5 scripted 401s were met"
    assert_clean(outcome, debug_logs)


DRIVER = r"""
import asyncio, json, sys, time
from trainflow.core import get_backend

def peak_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

config, path, name, bound = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
backend = get_backend("kubernetes", kubeconfig=config, namespace="ns")
backend.get(name)  # the client libraries are loaded before the baseline
import aiohttp  # the async path's transport, likewise
before, t0 = peak_kib(), time.monotonic()
try:
    if path == "sync":
        result = backend.wait(name, timeout=bound)
    else:
        result = asyncio.run(backend.wait_async(name, timeout=bound))
    out = {"state": result.state.value}
except Exception as exc:
    out = {"error": f"{type(exc).__name__}: {exc}"[:500]}
out.update(seconds=round(time.monotonic() - t0, 2), growth_kib=peak_kib() - before)
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.parametrize("path", PATHS)
def test_a_64_mib_line_costs_bounded_memory_and_time(fake, config, path):
    running_job(fake)
    rule = fake.inject(huge_line(BIG_LINE), trainjob_watch, then="stream")
    complete_after(fake, rule)
    cmd = [sys.executable, "-c", DRIVER, str(config), path, "a", str(BOUND)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BOUND + 60)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"the {path} waiter had no outcome within {BOUND + 60:.0f}s after a 64 MiB line: it hangs"
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    print(f"\n{path}: {out}")
    assert out.get("state") == "Complete", out
    assert out["growth_kib"] <= RSS_GROWTH_LIMIT_KIB, (
        f"a {BIG_LINE >> 20} MiB line raised the waiter's peak RSS by {out['growth_kib'] >> 10} MiB "
        f"(limit {RSS_GROWTH_LIMIT_KIB >> 10} MiB)"
    )
    assert out["seconds"] < 15, f"a {BIG_LINE >> 20} MiB line cost {out['seconds']}s"
    assert CANARY not in proc.stdout + proc.stderr


# --- no token in any repr ---------------------------------------------------------------------------------------
def _reachable(root: Any, limit: int = 50_000) -> list[Any]:
    """Objects reachable from ``root`` through attributes and containers (not into modules, classes, code)."""
    seen: set[int] = set()
    out: list[Any] = []
    stack = [root]
    skip = (type, type(sys), type(len), type(_reachable), str, bytes, int, float, bool, type(None))
    while stack and len(out) < limit:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        out.append(obj)
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        else:
            stack.extend(getattr(obj, "__dict__", {}).values())
            for name in getattr(type(obj), "__slots__", ()):
                stack.append(getattr(obj, name, None))
    return out


def _leaking_reprs(objects: list[Any]) -> list[str]:
    leaks = []
    for obj in objects:
        if getattr(type(obj), "__module__", None) == "builtins":
            continue  # plain containers hold the token by necessity; the objects that print them are checked
        try:
            text = repr(obj)
        except Exception:  # a repr that fails leaks nothing
            continue
        if CANARY in text:
            leaks.append(f"{type(obj).__module__}.{type(obj).__qualname__}: {text[:300]}")
    return leaks


def _trainflow_objects() -> list[Any]:
    def module(obj: Any) -> str:
        name = getattr(type(obj), "__module__", "")
        return name if isinstance(name, str) else ""

    return [o for o in gc.get_objects() if module(o).startswith("trainflow.")]


def test_the_token_is_in_no_repr_of_any_object_of_a_wait(fake, backend, debug_logs):
    gc.collect()
    fake.add("a")
    when(lambda: fake.open_watches, (fake.set_condition, "a", "Complete", "Done"))
    assert_complete(wait(backend, "sync", "a", None))
    during: list[str] = []

    def look(_result: Any) -> None:  # inside the async wait: the shared watch and its credentials are alive
        during.extend(_leaking_reprs(_trainflow_objects()))

    async def async_wait() -> Any:
        return await asyncio.wait_for(backend.wait_async("a", timeout=BOUND - 5, on_update=look), BOUND)

    assert asyncio.run(async_wait()).state is JobState.COMPLETE
    leaks = sorted(set(during + _leaking_reprs(_reachable(backend)) + _leaking_reprs(_trainflow_objects())))
    assert not leaks, "the bearer token is in the repr of:\n" + "\n".join(leaks)
    assert_clean(Outcome("both"), debug_logs)
