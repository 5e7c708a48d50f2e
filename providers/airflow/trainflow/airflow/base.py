"""Connection handling shared by every trainflow operator: conn_id plus per-task overrides -> a backend."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from trainflow.airflow.arguments import connection_overrides
from trainflow.airflow.compat_sdk import BaseOperator
from trainflow.airflow.hooks import TrainJobHook
from trainflow.airflow.provider_info import DEFAULT_CONN_ID

if TYPE_CHECKING:
    from trainflow.core.backend import Backend
    from trainflow.core.result import JobRef


class TrainJobBaseOperator(BaseOperator):
    """An operator that talks to TrainJobs through one ``kubeflow_trainer`` connection.

    :param conn_id: the connection (default ``kubeflow_trainer_default``; missing means
        ``[trainflow] default_backend`` discovery).
    :param namespace: namespace of the TrainJob (default: the connection's, then the kubeconfig's).
    :param backend: ``kubernetes`` or ``local``, overriding the connection.
    :param kubeconfig: kubeconfig path(s) overriding the connection.
    :param cluster_context: kubeconfig context overriding the connection.
    :param in_cluster: use the pod's service account, overriding the connection.
    :param local_home: local engine state directory, overriding the connection.
    """

    def __init__(
        self,
        *,
        conn_id: str | None = DEFAULT_CONN_ID,
        namespace: str | None = None,
        backend: str | None = None,
        kubeconfig: str | None = None,
        cluster_context: str | None = None,
        in_cluster: bool | None = None,
        local_home: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.namespace = namespace
        self.backend = backend
        self.kubeconfig = kubeconfig
        self.cluster_context = cluster_context
        self.in_cluster = in_cluster
        self.local_home = local_home

    @property
    def hook_params(self) -> dict[str, Any]:
        """Overrides of the connection; shipped to the triggerer (never the inline kubeconfig)."""
        return connection_overrides(self)

    @property
    def hook(self) -> TrainJobHook:
        cached = getattr(self, "_hook", None)
        if cached is None:
            cached = TrainJobHook(self.conn_id, **self.hook_params)
            self._hook = cached
        return cached

    def get_backend(self) -> Backend:
        with fail_without_retry():
            return self.hook.get_conn()

    def _ref(self, name: str, namespace: str | None) -> JobRef:
        from trainflow.core.result import JobRef

        return JobRef(name=name, namespace=namespace or self.get_backend().namespace)


@contextlib.contextmanager
def fail_without_retry() -> Iterator[None]:
    """Bad input (a malformed connection, an invalid request) fails the task at once: a retry cannot fix it."""
    from trainflow.core.errors import InvalidRequest

    try:
        yield
    except InvalidRequest as exc:
        from trainflow.airflow.compat_sdk import AirflowFailException

        raise AirflowFailException(str(exc)) from exc
