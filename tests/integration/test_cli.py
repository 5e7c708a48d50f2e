"""The ``trainflow`` command as users run it: a separate process, documented exit codes, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bounds import HANG
from trainflow.core.schema import schema_errors

REPO = Path(__file__).resolve().parents[2]
REQUESTS = sorted((REPO / "dags_examples" / "requests").glob("*.yaml"))
EXE = Path(sys.executable).parent / "trainflow"


def run(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EXE), "--backend", "local", "--home", str(home), *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=HANG,
    )


@pytest.mark.parametrize("path", REQUESTS, ids=lambda p: p.stem)
def test_render_of_every_example_request_is_schema_valid(tmp_path: Path, path: Path) -> None:
    proc = run(tmp_path, "render", "-f", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads(proc.stdout)
    assert list(schema_errors(manifest)) == []
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").rglob("*.json"))


def test_render_flags_override_the_file(tmp_path: Path) -> None:
    path = REQUESTS[0].parent / "torch-function.yaml"
    proc = run(
        tmp_path, "render", "-f", str(path), "--num-nodes", "3", "--env", "A=1", "--set", "suspend=true"
    )
    assert proc.returncode == 0, proc.stderr
    manifest = yaml.safe_load(proc.stdout)
    assert manifest["spec"]["trainer"]["numNodes"] == 3
    assert {"name": "A", "value": "1"} in manifest["spec"]["trainer"]["env"]
    assert manifest["spec"]["suspend"] is True


BAD_INPUTS = [
    (["--num-nodes", "0", "--", "torchrun", "t.py"], "num_nodes"),
    (["--num-nodes", "-2", "--", "torchrun", "t.py"], "num_nodes"),
    (["--env", "PET_NNODES=4", "--", "torchrun", "t.py"], "env.PET_NNODES"),
    (["--env", "HF_TOKEN=hf_secret_value", "--", "torchrun", "t.py"], "env.HF_TOKEN"),
    (["--env", "AWS_SECRET_ACCESS_KEY=abc", "--", "torchrun", "t.py"], "env.AWS_SECRET_ACCESS_KEY"),
    (["--runtime", "torchtune-llama3.2-1b", "--dataset-uri", "ftp:/x", "--name", "t"], "dataset_uri"),
    (["--name", "n" * 70, "--", "torchrun", "t.py"], "name"),
    (["--runtime", "no-such-runtime", "--", "torchrun", "t.py"], "runtime"),
    (["--set", "num_nodes=[1, 2]", "--", "torchrun", "t.py"], "num_nodes"),
    (["--set", "bogus_field=1", "--", "torchrun", "t.py"], "bogus_field"),
    (["--proc-per-node", "lots", "--", "torchrun", "t.py"], "--proc-per-node"),
    (["--kwargs", "{not json", "--function", "m:f"], "--kwargs"),
    (["--env", "NOEQUALS", "--", "torchrun", "t.py"], "--env"),
]


@pytest.mark.parametrize(("args", "field"), BAD_INPUTS, ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("verb", ["submit"])
def test_bad_input_exits_2_naming_the_field_and_starts_nothing(
    tmp_path: Path, verb: str, args: list[str], field: str
) -> None:
    proc = run(tmp_path, verb, *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert field in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "hf_secret_value" not in proc.stderr + proc.stdout
    jobs = tmp_path / "jobs"
    assert not jobs.exists() or not any(p.is_dir() for p in jobs.rglob("*")), "something was started"


@pytest.mark.parametrize(
    "content",
    ["a: [", "- just\n- a list\n", '{"num_nodes": "x"', "\x00\x01binary", "runtime: [unclosed"],
)
def test_malformed_request_files_exit_2_without_traceback(tmp_path: Path, content: str) -> None:
    path = tmp_path / "req.yaml"
    path.write_text(content)
    proc = run(tmp_path, "submit", "-f", str(path))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "req.yaml" in proc.stderr or "request" in proc.stderr


def test_missing_request_file_exits_2(tmp_path: Path) -> None:
    proc = run(tmp_path, "render", "-f", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "cannot read request file" in proc.stderr


def test_request_from_stdin(tmp_path: Path) -> None:
    proc = run(tmp_path, "render", "-f", "-", "--json", stdin='{"name": "from-stdin", "command": ["true"]}')
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["metadata"]["name"] == "from-stdin"


def test_unknown_job_status_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    proc = run(tmp_path, "status", "does-not-exist")
    assert proc.returncode == 1 and "not found" in proc.stderr and "Traceback" not in proc.stderr


def test_runtimes_lists_the_shipped_catalog(tmp_path: Path) -> None:
    proc = run(tmp_path, "runtimes", "--json")
    assert proc.returncode == 0, proc.stderr
    names = {r["name"] for r in json.loads(proc.stdout)}
    assert {"torch-distributed", "deepspeed-distributed", "torchtune-llama3.2-1b"} <= names


def test_failed_job_exits_1_with_reason(tmp_path: Path) -> None:
    proc = run(
        tmp_path,
        "submit",
        "--name",
        "fails",
        "--wait",
        "--timeout",
        str(HANG),
        "--",
        "python3",
        "-c",
        "import sys; print('boom'); sys.exit(3)",
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "exit" in proc.stderr.lower() and "3" in proc.stderr
    assert "Traceback" not in proc.stderr
