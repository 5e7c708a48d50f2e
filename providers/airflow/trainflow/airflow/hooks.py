"""TrainJobHook: turns a ``kubeflow_trainer`` connection into a trainflow core backend (cluster or local)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from trainflow.airflow import _config
from trainflow.airflow.provider_info import CONN_FIELDS, CONN_TYPE, DEFAULT_CONN_ID

if TYPE_CHECKING:
    from trainflow.core.backend import Backend

_BACKENDS: dict[str, Backend] = {}
_BACKENDS_LOCK = threading.Lock()
_TRUE = ("1", "true", "yes", "on", "t", "y")


# The extras of a cncf.kubernetes ``kubernetes`` connection, under the trainflow field they mean: the
# connection users already have (``kubernetes_default``) reaches the same cluster here.
CNCF_ALIASES = {
    "kubeconfig_path": "kube_config_path",
    "kubeconfig": "kube_config",
    "context": "cluster_context",
    "in_cluster": "in_cluster",
    "namespace": "namespace",
}
CNCF_CONN_TYPE = "kubernetes"


def _extra_value(extra: Mapping[str, Any], field: str) -> Any:
    """A connection extra as the Airflow 3 form stores it (plain) or older forms did (prefixed), under the
    trainflow name or the cncf.kubernetes one (``kube_config_path``, ``cluster_context``, ...)."""
    names = [field] + ([CNCF_ALIASES[field]] if field in CNCF_ALIASES else [])
    for name in dict.fromkeys(names):
        for key in (name, f"extra__{CONN_TYPE}__{name}", f"extra__{CNCF_CONN_TYPE}__{name}"):
            value = extra.get(key)
            if value not in (None, ""):
                return value
    return None


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in _TRUE


def backend_config(
    extra: Mapping[str, Any] | None,
    *,
    backend: str | None = None,
    namespace: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    in_cluster: bool | None = None,
    local_home: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """``(backend name, get_backend kwargs)`` from connection extras, operator overrides and ``[trainflow]``.

    Operator arguments win over the connection; without either, ``[trainflow] default_backend`` decides,
    and the kubernetes backend does its usual kubeconfig / in-cluster discovery.
    """
    extra = dict(extra or {})
    name = backend or _extra_value(extra, "backend") or _config.get("default_backend") or "kubernetes"
    name = str(name).strip().lower()
    kwargs: dict[str, Any] = {}
    ns = namespace or _extra_value(extra, "namespace")
    if ns:
        kwargs["namespace"] = str(ns)
    if name == "local":
        home = local_home or _extra_value(extra, "local_home") or _config.get("local_home") or None
        if home:
            kwargs["home"] = str(home)
        return name, kwargs
    if name not in ("kubernetes", "k8s"):
        from trainflow.core.errors import InvalidRequest

        raise InvalidRequest.one(
            "backend",
            f"unknown backend {name!r}",
            f"set the {CONN_TYPE} connection's backend to kubernetes or local",
        )
    cluster = in_cluster if in_cluster is not None else _as_bool(_extra_value(extra, "in_cluster") or False)
    path = kubeconfig or _extra_value(extra, "kubeconfig_path")
    inline = _extra_value(extra, "kubeconfig")
    ctx = context or _extra_value(extra, "context")
    given = [k for k, v in (("in_cluster", cluster), ("kubeconfig_path", path), ("kubeconfig", inline)) if v]
    if len(given) > 1 and not kubeconfig and in_cluster is None:
        from trainflow.core.errors import InvalidRequest

        raise InvalidRequest.one(
            "connection",
            f"{', '.join(given)} are mutually exclusive",
            "keep only one way to reach the cluster",
        )
    if cluster:
        kwargs["in_cluster"] = True
    elif path:
        kwargs["kubeconfig"] = os.path.expanduser(str(path))
    elif inline:
        kwargs["config_dict"] = _parse_kubeconfig(inline)
    if ctx:
        kwargs["context"] = str(ctx)
    if _as_bool(_extra_value(extra, "disable_verify_ssl") or False):
        kwargs["verify_ssl"] = False  # cncf.kubernetes' switch; disable_tcp_keepalive has no meaning here
    return "kubernetes", kwargs


def _parse_kubeconfig(value: Any) -> dict[str, Any]:
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
    if not isinstance(parsed, dict):
        from trainflow.core.errors import InvalidRequest

        # Never echo the value: it holds credentials.
        raise InvalidRequest.one(
            "connection.kubeconfig", "is not a YAML/JSON kubeconfig mapping", "paste the file"
        )
    return parsed


def make_backend(name: str, kwargs: Mapping[str, Any]) -> Backend:
    """One backend per configuration per process, so waiters share the core's watch and client pool."""
    key = json.dumps([name, kwargs], sort_keys=True, default=str)
    with _BACKENDS_LOCK:
        found = _BACKENDS.get(key)
        if found is None:
            from trainflow.core.backend import get_backend

            found = get_backend(name, **dict(kwargs))
            _BACKENDS[key] = found
        return found


