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
    from trainflow.core.errors import InvalidRequest

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


_FALSE = ("0", "false", "no", "off", "f", "n", "")
BACKENDS = ("kubernetes", "k8s", "local")
EXTRA_FIX = (
    'set the Extra field to a JSON object, e.g. {"backend": "local"} or {"kubeconfig_path": "~/.kube/config"}'
)


def connection_error(conn_id: str | None, field: str, problem: str, fix: str) -> InvalidRequest:
    """A bad connection or override: names the connection and the field; never falls back to another backend."""
    from trainflow.core.errors import FieldIssue, InvalidRequest  # not at DAG parse time

    subject = f"{CONN_TYPE} connection {conn_id!r}" if conn_id else f"{CONN_TYPE} settings"
    return InvalidRequest([FieldIssue(field, problem, fix)], subject=subject)


def parse_extra(conn_id: str | None, raw: Any) -> dict[str, Any]:
    """A connection's Extra as a JSON object; bad JSON or another JSON type is an error, not an empty extra."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    value = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            where = (
                f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
            )
            raise connection_error(conn_id, "extra", f"is not valid JSON{where}", EXTRA_FIX) from None
    if not isinstance(value, dict):
        kind = "list" if isinstance(value, list) else type(value).__name__
        raise connection_error(conn_id, "extra", f"is a JSON {kind}, not an object", EXTRA_FIX)
    return value


def _text(value: Any, conn_id: str | None, field: str) -> str | None:
    if value is None or isinstance(value, str):
        return value.strip() if value is not None else None
    raise connection_error(
        conn_id, f"extra.{field}", f"is a {type(value).__name__}, not a string", f"give {field} as a string"
    )


def _as_bool(value: Any, conn_id: str | None, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if isinstance(value, str) and text in _TRUE + _FALSE:
        return text in _TRUE
    shown = repr(value)[:40]
    raise connection_error(conn_id, f"extra.{field}", f"{shown} is not true or false", "use true or false")


def backend_config(
    extra: Mapping[str, Any] | None,
    *,
    backend: str | None = None,
    namespace: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    in_cluster: bool | None = None,
    local_home: str | None = None,
    conn_id: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """``(backend name, get_backend kwargs)`` from connection extras, operator overrides and ``[trainflow]``.

    Operator arguments win over the connection; without either, ``[trainflow] default_backend`` decides,
    and the kubernetes backend does its usual kubeconfig / in-cluster discovery. A malformed value (wrong
    type, unknown backend, a boolean that is neither true nor false) is an error naming ``conn_id`` and the
    field: a connection that means "local" must never end up on whatever cluster the host's kubeconfig names.
    """
    extra = dict(extra or {})

    def text(field: str) -> str | None:
        return _text(_extra_value(extra, field), conn_id, field)

    from_extra = not backend and text("backend")
    name = (backend or text("backend") or _config.get("default_backend") or "kubernetes").strip().lower()
    if name not in BACKENDS:
        raise connection_error(
            conn_id if from_extra else None,
            "extra.backend" if from_extra else "backend",
            f"unknown backend {name[:40]!r}",
            "use kubernetes or local",
        )
    kwargs: dict[str, Any] = {}
    ns = namespace or text("namespace")
    if ns:
        kwargs["namespace"] = ns
    if name == "local":
        home = local_home or text("local_home") or _config.get("local_home") or None
        if home:
            kwargs["home"] = str(home)
        return name, kwargs
    flag = _extra_value(extra, "in_cluster")
    cluster = in_cluster if in_cluster is not None else _as_bool(flag or False, conn_id, "in_cluster")
    path = kubeconfig or text("kubeconfig_path")
    inline = _extra_value(extra, "kubeconfig")
    ctx = context or text("context")
    given = [k for k, v in (("in_cluster", cluster), ("kubeconfig_path", path), ("kubeconfig", inline)) if v]
    if len(given) > 1 and not kubeconfig and in_cluster is None:
        raise connection_error(
            conn_id,
            "extra",
            f"{', '.join(given)} are mutually exclusive",
            "keep only one way to reach the cluster",
        )
    if cluster:
        kwargs["in_cluster"] = True
    elif path:
        kwargs["kubeconfig"] = os.path.expanduser(str(path))
    elif inline:
        kwargs["config_dict"] = _parse_kubeconfig(inline, conn_id)
    if ctx:
        kwargs["context"] = str(ctx)
    if _as_bool(_extra_value(extra, "disable_verify_ssl") or False, conn_id, "disable_verify_ssl"):
        kwargs["verify_ssl"] = False  # cncf.kubernetes' switch; disable_tcp_keepalive has no meaning here
    return "kubernetes", kwargs


def _parse_kubeconfig(value: Any, conn_id: str | None) -> dict[str, Any]:
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
        # Never echo the value: it holds credentials.
        raise connection_error(
            conn_id, "extra.kubeconfig", "is not a YAML/JSON kubeconfig mapping", "paste the file"
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
        parse_extra(self.conn_id, conn.extra)  # bad JSON or a list is an error (extra_dejson gives {})
        return dict(conn.extra_dejson or {})  # the same object, its secrets registered with the masker

    def backend_config(self, extra: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        if extra is None:
            extra = self.connection_extra()
        return backend_config(extra, **self.overrides, conn_id=self.conn_id)

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
                except AirflowNotFoundException:
                    conn = None
                if conn is not None:
                    parse_extra(self.conn_id, conn.extra)
                    extra = dict(conn.extra_dejson or {})
            name, kwargs = backend_config(extra, **self.overrides, conn_id=self.conn_id)
            self._backend = make_backend(name, kwargs)
        return self._backend

    def test_connection(self) -> tuple[bool, str]:
        try:
            backend = self.get_conn()
            names = [r.name for r in backend.runtimes()]
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return True, f"{backend.name} backend, namespace {backend.namespace}: {len(names)} runtimes"
