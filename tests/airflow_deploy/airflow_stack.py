"""A real Airflow deployment on loopback: Postgres plus scheduler (LocalExecutor), triggerer, dag-processor and
api-server (Airflow 3) or webserver (Airflow 2), each in its own process group, started and stopped by this file
(no orphans). The Airflow line is the venv's; where 2.x and 3.x differ (components, option names, auth), the
environment says so.

    python tests/airflow_deploy/airflow_stack.py up   --dir D --venv V --dags DAGS [--port-base P] [--env K=V ...]
    python tests/airflow_deploy/airflow_stack.py down --dir D
    python tests/airflow_deploy/airflow_stack.py status --dir D

``D/state.json`` records ports, pids and the environment every process shares (``D/env`` has it as shell
exports for the CLI). Every process carries ``TRAINFLOW_AIRFLOW_INSTANCE=D``: ``down`` stops the recorded
process groups, then any process still tagged (LocalExecutor workers, task processes, local-engine jobs).
Ports (127.0.0.1 only): base+0 api-server or webserver, +1 Postgres, +2 scheduler health check.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import airflow_pg

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
COMPONENTS_2 = ("webserver", "scheduler", "dag-processor", "triggerer")  # Airflow 2: the Flask webserver
TAG = "TRAINFLOW_AIRFLOW_INSTANCE"
DEFAULT_PORT_BASE = 29470


def _log(msg: str) -> None:
    print(f"[airflow-stack {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load(root: Path) -> dict[str, Any]:
    return json.loads((root / "state.json").read_text())  # type: ignore[no-any-return]


def _save(root: Path, state: dict[str, Any]) -> None:
    tmp = root / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(root / "state.json")
    exports = "".join(f"export {k}={json.dumps(v)}\n" for k, v in sorted(state["env"].items()))
    (root / "env").write_text(exports + f'export PATH={json.dumps(state["venv"] + "/bin")}:"$PATH"\n')


def airflow_version(venv: Path) -> str:
    out = subprocess.run(
        [f"{venv}/bin/python", "-c", "import importlib.metadata as m; print(m.version('apache-airflow'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def components_of(version: str) -> tuple[str, ...]:
    return COMPONENTS if int(version.split(".")[0]) >= 3 else COMPONENTS_2


def build_env(
    root: Path, venv: Path, dags: Path, base: int, extra: dict[str, str], version: str = "3"
) -> dict[str, str]:
    """The environment every Airflow process of the deployment shares (secrets identical everywhere)."""
    from cryptography.fernet import Fernet

    api = f"http://127.0.0.1:{base}"
    env = {
        TAG: str(root),
        "AIRFLOW_HOME": str(root / "airflow"),
        "TRAINFLOW_HOME": str(root / "trainflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        # modules beside the DAGs that every process imports by name (callbacks the triggerer runs)
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(dags.parent / "plugins"),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__PARALLELISM": "8",
        "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_pg.url(base + 1),
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "True",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": "127.0.0.1",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(base + 2),
        # the log servers of workers and triggerer (defaults 8793/8794): two deployments may run at once
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(base + 3),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(base + 4),
        # Failure detection fast enough for tests (defaults: 300 s task heartbeat, 30 s triggerer).
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "20",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
        "AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL": "5",
        "AIRFLOW__WEBSERVER__EXPOSE_CONFIG": "True",
        # the REST API returns XCom values as JSON (``deserialize=true``; off by default before 3.2)
        "AIRFLOW__API__ENABLE_XCOM_DESERIALIZE_SUPPORT": "True",
        "PYTHONUNBUFFERED": "1",
        # setproctitle (process titles of workers and task runners) otherwise overwrites the environment
        # block, and with it the tag that ``down`` finds processes by
        "SPT_NOENV": "1",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    if int(version.split(".")[0]) >= 3:
        env |= {
            "AIRFLOW__API_AUTH__JWT_SECRET": base64.b64encode(secrets.token_bytes(32)).decode(),
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(24),
            "AIRFLOW__API__BASE_URL": api,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(base),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
            # a healthy task's heartbeat lapsed past 45 s at load 33 (a 2.11 retry failed so): 90 s
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "90",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            # a loaded machine: the task supervisor's calls to the execution API time out after 5 s (httpx's
            # default), and with the default 5 retries a task failed before it ran at load 15-18 (3.0.6);
            # retried for minutes instead, and a few slow heartbeats do not end a healthy task
            "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "30",
            "AIRFLOW__WORKERS__MAX_FAILED_HEARTBEATS": "10",
        }
    else:  # Airflow 2: the same settings under their 2.x names; the webserver (FAB) public role is Admin
        env |= {
            "AIRFLOW__WEBSERVER__SECRET_KEY": secrets.token_hex(24),
            "AIRFLOW__WEBSERVER__BASE_URL": api,
            "AIRFLOW__WEBSERVER__WEB_SERVER_HOST": "127.0.0.1",
            "AIRFLOW__WEBSERVER__WEB_SERVER_PORT": str(base),
            "AIRFLOW__WEBSERVER__WORKERS": "1",
            "AIRFLOW__API__AUTH_BACKENDS": "airflow.api.auth.backend.default",
            "AIRFLOW__SCHEDULER__STANDALONE_DAG_PROCESSOR": "True",
            "AIRFLOW__SCHEDULER__DAG_DIR_LIST_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "10",
            "AIRFLOW__SCHEDULER__SCHEDULER_ZOMBIE_TASK_THRESHOLD": "90",
            "AIRFLOW__SCHEDULER__ZOMBIE_DETECTION_INTERVAL": "5",
        }
    env.update(extra)
    return env


# Airflow 2's webserver (Flask AppBuilder): every visitor is an Admin, as the 3.x deployment's all-admins mode
WEBSERVER_CONFIG_2 = 'AUTH_ROLE_PUBLIC = "Admin"\n'


def process_env(state: dict[str, Any]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.pop("KUBECONFIG", None)  # the connection alone must say where the cluster is
    env.update(state["env"])
    env["PATH"] = f"{state['venv']}/bin{os.pathsep}{os.environ.get('PATH', '')}"
    return env


def airflow_cli(state: dict[str, Any], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [f"{state['venv']}/bin/airflow", *args],
        env=process_env(state),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_component(root: Path, name: str) -> int:
    """Start one Airflow process in its own process group; its output goes to ``logs/<name>.log``."""
    state = load(root)
    argv = [f"{state['venv']}/bin/airflow", name]
    if name == "api-server":
        argv += ["--host", "127.0.0.1", "--port", str(state["ports"]["api"])]
    elif name == "webserver":
        argv += ["--hostname", "127.0.0.1", "--port", str(state["ports"]["api"]), "--workers", "1"]
    elif name in ("scheduler", "triggerer"):
        # Airflow's log server binds every interface and has no host option; on one host the API server
        # reads the task and trigger log files directly, so it is not needed.
        argv.append("--skip-serve-logs")
    log = root / "logs" / f"{name}.log"
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            argv,
            env=process_env(state),
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=root,
        )
    state = load(root)
    state["pids"][name] = proc.pid
    _save(root, state)
    return proc.pid


def stop_component(root: Path, name: str, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
    """Signal the component's process group; SIGKILL it when it has not exited in ``timeout``."""
    state = load(root)
    pid = state["pids"].pop(name, None)
    _save(root, state)
    if pid is None:
        return
    _signal_group(pid, sig)
    end = time.monotonic() + timeout
    while time.monotonic() < end and _group_alive(pid):
        time.sleep(0.2)
    _signal_group(pid, signal.SIGKILL)
    while _group_alive(pid) and time.monotonic() < end + 10:
        time.sleep(0.1)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    return any(_pgid(pid) == pgid for pid in _live_pids())


