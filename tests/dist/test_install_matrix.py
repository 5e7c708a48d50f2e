"""The built wheel (not the repository) installs into fresh venvs and works: Airflow 2.11.2 (the floor),
3.0.6, 3.1.8, 3.2.2 and 3.3.2 (the newest) under their constraints, the kfp extra, and the core alone.

Airflow's constraints files live on GitHub, out of reach here; tests/dist/constraints/ holds stand-ins that
scripts/airflow_constraints.py resolves from PyPI the way Airflow makes its own (apache-airflow[all] at the
release date). Run by ``make test-dist`` after ``make dist``; uses the shared uv cache.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = Path(__file__).parent / "constraints"
REQUEST = REPO / "dags_examples" / "requests" / "torch-minimal.yaml"
AIRFLOW_MODULES = ("hooks", "operators", "sensors", "triggers", "decorators", "links")

pytestmark = pytest.mark.dist


@dataclass(frozen=True)
class Case:
    id: str
    extra: str | None
    pins: tuple[str, ...] = ()
    constraints: str | None = None

    @property
    def airflow(self) -> str | None:
        return next((p.split("==")[1] for p in self.pins if p.startswith("apache-airflow==")), None)


CASES = [
    Case("airflow-floor-2.11.2", "airflow", ("apache-airflow==2.11.2",), "airflow-2.11.2-py3.11.txt"),
    Case("airflow-3.0.6", "airflow", ("apache-airflow==3.0.6",), "airflow-3.0.6-py3.11.txt"),
    Case("airflow-3.1.8", "airflow", ("apache-airflow==3.1.8",), "airflow-3.1.8-py3.11.txt"),
    Case("airflow-3.2.2", "airflow", ("apache-airflow==3.2.2",), "airflow-3.2.2-py3.11.txt"),
    Case("airflow-newest-3.3.2", "airflow", ("apache-airflow==3.3.2",), "airflow-3.3.2-py3.11.txt"),
    Case("kfp", "kfp"),
    Case("core", None),
]


def _uv() -> str:
    for candidate in (os.environ.get("UV"), str(Path.home() / ".local" / "bin" / "uv")):
        if candidate and Path(candidate).exists():
            return candidate
    raise AssertionError("uv not found: run 'make setup'")


def _wheel() -> Path:
    wheels = sorted((REPO / "dist").glob("trainflow-*-py3-none-any.whl"))
    assert len(wheels) == 1, f"expected one built wheel in dist/, found {wheels}: run 'make dist'"
    return wheels[0]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(AIRFLOW_HOME=str(tmp_path / "airflow-home"), TRAINFLOW_HOME=str(tmp_path / "trainflow-home"))
    env.update(AIRFLOW__CORE__LOAD_EXAMPLES="False", UV_NO_CONFIG="1")
    return env


def _run(cmd: list[str], tmp_path: Path, timeout: float = 900) -> str:
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    return proc.stdout


# README connection field -> the get_backend argument the provider must turn it into
_CONN_FIELDS = {"in_cluster": "in_cluster", "kubeconfig_path": "kubeconfig", "kubeconfig": "config_dict",
                "context": "context", "namespace": "namespace"}  # fmt: skip

# One process (one Airflow import): Airflow's version, each provider module's import, and the README's
# connections as the installed provider reads them.
_AIRFLOW_PROBE = """
import importlib, json, sys
import airflow
out = {"airflow": airflow.__version__, "modules": {}, "connections": []}
for module in sys.argv[1].split(","):
    try:
        importlib.import_module(module)
        out["modules"][module] = "ok"
    except Exception as exc:
        out["modules"][module] = f"{type(exc).__name__}: {exc}"
if all(v == "ok" for v in out["modules"].values()):
    import asyncio, importlib.metadata as md
    from trainflow.airflow import compat_sdk
    from trainflow.airflow.hooks import TrainJobHook
    out["common_compat"] = md.version("apache-airflow-providers-common-compat")
    out["names"] = {}
    for name in compat_sdk.WHERE:  # through the installed common-compat, and through trainflow's own table
        for via in (True, False):
            try:
                compat_sdk.resolve(name, through_common_compat=via)
            except Exception as exc:
                out["names"][f"{name} (common-compat: {via})"] = f"{type(exc).__name__}: {exc}"
    for conn_id in sys.argv[2:]:
        hook = TrainJobHook(conn_id)
        name, kwargs = hook.backend_config()
        same = asyncio.run(hook.aconnection_extra()) == hook.connection_extra()  # the triggerer's read
        out["connections"].append([name, sorted(kwargs), hook.test_connection() if name == "local" else None, same])
