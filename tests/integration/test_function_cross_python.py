"""Issue 11.3 across interpreters: a Python >= 3.12 client ships code that the runtime images' Python 3.10 runs.

The deepspeed, mlx and xgboost runtime images run Python 3.10. On a 3.12+ client (an Airflow worker),
``ast.unparse`` rewrote ``f"{cfg['name']}"`` as ``f'{cfg['name']}'``, a syntax error before 3.12.
The interpreters come from uv (found or installed) or pyenv; none found is a failure, not a skip.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bounds import HANG

REPO = Path(__file__).resolve().parents[2]
FUNCTIONS = REPO / "tests" / "data" / "functions" / "user_functions.py"
# Loads only errors.py, reporting.py and function_trainer.py (no third-party imports), so a bare interpreter can
# run it.
CLIENT = """
import importlib.util, sys
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
core = sys.argv[1]
load("trainflow.core.errors", core + "/errors.py")
load("trainflow.core.reporting", core + "/reporting.py")
ft = load("trainflow.core.function_trainer", core + "/function_trainer.py")
user = load("user_functions", sys.argv[2])
sys.stdout.write(ft.function_code(user.train))
"""


def _uv() -> str:
    found = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    assert Path(found).exists(), "uv is needed to find Python interpreters (make setup installs it)"
    return found


def _run(*argv: str) -> str | None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=HANG)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _pyenv(version: str) -> str | None:
    pyenv = shutil.which("pyenv")
    for full in sorted((_run(pyenv, "versions", "--bare") or "").split() if pyenv else [], reverse=True):
        prefix = _run(pyenv, "prefix", full) if pyenv and full.startswith(version + ".") else None
        if prefix and (Path(prefix) / "bin" / f"python{version}").exists():
            return str(Path(prefix) / "bin" / f"python{version}")
    return None


def _python(version: str) -> str:
    """An interpreter of this minor version: uv's, else pyenv's, else one uv installs now."""
    uv = _uv()
    found = _run(uv, "python", "find", "--no-project", version) or _pyenv(version)
    if not found and _run(uv, "python", "install", version) is not None:
        found = _run(uv, "python", "find", "--no-project", version)
    if not found:
        pytest.fail(f"no Python {version}: neither uv nor pyenv has one, and `uv python install` failed")
    return found


def _version(exe: str) -> tuple[int, int]:
    out = subprocess.run(
        [exe, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True
    )
    major, minor = out.stdout.split()
    return int(major), int(minor)


def test_code_shipped_from_a_312_client_runs_on_python_310(tmp_path: Path) -> None:
    client, runtime = _python("3.12"), _python("3.10")
    assert _version(client) >= (3, 12) and _version(runtime) == (3, 10)
    shipped = subprocess.run(
        [client, "-c", CLIENT, str(REPO / "src" / "trainflow" / "core"), str(FUNCTIONS)],
        capture_output=True,
        text=True,
        timeout=HANG,
        check=True,
    ).stdout
    assert "f\"{cfg['name']}\"" in shipped  # the user's quotes, not 3.12's unparse
    run = subprocess.run(
        [runtime, "-c", shipped, json.dumps({"cfg": {"name": "qwen"}})],
        capture_output=True,
        text=True,
        timeout=HANG,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    *printed, marker, returned = run.stdout.split()
    assert printed == ["trained", "qwen", "'qwen'", "2"]
    assert marker == "TRAINFLOW_RETURN" and json.loads(returned) == {"name": "qwen"}  # rank 0's return value
