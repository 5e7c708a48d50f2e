"""AsyncKubeApi: the calls of kube/calls.py on an event loop, retried and translated as KubeApi does.

The async twin of ``KubeApi`` over the async transport of kube/http.py: same calls, same retry policy, same
error translation, same raw JSON. A waiter on an event loop never falls back to the sync client (nor loads it).
"""

from __future__ import annotations

from typing import Any

from trainflow.core.kube import retry
from trainflow.core.kube.calls import Call
from trainflow.core.kube.client import _mapped, decode, policy_for
from trainflow.core.kube.http import Transport, aread_all


class AsyncKubeApi:
    """Calls of one transport (one HTTP client, one event loop)."""

    def __init__(self, transport: Transport, policy: retry.RetryPolicy = retry.DEFAULT_POLICY) -> None:
        self.transport = transport
        self.policy = policy

    def __repr__(self) -> str:
        return f"AsyncKubeApi({self.transport!r})"

    async def run(self, call: Call) -> Any:
        """Send a call and read its answer; a streaming call returns the open response. Never a create."""
        try:
            if call.verb == "create":
                raise ValueError("creates go through the sync client (launch), never an event loop")
            policy = policy_for(call, self.policy)
            if call.stream:
                return await retry.acall(self.transport.send, call, policy=policy)
            return await retry.acall(self._read, call, policy=policy)
        except Exception as exc:
            mapped = _mapped(exc, call, self.transport.cluster)
            if mapped is exc:
                raise
            raise mapped from exc

    async def _read(self, call: Call) -> Any:
        return decode(call, await aread_all(await self.transport.send(call)))
