"""Where the cluster is and how to reach it, read once from a kubeconfig (or the pod's service account).

One loader for every path: the sync client, the async waiters and the log readers all take their server, TLS,
proxy and credential settings from the ``ClusterConfig`` made here, so they behave alike and as kubectl does
(docs/architecture.md, "Talking to the API server"):

* ``KUBECONFIG`` is a list; the first file that sets a map key wins, ``current-context`` from the first file
  that has one;
* relative paths resolve against the directory of the path the file was loaded from, without following
  symlinks (client-go's ``ResolveLocalPaths``);
* ``insecure-skip-tls-verify`` together with a CA is refused, as kubectl refuses it; the adapters' own
  "do not verify" switch clears the CA instead, as kubectl's ``--insecure-skip-tls-verify`` flag does.

No client library is imported, and nothing secret appears in a repr.
"""

from __future__ import annotations

import base64
import contextlib
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
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


def _secret(value: Any) -> Any:
    return field(default=value, repr=False)


@dataclass(frozen=True)
class ExecSpec:
    """A kubeconfig ``exec`` entry (client.authentication.k8s.io v1 or v1beta1)."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # plugin env may hold secrets
    api_version: str = EXEC_API_VERSIONS[0]
    cluster_info: Mapping[str, Any] | None = field(default=None, repr=False)
    interactive_mode: str = "IfAvailable"


@dataclass(frozen=True)
class ClusterConfig:
    """A resolved connection: server, namespace, TLS, proxy and the user's credentials (never in a repr)."""

    namespace: str
    server: str
    context: str | None = None
    in_cluster: bool = False
    user: str | None = None  # the kubeconfig user's name, for messages
    where: str = ""  # where the settings came from, for messages
    ca_file: str | None = None
    ca_data: bytes | None = _secret(None)
    insecure: bool = False
    tls_server_name: str | None = None
    proxy_url: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = _secret(None)
    key_data: bytes | None = _secret(None)
    token: str | None = _secret(None)
    token_file: str | None = None
    username: str | None = None
    password: str | None = _secret(None)
    exec: ExecSpec | None = None
    impersonate: tuple[tuple[str, str], ...] = ()  # (header, value) pairs: Impersonate-User, -Group, ...

    @property
    def verify_ssl(self) -> bool:
        return not self.insecure

    def describe(self) -> str:
        """Which context or account, for error messages."""
        return (
            "the in-cluster service account" if self.in_cluster else f"{self.where} (context {self.context})"
        )


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


def context_namespace(
    docs: Sequence[Mapping[str, Any]], context: str | None
) -> tuple[str | None, str | None]:
    """(context name, its namespace) from kubeconfig documents merged the way kubectl merges them."""
    name = context
    if name is None:
        name = next((str(d["current-context"]) for d in docs if d.get("current-context")), None)
    if name is None:
        return None, None
    found = entry_at(docs, "contexts", name)
    ns = (found[0] if found else {}).get("namespace")
    return name, str(ns) if ns else None


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
        return _in_cluster(namespace, sa_namespace_file, verify_ssl)
    if config_dict is not None:
        docs: list[tuple[Mapping[str, Any], Path]] = [(dict(config_dict), Path.cwd())]
        where = "the inline kubeconfig"
    else:
        candidates = kubeconfig_paths(kubeconfig)
        existing = [p for p in candidates if p.is_file()]
        if not existing:
            raise BackendError(
                f"no kubeconfig found at {os.pathsep.join(str(p) for p in candidates)}; {HOW_TO_CONNECT}"
            )
        # the directory of the path as given (kubectl: filepath.Abs, no symlink evaluation)
        docs = [(doc, Path(os.path.abspath(p)).parent) for p in existing for doc in read_kubeconfigs([p])]
        where = f"kubeconfig {os.pathsep.join(str(p) for p in existing)}"
    return _from_docs(docs, where, context, namespace, sa_namespace_file, verify_ssl)


