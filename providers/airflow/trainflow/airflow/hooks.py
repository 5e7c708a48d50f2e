"""TrainJobHook: turns a ``kubeflow_trainer`` connection into a trainflow core backend (cluster or local)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trainflow.airflow import _config
from trainflow.airflow.compat_sdk import BaseHook
from trainflow.airflow.provider_info import CONN_FIELDS, CONN_TYPE, DEFAULT_CONN_ID
from trainflow.airflow.version_compat import AIRFLOW_V_3_0_PLUS, AIRFLOW_V_3_2_PLUS

if TYPE_CHECKING:
    from trainflow.core.backend import Backend
    from trainflow.core.errors import InvalidRequest

_BACKENDS: dict[str, Backend] = {}
_BACKENDS_LOCK = threading.Lock()


CNCF_CONN_TYPE = "kubernetes"


def unprefixed(extra: Mapping[str, Any]) -> dict[str, Any]:
    """A connection's extras as the Airflow 3 form stores them (plain); older forms prefixed each with
    ``extra__<conn type>__`` (kubeflow_trainer's, or cncf.kubernetes' for its connections). What each name
    means, cncf.kubernetes' included, is the core's (``trainflow.core.connection``)."""
    out: dict[str, Any] = {}
    for prefix in ("", f"extra__{CONN_TYPE}__", f"extra__{CNCF_CONN_TYPE}__"):
        for key, value in extra.items():
            if (
                value in (None, "")
                or not key.startswith(prefix)
                or (not prefix and key.startswith("extra__"))
            ):
                continue
            out.setdefault(key[len(prefix) :], value)
    return out


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


def not_found(conn_id: str) -> None:
    """Airflow said "not found": fine when the connection is not set, an error when it is set in the
    environment (Airflow 3.0 drops an environment connection it cannot read, such as one whose Extra is not a
    JSON object). Falling back to discovery there would train on another cluster."""
    var = f"AIRFLOW_CONN_{conn_id.upper()}"
    raw = os.environ.get(var)
    if raw is None:
        return
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("extra"), str):
        parse_extra(conn_id, value["extra"])  # names the Extra's problem, as on the other lines
    raise connection_error(
        conn_id,
        var,
        "is set, but Airflow could not read it as a connection",
        f'set {var} to a JSON connection, e.g. {{"conn_type": "{CONN_TYPE}", "extra": {{"backend": "local"}}}}',
    )


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
    """``(backend name, get_backend kwargs)``: operator arguments over the connection's extras over
    ``[trainflow] default_backend`` / ``local_home``, merged by the core's one rule
    (``trainflow.core.connection.connection_config``). A malformed value is an error naming ``conn_id`` and
    the field: a connection that means "local" never ends up on whatever cluster the host's kubeconfig names.
    """
    from trainflow.core.connection import connection_config  # not at DAG parse time

    arguments: dict[str, Any] = {"backend": backend, "namespace": namespace, "kubeconfig": kubeconfig}
    arguments.update({"context": context, "in_cluster": in_cluster, "home": local_home})
    defaults = {"backend": _config.get("default_backend"), "home": _config.get("local_home")}
    return connection_config(
        arguments,
        unprefixed(extra or {}),
        defaults,
        connection_subject=f"{CONN_TYPE} connection {conn_id!r}" if conn_id else f"{CONN_TYPE} settings",
        subject=f"{CONN_TYPE} settings",
    )


def make_backend(name: str, kwargs: Mapping[str, Any]) -> Backend:
    """One backend per configuration per process, so waiters share the core's watch and client pool."""
    key = json.dumps([name, kwargs], sort_keys=True, default=str)
    with _BACKENDS_LOCK:
        found = _BACKENDS.get(key)
        if found is None:
            from trainflow.core.connection import get_backend

            found = get_backend(name, **dict(kwargs))
            _BACKENDS[key] = found
        return found


def form_widgets() -> dict[str, Any]:
    """``CONN_FIELDS`` as WTForms fields: the Flask UI's (Airflow 2) or those Airflow 3.0 and 3.1 turn into the
    React form (they swap WTForms' field classes for their own while asking; 3.0 needs WTForms importable)."""
    from wtforms import BooleanField, PasswordField, StringField

    text: dict[str, Any] = {}
    secret: dict[str, Any] = {}
    if not AIRFLOW_V_3_0_PLUS:  # the Flask UI's Bootstrap inputs
        from flask_appbuilder.fieldwidgets import BS3PasswordFieldWidget, BS3TextFieldWidget

        text, secret = {"widget": BS3TextFieldWidget()}, {"widget": BS3PasswordFieldWidget()}
    out: dict[str, Any] = {}
    for name, field in CONN_FIELDS.items():
        schema, label, description = field["schema"], field["label"], field["description"]
        if "boolean" in schema["type"]:
            out[name] = BooleanField(label, description=description, default=bool(schema.get("default")))
        elif schema.get("format") == "password":
            out[name] = PasswordField(label, description=description, **secret)
        else:
            out[name] = StringField(label, description=description, default=schema.get("default"), **text)
    return out


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
        """The connection form's fields where Airflow builds them from the hook (before 3.2; from 3.2 it reads
        ``conn-fields`` in provider info): the same fields, made from ``CONN_FIELDS``."""
        return {} if AIRFLOW_V_3_2_PLUS else form_widgets()

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
        from trainflow.airflow.compat_sdk import AirflowNotFoundException

        try:
            conn = self.get_connection(self.conn_id)
        except AirflowNotFoundException:
            not_found(self.conn_id)
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
        """get_conn for the triggerer: reads the connection without blocking (or deadlocking) the event loop."""
        if self._backend is None:
            extra = await self.aconnection_extra()
            name, kwargs = backend_config(extra, **self.overrides, conn_id=self.conn_id)
            # off the loop: making a backend imports the core and reads kubeconfig files
            self._backend = await asyncio.to_thread(make_backend, name, kwargs)
        return self._backend

    async def aconnection_extra(self) -> dict[str, Any] | None:
        """``connection_extra`` on an event loop (``connection_reads``): Airflow's own async reads where the line
        has them (3.3.2+), else the synchronous ones on a worker thread (the masking call of ``extra_dejson``
        raises ``DeadlockImminentError`` when run on the triggerer's loop)."""
        if not self.conn_id:
            return None
        from trainflow.airflow.compat_sdk import AirflowNotFoundException
        from trainflow.airflow.connection_reads import get_async_connection, get_async_extra_dejson

        try:
            conn = await get_async_connection(self.conn_id, hook=self)
        except AirflowNotFoundException:
            not_found(self.conn_id)
            self.log.info(
                "Connection %s not found; using [trainflow] default_backend discovery", self.conn_id
            )
            return None
        parse_extra(self.conn_id, conn.extra)  # bad JSON or a list is an error (extra_dejson gives {})
        return dict(await get_async_extra_dejson(conn) or {})

    def test_connection(self) -> tuple[bool, str]:
        try:
            backend = self.get_conn()
            names = [r.name for r in backend.runtimes()]
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return True, f"{backend.name} backend, namespace {backend.namespace}: {len(names)} runtimes"
