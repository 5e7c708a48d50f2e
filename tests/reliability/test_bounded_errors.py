"""Issue 12, point 6: every value an error echoes is bounded (about 4 KB), a YAML alias bomb exits 2 at once
with a short message and bounded memory, and schema errors name the request field the user wrote."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG
from trainflow.core import InvalidRequest, TrainflowError
from trainflow.core.local.engine import LocalBackend

EXE = Path(sys.executable).parent / "trainflow"
MAX_ERROR = 4096
HUGE = "Z!" * 150_000  # 300 KB of text that no field accepts as it is


def alias_bomb(levels: int, key: str = "function_kwargs") -> str:
    """A ~300-byte YAML document whose ``key`` expands to 9**levels strings."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    names = "abcdefghij"
    lines += [f"{n}: &{n} [{','.join(['*' + p] * 9)}]" for p, n in itertools.pairwise(names[:levels])]
    body = "\n".join("  " + line for line in lines)
    head = "function: mymod:train\n" if key == "function_kwargs" else "command: [python3]\n"
    return f"{head}{key}:\n{body}\n"


# Linux carries a process's RSS high-water mark across fork and exec, so a CLI started straight from a large
# pytest process would report pytest's size. A small fresh interpreter starts it and reports its peak instead.
MEASURE = (
    "import os, subprocess, sys\n"
    "proc = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL)\n"
    "_, status, usage = os.wait4(proc.pid, 0)\n"
    "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def run_measured(args: list[str], cwd: Path) -> tuple[int, str, float, int]:
    """Exit code, stderr, seconds and peak RSS (KiB) of one CLI run."""
    started = time.monotonic()
    err_path, rss_path = cwd / "stderr.txt", cwd / "maxrss.txt"
    with open(err_path, "wb") as err:
        code = subprocess.run(
            [sys.executable, "-c", MEASURE, str(rss_path), *args], stderr=err, cwd=cwd, check=False
        ).returncode
    rss = int(rss_path.read_text())
    return code, err_path.read_text(errors="replace"), time.monotonic() - started, rss


@pytest.mark.parametrize(
    ("levels", "key"), [(7, "function_kwargs"), (8, "function_kwargs"), (7, "args"), (7, "env")]
)
def test_yaml_alias_bomb_exits_2_quickly_with_a_short_message(tmp_path: Path, levels: int, key: str) -> None:
    text = alias_bomb(levels, key)
    assert len(text) < 400
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    home = tmp_path / "home"
    code, err, seconds, rss_kib = run_measured(
        [str(EXE), "--backend", "local", "--home", str(home), "submit", "-f", str(path)], tmp_path
    )
    print(
        f"alias bomb levels={levels} key={key}: exit {code}, {seconds:.2f}s, {rss_kib // 1024} MiB, "
        f"{len(err)} bytes of stderr"
    )
    assert code == 2, err[:2000]
    assert len(err) <= MAX_ERROR, f"{len(err)} bytes of stderr"
    assert key in err and "alias" in err.lower(), err
    assert seconds < 15
    assert rss_kib < 300 * 1024, f"peak RSS {rss_kib // 1024} MiB"
    assert not (home / "jobs").exists() or not any((home / "jobs").rglob("trainjob.json"))


def test_alias_bomb_through_the_python_api_is_refused_before_it_expands(tmp_path: Path) -> None:
    level: Any = ["lol"] * 9
    for _ in range(8):  # 9**9 strings once expanded; a few hundred objects in memory
        level = [level] * 9
    backend = LocalBackend(tmp_path / "home")
    started = time.monotonic()
    with pytest.raises(InvalidRequest) as info:
        backend.render({"function": "mymod:train", "function_kwargs": {"a": level}})
    assert time.monotonic() - started < 5
    assert info.value.fields == ["function_kwargs"]
    assert len(str(info.value)) <= MAX_ERROR


def _huge_cases() -> list[tuple[str, dict[str, Any]]]:
    cmd = {"command": ["python3", "-c", "pass"]}
    return [
        ("name", {**cmd, "name": HUGE}),
        ("runtime", {**cmd, "runtime": HUGE}),
        ("namespace", {**cmd, "namespace": HUGE}),
        ("image", {**cmd, "image": HUGE + "\0"}),
        ("command", {"command": [HUGE + "\0"]}),
        ("args", {**cmd, "args": [HUGE + "\0"]}),
        ("function", {"function": HUGE}),
        ("env-name", {**cmd, "env": {HUGE: "v"}}),
        ("env-value", {**cmd, "env": {"A": HUGE + "\0"}}),
        ("labels", {**cmd, "labels": {HUGE: HUGE}}),
        ("annotations", {**cmd, "annotations": {HUGE: "v"}}),
        ("node_selector", {**cmd, "node_selector": {"k": HUGE}}),
        ("tolerations", {**cmd, "tolerations": [{"operator": HUGE, "effect": HUGE, HUGE: 1}]}),
        ("toleration-value", {**cmd, "tolerations": [{"key": "k", "value": [HUGE]}]}),
        ("volumes", {**cmd, "volumes": [{"claim_name": HUGE, "mount_path": HUGE, "name": HUGE}]}),
        ("resources", {**cmd, "resources": {"cpu": HUGE, "memory": HUGE, "limits": {HUGE: HUGE}}}),
        ("image_pull_secrets", {**cmd, "image_pull_secrets": [HUGE, HUGE]}),
        ("queue", {**cmd, "queue": HUGE}),
        ("service_account", {**cmd, "service_account": HUGE}),
        ("output_uri", {**cmd, "output_uri": HUGE}),
        ("dataset_uri", {**cmd, "dataset_uri": HUGE}),
        ("secret_env", {**cmd, "secret_env": {"A": HUGE}}),
        ("runtime_patches", {**cmd, "runtime_patches": [{"manager": HUGE, HUGE: HUGE}]}),
        ("packages", {"function": "m:f", "packages_to_install": [HUGE]}),
        ("pip_index_urls", {"function": "m:f", "pip_index_urls": [HUGE]}),
        ("kwargs", {"function": "m:f", "function_kwargs": {HUGE: [HUGE] * 4}}),
        ("unknown-field", {**cmd, HUGE: 1}),
        ("many-issues", {**cmd, "env": {f"BAD NAME {i} {HUGE[:2000]}": "v" for i in range(300)}}),
    ]


@pytest.mark.parametrize("request_data", [c[1] for c in _huge_cases()], ids=[c[0] for c in _huge_cases()])
def test_every_error_is_bounded(tmp_path: Path, request_data: dict[str, Any]) -> None:
    backend = LocalBackend(tmp_path / "home")
    with pytest.raises(TrainflowError) as info:
        backend.submit(request_data)
    text = str(info.value)
    assert len(text) <= MAX_ERROR, f"{len(text)} characters"
    if isinstance(info.value, InvalidRequest):
        assert all(len(str(issue)) <= MAX_ERROR for issue in info.value.issues)
    assert not (tmp_path / "home" / "jobs").exists() or not any(
        (tmp_path / "home" / "jobs").rglob("trainjob.json")
    )


def test_cli_errors_are_bounded_for_option_values(tmp_path: Path) -> None:
    big = HUGE[:100_000]  # one argv item holds at most 128 KiB
    for args in (["--num-nodes", "9" * 100_000], ["--set", f"num_nodes={big}"], ["--proc-per-node", big]):
        proc = subprocess.run(
            [str(EXE), "--home", str(tmp_path), "render", *args, "--", "python3"],
            capture_output=True,
            text=True,
            timeout=HANG,
        )
        assert proc.returncode == 2, proc.stderr[:500]
        assert len(proc.stderr) <= MAX_ERROR, f"{args[0]}: {len(proc.stderr)} bytes"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"tolerations": [{"key": "gpu", "operator": "Equal", "value": 5}]}, "tolerations[0].value"),
        (
            {"tolerations": [{"key": "a"}, {"key": "b", "tolerationSeconds": "soon"}]},
            "tolerations[1].tolerationSeconds",
        ),
        (
            {
                "volumes": [{"claim_name": "data", "mount_path": "/d", "sub_path": ""}],
                "labels": {"a": "b"},
                "tolerations": [{"key": 7}],
            },
            "tolerations[0].key",
        ),
        ({"resources": {"claims": [{"name": 5}]}}, "resources.claims[0].name"),
        (
            {"runtime_patches": [{"manager": "example.com/m", "trainingRuntimeSpec": {"bogus": 1}}]},
            "runtime_patches[0].trainingRuntimeSpec",
        ),
    ],
)
def test_schema_errors_name_the_request_field(tmp_path: Path, extra: dict[str, Any], field: str) -> None:
    backend = LocalBackend(tmp_path / "home")
    with pytest.raises(InvalidRequest) as info:
        backend.render({"command": ["python3", "-c", "pass"], **extra})
    assert any(f.startswith(field) for f in info.value.fields), info.value.fields
    assert not any(f.startswith(("spec.", "runtime_patches[-")) for f in info.value.fields), info.value.fields