def _in_cluster(
    namespace: str | None, sa_namespace_file: str | os.PathLike[str], verify: bool
) -> ClusterConfig:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port or not Path(SA_TOKEN_FILE).is_file():
        raise BackendError(
            "cannot load Kubernetes credentials from the in-cluster service account "
            f"(KUBERNETES_SERVICE_HOST/PORT and {SA_TOKEN_FILE} are needed); {HOW_TO_CONNECT}"
        )
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return ClusterConfig(
        namespace=discover_namespace(namespace, None, sa_namespace_file),
        server=server,
        in_cluster=True,
        where="the in-cluster service account",
        ca_file=None if not verify else f"{SA_DIR}/ca.crt",
        insecure=not verify,
        token_file=SA_TOKEN_FILE,
    )


def _from_docs(
    docs: Sequence[tuple[Mapping[str, Any], Path]],
    where: str,
    context: str | None,
    namespace: str | None,
    sa_namespace_file: str | os.PathLike[str],
    verify: bool,
) -> ClusterConfig:
    plain = [d for d, _ in docs]
    ctx_name, ctx_ns = context_namespace(plain, context)
    if ctx_name is None:
        raise BackendError(f"{where} names no current-context: pass a context, or set current-context")
    found = entry_at(plain, "contexts", ctx_name)
    if found is None:
        names = sorted(
            {str(e.get("name")) for d in plain for e in d.get("contexts") or [] if isinstance(e, dict)}
        )
        raise BackendError(
            f"context {ctx_name!r} not found in {where} (contexts: {', '.join(names) or 'none'})"
        )
    ctx = found[0]
    cluster_name, user_name = str(ctx.get("cluster") or ""), str(ctx.get("user") or "")
    c, c_dir = _section(docs, "clusters", cluster_name)
    u, u_dir = _section(docs, "users", user_name)
    if not c.get("server"):
        raise BackendError(f"context {ctx_name!r} in {where} has no cluster server")
    label = f"user {user_name!r} of {where}"
    ca_file, ca_data = (
        _path(c.get("certificate-authority"), c_dir),
        _data(c, "certificate-authority-data", label),
    )
    insecure = bool(c.get("insecure-skip-tls-verify"))
    if insecure and (ca_file or ca_data):
        raise BackendError(
            f"cluster {cluster_name!r} of {where}: specifying a root certificates file with the insecure flag "
            "is not allowed (kubectl refuses it too); remove insecure-skip-tls-verify or the certificate-authority"
        )
    if not verify:  # the adapter's switch, like kubectl's --insecure-skip-tls-verify flag: clears the CA
        insecure, ca_file, ca_data = True, None, None
    proxy = str(c.get("proxy-url") or "") or None
    return ClusterConfig(
        namespace=discover_namespace(namespace, ctx_ns, sa_namespace_file),
        server=str(c["server"]),
        context=ctx_name,
        user=user_name or None,
        where=where,
        ca_file=ca_file,
        ca_data=ca_data,
        insecure=insecure,
        tls_server_name=str(c.get("tls-server-name") or "") or None,
        proxy_url=proxy,
        **_user(u, u_dir, label, c),
    )


def _section(
    docs: Sequence[tuple[Mapping[str, Any], Path]], section: str, name: str
) -> tuple[Mapping[str, Any], Path]:
    found = entry_at([d for d, _ in docs], section, name)
    return (found[0], docs[found[1]][1]) if found else ({}, Path.cwd())


def _path(value: Any, base: Path) -> str | None:
    if not value:
        return None
    path = Path(str(value)).expanduser()
    return str(path if path.is_absolute() else base / path)


def _data(entry: Mapping[str, Any], key: str, label: str) -> bytes | None:
    value = entry.get(key)
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError:
        raise BackendError(f"{label}: {key} is not valid base64") from None


