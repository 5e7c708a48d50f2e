"""Retry classification and the never-retry-a-create rule of the Kubernetes backend."""

from __future__ import annotations

import http.client
import json

import httpx
import pytest
from kubernetes.client import ApiException

from trainflow.core.errors import AlreadyExists, BackendError, OutcomeUnknown
from trainflow.core.kube import calls, retry
from trainflow.core.kube.client import KubeApi
from trainflow.core.kube.config import ClusterConfig


def api_error(status: int, headers: dict[str, str] | None = None, body: dict | None = None) -> ApiException:
    exc = ApiException(status=status, reason="x")
    exc.headers = headers or {}
    exc.body = json.dumps(body or {"kind": "Status", "message": f"status {status}"})
    return exc


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_throttling_and_server_errors_are_retryable(status):
    assert retry.is_retryable(api_error(status))


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 410, 422])
def test_other_client_errors_are_not_retryable(status):
    assert not retry.is_retryable(api_error(status))


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionResetError(104, "reset"),
        ConnectionRefusedError(111, "refused"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ReadTimeout("read timed out"),
        httpx.ConnectError("All connection attempts failed"),
        http.client.RemoteDisconnected("gone"),
        TimeoutError(),
    ],
)
def test_connection_errors_are_retryable(exc):
    assert retry.is_retryable(exc)


def test_a_certificate_that_does_not_verify_is_not_retried_and_says_so():
    import ssl

    from trainflow.core.kube.apierrors import translate

    cause = ssl.SSLCertVerificationError(
        1, "certificate verify failed: unable to get local issuer certificate"
    )
    try:
        try:
            raise cause
        except ssl.SSLError as exc:
            raise httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED]") from exc
    except httpx.ConnectError as exc:
        assert not retry.is_retryable(exc)
        mapped = translate(exc, "list", "trainjobs", "ns")
    assert isinstance(mapped, BackendError)
    assert "certificate does not verify" in str(mapped) and "certificate-authority" in str(mapped)


def test_programming_errors_are_not_retryable():
    assert not retry.is_retryable(KeyError("x"))
    assert not retry.is_retryable(ValueError("x"))


def test_retry_after_seconds_and_http_date():
    assert retry.retry_after(api_error(429, {"Retry-After": "7"})) == 7.0
    assert retry.retry_after(api_error(429, {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0.0
    assert retry.retry_after(api_error(429)) is None
    assert retry.retry_after(api_error(500, {"Retry-After": "7"})) is None
    policy = retry.RetryPolicy(max_retry_after=5)
    assert retry.wait_seconds(api_error(429, {"Retry-After": "7"}), 1, policy) == 5.0


def test_backoff_is_exponential_bounded_and_jittered():
    policy = retry.RetryPolicy(initial=1.0, max_wait=8.0, jitter=0.5)
    waits = [[retry.backoff(n, policy) for n in range(1, 7)] for _ in range(20)]
    for row in waits:
        assert 0.5 <= row[0] <= 1.0
        assert 1.0 <= row[1] <= 2.0
        assert all(w <= 8.0 for w in row)
    assert len({round(row[0], 6) for row in waits}) > 1  # jitter


def test_call_honours_retry_after_then_succeeds(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr("time.sleep", lambda s: slept.append(s))
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise api_error(429, {"Retry-After": "3"})
        if len(calls) == 2:
            raise ConnectionResetError(104, "reset")
        return "ok"

    assert retry.call(flaky) == "ok"
    assert len(calls) == 3
    assert slept[0] == 3.0
    assert 0 < slept[1] <= retry.DEFAULT_POLICY.max_wait


def test_call_gives_up_after_bounded_attempts(monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    calls = []

    def down():
        calls.append(1)
        raise api_error(503)

    with pytest.raises(ApiException):
        retry.call(down, policy=retry.RetryPolicy(attempts=4))
    assert len(calls) == 4


@pytest.mark.parametrize("status", [403, 404, 409, 422])
def test_call_does_not_retry_other_4xx(status, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    calls = []

    def bad():
        calls.append(1)
        raise api_error(status)

    with pytest.raises(ApiException):
        retry.call(bad)
    assert calls == [1]


async def test_acall_retries_coroutines(monkeypatch):
    calls = []

    async def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise api_error(502)
        return 42

    assert await retry.acall(flaky, policy=retry.RetryPolicy(initial=0.01, max_wait=0.02)) == 42
    assert len(calls) == 3


# --- create is never retried blindly (KubeApi, the API boundary) -----------------------------------


class FakeResponse:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self) -> bytes:
        return self.data

    def close(self) -> None:
        pass


class FakeHttp:
    """The sync transport's stand-in for KubeApi: raises the queued errors, then answers the POST."""

    def __init__(self, errors):
        self.errors = list(errors)
        self.posts = 0

    def send(self, call):
        assert call.method == "POST"
        self.posts += 1
        if self.errors:
            raise self.errors.pop(0)
        body = json.loads(call.body)
        return FakeResponse(json.dumps({**body, "metadata": {**body["metadata"], "uid": "u-1"}}).encode())


def kube_api(errors) -> tuple[KubeApi, FakeHttp]:
    api = KubeApi(ClusterConfig(namespace="ns", server="https://127.0.0.1:1"))
    http = FakeHttp(errors)
    api._http = http
    return api, http


def create(api: KubeApi, body: dict) -> dict:
    return api.run(calls.create_trainjob("ns", body))


BODY = {"metadata": {"name": "job-a", "namespace": "ns"}, "spec": {}}


def test_create_server_error_is_not_retried(monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    api, custom = kube_api([api_error(503)])
    with pytest.raises(BackendError, match="503"):
        create(api, BODY)
    assert custom.posts == 1


def test_create_throttled_is_posted_again_after_retry_after(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr("time.sleep", slept.append)
    api, custom = kube_api([api_error(429, {"Retry-After": "2"})])
    assert create(api, BODY)["metadata"]["uid"] == "u-1"
    assert (custom.posts, slept) == (2, [2.0])


@pytest.mark.parametrize(
    "error",
    [httpx.RemoteProtocolError("aborted"), ConnectionRefusedError(111, "x")],
)
def test_create_lost_answer_is_outcome_unknown_not_a_second_post(error):
    api, custom = kube_api([error])
    with pytest.raises(OutcomeUnknown):
        create(api, BODY)
    assert custom.posts == 1


def test_create_conflict_is_already_exists():
    api, _ = kube_api([api_error(409)])
    with pytest.raises(AlreadyExists):
        create(api, BODY)
