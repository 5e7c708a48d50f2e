#!/usr/bin/env python3
"""Supervisor for the trainflow e2e testbed.

Runs a real Kubernetes control plane plus the real Kubeflow Trainer and JobSet
controllers as local processes bound to 127.0.0.1 (no container engine):

  etcd -> kube-apiserver (RBAC) -> kube-controller-manager, kube-scheduler
       -> kwok (simulated nodes + pod lifecycle)
       -> JobSet controller + webhooks, Trainer controller manager + webhooks
       (+ Kueue with --kueue-bin, an S3-compatible object store with --objstore-bin)

Usage (normally through testbed/up.sh and testbed/down.sh):
  testbed.py up     --bin BIN_DIR [--dir RUN_DIR] [--trainer-upstream DIR]
  testbed.py down   [--dir RUN_DIR]
  testbed.py status [--dir RUN_DIR]
  testbed.py logs   [--dir RUN_DIR] [--lines N]

Only the standard library and PyYAML are used; certificates come from openssl. The modules beside this file
do one job each: layout (directories, ports, settings), pki, procs (tagged processes), ready (waits), kubectl,
webhooks, control_plane, kwok (kwok mode), instance (up, down, status); node/ is the pods mode.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

try:
    import yaml  # noqa: F401
except ImportError:  # pragma: no cover - reported loudly
    sys.exit("testbed.py needs PyYAML (run it with the project's .venv python)")

from instance import down, status, up
from layout import DEFAULT_DIR, Layout, log
from procs import tail_logs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("command", choices=["up", "down", "status", "logs"])
    ap.add_argument("--dir", default=os.environ.get("TRAINFLOW_TESTBED_DIR", DEFAULT_DIR))
    ap.add_argument("--bin")
    ap.add_argument("--trainer-upstream")
    ap.add_argument("--node-bin", help="pods mode: the node build (testbed/node/build.sh output)")
    ap.add_argument("--kueue-bin", help="Kueue mode: the Kueue build (testbed/kueue/build.sh output)")
    ap.add_argument("--objstore-bin", help="object-store mode: the build (testbed/objstore/build.sh output)")
    ap.add_argument("--lines", type=int, default=40)
    a = ap.parse_args()
    L = Layout(a.dir, a.bin)
    if a.command == "up":
        if not a.bin or not a.trainer_upstream:
            ap.error("up needs --bin and --trainer-upstream")
        L.dir.mkdir(parents=True, exist_ok=True)
        try:
            up(
                L,
                Path(a.trainer_upstream),
                Path(a.node_bin) if a.node_bin else None,
                Path(a.kueue_bin) if a.kueue_bin else None,
                Path(a.objstore_bin) if a.objstore_bin else None,
            )
        except Exception as e:
            log(f"FAILED to start testbed: {e}")
            print(tail_logs(L, a.lines), file=sys.stderr)
            try:
                down(Layout(a.dir, a.bin))
            except Exception as e2:
                log(f"cleanup after failure: {e2}")
            return 1
        return 0
    if a.command == "down":
        down(L)
        log(f"testbed in {L.dir} stopped")
        return 0
    if a.command == "status":
        return status(L)
    print(tail_logs(L, a.lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