def _user(u: Mapping[str, Any], base: Path, label: str, cluster: Mapping[str, Any]) -> dict[str, Any]:
    """The credential settings of one kubeconfig user (client-go's rules for which one applies)."""
    if u.get("auth-provider"):
        name = (
            (u.get("auth-provider") or {}).get("name", "?")
            if isinstance(u.get("auth-provider"), Mapping)
            else "?"
        )
        raise BackendError(
            f"{label} uses the auth-provider {name!r}, which trainflow does not support (client-go dropped the "
            "gcp and azure providers in Kubernetes 1.26); use an exec credential plugin instead "
            "(for example gke-gcloud-auth-plugin, kubelogin)"
        )
    token, token_file = str(u.get("token") or "") or None, _path(u.get("tokenFile"), base)
    username, password = str(u.get("username") or "") or None, str(u.get("password") or "") or None
    if (token or token_file) and (username or password):
        raise BackendError(
            f"{label}: more than one authentication method found (token, basicAuth); only one is allowed"
        )
    out: dict[str, Any] = {
        "cert_file": _path(u.get("client-certificate"), base),
        "key_file": _path(u.get("client-key"), base),
        "cert_data": _data(u, "client-certificate-data", label),
        "key_data": _data(u, "client-key-data", label),
        "token": token,
        "token_file": token_file,
        "username": username,
        "password": password,
        "impersonate": _impersonation(u),
    }
    spec = u.get("exec")
    if isinstance(spec, Mapping):
        out["exec"] = _exec(spec, base, cluster, label)
    return out


def _impersonation(u: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    if u.get("as"):
        pairs.append(("Impersonate-User", str(u["as"])))
    if u.get("as-uid"):
        pairs.append(("Impersonate-Uid", str(u["as-uid"])))
    pairs += [("Impersonate-Group", str(g)) for g in u.get("as-groups") or []]
    for key, values in (u.get("as-user-extra") or {}).items():
        pairs += [(f"Impersonate-Extra-{key}", str(v)) for v in values or []]
    return tuple(pairs)


def _exec(spec: Mapping[str, Any], base: Path, cluster: Mapping[str, Any], label: str) -> ExecSpec:
    command = str(spec.get("command") or "")
    if not command:
        raise BackendError(f"{label}: the exec entry has no command")
    if os.sep in command and not os.path.isabs(command):  # kubectl: relative to the kubeconfig file
        command = str(base / command)
    api_version = str(spec.get("apiVersion") or "")
    if api_version not in EXEC_API_VERSIONS:
        raise BackendError(
            f"{label}: exec apiVersion {api_version!r} is not supported; use one of {', '.join(EXEC_API_VERSIONS)}"
        )
    info = _cluster_info(cluster, base) if spec.get("provideClusterInfo") else None
    env = tuple(
        (str(e.get("name")), str(e.get("value", ""))) for e in spec.get("env") or [] if isinstance(e, Mapping)
    )
    return ExecSpec(
        command=command,
        args=tuple(str(a) for a in spec.get("args") or []),
        env=env,
        api_version=api_version,
        cluster_info=info,
        interactive_mode=str(spec.get("interactiveMode") or "IfAvailable"),
    )


def _cluster_info(cluster: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """The ExecCredential ``spec.cluster`` from a kubeconfig cluster entry (the same kebab-case names); the CA
    as data even when the kubeconfig names a file, as client-go passes it."""
    keys = (
        "server",
        "certificate-authority-data",
        "insecure-skip-tls-verify",
        "tls-server-name",
        "proxy-url",
    )
    info = {k: cluster[k] for k in keys if k in cluster}
    ca_file = _path(cluster.get("certificate-authority"), base)
    if ca_file and "certificate-authority-data" not in info:
        with contextlib.suppress(OSError):
            info["certificate-authority-data"] = base64.b64encode(Path(ca_file).read_bytes()).decode()
    return info
