"""One retry policy for every Kubernetes read, patch, delete and watch setup (never for a create).

Retried: 429 (honouring Retry-After), 5xx, and connection-level failures (httpx transport errors, resets,
timeouts). Not retried: every other 4xx, a server certificate that does not verify, programming errors.
Bounded attempts, exponential backoff with jitter.
"""

from __future__ import annotations

import asyncio
import email.utils
import http.client
import random
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: attempts in total, backoff base/cap, the longest Retry-After honoured."""

    attempts: int = 6
    initial: float = 0.5
    max_wait: float = 8.0
    max_retry_after: float = 30.0
    jitter: float = 0.5


DEFAULT_POLICY = RetryPolicy()


def status_of(exc: BaseException) -> int | None:
    """HTTP status of an ApiException: the client libraries' or kube/transport.py's (None for other errors)."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and type(exc).__name__ == "ApiException":
        return status
    return None


def tls_failure(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification error behind a connection failure, if that is what it was."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLCertVerificationError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def is_connection_error(exc: BaseException) -> bool:
    """Transport failures: the request may not have reached the server, or its answer was lost."""
    if tls_failure(exc) is not None:
        return False  # a configuration error: trying again cannot help
    if isinstance(exc, ConnectionError | TimeoutError | http.client.HTTPException):
        return True
    httpx = sys.modules.get("httpx")  # loaded with the transports
    if httpx is not None and isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, asyncio.TimeoutError)


def is_retryable(exc: BaseException) -> bool:
    """Whether retrying an idempotent request after this error can help."""
    status = status_of(exc)
    if status is not None:
        # status 0: kubernetes_asyncio's wrapper for a transport failure
        return status in RETRYABLE_STATUS or status == 0 or 500 <= status < 600
    return is_connection_error(exc)


def _headers(exc: BaseException) -> Mapping[str, Any]:
    headers = getattr(exc, "headers", None)
    if headers is None:
        resp = getattr(exc, "http_resp", None)
        headers = getattr(resp, "headers", None)
    return headers if headers is not None else {}


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait (Retry-After: seconds or HTTP date), for 429/503 answers."""
    if status_of(exc) not in (429, 503):
        return None
    headers = _headers(exc)
    value = None
    try:
        value = headers.get("Retry-After") or headers.get("retry-after")
    except AttributeError:
        return None
    if value is None:
        return None
    text = str(value).strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff(attempt: int, policy: RetryPolicy = DEFAULT_POLICY) -> float:
    """Exponential backoff with full-ish jitter for the attempt-th retry (1-based)."""
    base = min(policy.max_wait, policy.initial * 2.0 ** max(0, attempt - 1))
    return base * (1 - policy.jitter) + random.uniform(0, base * policy.jitter)


def wait_seconds(exc: BaseException | None, attempt: int, policy: RetryPolicy = DEFAULT_POLICY) -> float:
    """How long to sleep before the next attempt: Retry-After when given (capped), else backoff."""
    if exc is not None:
        hinted = retry_after(exc)
        if hinted is not None:
            return min(hinted, policy.max_retry_after)
    return backoff(attempt, policy)


def _tenacity_kwargs(policy: RetryPolicy, deadline: float | None) -> dict[str, Any]:
    import tenacity

    def wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        delay = wait_seconds(exc, state.attempt_number, policy)
        if deadline is not None:
            delay = max(0.0, min(delay, deadline - time.time()))
        return delay

    stop: Any = tenacity.stop_after_attempt(policy.attempts)
    if deadline is not None:
        stop = stop | tenacity.stop_after_delay(max(0.0, deadline - time.time()))
    return {
        "retry": tenacity.retry_if_exception(is_retryable),
        "wait": wait,
        "stop": stop,
        "reraise": True,
    }


def call(
    fn: Callable[..., T],
    *args: Any,
    policy: RetryPolicy = DEFAULT_POLICY,
    deadline: float | None = None,
    **kwargs: Any,
) -> T:
    """Call ``fn`` and retry it on retryable errors. Only for idempotent requests."""
    import tenacity

    for attempt in tenacity.Retrying(**_tenacity_kwargs(policy, deadline)):
        with attempt:
            return fn(*args, **kwargs)
    raise AssertionError("unreachable")  # pragma: no cover


async def acall(
    fn: Callable[..., Awaitable[T]],
    *args: Any,
    policy: RetryPolicy = DEFAULT_POLICY,
    deadline: float | None = None,
    **kwargs: Any,
) -> T:
    """``call`` for coroutines (the async transport)."""
    import tenacity

    async for attempt in tenacity.AsyncRetrying(**_tenacity_kwargs(policy, deadline)):
        with attempt:
            return await fn(*args, **kwargs)
    raise AssertionError("unreachable")  # pragma: no cover
