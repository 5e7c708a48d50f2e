"""Issue 12, point 7: what the local engine cannot run is refused at submit (and at dry run) naming the request
field - an argv item or env value over the OS limit, argv + env over ARG_MAX, an empty command, num_nodes above
the local cap - and a secret file missing when a node starts is reported as that secret."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG
from trainflow.core import InvalidRequest, TrainJobFailed
from trainflow.core.local.engine import LocalBackend

pytestmark = pytest.mark.timeout(2 * HANG)  # a backstop above the waits' own hang detector

BIG = "x" * (200 * 1024)  # over Linux's MAX_ARG_STRLEN (128 KiB per argv or env string)
CMD = ["python3", "-c", "pass"]


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(tmp_path / "home", namespace="limits")


def refused(backend: LocalBackend, request: dict[str, Any]) -> InvalidRequest:
    """Refused by the dry run and by the submit, with nothing created."""
    with pytest.raises(InvalidRequest):
        backend.submit(request, dry_run=True)
    with pytest.raises(InvalidRequest) as info:
        backend.submit(request)
    assert not (backend.home / "jobs" / "limits").exists() or not any(
        (backend.home / "jobs" / "limits").iterdir()
    ), "a job was created"
    assert "is it installed" not in str(info.value)
    return info.value


@pytest.mark.parametrize(
    ("request_data", "field"),
    [
        ({"command": CMD, "env": {"BIG": BIG}}, "env.BIG"),
        ({"command": CMD, "args": ["--data", BIG]}, "args[1]"),
        ({"command": [*CMD, BIG]}, "command[3]"),
        ({"function": "mymod:train", "function_kwargs": {"data": BIG}}, "function_kwargs"),
    ],
    ids=["env-value", "arg", "command-item", "function-kwargs"],
)
def test_one_string_over_the_os_limit_is_refused(
    backend: LocalBackend, request_data: dict[str, Any], field: str
) -> None:
    error = refused(backend, request_data)
    assert error.fields == [field]
    assert "128 KiB" in str(error)


# Submits through the local backend in a process whose RLIMIT_STACK is 1 MiB: Linux (and sysconf) then allow
# ARG_MAX = 256 KiB. Each 100 KiB item fits in MAX_ARG_STRLEN, three together do not fit in ARG_MAX.
_UNDER_SMALL_STACK = """
import json, resource, sys
from trainflow.core import InvalidRequest
from trainflow.core.local.engine import LocalBackend
resource.setrlimit(resource.RLIMIT_STACK, (1024 * 1024, resource.getrlimit(resource.RLIMIT_STACK)[1]))
backend, chunk, out = LocalBackend(sys.argv[1], namespace="limits"), "y" * (100 * 1024), []
for request in ({"args": [chunk] * 3}, {"env": {f"V{i}": chunk for i in range(3)}}):
    try:
        backend.submit({"command": ["python3", "-c", "pass"], **request})
        out.append(None)
    except InvalidRequest as exc:
        out.append([exc.fields, str(exc)])
print(json.dumps(out))
"""


@pytest.mark.timeout(1200)  # a backstop above the subprocess's own hang detector
def test_argv_and_env_over_arg_max_are_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # no wait inside: the bound is a hang detector only (60 s ran out once at load 23 on a cold CI machine)
    proc = subprocess.run(
        [sys.executable, "-c", _UNDER_SMALL_STACK, str(home)], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr
    (args_fields, args_text), (env_fields, env_text) = json.loads(proc.stdout)
    assert args_fields == ["args"] and "ARG_MAX (256 KiB)" in args_text, args_text
    assert env_fields == ["env"] and "ARG_MAX (256 KiB)" in env_text, env_text
    assert len(args_text) < 4096 and len(env_text) < 4096
    assert not (home / "jobs" / "limits").exists() or not any((home / "jobs" / "limits").iterdir())
    # under this process's own (larger) stack limit the same argv fits: the check follows the real limit
    LocalBackend(tmp_path / "other", namespace="limits").submit(
        {"command": CMD, "args": ["y" * (100 * 1024)] * 3}, dry_run=True
    )


@pytest.mark.parametrize("command", [[""], ["", "train.py"], ["   "]])
def test_an_empty_command_is_refused(backend: LocalBackend, command: list[str]) -> None:
    assert refused(backend, {"command": command}).fields == ["command[0]"]


def test_num_nodes_above_the_local_cap_is_refused(backend: LocalBackend) -> None:
    error = refused(backend, {"command": CMD, "num_nodes": 1000})
    assert error.fields == ["num_nodes"]
    assert "local" in str(error)
    error = refused(backend, {"command": CMD, "num_nodes": 33})
    assert error.fields == ["num_nodes"]


def test_the_local_node_cap_is_configurable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINFLOW_LOCAL_MAX_NODES", "2")
    backend = LocalBackend(tmp_path / "home", namespace="limits")
    assert refused(backend, {"command": CMD, "num_nodes": 3}).fields == ["num_nodes"]
    backend.submit({"command": CMD, "num_nodes": 2}, dry_run=True)


def test_a_secret_file_missing_at_start_is_reported_as_the_secret(backend: LocalBackend) -> None:
    secret = backend.home / "secrets" / "creds" / "token"
    secret.parent.mkdir(parents=True)
    secret.write_text("value\n")
    request = {
        "name": "sec",
        "command": CMD,
        "secret_env": {"API_TOKEN": "creds/token"},
        "suspend": True,
    }
    ref = backend.submit(request)  # suspended from creation: no node starts before resume
    secret.unlink()
    backend.resume(ref)
    with pytest.raises(TrainJobFailed) as info:
        backend.wait(ref, timeout=HANG)
    result = info.value.result
    assert result.reason == "SecretNotFound", result.reason
    assert "secret_env.API_TOKEN" in (result.message or "") and "creds/token" in (result.message or "")
    assert "python3" not in (result.message or "") and "PATH" not in (result.message or "")
