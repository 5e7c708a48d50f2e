"""Issue 11.6: packages_to_install / pip_index_urls, run for real: pip installs from a local index, once per node.

The function command is run as a node runs it (python3 on PATH from a fresh virtualenv, as in an
image), against a PEP 503 index on disk, so no network is needed.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bounds import HANG
from trainflow.core.function_trainer import function_command

PACKAGE, VERSION = "tfdemo_pkg", "0.1"


def _wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel: module tfdemo_pkg with a main(**kwargs) function."""
    files = {
        f"{PACKAGE}/__init__.py": "def main(**kwargs):\n    print('answer', 42, kwargs)\n",
        f"{PACKAGE}-{VERSION}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n",
        f"{PACKAGE}-{VERSION}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},{len(text)}"
        for name, text in files.items()
    ]
    files[f"{PACKAGE}-{VERSION}.dist-info/RECORD"] = (
        "\n".join([*record, f"{PACKAGE}-{VERSION}.dist-info/RECORD,,"]) + "\n"
    )
    path = folder / f"{PACKAGE}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """PATH and HOME of a fresh 'image': a virtualenv without pip (the step bootstraps it), a local index."""
    root = tmp_path_factory.mktemp("image")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=HANG
    )
    project = root / "simple" / PACKAGE.replace("_", "-")
    project.mkdir(parents=True)
    wheel = _wheel(project)
    (project / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    (root / "home").mkdir()
    (root / "tmp").mkdir()
    return {
        "PATH": f"{root / 'venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(root / "home"),
        "TMPDIR": str(root / "tmp"),
        "index": (root / "simple").as_uri(),
        "venv": str(root / "venv"),
    }


def _run(node: dict[str, str], argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in node.items() if k in ("PATH", "HOME", "TMPDIR")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=HANG, env=env, cwd=node["HOME"])


def test_packages_are_installed_once_per_node_then_the_function_runs(node: dict[str, str]) -> None:
    requirement = f"{PACKAGE.replace('_', '-')}=={VERSION}"
    argv = function_command(f"{PACKAGE}:main", {"lr": 0.1}, None, [requirement], [node["index"]])
    with ThreadPoolExecutor(3) as pool:  # three ranks of one node start together
        runs = list(pool.map(lambda _: _run(node, argv), range(3)))
    for run in runs:
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip().endswith("answer 42 {'lr': 0.1}")
    assert sum("trainflow: installed" in run.stdout for run in runs) == 1
    again = _run(node, argv)
    assert again.returncode == 0 and "trainflow: installed" not in again.stdout


def test_a_package_pip_cannot_find_fails_the_node_with_pips_message(node: dict[str, str]) -> None:
    argv = function_command("json:dumps", {}, None, ["no-such-package-tf==9"], [node["index"]])
    run = _run(node, argv)
    assert run.returncode == 1
    assert "no-such-package-tf" in run.stderr and "trainflow: pip could not install" in run.stderr
