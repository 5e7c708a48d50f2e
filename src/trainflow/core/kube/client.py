"""KubeApi: runs the calls of kube/calls.py on the sync transport, each retried and translated once, here.

Every call except a create is retried (``retry.call``: 429 with Retry-After, 5xx, connection errors). A create
is POSTed once, and again only after a 429 (refused before it was processed). Every failure leaves as a
trainflow error (``apierrors.translate``): callers never see an ApiException or a status code. Answers are
the server's JSON (camelCase dicts).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

from trainflow.core.errors import BackendError, Unauthorized
from trainflow.core.kube import retry
from trainflow.core.kube.apierrors import described, translate
from trainflow.core.kube.auth import credentials_for
from trainflow.core.kube.calls import ApiException, Call
from trainflow.core.kube.config import ClusterConfig
from trainflow.core.kube.http import SyncHttp, iter_chunks, read_all
from trainflow.core.kube.lines import LineBuffer


def decode(call: Call, data: bytes) -> Any:
    """A non-streamed answer as the call reads it: a dict (JSON) or text."""
    if call.read == "text":
        return data.decode("utf-8", "replace")
    out = json.loads(data) if data else {}
    return out if isinstance(out, dict) else {}


def iter_lines(resp: Any) -> Iterator[bytes]:
    """Lines of a streamed response (followed logs), without the newline; capped (kube/lines.py)."""
    lines = LineBuffer()
    for piece in iter_chunks(resp):
        if piece:
            yield from lines.feed(piece)
    last = lines.flush()
    if last is not None:
        yield last


def policy_for(call: Call, policy: retry.RetryPolicy) -> retry.RetryPolicy:
    """The retry policy of one call: the API's, with the call's own number of attempts when it sets one."""
    return policy if call.attempts is None else dataclasses.replace(policy, attempts=call.attempts)


def _mapped(exc: Exception, call: Call, cluster: ClusterConfig | None) -> Exception:
    """The trainflow error for a failed call; a 401 names the kubeconfig user and context; a rejected create
    names the request field behind each path of the manifest it sent."""
    sent = (
        json.loads(call.body) if call.verb == "create" and call.body else None
    )  # names the request's fields
    mapped = translate(exc, call.verb, call.resource, call.namespace, call.name, sent=sent)
    if isinstance(mapped, Unauthorized) and cluster is not None:
        return Unauthorized(f"{mapped} (user {cluster.user or '?'} of {cluster.describe()})")
    return mapped


class KubeApi:
    """The sync calls of one backend: one connection pool, the process's credentials for this identity."""

    def __init__(self, cluster: ClusterConfig, policy: retry.RetryPolicy = retry.DEFAULT_POLICY) -> None:
        self.cluster = cluster
        self.policy = policy
        self._http: SyncHttp | None = None

    def __repr__(self) -> str:
        return f"KubeApi(server={self.cluster.server!r})"

    @property
    def http(self) -> SyncHttp:
        if self._http is None:
            self._http = SyncHttp(self.cluster, credentials_for(self.cluster))
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def run(self, call: Call) -> Any:
        """Send a call and read its answer (retried, translated). A streaming call returns the open response."""
        try:
            if call.verb == "create":
                return self._create(call)
            policy = policy_for(call, self.policy)
            if call.stream:
                return retry.call(self.http.send, call, policy=policy)
            return retry.call(self._read, call, policy=policy)
        except Exception as exc:
            mapped = _mapped(exc, call, self.cluster)
            if mapped is exc:
                raise
            raise mapped from exc

    def _read(self, call: Call) -> Any:
        return decode(call, read_all(self.http.send(call)))

    def _create(self, call: Call) -> Any:
        """POST once; only a 429 (refused before it was processed) is POSTed again, after Retry-After."""
        throttled = 0
        while True:
            try:
                return self._read(call)
            except Exception as exc:
                if retry.status_of(exc) == 429 and throttled < self.policy.attempts:
                    throttled += 1
                    time.sleep(retry.wait_seconds(exc, throttled, self.policy))
                    continue
                raise


def check_reachable(cluster: ClusterConfig, timeout: float = 5.0) -> None:
    """Fail fast, naming the server, when nothing answers there: one GET /version, no retries.

    Any HTTP answer (even 401/403) counts as reachable; credentials are checked by the calls that follow.
    """
    from dataclasses import replace

    from trainflow.core.kube import calls

    http = SyncHttp(cluster, credentials_for(cluster))
    try:
        read_all(http.send(replace(calls.version(), timeout=timeout)))
        return
    except ApiException:
        return  # an HTTP answer
    except BackendError:
        raise  # the kubeconfig's TLS or proxy settings, the exec plugin: already named
    except Exception as exc:
        failure = exc
    finally:
        http.close()
    where = "in-cluster config" if cluster.in_cluster else f"context {cluster.context or '(none)'}"
    raise BackendError(
        f"cannot reach the Kubernetes API server at {cluster.server} ({where}): {described(failure)}; "
        "check that the cluster is up and that KUBECONFIG / the context point at it"
    ) from failure
