"""Issue 11.3: a function trainer ships the user's own source text, decorators removed, never ast.unparse.

The cross-interpreter half (a Python >= 3.12 client, the runtime images' Python 3.10) is in
tests/integration/test_function_cross_python.py.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bounds import HANG
from trainflow.core import InvalidRequest, build_trainjob, local_catalog
from trainflow.core.function_trainer import function_code, function_command, function_source
from trainflow.core.reporting import return_value
from trainflow.core.runtimes import find_runtime

FUNCTIONS = Path(__file__).resolve().parents[1] / "data" / "functions" / "user_functions.py"


def user_module() -> ModuleType:
    """The functions' module, imported from its file (inspect reads the source from there)."""
    if str(FUNCTIONS.parent) not in sys.path:
        sys.path.insert(0, str(FUNCTIONS.parent))
    return importlib.import_module(FUNCTIONS.stem)


def _user_text(first: str, last: str) -> str:
    lines = FUNCTIONS.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith(last))
    return "".join(lines[start : end + 1])


def test_shipped_source_is_the_users_text_without_decorators() -> None:
    source, name = function_source(user_module().train)
    assert name == "train"
    assert source == _user_text("def train(", "    return {")
    assert "# the user's comment stays" in source  # ast.unparse dropped comments
    assert "f'{cfg[\"name\"]!r:>12}'" in source  # quotes kept as written
    assert "@traced" not in source and "owner=" not in source


def test_shipped_code_runs_with_annotations_naming_the_callers_imports(tmp_path: Path) -> None:
    """``Mapping`` exists only under TYPE_CHECKING in the user's module; the trainer must not evaluate it."""
    code = function_code(user_module().train)
    assert code.startswith("from __future__ import annotations\n")
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps({"cfg": {"name": "llama"}, "steps": 3})],
        capture_output=True,
        text=True,
        timeout=HANG,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    # the function's return value follows as one JSON line, which reporting.return_value reads back
    assert proc.stdout.splitlines() == ["trained llama 'llama' 3", 'TRAINFLOW_RETURN {"name":"llama"}']
    assert return_value(proc.stdout.splitlines()) == {"name": "llama"}


@pytest.mark.parametrize(
    ("rank", "value", "outcome"),
    [
        ("1", "{'a': 1}", ""),  # only rank 0 reports its return value
        ("0", "None", ""),  # nothing to report
        ("0", "[1.5, 'x', None]", 'TRAINFLOW_RETURN [1.5,"x",null]'),
        ("0", "object()", "not JSON"),
        ("0", "'x' * 70000", "write it to trainflow.core.output_dir()"),
    ],
)
def test_return_value_is_rank_0s_json_line_or_a_clear_failure(
    tmp_path: Path, rank: str, value: str, outcome: str
) -> None:
    module = tmp_path / "returning.py"
    module.write_text(f"def fit():\n    return {value}\n")
    sys.path.insert(0, str(tmp_path))
    try:
        code = function_code(importlib.import_module("returning").fit)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("returning", None)
    proc = subprocess.run(
        [sys.executable, "-c", code, "{}"],
        capture_output=True,
        text=True,
        timeout=HANG,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "RANK": rank},
    )
    if outcome.startswith("TRAINFLOW_RETURN") or not outcome:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == outcome
    else:
        assert proc.returncode == 1 and outcome in proc.stderr, proc.stderr


def test_async_function_is_run_with_asyncio(tmp_path: Path) -> None:
    code = function_code(user_module().train_async)
    proc = subprocess.run(
        [sys.executable, "-c", code, '{"lr": 0.5}'],
        capture_output=True,
        text=True,
        timeout=HANG,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "lr=0.5"


def test_lambdas_and_nested_functions_are_refused_naming_the_field() -> None:
    def nested() -> None:
        pass

    for fn in (lambda: None, nested):
        with pytest.raises(InvalidRequest) as err:
            function_source(fn)
        assert err.value.fields == ["function"]


@pytest.mark.parametrize(
    ("policy", "head"),
    [
        ("torch", ["torchrun", "--no-python", "python3", "-c"]),
        ("mpi", ["mpirun", "--hostfile", "/etc/mpi/hostfile", "python3", "-c"]),
        (None, ["python3", "-c"]),
    ],
)
def test_launcher_per_policy_and_kwargs_as_one_json_argument(policy: str | None, head: list[str]) -> None:
    argv = function_command("pkg.mod:train", {"b": [1, 2], "a": "x"}, policy)
    assert argv[: len(head)] == head
    assert argv[-1] == '{"a":"x","b":[1,2]}'


def test_packages_install_before_the_launcher_and_inside_mpirun() -> None:
    torch = function_command(
        "pkg.mod:train", {}, "torch", ["transformers==4.57.1"], ["https://i.example/simple"]
    )
    assert torch[:2] == ["python3", "-c"] and torch[4:6] == ["torchrun", "--no-python"]
    assert json.loads(torch[3]) == {
        "packages": ["transformers==4.57.1"],
        "index_urls": ["https://i.example/simple"],
    }
    mpi = function_command("pkg.mod:train", {}, "mpi", ["datasets"])
    assert mpi[:5] == ["mpirun", "--hostfile", "/etc/mpi/hostfile", "python3", "-c"]
    assert json.loads(mpi[6]) == {"packages": ["datasets"], "index_urls": []}


def test_mpirun_forwards_the_env_trainflow_sets_to_every_rank() -> None:
    """Ranks on other nodes start over SSH without the pod's env: the request's env, secret_env names and
    the output URI reach them through mpirun's -x (values stay in the pod spec, never in argv)."""
    request = {
        "runtime": "deepspeed-distributed",
        "function": "pkg.mod:train",
        "env": {"LR": "0.1"},
        "secret_env": {"HF_TOKEN": "hf/token"},
        "output_uri": "file:///out",
    }
    runtime = find_runtime(local_catalog(), "deepspeed-distributed")
    command = build_trainjob(request, runtime)["spec"]["trainer"]["command"]
    exports = command[3 : command.index("python3")]
    assert exports == ["-x", "HF_TOKEN", "-x", "LR", "-x", "TRAINFLOW_OUTPUT_URI"]
    assert "0.1" not in command[:-1] and "file:///out" not in command
    torch = function_command("pkg.mod:train", {}, "torch", forward_env=["LR"])
    assert "-x" not in torch  # torchrun's workers inherit the pod's env


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"packages_to_install": ["x"], "function": None, "command": ["python3"]}, "packages_to_install"),
        ({"pip_index_urls": ["https://pypi.org/simple"]}, "pip_index_urls"),
        ({"packages_to_install": ["--index-url=https://evil/simple"]}, "packages_to_install[0]"),
        ({"packages_to_install": ["x"], "pip_index_urls": ["https://u:p@idx/simple"]}, "pip_index_urls[0]"),
        ({"packages_to_install": ["x"], "pip_index_urls": ["idx/simple"]}, "pip_index_urls[0]"),
    ],
)
def test_bad_package_settings_name_the_field(extra: dict, field: str) -> None:
    req = {"name": "f", "function": "pkg.mod:train", **extra}
    if req["function"] is None:
        del req["function"]
    with pytest.raises(InvalidRequest) as err:
        build_trainjob(req, find_runtime(local_catalog(), "torch-distributed"))
    assert err.value.fields == [field]
    assert "u:p" not in str(err.value)
