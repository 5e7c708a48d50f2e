"""DAG-parse cost of many TrainJobOperators: a DagBag of one DAG file with N operators, time and memory.

What the DAG processor pays for each file that uses the provider: ``airflow.sdk`` is loaded before the parse
(as in the processor), then ``DagBag`` parses a folder holding one DAG with N TrainJobOperators (plain and
templated arguments, a request dict) or, as the reference, the same DAG with N ``BaseOperator`` tasks. Each
parse runs in a fresh interpreter; the figures are medians: wall time of the parse and the peak RSS it added.

    python benchmarks/dag_parse_many.py [--operators 100] [--runs 7] [--before DIR]

``--before DIR``: also parse the trainflow DAG with the provider of another checkout (``git archive`` of an
earlier commit, say), interleaved with the others so machine load hits all alike: a before/after figure.

Runs on any Airflow line the provider supports (the DagBag class moved in 3.1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HEAD = """
from datetime import datetime
from airflow.providers.common.compat.sdk import DAG, BaseOperator
"""
TRAINFLOW_TASK = """
    TrainJobOperator(
        task_id="train_{i}",
        runtime="torch-distributed",
        function="example_training:train_regression",
        function_kwargs={{"epochs": 60, "lr": 0.1, "seed": "{{{{ ds_nodash }}}}"}},
        num_nodes={nodes},
        proc_per_node="auto",
        resources_per_node={{"cpu": "2", "memory": "4Gi"}},
        env={{"RUN": "{{{{ run_id }}}}", "SHARD": "{i}"}},
        dataset_uri="s3://bucket/data/{{{{ ds }}}}/{i}",
        output_uri="s3://bucket/models/{i}",
        deadline_seconds="3600",
        request={{"labels": {{"team": "ml"}}, "packages_to_install": ["numpy"]}},
    )
"""
BASE_TASK = """
    BaseOperator(task_id="train_{i}")
"""
PROBE = """
import json, resource, sys, time
import airflow.sdk  # the DAG processor has this loaded before it parses any file
try:
    from airflow.dag_processing.dagbag import DagBag
except ImportError:  # Airflow < 3.1
    from airflow.models.dagbag import DagBag
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
bag = DagBag(sys.argv[1])  # LOAD_EXAMPLES=False in the environment
elapsed = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert not bag.import_errors, bag.import_errors
tasks = sum(len(d.tasks) for d in bag.dags.values())
print(json.dumps({"seconds": elapsed, "rss_kib": after - before, "tasks": tasks,
                  "core": sorted(m for m in sys.modules if m.startswith("trainflow.core"))}))
"""


def dag_file(kind: str, n: int) -> str:
    if kind == "trainflow":
        body = "".join(TRAINFLOW_TASK.format(i=i, nodes=1 + i % 4) for i in range(n))
        head = HEAD + "from trainflow.airflow import TrainJobOperator\n"
    else:
        body = "".join(BASE_TASK.format(i=i) for i in range(n))
        head = HEAD
    return head + f'\nwith DAG("parse_{kind}", schedule=None, start_date=datetime(2026, 1, 1)):\n' + body


def parse_once(folder: Path, env: dict[str, str]) -> dict[str, object]:
    """One DagBag parse of ``folder`` in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(folder)], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"parse failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operators", type=int, default=100)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--before", type=Path, help="another checkout whose provider to compare")
    args = parser.parse_args()
    results: dict[str, list[dict[str, object]]] = {"trainflow": [], "base": []}
    if args.before:
        results["before"] = []
    with tempfile.TemporaryDirectory(prefix="trainflow-parse-many-") as tmp:
        root = Path(tmp)
        env = {**os.environ, "AIRFLOW_HOME": str(root / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
        envs = {kind: env for kind in results}
        if args.before:
            tree = args.before.resolve()
            envs["before"] = {**env, "PYTHONPATH": f"{tree / 'src'}:{tree / 'providers' / 'airflow'}"}
        for kind in results:
            (root / kind).mkdir()
            (root / kind / f"{kind}.py").write_text(
                dag_file("base" if kind == "base" else "trainflow", args.operators)
            )
            parse_once(root / kind, envs[kind])  # warm the OS cache and the .pyc files
        for _ in range(args.runs):  # interleaved, so machine load hits all alike
            for kind, runs in results.items():
                runs.append(parse_once(root / kind, envs[kind]))
    import airflow

    print(f"Airflow {airflow.__version__}: DagBag of one DAG with {args.operators} tasks, fresh interpreters, "
          f"median of {args.runs}")  # fmt: skip
    medians = {}
    for kind, runs in results.items():
        seconds = statistics.median(float(r["seconds"]) for r in runs)  # type: ignore[arg-type]
        rss = statistics.median(int(r["rss_kib"]) for r in runs) / 1024  # type: ignore[call-overload]
        medians[kind] = (seconds, rss)
        print(
            f"  {kind:10} parse {seconds * 1000:8.1f} ms   peak RSS added {rss:6.1f} MiB   tasks {runs[-1]['tasks']}"
        )
    t_base, m_base = medians["base"]
    for kind in [k for k in results if k != "base"]:
        t, m = medians[kind]
        per_op = (t - t_base) / args.operators * 1000
        print(f"  {kind} - base: {1000 * (t - t_base):.1f} ms ({per_op:.2f} ms per operator), "
              f"{m - m_base:.1f} MiB; ratio {t / t_base:.2f}x; "
              f"trainflow.core loaded: {results[kind][-1]['core'] or 'none'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
