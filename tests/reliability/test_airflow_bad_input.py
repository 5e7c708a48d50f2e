"""Issue 12, point 8: a malformed ``kubeflow_trainer`` connection (bad JSON, a list, wrong types, an unknown
backend, ``in_cluster: maybe``) is an error naming the connection and the field, never a fall back to another
backend; operator argument errors that need no cluster surface when the DAG file is parsed; bad input fails a
real Airflow task at once (AirflowFailException), whatever its retries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from airflow_local import dag_args, run

CONN = "tf_rel_malformed"
CASES = {
    "bad-json": ('{"backend": "local",}', "extra: is not valid JSON at line 1 column 21"),
    "list": ('["local"]', "extra: is a JSON list, not an object"),
    "in-cluster-maybe": ('{"in_cluster": "maybe"}', "extra.in_cluster: 'maybe' is not true or false"),
    "unknown-backend": ('{"backend": "kubernets"}', "extra.backend: unknown backend 'kubernets'"),
    "namespace-list": (
        '{"backend": "local", "namespace": ["a"]}',
        "extra.namespace: is a list, not a string",
    ),
}
PROBE = """
import json, os, sys
from trainflow.airflow.hooks import TrainJobHook
out = {}
for case, extra in json.loads(sys.argv[1]).items():
    os.environ["AIRFLOW_CONN_TF_REL_MALFORMED"] = json.dumps({"conn_type": "kubeflow_trainer", "extra": extra})
    try:
        out[case] = ["ok", TrainJobHook("tf_rel_malformed").backend_config()]
    except Exception as exc:
        out[case] = [type(exc).__name__, str(exc)]
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(sys.argv[2])
out["import_errors"] = {os.path.basename(k): v for k, v in bag.import_errors.items()}
out["dags"] = sorted(bag.dag_ids)
print("RESULT " + json.dumps(out))
"""
DAG_HEAD = """
from datetime import datetime
from airflow.sdk import DAG
from trainflow.airflow import TrainJobOperator
with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1)):
"""
# operator arguments and the fields their errors must name, all found when the DAG file is parsed
BAD_ARGS = {
    "num_nodes=0": "num_nodes: '0' is not a whole number of 1 or more",
    "command='python train.py'": "command: is a string, not a list",
    "env=['A=1']": "env: is a list, not a mapping",
    "proc_per_node='many'": "proc_per_node: 'many' is not a whole number of 1 or more, nor 'auto'",
    "function='train'": "function: 'train' is not 'module:function'",
    "request={'num_node': 2}": "request.num_node: is not a TrainJob request field",
}
GOOD_ARGS = (
    "num_nodes='{{ params.n }}', command=['python3', 'train.py'], env={'A': '{{ ds }}'}, proc_per_node='auto'"
)


def write_dags(folder: Path) -> None:
    folder.mkdir()
    for i, args in enumerate(BAD_ARGS):
        body = DAG_HEAD.format(dag_id=f"bad_{i}") + f"    TrainJobOperator(task_id='t', {args})\n"
        (folder / f"bad_{i}.py").write_text(body)
    good = DAG_HEAD.format(dag_id="good") + f"    TrainJobOperator(task_id='t', {GOOD_ARGS})\n"
    (folder / "good.py").write_text(good)


def test_a_malformed_connection_names_the_connection_and_field(tmp_path: Path) -> None:
    e = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "KUBECONFIG": str(tmp_path / "kubeconfig")}
    e["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    (tmp_path / "kubeconfig").write_text(
        "apiVersion: v1\nkind: Config\nclusters: []\n"
    )  # what a fallback finds
    extras = {case: raw for case, (raw, _) in CASES.items()}
    write_dags(tmp_path / "dags")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(extras), str(tmp_path / "dags")],
        capture_output=True,
        text=True,
        timeout=300,
        env=e,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    for case, (_, expected) in CASES.items():
        kind, text = out[case]
        assert kind == "InvalidRequest", (case, out[case])  # an error, never a backend
        assert f"kubeflow_trainer connection '{CONN}'" in text and expected in text, (case, text)
    # operator argument errors surface when the DAG file is parsed (DagBag: what the dag-processor runs)
    assert out["dags"] == ["good"], out["dags"]  # templated values are left for execute
    errors = out["import_errors"]
    for i, expected in enumerate(BAD_ARGS.values()):
        text = errors[f"bad_{i}.py"]
        assert "invalid TrainJobOperator 't'" in text and expected in text, (expected, text[-2000:])


@pytest.mark.slow
def test_bad_input_fails_the_task_without_retries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = json.dumps({"conn_type": "kubeflow_trainer", "extra": '{"backend": "local",'})
    monkeypatch.setenv("AIRFLOW_CONN_TF_REL_MALFORMED", bad)
    home = tmp_path / "trainflow"
    home.mkdir()
    out = run(home, dag_args("tf_rel_bad_input", "2026-03-03T01:00:00"), tmp_path / "task.log")
    for task_id, named in (
        ("bad_connection", "'tf_rel_malformed': extra"),
        ("bad_request", "no-such-runtime"),
    ):
        task = out["tasks"][f"{task_id}[-1]"]
        assert task == {"state": "failed", "try": 1}, (task_id, task, out["log"][-4000:])
        assert named in out["log"], out["log"][-4000:]
    assert "AirflowFailException" in out["log"], out["log"][-4000:]
    assert not any((home / "jobs").glob("*/*")), "a job was created"
