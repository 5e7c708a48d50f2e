"""Faults at the cluster boundary against the real kube-apiserver of the kwok testbed (issue 19).

The fatal faults come from the real server where it can produce them: a service account whose RBAC allows
``get`` but not ``list``/``watch`` on TrainJobs (the server's own 403); through tests/reliability/faultproxy.py,
the wait's reads rerouted to an API group that does not exist (the server's own 404 of a resource type) and
forwarded without credentials (the server's own 401). Faults it never sends on its own are injected by the
proxy into a forwarded watch: ``ERROR`` events (500 "etcdserver: request timed out", 429) and lines of the wrong
shape. Straight from the server (HTTP/2 where it offers it, as it does: it closes a connection with GOAWAY
after a 401): a deleted service account's token (``Unauthorized``), and an exec plugin whose token is refused
mid-life (one refresh, then the wait goes on). Each on the sync path (``backend.wait``) and the async path
(``backend.wait_async``), for waiters with and without a timeout: a typed error within a bound, or the job's
real final state.

The TrainJobs are ``managedBy`` another controller so the Trainer leaves them alone: the test writes the status
(through the real API server, as the Trainer would) only after every fault was delivered.

Run on a testbed (testbed/up.sh; TRAINFLOW_TESTBED_DIR names it), about a minute:

    uv run --frozen --extra dev --no-sync pytest -m e2e tests/reliability/test_watch_faults_real.py
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from credential_helpers import exec_plugin, parked_trainjob, write_kubeconfig
from faultproxy import FaultProxy
from waits import PATHS, assert_complete, assert_fatal, assert_no_secret, wait

from bounds import HANG
from conftest import TRAINER_GROUP, TRAINER_VERSION, sa_kubeconfig
from trainflow.core import get_backend
from trainflow.core.errors import NotFound, PermissionDenied, TrainJobNotFound, Unauthorized

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

BOUND = 30.0
TIMEOUT = 10.0
PLURAL = "trainjobs"


def is_wait_read(method: str, path: str) -> bool:
    """A TrainJob list or watch of a wait (a launch's lookup of earlier attempts carries a labelSelector)."""
    route = path.split("?", 1)[0]
    return method == "GET" and route.endswith("/trainjobs") and "labelSelector" not in path


def is_trainjob_watch(method: str, path: str) -> bool:
    query = parse_qs(urlsplit(path).query)
    return is_wait_read(method, path) and query.get("watch", [""])[0].lower() in ("true", "1")


def create(k8s: Any, namespace: str, name: str) -> dict[str, Any]:
    return dict(
        k8s.custom.create_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, namespace, PLURAL, parked_trainjob(name)
        )
    )


def set_condition(k8s: Any, namespace: str, name: str, ctype: str) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {"conditions": [{"type": ctype, "status": "True", "reason": "ByTest", "message": ctype,
                              "lastTransitionTime": now}]}  # fmt: skip
    k8s.custom.patch_namespaced_custom_object_status(
        TRAINER_GROUP, TRAINER_VERSION, namespace, PLURAL, name, {"status": status}
    )


@pytest.fixture
def proxy(testbed: Any) -> Iterator[FaultProxy]:
    pki = testbed.dir / "pki"
    p = FaultProxy(testbed.server, pki / "ca.crt", pki / "admin.crt", pki / "admin.key").start()
    yield p
    p.stop()


def proxy_backend(proxy: FaultProxy, namespace: str, tmp_path: Path) -> Any:
    path = tmp_path / "proxy-kubeconfig"
    path.write_text(yaml.safe_dump(proxy.kubeconfig(namespace)))
    return get_backend("kubernetes", kubeconfig=str(path), namespace=namespace)


@pytest.fixture(autouse=True)
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


# --- 403: the server's RBAC --------------------------------------------------------------------------------
@pytest.fixture
def getter(testbed: Any, k8s: Any, namespace: str, tmp_path: Path) -> Iterator[tuple[Any, str]]:
    """A backend acting as a service account that may get TrainJobs but not list or watch them; its token."""
    k8s.core.create_namespaced_service_account(namespace, {"metadata": {"name": "getter"}})
    rule = {"apiGroups": [TRAINER_GROUP], "resources": [PLURAL], "verbs": ["get"]}
    k8s.rbac.create_namespaced_role(namespace, {"metadata": {"name": "getter"}, "rules": [rule]})
    k8s.rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "getter"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "getter"},
            "subjects": [{"kind": "ServiceAccount", "name": "getter", "namespace": namespace}],
        },
    )
    config = sa_kubeconfig(testbed, namespace, "getter", tmp_path / "getter-kubeconfig")
    token = str(yaml.safe_load(config.read_text())["users"][0]["user"]["token"])
    b = get_backend("kubernetes", kubeconfig=str(config), namespace=namespace)
    yield b, token
    b.close()