def _live_pids() -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    if fh.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                        out.append(int(entry.name))
            except OSError:
                continue
    return out


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def tagged(root: Path) -> list[int]:
    """Live processes whose environment carries this deployment's tag (never another instance's)."""
    mark = f"{TAG}={root}".encode()
    found = []
    for pid in _live_pids():
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if mark in fh.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


def component_pids(root: Path, name: str) -> list[int]:
    """Every live process of one component (its process group: LocalExecutor workers, task runners, ...)."""
    pgid = load(root)["pids"].get(name)
    return [] if pgid is None else [p for p in _live_pids() if _pgid(p) == pgid]


def http_ok(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except Exception:
        return False


def health(root: Path) -> dict[str, Any]:
    state = load(root)
    path = "/api/v2/monitor/health" if state.get("major", 3) >= 3 else "/api/v1/health"
    url = f"http://127.0.0.1:{state['ports']['api']}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]
    except Exception as exc:
        return {"error": repr(exc)}


def wait_healthy(root: Path, components: tuple[str, ...], timeout: float) -> float:
    """Wait until the API server reports every started component healthy; returns the seconds it took."""
    t0 = time.monotonic()
    want = {"scheduler", "triggerer", "dag-processor"}.intersection(components)
    keys = {"scheduler": "scheduler", "triggerer": "triggerer", "dag-processor": "dag_processor"}
    last: dict[str, Any] = {}
    while time.monotonic() - t0 < timeout:
        last = health(root)
        ok = "error" not in last and all((last.get(keys[c]) or {}).get("status") == "healthy" for c in want)
        if ok:
            return time.monotonic() - t0
        for name, pid in load(root)["pids"].items():
            if not _group_alive(pid):
                raise RuntimeError(f"{name} exited during start-up:\n{tail(root, name)}")
        time.sleep(1)
    raise RuntimeError(f"deployment not healthy after {timeout:.0f}s: {last}\n{tail(root)}")


def tail(root: Path, name: str | None = None, lines: int = 40) -> str:
    out = []
    for log in sorted((root / "logs").glob("*.log")):
        if name is None or log.stem == name:
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(text))
    return "\n".join(out)