class TrainJobHook(BaseHook):
    """Gives operators, sensors and triggers a trainflow backend for one ``kubeflow_trainer`` connection.

    A missing connection is not an error: the backend named by ``[trainflow] default_backend`` is used
    (kubernetes: kubeconfig / in-cluster discovery).
    """

    conn_name_attr = "conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = CONN_TYPE
    hook_name = "Kubeflow Trainer"

    def __init__(
        self,
        conn_id: str | None = DEFAULT_CONN_ID,
        *,
        backend: str | None = None,
        namespace: str | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        in_cluster: bool | None = None,
        local_home: str | None = None,
    ) -> None:
        super().__init__()
        self.conn_id = conn_id
        self.overrides: dict[str, Any] = {
            "backend": backend,
            "namespace": namespace,
            "kubeconfig": kubeconfig,
            "context": context,
            "in_cluster": in_cluster,
            "local_home": local_home,
        }
        self._backend: Backend | None = None

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """Airflow 3 builds the form from ``conn-fields`` in provider info; nothing to add here."""
        return {}

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {"hidden_fields": ["host", "schema", "port", "login", "password"], "relabeling": {}}

    @staticmethod
    def conn_fields() -> dict[str, Any]:
        return dict(CONN_FIELDS)

    def connection_extra(self) -> dict[str, Any] | None:
        """The connection's extras, or None when the connection does not exist."""
        if not self.conn_id:
            return None
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            conn = self.get_connection(self.conn_id)
        except AirflowNotFoundException:
            self.log.info(
                "Connection %s not found; using [trainflow] default_backend discovery", self.conn_id
            )
            return None
        return dict(conn.extra_dejson or {})

    def backend_config(self, extra: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        if extra is None:
            extra = self.connection_extra()
        return backend_config(extra, **self.overrides)

    def get_conn(self) -> Backend:
        """The trainflow backend (``trainflow.core.Backend``) this connection points at."""
        if self._backend is None:
            name, kwargs = self.backend_config()
            self._backend = make_backend(name, kwargs)
        return self._backend

    get_backend = get_conn

    async def aget_backend(self) -> Backend:
        """get_conn for the triggerer: reads the connection without blocking the event loop."""
        if self._backend is None:
            extra: dict[str, Any] | None = None
            if self.conn_id:
                from airflow.sdk.exceptions import AirflowNotFoundException

                try:
                    conn = await self.aget_connection(self.conn_id)
                    extra = dict(conn.extra_dejson or {})
                except AirflowNotFoundException:
                    extra = None
            name, kwargs = backend_config(extra, **self.overrides)
            self._backend = make_backend(name, kwargs)
        return self._backend

    def test_connection(self) -> tuple[bool, str]:
        try:
            backend = self.get_conn()
            names = [r.name for r in backend.runtimes()]
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return True, f"{backend.name} backend, namespace {backend.namespace}: {len(names)} runtimes"
