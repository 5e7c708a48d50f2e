"""kwok mode: simulated nodes and pods (kwok with upstream Stages tuned for tests) and the Trainer controller
manager as a local process, its webhooks on loopback and the default runtimes installed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import yaml
from kubectl import Kubectl, load_yaml_docs
from layout import TRAINER_FEATURE_GATES, TS, Layout, TestbedError, components, log
from pki import write_kubeconfig
from procs import start
from ready import http_ok, wait_for
from webhooks import probe_jobset_webhook, probe_trainer_webhook, webhook_configs

KWOK_NODES = ["kwok-node-0", "kwok-node-1"]
KWOK_NODE_IP = "127.0.0.1"  # kwok serves the nodes' kubelet API (logs) here
# What every simulated container "prints" (served by kwok for pods/log requests).
# CRI log format ("<RFC3339Nano> <stream> <F|P> <line>"), which kwok parses.
SIMULATED_LOG = (
    "2026-01-01T00:00:00.000000000Z stdout F [trainflow-testbed] simulated container log (kwok)\n"
    "2026-01-01T00:00:01.000000000Z stdout F step=1 loss=0.90\n"
    "2026-01-01T00:00:02.000000000Z stdout F step=2 loss=0.45\n"
    "2026-01-01T00:00:03.000000000Z stderr F training finished\n"
)
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
KWOK_UID_BASE = 3_000_000  # kwok's user when the testbed runs as root: this plus the port base


def kwok_stages(L: Layout) -> list[dict]:
    """Upstream kwok Stages (node-fast + lease heartbeat, pod 'general', pod chaos failure).

    Tuned for tests: shorter default delays without default jitter (the upstream per-pod
    annotations such as pod-complete.stage.kwok.x-k8s.io/delay still override), and
    pod-complete never applies to pods labelled for failure, so a pod labelled
    pod-container-running-failed.stage.kwok.x-k8s.io=true deterministically fails
    (exit code 1; override via the upstream ...stage.kwok.x-k8s.io/exit-code annotation).
    """
    assert L.bin is not None
    delays_ms = {
        "pod-create": 200,
        "pod-init-container-running": 200,
        "pod-init-container-completed": 200,
        "pod-ready": 300,
        "pod-complete": 2000,
        "pod-delete": 0,
        "pod-container-running-failed": 2000,
    }
    stages = []
    for f in sorted((L.bin / "manifests" / "kwok").glob("*.yaml")):
        for d in load_yaml_docs(f):
            if d.get("kind") != "Stage":
                continue
            name = d["metadata"]["name"]
            spec = d["spec"]
            delay = spec.get("delay")
            if delay is not None and name in delays_ms:
                delay["durationMilliseconds"] = delays_ms[name]
                # kwok treats the jitter as an upper bound (jitter <= duration means
                # "use jitter"), so drop the default jitter; the per-pod
                # ...stage.kwok.x-k8s.io/jitter-delay annotation still works.
                delay.pop("jitterDurationMilliseconds", None)
            if name == "pod-complete":
                spec["selector"]["matchExpressions"].append(
                    {"key": f'.metadata.labels["{FAIL_LABEL}"]', "operator": "NotIn", "values": ["true"]}
                )
            stages.append(d)
    names = {s["metadata"]["name"] for s in stages}
    need = {
        "node-initialize",
        "node-heartbeat-with-lease",
        "pod-ready",
        "pod-complete",
        "pod-delete",
        "pod-container-running-failed",
    }
    if not need <= names:
        raise TestbedError(f"kwok stages missing: {sorted(need - names)}")
    return stages


def kwok_nodes() -> list[dict]:
    nodes = []
    for n in KWOK_NODES:
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": n,
                    "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "kubernetes.io/hostname": n,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                        "node-role.kubernetes.io/worker": "",
                    },
                },
                "spec": {},
                "status": {
                    # Both address kinds, as a kubelet registers them: kwok's node-initialize stage
                    # renders an empty "addresses:" (which clears them) when it re-initializes a
                    # node that lacks either, e.g. after a missed lease turned it Ready=Unknown.
                    "addresses": [
                        {"type": "InternalIP", "address": KWOK_NODE_IP},
                        {"type": "Hostname", "address": n},
                    ],
                    "allocatable": {
                        "cpu": "64",
                        "memory": "256Gi",
                        "pods": "110",
                        "nvidia.com/gpu": "8",
                        "ephemeral-storage": "1Ti",
                    },
                    "capacity": {
                        "cpu": "64",
                        "memory": "256Gi",
                        "pods": "110",
                        "nvidia.com/gpu": "8",
                        "ephemeral-storage": "1Ti",
                    },
                    "nodeInfo": {
                        "architecture": "amd64",
                        "operatingSystem": "linux",
                        "kubeletVersion": "fake",
                        "kubeProxyVersion": "fake",
                        "bootID": "",
                        "containerRuntimeVersion": "",
                        "kernelVersion": "",
                        "machineID": "",
                        "osImage": "",
                        "systemUUID": "",
                    },
                },
            }
        )
    return nodes


def start_kwok(L: Layout) -> None:
    P = L.ports
    # ---- kwok
    stages = kwok_stages(L)
    (L.etc / "kwok.yaml").write_text(
        yaml.safe_dump_all(
            [
                {
                    "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
                    "kind": "KwokConfiguration",
                    "options": {
                        "podPlayStageParallelism": 4,
                        "nodePlayStageParallelism": 2,
                        "nodeLeaseParallelism": 2,
                        "podsOnNodeSyncParallelism": 1,
                        "nodeLeaseDurationSeconds": 40,
                        "enablePodsOnNodeSyncListPager": True,
                        "enablePodsOnNodeSyncStreamWatch": False,
                        # kwok does not default options given in a config file
                        "enableDebuggingHandlers": True,
                        "enableProfilingHandler": False,
                        "enableContentionProfiling": False,
                    },
                },
                *stages,
            ],
            sort_keys=False,
        )
    )
    # Container logs served by kwok's "kubelet" endpoint (kubectl logs / read_namespaced_pod_log).
    (L.etc / "container.log").write_text(SIMULATED_LOG)
    (L.etc / "kwok.yaml").write_text(
        (L.etc / "kwok.yaml").read_text()
        + "---\n"
        + yaml.safe_dump(
            {
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "ClusterLogs",
                "metadata": {"name": "trainflow-testbed-logs"},
                "spec": {"logs": [{"logsFile": str(L.etc / "container.log"), "follow": False}]},
            }
        )
    )
    uid, home = kwok_user(L)
    start(
        L,
        "kwok",
        [
            str(home / "kwok"),
            "--kubeconfig",
            str(home / "kubeconfig"),
            "--config",
            str(L.etc / "kwok.yaml"),
            # a Logs object gives one pod a log file of its own (benchmarks/triggerer_harness.py)
            "--enable-crds",
            "Logs",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector",
            "kwok.x-k8s.io/node=fake",
            "--node-ip",
            KWOK_NODE_IP,
            "--node-port",
            str(P["kwok"]),
            "--server-address",
            f"127.0.0.1:{P['kwok']}",
            "--tls-cert-file",
            str(home / "serving.crt"),
            "--tls-private-key-file",
            str(home / "serving.key"),
            "--cidr",
            "10.244.0.0/16",
            "--node-lease-duration-seconds",
            "40",
        ],
        {"HOME": str(home)},
        uid=uid,
    )


def kwok_user(L: Layout) -> tuple[int | None, Path]:
    """The user kwok runs as, and its directory (its binary, kubeconfig, serving certificate, HOME).

    kwok serves each followed log (``pods/log?follow=true``) with an inotify instance, which the kernel
    counts per user (``fs.inotify.max_user_instances``, 128 by default): as root, kwok would share that
    budget with every root process of the machine and refuse follows beyond it ("failed to create fsnotify
    watcher: too many open files"). A kubelet serves one node's pods; kwok serves them all, so a testbed
    started as root runs it as a user of its own (one per instance), with its own copies of what it reads
    (the binary linked: the build cache may sit in a home only root can enter).
    """
    home = L.etc / "kwok-user"
    home.mkdir(mode=0o700, exist_ok=True)
    try:
        os.link(L.b("kwok"), home / "kwok")
    except OSError:  # another filesystem
        shutil.copy2(L.b("kwok"), home / "kwok")
    for name in ("ca.crt", "admin.crt", "admin.key", "serving.crt", "serving.key"):
        shutil.copy2(L.pki / name, home / name)
    write_kubeconfig(L, home / "kubeconfig", "admin", pki=home)
    if os.geteuid() != 0:
        return None, home
    uid = KWOK_UID_BASE + L.port_base
    for path in (home, *home.iterdir()):
        if path.name != "kwok":
            os.chown(path, uid, uid)
    return uid, home


def start_local_trainer(L: Layout) -> None:
    P = L.ports
    # ---- Trainer controller manager
    tr_cfg = {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "webhook": {"host": "127.0.0.1", "port": P["trainer_webhook"]},
        "metrics": {"bindAddress": "0", "secureServing": False},
        "health": {
            "healthProbeBindAddress": f"127.0.0.1:{P['trainer_health']}",
            "readinessEndpointName": "readyz",
            "livenessEndpointName": "healthz",
        },
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": False},
        "controller": {
            "groupKindConcurrency": {
                "TrainJob.trainer.kubeflow.org": 5,
                "TrainingRuntime.trainer.kubeflow.org": 1,
                "ClusterTrainingRuntime.trainer.kubeflow.org": 1,
            }
        },
    }
    (L.etc / "trainer-config.yaml").write_text(yaml.safe_dump(tr_cfg))
    tr_argv = [
        L.b("trainer-controller-manager"),
        "--kubeconfig",
        str(L.kubeconfig),
        "--config",
        str(L.etc / "trainer-config.yaml"),
        "--zap-log-level",
        "info",
    ]
    if TRAINER_FEATURE_GATES:
        tr_argv += ["--feature-gates", TRAINER_FEATURE_GATES]
    start(L, "trainer-controller-manager", tr_argv, {"TMPDIR": str(L.dir / "tmp" / "trainer")})


def trainer_ready(L: Layout, k: Kubectl, trainer_upstream: Path) -> list[dict]:
    """kwok mode: wait for the local Trainer, wire both webhooks, install the runtimes, kwok nodes Ready."""
    P, all_procs = L.ports, components(L)
    wait_for(
        "trainer-controller-manager /readyz",
        lambda: http_ok(f"http://127.0.0.1:{P['trainer_health']}/readyz"),
        90 * TS,
        watch=all_procs,
        L=L,
    )

    # ---- webhooks (URL client configs) and proof that admission calls them
    k.apply_objs(webhook_configs(L))
    wait_for(
        "JobSet validating webhook to answer", lambda: probe_jobset_webhook(k), 60 * TS, watch=all_procs, L=L
    )
    wait_for(
        "Trainer validating webhook to answer",
        lambda: probe_trainer_webhook(k),
        60 * TS,
        watch=all_procs,
        L=L,
    )
    log("admission webhooks answering (JobSet + Trainer)")

    # ---- default ClusterTrainingRuntimes (validated by the Trainer webhook)
    rt_files = sorted((trainer_upstream / "runtimes").rglob("*.yaml"))
    runtimes = [d for f in rt_files for d in load_yaml_docs(f)]
    k.apply_objs(runtimes)
    log(f"ClusterTrainingRuntimes: {', '.join(r['metadata']['name'] for r in runtimes)}")

    # ---- kwok nodes Ready
    k.apply_objs(kwok_nodes(), server_side=False)
    k.run("wait", "--for=condition=Ready", f"--timeout={int(120 * TS)}s", *[f"node/{n}" for n in KWOK_NODES])
    return runtimes
