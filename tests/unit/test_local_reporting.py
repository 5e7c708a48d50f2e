"""trainflow.core.report / output_dir: Trainer status server (real HTTPS on loopback), local job state,
structured stdout line; rank 0 only; never raises into training code."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import os
import ssl
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bounds import HANG
from trainflow.core import reporting
from trainflow.core.local import store

SERVER_ENV = (
    "KUBEFLOW_TRAINER_SERVER_URL",
    "KUBEFLOW_TRAINER_SERVER_TOKEN",
    "KUBEFLOW_TRAINER_SERVER_CA_CERT",
)
RANK_ENV = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JAX_PROCESS_ID", "DMLC_TASK_ID", "PET_NODE_RANK")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*SERVER_ENV, *RANK_ENV, "TRAINFLOW_LOCAL_JOB_DIR", "TRAINFLOW_OUTPUT_URI"):
        monkeypatch.delenv(name, raising=False)
    reporting._sent.clear()
    reporting._sent_progress.clear()
    reporting._first_progress.clear()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "ca.crt", tmp / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@pytest.fixture
def status_server(tmp_path: Path) -> Iterator[tuple[str, Path, list[dict[str, object]]]]:
    """A real HTTPS server on loopback that records what the Trainer's status endpoint would receive."""
    received: list[dict[str, object]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(
                {"path": self.path, "auth": self.headers.get("Authorization"), "body": json.loads(body)}
            )
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    cert, key = _self_signed(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"https://localhost:{server.server_address[1]}/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/j/status"
    yield url, cert, received
    server.shutdown()


def test_report_posts_trainer_status_with_token_and_ca(
    status_server: tuple[str, Path, list[dict[str, object]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, ca, received = status_server
    token = tmp_path / "token"
    token.write_text("tok-123\n")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", url)
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(token))
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", str(ca))
    reporting.report(metrics={"loss": 0.5, "acc": 0.9}, progress=40)
    reporting.report(metrics={"loss": 0.25}, progress=150)
    assert len(received) == 2
    assert received[0]["auth"] == "Bearer tok-123"
    assert str(received[0]["path"]).endswith("/trainjobs/j/status")
    last = received[1]["body"]["trainerStatus"]  # type: ignore[index]
    assert last["progressPercentage"] == 100  # clamped
    assert sorted(last["metrics"], key=lambda m: m["name"]) == [  # every metric so far, values as strings
        {"name": "acc", "value": "0.9"},
        {"name": "loss", "value": "0.25"},
    ]
    assert last["lastUpdatedTime"].endswith("Z")


def test_eta_is_extrapolated_from_progress_and_progress_outlives_a_metrics_only_report(
    status_server: tuple[str, Path, list[dict[str, object]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, ca, received = status_server
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", url)
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", str(ca))
    clock = [1000.0]
    monkeypatch.setattr(reporting.time, "monotonic", lambda: clock[0])
    reporting.report(progress=10)  # the first progress report: no rate yet
    clock[0] += 30
    reporting.report(progress=40)  # 30 points in 30 s: 60 points left, 60 s
    reporting.report(metrics={"loss": 0.5})  # metrics only: the status server replaces trainerStatus whole
    reporting.report(progress=50, eta_seconds=7.6)  # given: sent as the CRD's integer
    bodies = [r["body"]["trainerStatus"] for r in received]  # type: ignore[index]
    assert "estimatedRemainingSeconds" not in bodies[0]
    assert bodies[1]["estimatedRemainingSeconds"] == 60
    assert bodies[2]["progressPercentage"] == 40 and "estimatedRemainingSeconds" not in bodies[2]
    assert bodies[3]["estimatedRemainingSeconds"] == 8 and bodies[3]["metrics"] == [
        {"name": "loss", "value": "0.5"}
    ]


def test_report_never_raises_on_delivery_errors(
    status_server: tuple[str, Path, list[dict[str, object]]], monkeypatch: pytest.MonkeyPatch, caplog
) -> None:  # type: ignore[no-untyped-def]
    url, _, received = status_server
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", url)  # no CA given: the self-signed cert is refused
    reporting.report(metrics={"loss": 1.0})
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "https://127.0.0.1:1/status")  # nothing listens
    reporting.report(metrics={"loss": 1.0})
    assert received == []
    warnings = [r for r in caplog.records if r.name == "trainflow.report"]
    assert len(warnings) == 2 and "could not deliver" in warnings[0].getMessage()


def test_report_merges_into_local_job_state_from_rank0_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINFLOW_LOCAL_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    reporting.report(metrics={"loss": 9.0})
    assert not (tmp_path / "metrics.json").exists()
    monkeypatch.setenv("RANK", "0")
    reporting.report(metrics={"loss": 0.5, "phase": "warmup"}, progress=10)
    reporting.report(metrics={"loss": 0.25})
    state = json.loads((tmp_path / "metrics.json").read_text())
    assert state["metrics"] == {"loss": 0.25, "phase": "warmup"} and state["progressPercentage"] == 10
    trainer_status = store.trainer_status(state)
    assert trainer_status is not None
    assert {"name": "loss", "value": "0.25"} in trainer_status["metrics"]


def test_node_rank_decides_when_rank_is_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINFLOW_LOCAL_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("PET_NODE_RANK", "1")
    assert reporting.is_rank0() is False
    monkeypatch.setenv("RANK", "0")  # torchrun's global rank wins over the node rank
    assert reporting.is_rank0() is True


def test_concurrent_reports_from_processes_lose_nothing(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom trainflow.core import report\n"
        "for i in range(20):\n    report(metrics={f'm{sys.argv[1]}_{i}': i})\n"
    )
    env = {"TRAINFLOW_LOCAL_JOB_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(n)], env=env) for n in range(3)]
    assert [p.wait(timeout=HANG) for p in procs] == [0, 0, 0]
    metrics = json.loads((tmp_path / "metrics.json").read_text())["metrics"]
    assert len(metrics) == 60


def test_stdout_line_when_nothing_else_is_available(capsys: pytest.CaptureFixture[str]) -> None:
    reporting.report(metrics={"loss": 0.5, "tag": "x"}, progress=5)
    line = capsys.readouterr().out.strip()
    assert line.startswith("TRAINFLOW_REPORT ")
    assert reporting.parse_report_line(line) == {"metrics": {"loss": 0.5, "tag": "x"}, "progress": 5}
    assert reporting.parse_report_line("[rank0] TRAINFLOW_REPORT {bad json") is None


def test_output_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match="TRAINFLOW_OUTPUT_URI"):
        reporting.output_dir()
    target = tmp_path / "out dir" / "model"
    monkeypatch.setenv("TRAINFLOW_OUTPUT_URI", target.as_uri())
    assert reporting.output_dir() == target and target.is_dir()
    monkeypatch.setenv("TRAINFLOW_OUTPUT_URI", str(tmp_path / "abs"))
    assert reporting.output_dir() == tmp_path / "abs"
    monkeypatch.setenv("TRAINFLOW_OUTPUT_URI", "gs://bucket/model")
    with pytest.raises(RuntimeError, match="neither a local path nor s3://"):
        reporting.output_dir()
    # s3://: a private staging directory (0700 whatever the umask) that publish_output() uploads
    monkeypatch.setenv("TRAINFLOW_OUTPUT_URI", "s3://bucket/model")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    old = os.umask(0)
    try:
        staged = reporting.output_dir()
    finally:
        os.umask(old)
    assert staged.parent == tmp_path / "tmp" and stat.S_IMODE(staged.stat().st_mode) == 0o700
    assert reporting.output_staged()
    # another user's directory, or a symlink, in its place is refused
    staged.rmdir()
    staged.symlink_to(tmp_path)
    with pytest.raises(RuntimeError, match="not a directory of this user"):
        reporting.output_dir()