print("PROBE " + json.dumps(out))
"""


def _check_airflow(case: Case, python: Path, tmp_path: Path) -> None:
    """The provider's modules import under this Airflow, and read each README connection as documented."""
    examples = re.findall(
        r"AIRFLOW_CONN_KUBEFLOW_TRAINER_DEFAULT='(\{.*\})'", (REPO / "README.md").read_text()
    )
    assert len(examples) == 4, examples
    conn_ids = [f"readme_{i}" for i in range(len(examples))]
    env = {
        **_env(tmp_path),
        **{f"AIRFLOW_CONN_{c.upper()}": e for c, e in zip(conn_ids, examples, strict=True)},
    }
    modules = ",".join(f"trainflow.airflow.{m}" for m in AIRFLOW_MODULES)
    cmd = [str(python), "-c", _AIRFLOW_PROBE, modules, *conn_ids]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = json.loads(next(line[6:] for line in proc.stdout.splitlines() if line.startswith("PROBE ")))
    assert probe["airflow"] == case.airflow
    broken = {m: why for m, why in probe["modules"].items() if why != "ok"}
    assert not broken, f"trainflow's provider does not import on Airflow {case.airflow}: {broken}"
    assert not probe["names"], f"moved names that do not resolve on Airflow {case.airflow}: {probe['names']}"
    pinned = next(ln.split("==")[1] for ln in (CONSTRAINTS / str(case.constraints)).read_text().splitlines()
                  if ln.startswith("apache-airflow-providers-common-compat=="))  # fmt: skip
    assert probe["common_compat"] == pinned, (probe["common_compat"], pinned)  # the constraints' own pin
    for example, (name, kwargs, tested, same) in zip(examples, probe["connections"], strict=True):
        assert same, f"the async read of {example} differs from the synchronous one"
        extra = json.loads(example)["extra"]
        assert name == extra["backend"], (example, name)
        assert sorted(_CONN_FIELDS[k] for k in extra if k != "backend") == kwargs, (example, kwargs)
        if name == "local":
            assert tested[0] is True, tested


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_built_wheel_installs_and_works(case: Case, tmp_path: Path) -> None:
    wheel, venv = _wheel(), tmp_path / "venv"
    python, bindir = venv / "bin" / "python", venv / "bin"
    started = time.monotonic()
    _run([_uv(), "venv", "-q", "-p", "3.11", str(venv)], tmp_path)
    spec = f"trainflow[{case.extra}] @ {wheel.as_uri()}" if case.extra else f"trainflow @ {wheel.as_uri()}"
    install = [_uv(), "pip", "install", "-q", "--python", str(python), spec, *case.pins]
    if case.constraints:
        # the release's whole constraints file, provider pins included, as MWAA, Composer and most images use it
        install += ["-c", str(CONSTRAINTS / case.constraints)]
    _run(install, tmp_path)
    installed = time.monotonic() - started

    # the installed copy, not the repository: the module lives in the venv and the metadata is the wheel's
    probe = (
        "import json, importlib.metadata as md, trainflow.core as c; "
        "print(json.dumps([c.__file__, md.version('trainflow'), (md.distribution('trainflow').read_text("
        "'direct_url.json') or '')]))"
    )
    module, version, direct_url = json.loads(_run([str(python), "-c", probe], tmp_path))
    assert Path(module).is_relative_to(venv), module
    assert wheel.name.startswith(f"trainflow-{version}-")
    assert "archive_info" in direct_url and "dir_info" not in direct_url, direct_url  # a wheel, not editable

    manifest = yaml.safe_load(_run([str(bindir / "trainflow"), "render", "-f", str(REQUEST)], tmp_path))
    assert manifest["kind"] == "TrainJob" and manifest["metadata"]["name"] == "torch-minimal"
    assert manifest["spec"]["runtimeRef"]["name"] == "torch-distributed"

    if case.extra == "kfp":
        compiled = tmp_path / "train_job.yaml"
        code = (
            "import sys; from kfp import compiler; from trainflow.kfp import train_job; "
            "compiler.Compiler().compile(train_job, sys.argv[1])"
        )
        _run([str(python), "-c", code, str(compiled)], tmp_path)
        text = compiled.read_text()
        assert "train-job" in text
        # the installed wheel names the KFP step image of its own version, and installs nothing at start
        assert f"image: ghcr.io/trainflow/trainflow-kfp:{version}" in text and "pip install" not in text

    if case.airflow:
        listing = _run([str(bindir / "airflow"), "providers", "list", "-o", "json"], tmp_path)
        # Airflow 3.0 logs INFO lines to stdout before the JSON document
        providers = json.loads(next(line for line in listing.splitlines() if line.startswith("[{")))
        ours = [p for p in providers if p["package_name"] == "trainflow"]
        assert ours, f"trainflow not in 'airflow providers list': {[p['package_name'] for p in providers]}"
        assert ours[0]["version"] == version
        _check_airflow(case, python, tmp_path)

    print(
        f"\n{case.id}: install {installed:.1f} s, total {time.monotonic() - started:.1f} s", file=sys.stderr
    )
