"""A small, torch-free trainer for local-engine tests: prints, sleeps, dumps its env, reports, exits."""

import argparse
import hashlib
import json
import os
import sys
import time

from trainflow.core import output_dir, report

DUMPED = [
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID",
    "JAX_COORDINATOR_ADDRESS",
    "DMLC_TRACKER_URI",
    "DMLC_TRACKER_PORT",
    "DMLC_TASK_ID",
    "DMLC_NUM_WORKER",
    "TRAINFLOW_OUTPUT_URI",
    "TRAINFLOW_NODE_RANK",
    "TRAINFLOW_DATASET_DIR",
    "TRAINFLOW_MODEL_DIR",
    "HOME",
    "PATH",
    "PLAIN",
]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=1)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--line-sleep", type=float, default=0.0)
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--fail-node", type=int, default=-1, help="only this node exits with --exit-code")
    parser.add_argument("--dump-env", action="store_true")
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--secret-var", default="")
    parser.add_argument("--read-dataset", action="store_true")
    args = parser.parse_args()
    node = int(os.environ.get("TRAINFLOW_NODE_RANK", "0"))
    for i in range(args.lines):
        print(f"node={node} line={i}", flush=True)
        if args.line_sleep:
            time.sleep(args.line_sleep)
    out = output_dir()
    if args.dump_env:
        env = {k: os.environ.get(k) for k in DUMPED}
        env["cwd"] = os.getcwd()
        (out / f"env-{node}.json").write_text(json.dumps(env))
    if args.secret_var:
        value = os.environ.get(args.secret_var, "")
        digest = hashlib.sha256(value.encode()).hexdigest()
        (out / f"secret-{node}.sha256").write_text(digest)
        print(f"node={node} secret present={bool(value)}", flush=True)
    if args.read_dataset:
        data = os.path.join(os.environ["TRAINFLOW_DATASET_DIR"], "data.txt")
        with open(data, encoding="utf-8") as fh:
            (out / "dataset-copy.txt").write_text(fh.read())
    if args.report:
        report(metrics={"loss": 0.5, "node_seen": float(node)}, progress=50)
        report(metrics={"loss": 0.25}, progress=100)
    if args.sleep:
        time.sleep(args.sleep)
    if args.exit_code and (args.fail_node < 0 or args.fail_node == node):
        print(f"node={node} exiting with {args.exit_code}", flush=True)
        return args.exit_code
    print(f"node={node} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