@pytest.mark.parametrize("timeout", [None, TIMEOUT], ids=["no-timeout", "timeout"])
@pytest.mark.parametrize("path", PATHS)
def test_rbac_without_list_is_permission_denied(k8s, namespace, getter, debug_logs, path, timeout):
    backend, token = getter
    create(k8s, namespace, "a")
    debug_logs.clear()  # the test's own admin client logged the TokenRequest; trainflow's records are checked
    assert backend.get("a").name == "a"  # the identity may read the job, not list or watch it
    outcome = wait(backend, path, "a", timeout, BOUND)
    assert_fatal(outcome, PermissionDenied, PLURAL, within=TIMEOUT)
    assert_no_secret(token, outcome, debug_logs)


# --- 404 of the resource type, 401: the server's own answers, through the proxy ------------------------------
def missing_group(path: str) -> str:
    return path.replace(f"/apis/{TRAINER_GROUP}/", "/apis/trainer-missing.kubeflow.org/", 1)


@pytest.mark.parametrize("timeout", [None, TIMEOUT], ids=["no-timeout", "timeout"])
@pytest.mark.parametrize("path", PATHS)
def test_a_missing_trainjob_api_is_not_found_naming_it(k8s, namespace, proxy, tmp_path, path, timeout):
    create(k8s, namespace, "a")
    rule = proxy.reroute(missing_group, is_wait_read)
    backend = proxy_backend(proxy, namespace, tmp_path)
    try:
        outcome = wait(backend, path, "a", timeout, BOUND)
    finally:
        backend.close()
    assert rule.fired >= 1
    assert_fatal(outcome, NotFound, TRAINER_GROUP, within=TIMEOUT)
    assert not isinstance(outcome.error, TrainJobNotFound), (
        f"the API is missing, not the job: {outcome.describe()}"
    )


@pytest.mark.parametrize("timeout", [None, TIMEOUT], ids=["no-timeout", "timeout"])
@pytest.mark.parametrize("path", PATHS)
def test_credentials_the_server_rejects_are_unauthorized(k8s, namespace, proxy, tmp_path, path, timeout):
    create(k8s, namespace, "a")
    rule = proxy.unauthenticate(is_wait_read)
    backend = proxy_backend(proxy, namespace, tmp_path)
    try:
        outcome = wait(backend, path, "a", timeout, BOUND)
    finally:
        backend.close()
    assert_fatal(outcome, Unauthorized, within=TIMEOUT)
    assert 1 <= rule.fired <= 8, f"{rule.fired} requests got 401: re-authentication must be bounded"


