"""Which backend a step reaches, and how: the one merge of connection settings, under one set of names.

Every adapter has the same layers, strongest first: the step's own arguments (operator arguments, CLI options,
a KFP step's parameters), a stored connection (an Airflow ``kubeflow_trainer`` connection's extras, or
cncf.kubernetes' ``kubernetes`` connection's; a KFP step's ``backend_config``), then the deployment's defaults
(``[trainflow] default_backend`` and ``local_home``). Each setting comes from the strongest layer that gives it;
the way to reach a cluster (in-cluster account, kubeconfig file, inline kubeconfig) from the strongest layer
that names one, and one layer naming two is an error. A malformed value is an error naming the field, never
a fall back to another backend or cluster. The result is ``(backend name, get_backend keyword arguments)``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from trainflow.core.errors import FieldIssue, InvalidRequest

if TYPE_CHECKING:
    from trainflow.core.backend import Backend, BackendName

BACKENDS = ("kubernetes", "k8s", "local")
# get_backend's keywords (arguments; a KFP backend_config), with the other spellings adapters accept
ARGUMENT_NAMES = {
    "backend": "backend",
    "namespace": "namespace",
    "kubeconfig": "kubeconfig",
    "kubeconfig_path": "kubeconfig",
    "config_dict": "config_dict",
    "context": "context",
    "cluster_context": "context",
    "in_cluster": "in_cluster",
    "verify_ssl": "verify_ssl",
    "home": "home",
    "local_home": "home",
}
# a stored connection's extras: the kubeflow_trainer form's fields and cncf.kubernetes' (there ``kubeconfig``
# and ``kube_config`` are the file's text, not its path)
CONNECTION_NAMES = {
    "backend": "backend",
    "namespace": "namespace",
    "kubeconfig_path": "kubeconfig",
    "kube_config_path": "kubeconfig",
    "kubeconfig": "config_dict",
    "kube_config": "config_dict",
    "context": "context",
    "cluster_context": "context",
    "in_cluster": "in_cluster",
    "disable_verify_ssl": "disable_verify_ssl",
    "local_home": "home",
}
_TRUE = ("1", "true", "yes", "on", "t", "y")
_FALSE = ("0", "false", "no", "off", "f", "n", "")
_WAYS = ("in_cluster", "kubeconfig", "config_dict")

Names = Literal["arguments", "connection"]


class _Layer:
    """One layer's settings under the canonical names; errors name the field as it was written."""

    def __init__(self, values: Mapping[str, Any] | None, names: Names, subject: str) -> None:
        table = ARGUMENT_NAMES if names == "arguments" else CONNECTION_NAMES
        self.prefix = "" if names == "arguments" else "extra."
        self.subject = subject
        self.given: dict[str, tuple[str, Any]] = {}
        self.other: dict[str, Any] = {}  # get_backend's other keywords (submit_timeout, ...)
        values = dict(values or {})
        for key, canonical in table.items():  # trainflow's spelling before an alias of the same setting
            value = values.get(key)
            if value is not None and value != "" and canonical not in self.given:
                self.given[canonical] = (key, value)
        if names == "arguments":
            self.other = {k: v for k, v in values.items() if k not in table and v is not None}

    def error(self, key: str, problem: str, fix: str) -> InvalidRequest:
        return InvalidRequest([FieldIssue(self.prefix + key, problem, fix)], subject=self.subject)

    def text(self, name: str) -> str | None:
        if name not in self.given:
            return None
        key, value = self.given[name]
        if not isinstance(value, str | os.PathLike):
            raise self.error(key, f"is a {type(value).__name__}, not a string", f"give {key} as a string")
        return os.fspath(value).strip() or None

    def flag(self, name: str) -> bool | None:
        if name not in self.given:
            return None
        key, value = self.given[name]
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        text = str(value).strip().lower()
        if isinstance(value, str) and text in _TRUE + _FALSE:
            return text in _TRUE
        raise self.error(key, f"{repr(value)[:40]} is not true or false", "use true or false")

    def kubeconfig_text(self) -> dict[str, Any] | None:
        if "config_dict" not in self.given:
            return None
        key, value = self.given["config_dict"]
        parsed = _parse_kubeconfig(value)
        if parsed is None:  # never echo the value: it holds credentials
            raise self.error(key, "is not a YAML/JSON kubeconfig mapping", "paste the file")
        return parsed