def up(
    root: Path,
    venv: Path,
    dags: Path,
    base: int = DEFAULT_PORT_BASE,
    extra: dict[str, str] | None = None,
    components: tuple[str, ...] | None = None,
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Start Postgres, migrate, start the components and wait until healthy. Idempotent per ``root``."""
    t0 = time.monotonic()
    if (root / "state.json").exists():
        down(root)
    if root.exists():  # every deployment starts from an empty database and empty homes
        shutil.rmtree(root)
    for sub in ("logs", "airflow", "trainflow"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    version = airflow_version(venv)
    components = components or components_of(version)
    state: dict[str, Any] = {
        "venv": str(venv),
        "airflow": version,
        "major": int(version.split(".")[0]),
        "components": list(components),
        "ports": {
            "api": base,
            "postgres": base + 1,
            "scheduler_health": base + 2,
            "worker_logs": base + 3,
            "trigger_logs": base + 4,
        },
        "pids": {},
        "env": build_env(root, venv, dags, base, extra or {}, version),
        "timings": {},
    }
    if state["major"] < 3:
        (root / "airflow" / "webserver_config.py").write_text(WEBSERVER_CONFIG_2)
    _save(root, state)
    os.environ[TAG] = str(root)  # the postmaster is tagged too, so down finds it whatever happens
    try:
        state["postgres_pid"] = airflow_pg.start(root / "pg", base + 1, root / "logs" / "postgres.log")
    finally:
        os.environ.pop(TAG, None)
    state["timings"]["postgres"] = round(time.monotonic() - t0, 1)
    _save(root, state)
    migrated = airflow_cli(state, "db", "migrate", timeout=600)
    if migrated.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{migrated.stdout[-3000:]}{migrated.stderr[-3000:]}")
    state["timings"]["migrate"] = round(time.monotonic() - t0, 1)
    _save(root, state)
    for name in components:
        start_component(root, name)
    healthy = wait_healthy(root, components, timeout)
    state = load(root)
    state["timings"]["healthy"] = round(time.monotonic() - t0, 1)
    state["timings"]["components_healthy"] = round(healthy, 1)
    _save(root, state)
    _log(f"up in {state['timings']['healthy']}s: {state['timings']}; api http://127.0.0.1:{base}")
    return state


def cpu_seconds(root: Path) -> float:
    """CPU used so far by the deployment's live processes and the children they reaped (task runners)."""
    total = 0.0
    for pid in tagged(root):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            continue
    return total


def down(root: Path) -> None:
    """Stop every component, then anything still tagged, then Postgres; safe to call twice."""
    if not (root / "state.json").exists():
        return
    _log(f"CPU used by the deployment's processes: {cpu_seconds(root):.0f} s")
    for name in reversed(load(root).get("components", COMPONENTS)):
        stop_component(root, name)
    pg_pid = airflow_pg.postmaster_pid(root / "pg")
    pg_group = {pg_pid} | {p for p in tagged(root) if pg_pid is not None and _ppid(p) == pg_pid}
    for _ in range(3):  # LocalExecutor workers, task runners, local-engine jobs left by killed parents
        rest = [p for p in tagged(root) if p not in pg_group]
        if not rest:
            break
        for pid in rest:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    airflow_pg.stop(root / "pg")
    left = tagged(root)
    if left:
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        _log(f"killed leftover processes {left}")
    _log(f"down: {root}")


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def status(root: Path) -> int:
    state = load(root)
    bad = 0
    for name in state.get("components", COMPONENTS):
        pid = state["pids"].get(name)
        alive = pid is not None and _group_alive(pid)
        bad += 0 if alive or pid is None else 1
        print(f"{name:14} pid={pid} {'running' if alive else 'stopped'}")
    print(json.dumps(health(root), indent=1))
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["up", "down", "status", "logs"])
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--venv", type=Path)
    p.add_argument("--dags", type=Path)
    p.add_argument("--port-base", type=int, default=DEFAULT_PORT_BASE)
    p.add_argument("--env", action="append", default=[], help="K=V added to every process")
    p.add_argument("--components", default="", help="default: every component of the venv's Airflow")
    a = p.parse_args()
    root = a.dir.resolve()
    if a.action == "up":
        if a.venv is None or a.dags is None:
            p.error("up needs --venv and --dags")
        extra = dict(kv.split("=", 1) for kv in a.env)
        try:
            parts = tuple(a.components.split(",")) if a.components else None
            up(root, a.venv.resolve(), a.dags.resolve(), a.port_base, extra, parts)
        except Exception as exc:
            _log(f"up failed: {exc}")
            down(root)
            return 1
        return 0
    if a.action == "down":
        down(root)
        return 0
    if a.action == "logs":
        print(tail(root))
        return 0
    return status(root)


if __name__ == "__main__":
    sys.exit(main())
