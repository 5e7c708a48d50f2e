"""Issue 12, point 9: credentials given as plain values are refused (URL userinfo in env values, known token
shapes in env, command, args and function kwargs, secret-looking names), never echoed, with the explicit
``allow_plain_credentials`` opt-out; duplicate keys in request files, non-finite timeouts and a negative
``--tail`` are refused."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG
from trainflow.core import InvalidRequest
from trainflow.core.local.engine import LocalBackend

EXE = Path(sys.executable).parent / "trainflow"
CMD = ["python3", "-c", "pass"]
# Shapes of real credentials (made-up values): AWS, Hugging Face, GitHub, GitLab, Slack, OpenAI-style, Google,
# a PEM private key and a JWT.
TOKENS = {
    "aws": "AKIAQ3EGRTZ7EXAMPLE1",
    "hf": "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
    "github": "ghp_0123456789abcdefghijABCDEFGHIJ012345",
    "gitlab": "glpat-abcdefghij0123456789",
    "slack": "xoxb-123456789012-abcdefghijkl",
    "openai": "sk-proj-abcdefghijklmnopqrstuvwxyz012345",
    "google": "AIzaSyA0123456789abcdefghijklmnopqrstuv",
    "pem": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\n-----END OPENSSH PRIVATE KEY-----",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1c2VyLTEyMyJ9.c2lnbmF0dXJlLXZhbHVlLTEyMw",
}


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(tmp_path / "home")


def refused(backend: LocalBackend, request: dict[str, Any], secret: str) -> list[str]:
    with pytest.raises(InvalidRequest) as info:
        backend.render(request)
    text = str(info.value)
    assert secret not in text, "the credential was echoed"
    for line in secret.splitlines():
        assert len(line) < 12 or line not in text
    return info.value.fields


@pytest.mark.parametrize(
    "value",
    [
        "postgres://admin:s3cr3t-pw@db.internal:5432/train",
        "https://user:hunter2hunter2@minio.local/bucket",
        "redis://:onlypassword@cache:6379/0",
        "mongodb+srv://svc:Pa55word@cluster0.example.net/?retryWrites=true",
        "--dsn=mysql://root:rootpw@localhost/db",
    ],
)
def test_url_userinfo_in_an_env_value_is_refused(backend: LocalBackend, value: str) -> None:
    fields = refused(backend, {"command": CMD, "env": {"DATABASE_URL": value}}, value.split("@")[0])
    assert fields == ["env.DATABASE_URL"]


@pytest.mark.parametrize("kind", sorted(TOKENS))
def test_known_token_shapes_are_refused_wherever_they_are(backend: LocalBackend, kind: str) -> None:
    token = TOKENS[kind]
    assert refused(backend, {"command": CMD, "env": {"SETTINGS": token}}, token) == ["env.SETTINGS"]
    assert refused(backend, {"command": CMD, "args": ["--auth", token]}, token) == ["args[1]"]
    assert refused(backend, {"command": ["python3", "-c", "pass", f"--t={token}"]}, token) == ["command[3]"]
    kwargs = {"opts": {"hub": [1, {"auth": token}]}}
    fields = refused(backend, {"function": "mymod:train", "function_kwargs": kwargs}, token)
    assert fields == ["function_kwargs.opts.hub[1].auth"]


@pytest.mark.parametrize(
    "name",
    ["DB_PASS", "SMTP_PASSWORD", "GITHUB_TOKEN", "CLIENT_SECRET", "SIGNING_KEY", "db_pass", "PASSWORD"],
)
def test_secret_looking_names_are_refused(backend: LocalBackend, name: str) -> None:
    assert refused(backend, {"command": CMD, "env": {name: "plain-value-xyz"}}, "plain-value-xyz") == [
        f"env.{name}"
    ]


def test_the_explicit_opt_out_allows_all_of_them(backend: LocalBackend) -> None:
    env = {"DATABASE_URL": "postgres://a:b@h/d", "DB_PASS": "x", "SIGNING_KEY": "y", "T": TOKENS["aws"]}
    manifest = backend.render(
        {"command": CMD, "args": [TOKENS["hf"]], "env": env, "allow_plain_credentials": True}
    )
    assert manifest["spec"]["trainer"]["args"] == [TOKENS["hf"]]
    manifest = backend.render(
        {"function": "m:f", "function_kwargs": {"k": TOKENS["github"]}, "allow_plain_credentials": True}
    )
    assert TOKENS["github"] in str(manifest)


def test_ordinary_values_are_not_mistaken_for_credentials(backend: LocalBackend) -> None:
    env = {
        "DATA_URL": "https://huggingface.co/datasets/squad",
        "GIT_REMOTE": "git@github.com:org/repo.git",
        "NOTIFY": "ops@example.com",
        "MODEL": "meta-llama/Llama-3.2-1B",
        "RUN_ID": "a" * 40,
        "KEYBOARD": "us",
        "PASSES": "3",
        "TOKENIZER": "bert-base-uncased",
    }
    args = ["--lr", "3e-4", "--skip-layers", "sk-1", "--hf-repo", "hf_user/model", "--uri", "s3://bucket/x"]
    backend.render({"command": CMD, "args": args, "env": env})
    backend.render({"function": "m:f", "function_kwargs": {"token_limit": 4096, "mask_token": "[MASK]"}})


@pytest.mark.timeout(30)
@pytest.mark.parametrize("unit", ["x", "a://"])
def test_scanning_a_large_value_stays_linear(backend: LocalBackend, unit: str) -> None:
    """A 512 KiB value is scanned in linear time: an unbounded scheme repeat took
    minutes (quadratic backtracking) on a 200 KiB value."""
    value = unit * (512 * 1024 // len(unit))
    backend.render({"command": CMD, "env": {"DATA": value}, "args": [value[:4096]]})


# --- request files and CLI values ------------------------------------------------------------------


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EXE), "--backend", "local", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=HANG,
    )


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("dup.yaml", "command: [python3]\nnum_nodes: 1\nnum_nodes: 4\n"),
        ("dup-nested.yaml", "command: [python3]\nenv:\n  A: '1'\n  A: '2'\n"),
        ("dup.json", '{"command": ["python3"], "env": {"A": "1", "A": "2"}}'),
    ],
)
def test_duplicate_keys_in_request_files_are_an_error(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    proc = cli(tmp_path / "home", "render", "-f", str(path))
    assert proc.returncode == 2, proc.stderr
    assert "duplicate key" in proc.stderr and name in proc.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0"])
def test_non_finite_or_non_positive_timeouts_are_refused(tmp_path: Path, value: str) -> None:
    commands = [["wait", "some-job", "--timeout", value]]
    if value == "nan":  # the same option type on submit --wait: one value is enough (each run is a CLI start)
        commands.append(["submit", "--wait", "--timeout", value, "--", "true"])
    for args in commands:
        proc = cli(tmp_path / "home", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "--timeout" in proc.stderr
    assert not (tmp_path / "home" / "jobs").exists()


def test_negative_tail_is_refused(tmp_path: Path) -> None:
    proc = cli(tmp_path / "home", "logs", "some-job", "--tail", "-1")
    assert proc.returncode == 2 and "--tail" in proc.stderr


@pytest.mark.parametrize("value", [math.nan, math.inf, -5.0])
def test_the_python_api_refuses_a_non_finite_timeout(backend: LocalBackend, value: float) -> None:
    ref = backend.submit({"name": "sleeper", "command": ["sleep", "30"]})
    try:
        with pytest.raises(InvalidRequest) as info:
            backend.wait(ref, timeout=value)
        assert info.value.fields == ["timeout"]
    finally:
        backend.cancel(ref)
