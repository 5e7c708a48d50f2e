"""The testbed's helpers as one namespace (``tb``), for testbed/node/ (pods mode) and ctl.py, which receive or
load it rather than importing the modules one by one."""

from __future__ import annotations

from layout import CONTEXT, TS, Layout, TestbedError, components, log
from pki import leaf, write_kubeconfig
from procs import alive, pid_of, running, start, stop_all
from ready import admin_ssl, http_ok, port_free, wait_for
from webhooks import probe_jobset_webhook, probe_trainer_webhook, webhook_configs

__all__ = [
    "CONTEXT",
    "TS",
    "Layout",
    "TestbedError",
    "admin_ssl",
    "alive",
    "components",
    "http_ok",
    "leaf",
    "log",
    "pid_of",
    "port_free",
    "probe_jobset_webhook",
    "probe_trainer_webhook",
    "running",
    "start",
    "stop_all",
    "wait_for",
    "webhook_configs",
    "write_kubeconfig",
]
