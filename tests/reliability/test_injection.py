"""Case 6: values from pipeline parameters never become code, shell or invalid metadata.

- function kwargs travel as one JSON argv item: a kwarg written as Python/shell injection runs nothing in a
  real local-engine trainer (runtime python, no launcher) and arrives verbatim;
- commands stay argv lists (one shell string is refused), shell metacharacters in args stay literal;
- Airflow dag/task/run ids (``+``, ``:``, ``/``, unicode) become valid names and label values, checked by
  hypothesis locally and by the real server's dry-run on the testbed.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bounds import HANG
from trainflow.airflow.operators import airflow_labels, idempotency_key
from trainflow.core import InvalidRequest, build_trainjob, get_backend, local_catalog
from trainflow.core.kube import calls
from trainflow.core.naming import LABEL_VALUE_PATTERN, NAME_PATTERN
from trainflow.core.runtimes import find_runtime

PAYLOADS = [
    "\"); import os; os.system('touch {marker}')#",
    "'); import os; os.system('touch {marker}')#",
    "__import__('os').system('touch {marker}')",
    "$(touch {marker})",
    "`touch {marker}`",
    "; touch {marker} #",
    "\n__import__('os').system('touch {marker}')\n",
    "{{{{}}}}\\\"}}; import os; os.system('touch {marker}')",
]


def record_kwargs(out: str, **kwargs: Any) -> None:
    """The trainer: writes the kwargs it received, as JSON, to ``out``."""
    import json as _json

    with open(out, "w") as fh:
        _json.dump(kwargs, fh)


def test_function_kwargs_cannot_execute_code_in_a_real_trainer(tmp_path: Path) -> None:
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    kwargs = {f"k{i}": p.format(marker=marker) for i, p in enumerate(PAYLOADS)}
    kwargs["nested"] = {"list": [p.format(marker=marker) for p in PAYLOADS]}
    kwargs["out"] = str(tmp_path / "received.json")
    backend = get_backend("local", home=tmp_path / "home", namespace="rel")
    for runtime in ("torch-distributed", "jax-distributed"):
        (tmp_path / "received.json").unlink(missing_ok=True)
        ref = backend.submit(
            {
                "runtime": runtime,
                "name": f"inject-{runtime[:5]}",
                "function": record_kwargs,
                "function_kwargs": kwargs,
            }
        )
        result = backend.wait(ref, timeout=240)
        assert result.succeeded, result
        assert not marker.exists(), f"a kwarg executed code under {runtime}"
        received = json.loads((tmp_path / "received.json").read_text())
        assert received == {k: v for k, v in kwargs.items() if k != "out"}  # verbatim
        manifest = backend.render(
            {"runtime": runtime, "name": "x", "function": record_kwargs, "function_kwargs": kwargs}
        )
        command = manifest["spec"]["trainer"]["command"]
        assert json.loads(command[-1]) == kwargs  # the kwargs are one JSON argv item
        assert all(p.format(marker=marker) not in "\n".join(command[:-1]) for p in PAYLOADS)


def test_shell_metacharacters_in_args_stay_literal(tmp_path: Path) -> None:
    marker = tmp_path / "pwned-args"
    backend = get_backend("local", home=tmp_path / "home", namespace="rel")
    args = [f"; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", f"&& touch {marker}"]
    out = tmp_path / "argv.json"
    code = f"import json, sys; json.dump(sys.argv[1:], open({str(out)!r}, 'w'))"
    ref = backend.submit(
        {"runtime": "jax-distributed", "name": "argv", "command": ["python3", "-c", code], "args": args}
    )
    assert backend.wait(ref, timeout=HANG).succeeded
    assert not marker.exists()
    assert json.loads(out.read_text()) == args
    with pytest.raises(InvalidRequest) as info:
        backend.submit(
            {"runtime": "jax-distributed", "name": "sh", "command": f"python3 -c 1; touch {marker}"}
        )
    assert info.value.fields == ["command"]


RUN_IDS = [
    "manual__2024-06-01T00:00:00+00:00",
    "scheduled__2024-06-01T10:00:00.123456+00:00",
    "backfill__2024-06-01T00:00:00+00:00",
    "dataset_triggered__2024-06-01T00:00:00+00:00",
    "my run/with:colons+plus and spaces",
    "Ünïcødé-рун-実行",
    "-" * 300,
    "a" * 300,
    "x$(touch /tmp/pwned)",
]


def _manifest(dag: str, task: str, run_id: str, map_index: int | None, namespace: str | None = None) -> dict:
    runtime = find_runtime(local_catalog(), "torch-distributed")
    request = {
        "runtime": "torch-distributed",
        "command": ["torchrun", "t.py"],
        "idempotency_key": idempotency_key(dag, task, run_id, map_index),
        "labels": airflow_labels(dag, task, run_id, map_index),
    }
    return build_trainjob(request, runtime, namespace=namespace)


def _assert_valid_identity(manifest: dict) -> None:
    meta = manifest["metadata"]
    assert NAME_PATTERN.match(meta["name"]) and len(meta["name"]) <= 40
    for value in meta["labels"].values():
        assert len(value) <= 63 and LABEL_VALUE_PATTERN.match(value), value


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    dag=st.text(min_size=1, max_size=250),
    task=st.text(min_size=1, max_size=250),
    run_id=st.one_of(st.sampled_from(RUN_IDS), st.text(min_size=1, max_size=250)),
    map_index=st.one_of(st.none(), st.integers(-1, 10**6)),
)
def test_any_airflow_identity_becomes_valid_names_and_labels(dag, task, run_id, map_index) -> None:
    _assert_valid_identity(_manifest(dag, task, run_id, map_index))
    # distinct run ids never share a TrainJob name (the hash is of the full identity)
    other = _manifest(dag, task, run_id + "+1", map_index)
    assert other["metadata"]["name"] != _manifest(dag, task, run_id, map_index)["metadata"]["name"]


@pytest.mark.e2e
def test_airflow_identities_pass_the_servers_dry_run(kube_backend, namespace) -> None:
    refused = []
    for i, run_id in enumerate(RUN_IDS):
        manifest = _manifest(f"dag:{i}+x", "train/task", run_id, i - 1, namespace)
        _assert_valid_identity(manifest)
        try:
            kube_backend.api.run(calls.create_trainjob(namespace, manifest, dry_run=True))
        except Exception as exc:
            refused.append((run_id, getattr(exc, "body", exc)))
    assert refused == []