def connection_config(
    arguments: Mapping[str, Any] | None = None,
    connection: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    *,
    connection_names: Names = "connection",
    connection_subject: str = "connection",
    subject: str = "backend settings",
) -> tuple[str, dict[str, Any]]:
    """``(backend name, get_backend kwargs)`` from the step's arguments over a connection over defaults.

    ``connection_names``: how the connection spells its settings (a stored connection's extras, or
    get_backend's keywords as a KFP ``backend_config`` does); ``connection_subject`` names it in errors.
    """
    layers = [
        _Layer(arguments, "arguments", subject),
        _Layer(connection, connection_names, connection_subject),
        _Layer({k: v for k, v in (defaults or {}).items() if k in ("backend", "home")}, "arguments", subject),
    ]

    def first(name: str) -> str | None:
        return next((v for v in (layer.text(name) for layer in layers) if v), None)

    source = next((layer for layer in layers if layer.text("backend")), None)
    name = (first("backend") or "kubernetes").lower()
    if name not in BACKENDS:
        assert source is not None
        raise source.error("backend", f"unknown backend {name[:40]!r}", "use kubernetes or local")
    kwargs: dict[str, Any] = {}
    for layer in reversed(layers):
        kwargs.update(layer.other)
    namespace = first("namespace")
    if namespace:
        kwargs["namespace"] = namespace
    if name == "local":
        home = first("home")
        if home:
            kwargs["home"] = home
        return name, kwargs
    kwargs.update(_way(layers))
    context = first("context")
    if context:
        kwargs["context"] = context
    verify = next((v for v in (_verify_ssl(layer) for layer in layers) if v is not None), None)
    if verify is False:
        kwargs["verify_ssl"] = (
            False  # cncf.kubernetes' disable_verify_ssl; disable_tcp_keepalive means nothing here
        )
    return "kubernetes", kwargs


def _verify_ssl(layer: _Layer) -> bool | None:
    verify = layer.flag("verify_ssl")
    disabled = layer.flag("disable_verify_ssl")
    return verify if verify is not None else (None if disabled is None else not disabled)


def _way(layers: list[_Layer]) -> dict[str, Any]:
    """How to reach the cluster: the strongest layer that names a way; an explicit in_cluster=False in a
    stronger layer turns a weaker layer's in_cluster off. Nothing named: the core's discovery."""
    in_cluster_off = False
    for layer in layers:
        flag = layer.flag("in_cluster")
        ways = {
            "in_cluster": bool(flag) and not in_cluster_off,
            "kubeconfig": layer.text("kubeconfig"),
            "config_dict": "config_dict" in layer.given,
        }
        named = [w for w in _WAYS if ways[w]]
        if len(named) > 1:
            keys = [layer.given[w][0] for w in named]
            field = layer.prefix.rstrip(".") or keys[0]
            fix = "keep only one way to reach the cluster"
            raise InvalidRequest(
                [FieldIssue(field, f"{', '.join(keys)} are mutually exclusive", fix)], subject=layer.subject
            )
        if named == ["in_cluster"]:
            return {"in_cluster": True}
        if named == ["kubeconfig"]:
            path = str(ways["kubeconfig"])
            return {"kubeconfig": os.pathsep.join(os.path.expanduser(p) for p in path.split(os.pathsep))}
        if named == ["config_dict"]:
            return {"config_dict": layer.kubeconfig_text()}
        in_cluster_off = in_cluster_off or flag is False
    # in_cluster=False alone keeps the discovery, as cncf.kubernetes' hook does (it tries in-cluster first)
    return {}


def _parse_kubeconfig(value: Any) -> dict[str, Any] | None:
    """An inline kubeconfig (a mapping, or its YAML/JSON text); None if it is neither."""
    if isinstance(value, Mapping):
        return dict(value)
    text = str(value)
    try:
        parsed = json.loads(text)
    except ValueError:
        import yaml

        try:
            parsed = yaml.safe_load(text)
        except yaml.YAMLError:
            parsed = None
    return parsed if isinstance(parsed, dict) else None


def get_backend(name: BackendName | str = "local", **config: Any) -> Backend:
    """Make a backend: ``"local"`` (embedded engine, no cluster) or ``"kubernetes"``.

    kubernetes config: ``kubeconfig``, ``context``, ``namespace``, ``in_cluster``, ``config_dict``,
    ``verify_ssl``.
    local config: ``home`` (state directory; default ``$TRAINFLOW_HOME`` or the user data dir), ``namespace``.
    The names and values are read as ``connection_config`` reads them (``cluster_context``,
    ``kubeconfig_path``, ``local_home`` too; a bad value or backend is an InvalidRequest naming it).
    """
    backend, kwargs = connection_config({**config, "backend": name})
    if backend == "local":
        from trainflow.core.local.engine import LocalBackend

        return LocalBackend(**kwargs)
    from trainflow.core.kube.backend import KubernetesBackend

    return KubernetesBackend(**kwargs)
