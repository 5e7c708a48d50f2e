"""Cluster connection settings: a private kubernetes client Configuration plus the namespace to use.

Never touches the kubernetes package's global default configuration, so several backends (clusters,
contexts) can live in one process (the Airflow triggerer, a worker).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from trainflow.core.errors import BackendError

SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
DEFAULT_KUBECONFIG = "~/.kube/config"


@dataclass(frozen=True)
class ClusterConfig:
    """A loaded connection: where the API server is, how to authenticate, and the namespace."""

    configuration: k8s_client.Configuration
    namespace: str
    server: str
    context: str | None = None
    in_cluster: bool = False


def kubeconfig_paths(kubeconfig: str | os.PathLike[str] | None = None) -> list[Path]:
    """The kubeconfig files to read, merged as kubectl merges them.

    The explicit value, else ``$KUBECONFIG``, else ~/.kube/config. Either may be a ``:``-separated list
    (the CLI's ``--kubeconfig`` defaults to ``$KUBECONFIG``), unless it names one existing file.
    """
    raw = str(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    if Path(raw).expanduser().is_file():
        return [Path(raw).expanduser()]
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p] or [
        Path(DEFAULT_KUBECONFIG).expanduser()
    ]


def _read_kubeconfigs(paths: list[Path]) -> list[dict[str, Any]]:
    docs = []
    for path in paths:
        if path.is_file():
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
            if isinstance(doc, dict):
                docs.append(doc)
    return docs


def context_namespace(
    docs: Sequence[Mapping[str, Any]], context: str | None
) -> tuple[str | None, str | None]:
    """(context name, its namespace) from kubeconfig documents merged the way kubectl merges them."""
    name = context
    if name is None:
        for doc in docs:
            if doc.get("current-context"):
                name = str(doc["current-context"])
                break
    if name is None:
        return None, None
    for doc in docs:
        for entry in doc.get("contexts") or []:
            if isinstance(entry, Mapping) and entry.get("name") == name:
                ns = (entry.get("context") or {}).get("namespace")
                return name, str(ns) if ns else None
    return name, None


def discover_namespace(
    explicit: str | None,
    context_ns: str | None,
    sa_namespace_file: str | os.PathLike[str] = SA_NAMESPACE_FILE,
) -> str:
    """Explicit namespace, else the kubeconfig context's, else the service account's, else ``default``."""
    if explicit:
        return explicit
    if context_ns:
        return context_ns
    try:
        text = Path(sa_namespace_file).read_text(encoding="utf-8").strip()
    except OSError:
        text = ""
    return text or "default"


def load_cluster_config(
    *,
    kubeconfig: str | os.PathLike[str] | None = None,
    context: str | None = None,
    in_cluster: bool | None = None,
    config_dict: Mapping[str, Any] | None = None,
    namespace: str | None = None,
    sa_namespace_file: str | os.PathLike[str] = SA_NAMESPACE_FILE,
) -> ClusterConfig:
    """Load a private Configuration. Default: in-cluster when ``KUBERNETES_SERVICE_HOST`` is set, else kubeconfig."""
    cfg = k8s_client.Configuration()
    use_in_cluster = in_cluster
    if use_in_cluster is None:
        use_in_cluster = (
            config_dict is None and kubeconfig is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        )
    ctx_name: str | None = None
    ctx_ns: str | None = None
    try:
        if use_in_cluster:
            k8s_config.load_incluster_config(client_configuration=cfg)
        elif config_dict is not None:
            k8s_config.load_kube_config_from_dict(
                dict(config_dict), context=context, client_configuration=cfg, persist_config=False
            )
            ctx_name, ctx_ns = context_namespace([config_dict], context)
        else:
            paths = kubeconfig_paths(kubeconfig)
            existing = [p for p in paths if p.is_file()]
            if not existing:
                raise BackendError(
                    f"no kubeconfig found at {', '.join(str(p) for p in paths)}: point KUBECONFIG (or the "
                    "kubeconfig setting) at a kubeconfig file, or run inside a cluster"
                )
            k8s_config.load_kube_config(
                config_file=os.pathsep.join(str(p) for p in existing),
                context=context,
                client_configuration=cfg,
                persist_config=False,
            )
            ctx_name, ctx_ns = context_namespace(_read_kubeconfigs(existing), context)
    except BackendError:
        raise
    except (k8s_config.ConfigException, OSError, ValueError, KeyError) as exc:
        where = (
            "in-cluster service account" if use_in_cluster else f"kubeconfig (context {context or 'current'})"
        )
        raise BackendError(f"cannot load Kubernetes credentials from the {where}: {exc}") from exc
    # tenacity (kube/retry.py) is the one retry layer: no hidden urllib3 retries under it.
    cfg.retries = False
    ns = discover_namespace(namespace, ctx_ns, sa_namespace_file)
    return ClusterConfig(
        configuration=cfg,
        namespace=ns,
        server=str(cfg.host),
        context=ctx_name,
        in_cluster=bool(use_in_cluster),
    )


def check_reachable(cluster: ClusterConfig, timeout: float = 5.0) -> None:
    """Fail fast, naming the server, when nothing answers there (one GET /version, no retries).

    Any HTTP answer (even 401/403) counts as reachable; credentials are checked by the calls that follow.
    """
    api = new_api_client(cluster)
    try:
        k8s_client.VersionApi(api).get_code(_request_timeout=(timeout, timeout))
        return
    except k8s_client.ApiException as exc:
        if exc.status:  # an HTTP answer
            return
        failure: Exception = exc  # status 0: the client's wrapping of a TLS failure
        reason: object = exc.reason
    except Exception as exc:  # urllib3 connection, timeout and TLS errors
        failure, reason = exc, getattr(exc, "reason", None) or exc
    finally:
        api.close()
    where = "in-cluster config" if cluster.in_cluster else f"context {cluster.context or '(none)'}"
    kind = "" if isinstance(reason, str) else f"{type(reason).__name__}: "
    raise BackendError(
        f"cannot reach the Kubernetes API server at {cluster.server} ({where}): "
        f"{kind}{' '.join(str(reason).split())[:200]}; "
        "check that the cluster is up and that KUBECONFIG / the context point at it"
    ) from failure


def new_api_client(cluster: ClusterConfig) -> k8s_client.ApiClient:
    """A private sync ApiClient for this connection."""
    return k8s_client.ApiClient(configuration=cluster.configuration)


def bearer_keys(api_key: Mapping[str, str] | None) -> dict[str, str]:
    """The token under both names clients use: kubernetes 30 says 'authorization', 37 and asyncio 'BearerToken'."""
    keys = dict(api_key or {})
    token = keys.get("BearerToken") or keys.get("authorization")
    if token:
        keys["BearerToken"] = keys["authorization"] = token
    return keys


def async_configuration(cluster: ClusterConfig) -> Any:
    """The same connection as a kubernetes_asyncio Configuration (copied fields; token refresh delegated)."""
    from kubernetes_asyncio.client import Configuration as AsyncConfiguration

    src = cluster.configuration
    dst = AsyncConfiguration()
    dst.host = src.host
    for attr in (
        "ssl_ca_cert",
        "cert_file",
        "key_file",
        "verify_ssl",
        "proxy",
        "tls_server_name",
        "assert_hostname",
    ):
        if hasattr(src, attr) and hasattr(dst, attr):
            setattr(dst, attr, getattr(src, attr))
    dst.api_key = bearer_keys(src.api_key)
    dst.api_key_prefix = dict(src.api_key_prefix or {})
    if src.username or src.password:
        dst.username, dst.password = src.username, src.password
    hook = getattr(src, "refresh_api_key_hook", None)
    if hook is not None:

        def refresh(conf: Any) -> None:
            hook(src)
            conf.api_key = bearer_keys(src.api_key)

        dst.refresh_api_key_hook = refresh
    return dst
