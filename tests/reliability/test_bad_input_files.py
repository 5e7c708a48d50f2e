"""Case 4 (files): hostile request files get a clear error naming the file or field, exit 2, no traceback.

tests/integration/test_cli.py already covers unclosed YAML, a list, truncated JSON, binary bytes, a missing
file and bad flags; these are the cases it does not: YAML bombs, deep nesting, invalid UTF-8, huge numbers,
unicode names, wrong types, a directory, and YAML tags that would run code with an unsafe loader.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bounds import HANG

EXE = Path(sys.executable).parent / "trainflow"

_BOMB = "\n".join(
    [
        'a: &a ["x","x","x","x","x","x","x","x","x"]',
        *(f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]" for p, n in zip("abcdefg", "bcdefgh", strict=True)),
        "runtime: torch-distributed",
        "command: *h",
    ]
)

CASES: list[tuple[str, bytes, str]] = [
    ("yaml-bomb", _BOMB.encode(), "command"),
    (
        "deep-json",
        b'{"function": "m:f", "function_kwargs": {"a": ' + b"[" * 5000 + b"]" * 5000 + b"}}",
        "nested",
    ),
    ("invalid-utf8", b'runtime: torch-distributed\nname: "\xff\xfe"\n', "UTF-8"),
    ("huge-int", b"command: [x]\nnum_nodes: " + b"9" * 500 + b"\n", "num_nodes"),
    ("huge-float", b"command: [x]\nnum_nodes: 1e400\n", "num_nodes"),
    ("unicode-name", "command: [x]\nname: trainjöb-名前\n".encode(), "name"),
    ("unicode-label", "command: [x]\nlabels: {team: équipe}\n".encode(), "labels.team"),
    ("rtl-override-name", 'command: [x]\nname: "abc\u202edef"\n'.encode(), "name"),
    ("wrong-types", b"command: [x]\nenv: {A: [1, 2]}\n", "env.A"),
    ("command-as-string", b"command: 'python train.py; rm -rf /'\n", "command"),
    ("null-field", b"runtime: null\ncommand: [x]\n", "runtime"),
    ("huge-annotation", b"command: [x]\nannotations: {a: '" + b"x" * 300_000 + b"'}\n", "annotations"),
    ("too-many-args", b"command: [x]\nargs: [" + b",".join([b"a"] * 500) + b"]\n", "args"),
    ("python-tag", b'!!python/object/apply:os.system ["touch PWNED"]\n', "not valid YAML"),
    ("nul-in-image", b'command: [x]\nimage: "a\\0b"\n', "image"),
    ("nul-in-arg", b'command: ["python3", "-c", "a\\0b"]\n', "command[2]"),
    ("nul-in-env", b'command: [x]\nenv: {A: "a\\0b"}\n', "env.A"),
]


@pytest.mark.parametrize(("content", "expect"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_request_file_is_a_clear_error(tmp_path: Path, content: bytes, expect: str) -> None:
    path = tmp_path / "req.yaml"
    path.write_bytes(content)
    proc = subprocess.run(
        [str(EXE), "--backend", "local", "--home", str(tmp_path / "home"), "submit", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=HANG,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[:2000]
    assert expect in proc.stderr, proc.stderr[:2000]
    assert "Traceback" not in out and "internal error" not in out
    assert len(proc.stderr) < 20_000, "the error must stay readable"
    assert not (tmp_path / "PWNED").exists()
    jobs = tmp_path / "home" / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir()), "something was started"


def test_directory_as_request_file(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(EXE), "--backend", "local", "--home", str(tmp_path), "render", "-f", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert proc.returncode == 2 and "cannot read request file" in proc.stderr
