"""One ServiceAccount's requests, counted by the API server itself: a FlowSchema per (verb, resource) that
matches only that account, and APF's ``apiserver_flowcontrol_dispatched_requests_total`` for it.

``apiserver_request_total`` counts every client; another pytest process on the same testbed (make e2e runs
two) creating TrainJobs at the same moment made a per-step count wrong. A FlowSchema sees the request's user,
so its count is this client's alone.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bounds import HANG

GROUP, VERSION, PLURAL = "flowcontrol.apiserver.k8s.io", "v1", "flowschemas"
_DISPATCHED = re.compile(r"^apiserver_flowcontrol_dispatched_requests_total\{([^}]*)\} ([0-9.e+]+)$")


def _dispatched(testbed: Any) -> dict[str, int]:
    from kubernetes import client

    resp = client.ApiClient.call_api(
        testbed.api_client, "/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False
    )[0]
    out: dict[str, int] = {}
    for line in resp.data.decode().splitlines():
        m = _DISPATCHED.match(line)
        if m:
            schema = re.search(r'flow_schema="([^"]*)"', m.group(1))
            if schema:
                out[schema.group(1)] = out.get(schema.group(1), 0) + int(float(m.group(2)))
    return out


@contextmanager
def counted(
    testbed: Any, namespace: str, account: str, calls: dict[str, tuple[str, str, str, bool]]
) -> Iterator[Any]:
    """Count ``calls`` (key -> verb, API group, resource, cluster-scoped) made by ``namespace/account``.

    Yields a function returning the counts since the schemas were in effect."""
    from kubernetes import client

    api = client.CustomObjectsApi(testbed.api_client)
    names = {key: f"tf-count-{namespace}-{key}"[:63] for key in calls}
    for key, (verb, group, resource, cluster) in calls.items():
        rule: dict[str, Any] = {"verbs": [verb], "apiGroups": [group], "resources": [resource]}
        rule |= {"clusterScope": True} if cluster else {"namespaces": [namespace]}
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "FlowSchema",
            "metadata": {"name": names[key]},
            "spec": {
                "priorityLevelConfiguration": {"name": "global-default"},
                "matchingPrecedence": 50,  # before every suggested schema but exempt and probes
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [
                    {
                        "subjects": [
                            {
                                "kind": "ServiceAccount",
                                "serviceAccount": {"name": account, "namespace": namespace},
                            }
                        ],
                        "resourceRules": [rule],
                    }
                ],
            },
        }
        api.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    try:
        deadline = time.monotonic() + HANG
        # in effect once APF's config controller has written each schema's Dangling condition
        while not all(
            any(c["type"] == "Dangling" for c in (api.get_cluster_custom_object(GROUP, VERSION, PLURAL, n)
                                                  .get("status") or {}).get("conditions", []))
            for n in names.values()
        ):  # fmt: skip
            assert time.monotonic() < deadline, f"APF did not take up the FlowSchemas within {HANG:.0f} s"
            time.sleep(0.2)
        before = _dispatched(testbed)
        yield lambda: {key: _dispatched(testbed).get(n, 0) - before.get(n, 0) for key, n in names.items()}
    finally:
        for n in names.values():
            api.delete_cluster_custom_object(GROUP, VERSION, PLURAL, n)