# --- 401 straight from the server (HTTP/2, as it offers: it answers a 401 and then sends GOAWAY) ------------
def service_account(k8s: Any, namespace: str, name: str) -> str:
    """A bound token of a new service account that may read TrainJobs and pods in ``namespace``."""
    from kubernetes import client

    k8s.core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    rules = [
        {"apiGroups": [TRAINER_GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods", "pods/log", "events"], "verbs": ["get", "list", "watch"]},
    ]
    k8s.rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
    k8s.rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    spec = client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    tr = k8s.core.create_namespaced_service_account_token(
        name, namespace, client.AuthenticationV1TokenRequest(spec=spec)
    )
    return str(tr.status.token)


def refused(testbed: Any, token: str, namespace: str) -> bool:
    """Whether the server answers 401 to ``token`` (a deleted service account's token is refused within
    seconds: the authenticator's cache)."""
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert = testbed.server, str(testbed.dir / "pki" / "ca.crt")
    cfg.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(cfg) as api:
        try:
            client.CoreV1Api(api).list_namespaced_pod(namespace, limit=1)
        except client.ApiException as exc:
            return exc.status == 401
    return False


def revoke(testbed: Any, k8s: Any, namespace: str, name: str, token: str) -> None:
    k8s.core.delete_namespaced_service_account(name, namespace)
    end = time.monotonic() + HANG
    while not refused(testbed, token, namespace):
        assert time.monotonic() < end, (
            f"the deleted service account's token was still accepted after {HANG:.0f} s"
        )
        time.sleep(0.5)


def token_backend(testbed: Any, namespace: str, user: dict[str, Any], path: Path) -> Any:
    cluster = {"certificate-authority": str(testbed.dir / "pki" / "ca.crt")}
    write_kubeconfig(path, testbed.server, user, cluster=cluster, namespace=namespace)
    return get_backend("kubernetes", kubeconfig=str(path), namespace=namespace)


@pytest.mark.parametrize("timeout", [None, TIMEOUT], ids=["no-timeout", "timeout"])
@pytest.mark.parametrize("path", PATHS)
def test_a_token_the_server_refuses_is_unauthorized(
    testbed, k8s, namespace, tmp_path, debug_logs, path, timeout
):
    create(k8s, namespace, "a")
    token = service_account(k8s, namespace, "gone")
    revoke(testbed, k8s, namespace, "gone", token)
    backend = token_backend(testbed, namespace, {"token": token}, tmp_path / "config")
    debug_logs.clear()  # the test's own admin client logged the TokenRequest; trainflow's records are checked
    try:
        outcome = wait(backend, path, "a", timeout, BOUND)
    finally:
        backend.close()
    assert_fatal(outcome, Unauthorized, within=TIMEOUT)
    assert_no_secret(token, outcome, debug_logs)


@pytest.mark.parametrize("path", PATHS)
def test_a_401_from_the_server_refreshes_the_exec_token_once(testbed, k8s, namespace, tmp_path, path):
    """The plugin's first token belongs to a service account that is then deleted (the server answers 401):
    the next request refreshes the credential once (the plugin's second token) and is retried."""
    create(k8s, namespace, "a")
    set_condition(k8s, namespace, "a", "Complete")
    tokens = [service_account(k8s, namespace, f"exec-{i}") for i in (1, 2)]
    plugin = exec_plugin(tmp_path / "plugin", tokens=tokens)  # no expiry: only a 401 makes it run again
    backend = token_backend(testbed, namespace, {"exec": plugin.entry}, tmp_path / "config")
    try:
        assert backend.get("a").name == "a"
        assert plugin.runs() == 1
        plugin.rotate()
        revoke(testbed, k8s, namespace, "exec-1", tokens[0])
        outcome = wait(backend, path, "a", BOUND - 5, BOUND)
    finally:
        backend.close()
    assert_complete(outcome)
    assert plugin.runs() == 2, f"a 401 ran the plugin {plugin.runs() - 1} times (one refresh expected)"


# --- ERROR events and malformed lines in a real watch stream -------------------------------------------------
def error_event(code: int, reason: str, message: str) -> bytes:
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
              "reason": reason, "code": code}  # fmt: skip
    return json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"


@pytest.mark.parametrize("path", PATHS)
def test_error_events_and_malformed_lines_end_in_the_real_state(k8s, namespace, proxy, tmp_path, path):
    """Six watches in a row each start with one fault and close; the job completes after the last."""
    job = create(k8s, namespace, "a")
    false_failed = {
        **job,
        "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "Untrue"}]},
    }
    faults = [
        error_event(500, "InternalError", "etcdserver: request timed out"),
        error_event(429, "TooManyRequests", "the server has received too many requests"),
        b"null\n",
        b"[]\n",
        json.dumps({"type": "MODIFIED", "object": "x"}).encode() + b"\n",
        json.dumps({"type": "SURPRISE", "object": false_failed}).encode() + b"\n",
    ]
    rules = [proxy.inject([line], is_trainjob_watch) for line in faults]
    backend = proxy_backend(proxy, namespace, tmp_path)

    def complete_after_faults() -> None:
        end = time.monotonic() + BOUND
        while not all(r.fired for r in rules) and time.monotonic() < end:
            time.sleep(0.05)
        set_condition(k8s, namespace, "a", "Complete")

    threading.Thread(target=complete_after_faults, daemon=True).start()
    try:
        outcome = wait(backend, path, "a", BOUND + 10, BOUND + 20)
    finally:
        backend.close()
    assert_complete(outcome)
    assert [r.fired for r in rules] == [1] * len(rules), "every fault was delivered once"
