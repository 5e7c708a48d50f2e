"""How a connection to the API server is made, decided once for both transports: the proxy and the TLS context.

Proxies follow kubectl: a cluster's ``proxy-url`` wins; otherwise Go's ``http.ProxyFromEnvironment``
(``HTTPS_PROXY``/``https_proxy`` for https servers, ``HTTP_PROXY`` for http, ``NO_PROXY`` with host names,
domain suffixes, IPs, CIDRs and ``*``), which never proxies ``localhost`` or a loopback address. Python's
own rules (urllib's, httpx's ``trust_env``) differ in those details, so they are written out here.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trainflow.core.errors import BackendError
from trainflow.core.kube.config import ClusterConfig

SUPPORTED_PROXY_SCHEMES = ("http", "https")


def _env(environ: Mapping[str, str], *names: str) -> str:
    for name in names:
        value = environ.get(name)
        if value:
            return value
    return ""


def _with_scheme(proxy: str) -> str:
    """Go: a proxy without a scheme is an http:// proxy."""
    return proxy if "://" in proxy else f"http://{proxy}"


def _default_port(scheme: str) -> str:
    return "443" if scheme == "https" else "80"


def _no_proxy_matches(no_proxy: str, host: str, port: str) -> bool:
    """Go's httpproxy NO_PROXY rules for one (host, port)."""
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if "/" in entry:  # a CIDR
            try:
                if ip is not None and ip in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        phost, pport = _split_host_port(entry)
        try:
            pip = ipaddress.ip_address(phost)
        except ValueError:
            pip = None
        if pip is not None:
            if ip is not None and ip == pip and pport in ("", port):
                return True
            continue
        if not phost:
            continue
        if phost.startswith("*."):
            phost = phost[1:]
        match_host = not phost.startswith(".")
        suffix = phost if phost.startswith(".") else "." + phost
        if (host.endswith(suffix) or (match_host and host == suffix[1:])) and pport in ("", port):
            return True
    return False


def _split_host_port(entry: str) -> tuple[str, str]:
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else ""
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, port
    return entry, ""


def proxy_for(server: str, proxy_url: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The proxy URL for requests to ``server`` (None: connect directly), as kubectl chooses it."""
    if proxy_url:
        return _checked(_with_scheme(proxy_url), "the kubeconfig's proxy-url")
    env = os.environ if environ is None else environ
    parts = urlsplit(server)
    scheme = parts.scheme or "https"
    proxy = (
        _env(env, "HTTPS_PROXY", "https_proxy")
        if scheme == "https"
        else _env(env, "HTTP_PROXY", "http_proxy")
    )
    if not proxy:
        return None
    host = (parts.hostname or "").lower()
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    port = str(parts.port or _default_port(scheme))
    if _no_proxy_matches(_env(env, "NO_PROXY", "no_proxy"), host, port):
        return None
    return _checked(_with_scheme(proxy), "HTTPS_PROXY" if scheme == "https" else "HTTP_PROXY")


def _checked(proxy: str, where: str) -> str:
    scheme = proxy.split("://", 1)[0].lower()
    if scheme not in SUPPORTED_PROXY_SCHEMES:
        raise BackendError(
            f"{where} names a {scheme} proxy; trainflow connects through http and https proxies only "
            "(kubectl also takes socks5): use an HTTP(S) proxy for the API server"
        )
    return proxy


class ServerNameContext(ssl.SSLContext):
    """A TLS context that sends and verifies one server name, whatever host the connection was opened to: the
    kubeconfig's ``tls-server-name``, through a proxy tunnel too (as Go's ``tls.Config.ServerName``)."""

    server_name = ""

    def wrap_socket(  # type: ignore[override]
        self,
        sock: Any,
        server_side: bool = False,
        do_handshake_on_connect: bool = True,
        suppress_ragged_eofs: bool = True,
        server_hostname: str | None = None,
        session: Any = None,
    ) -> Any:
        return super().wrap_socket(
            sock, server_side, do_handshake_on_connect, suppress_ragged_eofs, self.server_name, session
        )

    def wrap_bio(
        self,
        incoming: Any,
        outgoing: Any,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: Any = None,
    ) -> Any:
        return super().wrap_bio(incoming, outgoing, server_side, self.server_name, session)


def _verifying(cluster: ClusterConfig) -> ssl.SSLContext:
    cadata = cluster.ca_data.decode("ascii", "replace") if cluster.ca_data else None
    if not cluster.tls_server_name:
        return ssl.create_default_context(cafile=cluster.ca_file, cadata=cadata)
    ctx = ServerNameContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the name, as the default does
    ctx.server_name = cluster.tls_server_name
    if cluster.ca_file or cadata:
        ctx.load_verify_locations(cafile=cluster.ca_file, cadata=cadata)
    else:
        ctx.load_default_certs()
    return ctx


def ssl_context(cluster: ClusterConfig, cert: tuple[bytes, bytes] | None) -> ssl.SSLContext | None:
    """The TLS context of new connections (None for an http:// server). ``cert``: a client key pair given as
    data (inline in the kubeconfig, or from an exec plugin); otherwise the kubeconfig's files."""
    if not cluster.server.startswith("https://"):
        return None
    try:
        if cluster.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = _verifying(cluster)
        if cert is not None:
            _load_pair(ctx, *cert)
        elif cluster.cert_file and cluster.key_file:
            ctx.load_cert_chain(cluster.cert_file, cluster.key_file)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise BackendError(f"cannot load the TLS settings of {cluster.describe()}: {exc}") from None
    return ctx


def _load_pair(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a key pair from files only: write them to a private directory, load, delete."""
    with tempfile.TemporaryDirectory(prefix="trainflow-tls-") as tmp:  # mode 0700
        paths = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
        for path, data in zip(paths, (cert, key), strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(str(paths[0]), str(paths[1]))
