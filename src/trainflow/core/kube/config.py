"""Where the cluster is and how to reach it: kubeconfig files, an inline kubeconfig, or the in-cluster account.

The connection is resolved from the kubeconfig text alone (context, server, namespace), the way kubectl merges
several files, so making a backend imports no client library. The credentials for that same context are loaded
when first used: ``sync_configuration`` (kubernetes) for reads and creates; for the shared watch,
kube/credentials.py reads them itself, and ``async_configuration`` (kubernetes_asyncio) covers the kinds it does
not read. The process-wide default configurations of both libraries are never touched, so several clusters and
contexts can live in one process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainflow.core.errors import BackendError

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SA_NAMESPACE_FILE = f"{SA_DIR}/namespace"
SA_TOKEN_FILE = f"{SA_DIR}/token"
DEFAULT_KUBECONFIG = "~/.kube/config"
HOW_TO_CONNECT = (
    "point KUBECONFIG (or the kubeconfig setting) at a kubeconfig file, give an inline kubeconfig, "
    "or run inside a cluster with a service account"
)


@dataclass
class ClusterConfig:
    """A resolved connection: the server, the context and the namespace, plus where the credentials live."""

    namespace: str
    server: str
    context: str | None = None
    in_cluster: bool = False
    paths: tuple[str, ...] = ()
    config_dict: Mapping[str, Any] | None = None
    verify_ssl: bool = True  # False: the server's certificate is not checked (cncf's disable_verify_ssl)
    _sync: Any = field(default=None, repr=False, compare=False)

    def sync_configuration(self) -> Any:
        """The kubernetes client Configuration for this connection (loaded once, on first use)."""
        if self._sync is None:
            self._sync = _load_sync(self)
        return self._sync

    async def async_configuration(self) -> Any:
        """A fresh kubernetes_asyncio Configuration (auth-provider and basic-auth users; re-runs exec plugins)."""
        return await _load_async(self)


def split_paths(value: str | os.PathLike[str]) -> list[Path]:
    """A kubeconfig setting as files: ``a.yaml:b.yaml`` is several files, as in ``$KUBECONFIG``."""
    return [Path(p).expanduser() for p in str(value).split(os.pathsep) if p]


def kubeconfig_paths(kubeconfig: str | os.PathLike[str] | None = None) -> list[Path]:
    """The kubeconfig files to read: the given ones, else ``$KUBECONFIG``, else ~/.kube/config."""
    if kubeconfig:
        return split_paths(kubeconfig)
    env = os.environ.get("KUBECONFIG")
    return split_paths(env) if env else split_paths(DEFAULT_KUBECONFIG)


def read_kubeconfigs(paths: Sequence[Path]) -> list[dict[str, Any]]:
    docs = []
    for path in paths:
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise BackendError(f"cannot read kubeconfig {path}: {exc}") from None
        except yaml.YAMLError as exc:
            raise BackendError(f"kubeconfig {path} is not valid YAML: {exc}") from None
        if isinstance(doc, dict):
            docs.append(doc)
    return docs


def entry_at(
    docs: Sequence[Mapping[str, Any]], section: str, name: str
) -> tuple[Mapping[str, Any], int] | None:
    """The first entry of that name, and the index of its document (kubectl: the first file to set a key wins)."""
    for i, doc in enumerate(docs):
        for entry in doc.get(section) or []:
            if isinstance(entry, Mapping) and entry.get("name") == name:
                value = entry.get(section[:-1])
                return (value if isinstance(value, Mapping) else {}), i
    return None


def _entry(docs: Sequence[Mapping[str, Any]], section: str, name: str) -> Mapping[str, Any] | None:
    found = entry_at(docs, section, name)
    return found[0] if found else None


def context_namespace(
    docs: Sequence[Mapping[str, Any]], context: str | None
) -> tuple[str | None, str | None]:
    """(context name, its namespace) from kubeconfig documents merged the way kubectl merges them."""
    name = context
    if name is None:
        name = next((str(d["current-context"]) for d in docs if d.get("current-context")), None)
    if name is None:
        return None, None
    entry = _entry(docs, "contexts", name)
    ns = (entry or {}).get("namespace")
    return name, str(ns) if ns else None


def _server(docs: Sequence[Mapping[str, Any]], context: str | None, where: str) -> str:
    if context is None:
        raise BackendError(f"{where} names no current-context: pass a context, or set current-context")
    ctx = _entry(docs, "contexts", context)
    if ctx is None:
        names = sorted(
            {str(e.get("name")) for d in docs for e in d.get("contexts") or [] if isinstance(e, dict)}
        )
        raise BackendError(
            f"context {context!r} not found in {where} (contexts: {', '.join(names) or 'none'})"
        )
    cluster = _entry(docs, "clusters", str(ctx.get("cluster") or ""))
    server = (cluster or {}).get("server")
    if not server:
        raise BackendError(f"context {context!r} in {where} has no cluster server")
    return str(server)


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
    verify_ssl: bool = True,
) -> ClusterConfig:
    """Resolve a connection. Default: in-cluster when ``KUBERNETES_SERVICE_HOST`` is set, else kubeconfig."""
    use_in_cluster = in_cluster
    if use_in_cluster is None:
        use_in_cluster = (
            config_dict is None and kubeconfig is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        )
    if use_in_cluster:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port or not Path(SA_TOKEN_FILE).is_file():
            raise BackendError(
                "cannot load Kubernetes credentials from the in-cluster service account "
                f"(KUBERNETES_SERVICE_HOST/PORT and {SA_TOKEN_FILE} are needed); {HOW_TO_CONNECT}"
            )
        server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        ns = discover_namespace(namespace, None, sa_namespace_file)
        return ClusterConfig(namespace=ns, server=server, in_cluster=True, verify_ssl=verify_ssl)
    if config_dict is not None:
        docs = [dict(config_dict)]
        where = "the inline kubeconfig"
        paths: tuple[str, ...] = ()
    else:
        candidates = kubeconfig_paths(kubeconfig)
        existing = [p for p in candidates if p.is_file()]
        if not existing:
            raise BackendError(
                f"no kubeconfig found at {os.pathsep.join(str(p) for p in candidates)}; {HOW_TO_CONNECT}"
            )
        docs = read_kubeconfigs(existing)
        where = f"kubeconfig {os.pathsep.join(str(p) for p in existing)}"
        paths = tuple(str(p) for p in existing)
    ctx_name, ctx_ns = context_namespace(docs, context)
    server = _server(docs, ctx_name, where)
    return ClusterConfig(
        namespace=discover_namespace(namespace, ctx_ns, sa_namespace_file),
        server=server,
        context=ctx_name,
        paths=paths,
        config_dict=dict(config_dict) if config_dict is not None else None,
        verify_ssl=verify_ssl,
    )


def _credentials_error(cluster: ClusterConfig, exc: BaseException) -> BackendError:
    where = "in-cluster service account" if cluster.in_cluster else f"kubeconfig (context {cluster.context})"
    return BackendError(f"cannot load Kubernetes credentials from the {where}: {exc}")


def _load_sync(cluster: ClusterConfig) -> Any:
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    cfg = k8s_client.Configuration()
    try:
        if cluster.in_cluster:
            k8s_config.load_incluster_config(client_configuration=cfg)
        elif cluster.config_dict is not None:
            k8s_config.load_kube_config_from_dict(
                dict(cluster.config_dict),
                context=cluster.context,
                client_configuration=cfg,
                persist_config=False,
            )
        else:
            k8s_config.load_kube_config(
                config_file=os.pathsep.join(cluster.paths),
                context=cluster.context,
                client_configuration=cfg,
                persist_config=False,
            )
    except (k8s_config.ConfigException, OSError, ValueError, KeyError) as exc:
        raise _credentials_error(cluster, exc) from exc
    if not cluster.verify_ssl:
        cfg.verify_ssl = False
    cfg.retries = False  # tenacity (kube/retry.py) is the one retry layer: no hidden urllib3 retries under it
    cfg.api_key = bearer_keys(cfg.api_key)
    return cfg


async def _load_async(cluster: ClusterConfig) -> Any:
    from kubernetes_asyncio import config as async_config
    from kubernetes_asyncio.client import Configuration

    cfg = Configuration()
    try:
        if cluster.in_cluster:
            async_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        elif cluster.config_dict is not None:
            await async_config.load_kube_config_from_dict(
                dict(cluster.config_dict), context=cluster.context, client_configuration=cfg
            )
        else:
            await async_config.load_kube_config(
                config_file=os.pathsep.join(cluster.paths),
                context=cluster.context,
                client_configuration=cfg,
                persist_config=False,
            )
    except (async_config.ConfigException, OSError, ValueError, KeyError) as exc:
        raise _credentials_error(cluster, exc) from exc
    if not cluster.verify_ssl:
        cfg.verify_ssl = False
    cfg.api_key = bearer_keys(cfg.api_key)
    return cfg


def check_reachable(cluster: ClusterConfig, timeout: float = 5.0) -> None:
    """Fail fast, naming the server, when nothing answers there: one GET /version, no retries.

    Any HTTP answer (even 401/403) counts as reachable; credentials are checked by the calls that follow.
    """
    from kubernetes import client as k8s_client

    api = k8s_client.ApiClient(configuration=cluster.sync_configuration())
    try:  # a (connect, read) tuple: the client ignores a float timeout
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


def bearer_keys(api_key: Mapping[str, str] | None) -> dict[str, str]:
    """The token under both names clients use: kubernetes 30 says 'authorization', 37 and asyncio 'BearerToken'."""
    keys = dict(api_key or {})
    token = keys.get("BearerToken") or keys.get("authorization")
    if token:
        keys["BearerToken"] = keys["authorization"] = token
    return keys
