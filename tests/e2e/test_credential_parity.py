"""Credential parity with kubectl (issue 19): one kubeconfig matrix against the real kube-apiserver of the kwok
testbed, each case through trainflow's public operations (``submit``, ``wait``, ``wait_async``, ``logs``, run by
tests/e2e/parity_driver.py in a fresh process with the case's environment) and through the testbed's kubectl
(``auth whoami``, ``create``, ``get``, ``logs``). Every trainflow path must agree with kubectl: both succeed, or
both fail with the same kind of failure (``config``, ``tls``, ``connect``, ``unauthorized``, ``forbidden``); a
successful ``logs`` returns kubectl's lines.

Cases: exec plugins (``client.authentication.k8s.io/v1`` and ``v1beta1``) whose token expires a few seconds
after the first run, and a v1 plugin whose client certificate rotates (each identity loses its RBAC once its
credential expired, so only a client that ran the plugin again keeps working; ``kubectl auth whoami`` reads
back the user each credential is, a certificate's CN); a token file rotated on disk (the old service account
deleted) while both waits run; inline and file certificates; ``tls-server-name`` (right and wrong);
``proxy-url``; ``HTTPS_PROXY`` and ``NO_PROXY`` from the environment with a made-up server name only the proxy
resolves (Go never proxies loopback addresses); a kubeconfig reached through a symlink, its relative paths
resolving against the link's directory; ``KUBECONFIG=a:b`` (the first file wins per key);
``insecure-skip-tls-verify`` with a CA (kubectl refuses it); in-cluster (``KUBERNETES_SERVICE_HOST``/``PORT`` and
a service-account directory, mounted at the fixed path in a private mount namespace: the code reads
/var/run/secrets/kubernetes.io/serviceaccount and cannot be pointed elsewhere, neither can kubectl).
Behind the forward proxy (tests/e2e/forward_proxy.py) the CONNECT targets of each trainflow path equal
kubectl's.

Run on a testbed (testbed/up.sh; TRAINFLOW_TESTBED_DIR names it), about three minutes (173 s measured; the
NO_PROXY case alone is a minute: trainflow retries a name that does not resolve, kubectl does not):

    uv run --frozen --extra dev --no-sync pytest -m e2e tests/e2e/test_credential_parity.py
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from credential_helpers import (
    EXEC_V1,
    EXEC_V1BETA1,
    ExecPlugin,
    exec_plugin,
    write_kubeconfig,
)
from forward_proxy import ForwardProxy
from parity_runs import (
    DriverRun,
    World,
    agree,
    b64,
    base_env,
    case_dir,
    expect_kubectl,
    kubectl_kind,
    kubectl_ops,
    plan,
)

from bounds import HANG
from conftest import TRAINER_GROUP, TRAINER_VERSION, create_namespace, delete_namespace, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LIFETIME = 8  # seconds an exec credential lives after the plugin run that issued it
FAKE_HOST = "kube-api.test"  # resolves nowhere; only the forward proxy maps it to 127.0.0.1
SERVER_NAME = "kubernetes.default.svc"  # a name in the API server's certificate


# --- the world: a namespace, a completed reference job, identities -------------------------------------------
@pytest.fixture(scope="module")
def world(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    from kubernetes import client

    class K:
        core = client.CoreV1Api(testbed.api_client)
        custom = client.CustomObjectsApi(testbed.api_client)
        rbac = client.RbacAuthorizationV1Api(testbed.api_client)

    ns = create_namespace(testbed, "parity")
    root = tmp_path_factory.mktemp("parity")
    kubectl = str(Path(testbed.state["bin"]) / "kubectl")
    assert os.access(kubectl, os.X_OK), f"no kubectl at {kubectl}"
    job = {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": "parity-ref"},
        "spec": {
            "runtimeRef": {
                "name": "torch-distributed",
                "kind": "ClusterTrainingRuntime",
                "apiGroup": TRAINER_GROUP,
            },
            "trainer": {"numNodes": 1, "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"},
        },
    }
    K.custom.create_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs", job)

    def complete() -> bool:
        obj = K.custom.get_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs", "parity-ref"
        )
        return any(c["type"] == "Complete" for c in (obj.get("status") or {}).get("conditions") or [])

    wait_until(complete, HANG, "the reference TrainJob to complete")
    selector = "jobset.sigs.k8s.io/jobset-name=parity-ref,batch.kubernetes.io/job-completion-index=0"
    (pod,) = K.core.list_namespaced_pod(ns, label_selector=selector).items
    w = World(testbed, K, ns, kubectl, "parity-ref", pod.metadata.name, root, ((root / "x"), (root / "x")))
    w.static_cert = w.certs("static", "parity-static", "system:masters")
    yield w
    for name in w.bindings:
        try:
            K.rbac.delete_cluster_role_binding(name)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
    delete_namespace(testbed, ns)


# --- static credentials and kubeconfig shapes ----------------------------------------------------------------
def static_case(world: World, name: str, d: Path) -> tuple[dict[str, str], str]:
    """(environment, kubectl's expected outcome) of one case, with its files in ``d``."""
    crt, key = world.static_cert
    files = {"ca.crt": world.ca(), "client.crt": crt, "client.key": key}
    user_files = {"client-certificate": "client.crt", "client-key": "client.key"}
    server, ns = world.testbed.server, world.namespace
    if name == "inline-certs":
        user = {"client-certificate-data": b64(crt), "client-key-data": b64(key)}
        cfg = write_kubeconfig(
            d / "config", server, user, cluster={"certificate-authority-data": b64(world.ca())}, namespace=ns
        )
        return {"KUBECONFIG": str(cfg)}, "ok"
    for target, source in files.items():
        shutil.copy(source, d / target)
    if name == "file-certs":
        cfg = write_kubeconfig(
            d / "config", server, user_files, cluster={"certificate-authority": "ca.crt"}, namespace=ns
        )
        return {"KUBECONFIG": str(cfg)}, "ok"
    if name in ("tls-server-name", "tls-server-name-wrong"):
        sni = SERVER_NAME if name == "tls-server-name" else "not-the-apiserver.test"
        cluster = {"certificate-authority": "ca.crt", "tls-server-name": sni}
        cfg = write_kubeconfig(d / "config", server, user_files, cluster=cluster, namespace=ns)
        return {"KUBECONFIG": str(cfg)}, "ok" if name == "tls-server-name" else "tls"
    if name == "symlinked-kubeconfig":
        # the file lives elsewhere; its relative paths name files beside the link (kubectl: no symlink evaluation)
        real = d.parent / f"{d.name}-real"
        real.mkdir()
        write_kubeconfig(
            real / "config", server, user_files, cluster={"certificate-authority": "ca.crt"}, namespace=ns
        )
        (d / "config").symlink_to(real / "config")
        return {"KUBECONFIG": str(d / "config")}, "ok"
    if name == "kubeconfig-merge":
        first = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "parity",
            "contexts": [{"name": "parity", "context": {"cluster": "c", "user": "u", "namespace": ns}}],
            "users": [{"name": "u", "user": {k: str(d / v) for k, v in user_files.items()}}],
        }
        second = {  # the same keys, wrong: the first file wins each
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "elsewhere",
            "clusters": [
                {"name": "c", "cluster": {"server": server, "certificate-authority": str(d / "ca.crt")}}
            ],
            "contexts": [
                {"name": "parity", "context": {"cluster": "c", "user": "u", "namespace": "default"}}
            ],
            "users": [{"name": "u", "user": {"token": "not-a-token-the-server-knows"}}],
        }
        (d / "a.yaml").write_text(yaml.safe_dump(first))
        (d / "b.yaml").write_text(yaml.safe_dump(second))
        return {"KUBECONFIG": f"{d / 'a.yaml'}{os.pathsep}{d / 'b.yaml'}"}, "ok"
    if name == "insecure-with-ca":
        cluster = {"certificate-authority": "ca.crt", "insecure-skip-tls-verify": True}
        cfg = write_kubeconfig(d / "config", server, user_files, cluster=cluster, namespace=ns)
        return {"KUBECONFIG": str(cfg)}, "config"
    raise AssertionError(name)


STATIC = ["inline-certs", "file-certs", "tls-server-name", "tls-server-name-wrong", "symlinked-kubeconfig",
          "kubeconfig-merge", "insecure-with-ca"]  # fmt: skip


@pytest.mark.parametrize("name", STATIC)
def test_static_credentials_agree_with_kubectl(world: World, name: str) -> None:
    d = case_dir(world, name)
    extra, expected = static_case(world, name, d)
    env = base_env(d, extra)
    kubectl = kubectl_ops(world, env)
    expect_kubectl(kubectl, expected)
    if expected == "ok":
        assert kubectl["whoami"]["value"] == "parity-static"
    run = DriverRun(plan(f"parity/{name}", wait_timeout=30 if expected == "ok" else 10), env)
    trainflow = run.finish()
    agree(trainflow, kubectl)
    if expected == "ok":  # the job is where the kubeconfig's context says (merge: the first file's namespace)
        assert trainflow["submit"]["value"], trainflow
        obj = world.k8s.custom.get_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, world.namespace, "trainjobs", trainflow["submit"]["value"]
        )
        assert obj["metadata"]["namespace"] == world.namespace


# --- proxies ---------------------------------------------------------------------------------------------------
@pytest.fixture
def proxy() -> Iterator[ForwardProxy]:
    p = ForwardProxy({FAKE_HOST: "127.0.0.1"}).start()
    yield p
    p.stop()


@pytest.mark.parametrize("name", ["proxy-url", "https-proxy-env", "no-proxy-env"])
def test_proxies_carry_the_same_connections_as_kubectl(world: World, proxy: ForwardProxy, name: str) -> None:
    d = case_dir(world, name)
    crt, key = world.static_cert
    shutil.copy(world.ca(), d / "ca.crt")
    user = {"client-certificate": str(crt), "client-key": str(key)}
    extra: dict[str, str] = {}
    if name == "proxy-url":  # the kubeconfig's proxy, used for every host (loopback too)
        cluster = {"certificate-authority": "ca.crt", "proxy-url": proxy.url}
        cfg = write_kubeconfig(
            d / "config", world.testbed.server, user, cluster=cluster, namespace=world.namespace
        )
        through, expected = [f"CONNECT 127.0.0.1:{world.port}"], "ok"
    else:  # a name only the proxy resolves: Go never proxies loopback, so the server needs a name here
        cluster = {"certificate-authority": "ca.crt", "tls-server-name": SERVER_NAME}
        server = f"https://{FAKE_HOST}:{world.port}"
        cfg = write_kubeconfig(d / "config", server, user, cluster=cluster, namespace=world.namespace)
        extra["HTTPS_PROXY"] = proxy.url
        if name == "no-proxy-env":
            extra["NO_PROXY"] = f"127.0.0.1,localhost,{FAKE_HOST}"
        through, expected = (
            ([], "connect") if name == "no-proxy-env" else ([f"CONNECT {FAKE_HOST}:{world.port}"], "ok")
        )
    env = base_env(d, {"KUBECONFIG": str(cfg), **extra})
    proxy.take()
    kubectl = kubectl_ops(world, env)
    expect_kubectl(kubectl, expected)
    assert sorted(set(proxy.take())) == through, "kubectl's connections"
    timeout = 30 if expected == "ok" else 5
    sync = DriverRun(
        plan(f"parity/{name}", ops=["submit", "wait", "logs"], wait_timeout=timeout), env
    ).finish()
    sync_through = sorted(set(proxy.take()))
    asyncs = DriverRun(plan(f"parity/{name}", ops=["wait_async"], wait_timeout=timeout), env).finish()
    async_through = sorted(set(proxy.take()))
    agree({**sync, "wait_async": asyncs["wait_async"]}, kubectl)
    assert sync_through == through, f"the sync path's connections: {sync_through}, kubectl's: {through}"
    assert async_through == through, f"the async path's connections: {async_through}, kubectl's: {through}"


# --- exec plugins: expiry and rotation ---------------------------------------------------------------------------
def wait_denied(world: World, kubeconfig_user: dict[str, Any], d: Path) -> None:
    """Until the API server refuses the old credential (RBAC changes reach its authorizer within a moment)."""
    cfg = write_kubeconfig(d / "old-credential", world.testbed.server, kubeconfig_user,
                           cluster={"certificate-authority": str(world.ca())}, namespace=world.namespace)  # fmt: skip
    env = base_env(d, {"KUBECONFIG": str(cfg)})

    def denied() -> bool:
        proc = subprocess.run([world.kubectl, "get", "trainjobs", "-o", "name"], capture_output=True, text=True,
                              env=env, timeout=HANG)  # fmt: skip
        return proc.returncode != 0 and kubectl_kind(proc.stderr) in ("forbidden", "unauthorized")

    wait_until(denied, HANG, "the old credential to be refused", interval=0.3)


def rotation(
    world: World, d: Path, plugin: ExecPlugin, old_user: dict[str, Any], old_binding: str
) -> tuple[Any, ...]:
    """Phase 1 (the first credential) through kubectl and trainflow; then the issuer rotates, the first
    credential's identity loses its RBAC, and every first credential issued expires; phase 2 through both
    again: only a client that ran the plugin again after expiry still works."""
    cfg = write_kubeconfig(d / "config", world.testbed.server, {"exec": plugin.entry},
                           cluster={"certificate-authority": str(world.ca())}, namespace=world.namespace)  # fmt: skip
    env = base_env(d, {"KUBECONFIG": str(cfg)})
    kubectl_env, driver_env = {**env, "PARITY_CALLER": "kubectl"}, {**env, "PARITY_CALLER": "trainflow"}
    steps = plan(f"parity/{d.name}-1")
    steps += [{"op": "pause", "name": "expire"}, *plan(f"parity/{d.name}-2")[1:]]
    run = DriverRun(steps, driver_env)
    kubectl_1 = kubectl_ops(world, kubectl_env)
    run.until("PAUSE")
    phase_1 = {s["op"]: s for s in run.steps}
    plugin.rotate()
    world.revoke(old_binding)
    wait_denied(world, old_user, d)
    time.sleep(max(0.0, math.ceil(max(plugin.run_times()) + LIFETIME) - time.time() + 0.5))  # all expired
    kubectl_2 = kubectl_ops(world, kubectl_env)
    run.steps = []
    run.resume()
    phase_2 = run.finish()
    return kubectl_1, phase_1, kubectl_2, phase_2


@pytest.mark.parametrize("api_version", [EXEC_V1, EXEC_V1BETA1], ids=["v1", "v1beta1"])
def test_exec_token_is_refreshed_after_expiry(world: World, api_version: str) -> None:
    d = case_dir(world, f"exec-token-{api_version.rsplit('/', 1)[1]}")
    (token_1, user_1), (token_2, user_2) = (world.service_account(f"{d.name}-{i}") for i in (1, 2))
    binding_1 = world.bindings[-2]
    plugin = exec_plugin(d / "plugin", tokens=[token_1, token_2], lifetime=LIFETIME, api_version=api_version)
    t0 = time.time()
    kubectl_1, phase_1, kubectl_2, phase_2 = rotation(world, d, plugin, {"token": token_1}, binding_1)
    expect_kubectl(kubectl_1, "ok")
    expect_kubectl(kubectl_2, "ok")
    assert (kubectl_1["whoami"]["value"], kubectl_2["whoami"]["value"]) == (user_1, user_2)
    agree(phase_1, kubectl_1)
    agree(phase_2, kubectl_2)
    runs = plugin.runs("trainflow")
    most = 2 + math.ceil((time.time() - t0) / LIFETIME)
    assert 2 <= runs <= most, (
        f"trainflow ran the plugin {runs} times (at least again after expiry; not per request)"
    )


def test_exec_client_certificate_rotates_after_expiry(world: World) -> None:
    d = case_dir(world, "exec-cert")
    certs = [world.certs(f"{d.name}-{i}", f"parity-cert-{i}", f"parity-certs-{d.name}-{i}") for i in (1, 2)]
    binding_1 = world.grant(
        {"kind": "Group", "name": f"parity-certs-{d.name}-1", "apiGroup": "rbac.authorization.k8s.io"}
    )
    world.grant(
        {"kind": "Group", "name": f"parity-certs-{d.name}-2", "apiGroup": "rbac.authorization.k8s.io"}
    )
    plugin = exec_plugin(d / "plugin", certs=certs, lifetime=LIFETIME)
    old_user = {"client-certificate": str(certs[0][0]), "client-key": str(certs[0][1])}
    kubectl_1, phase_1, kubectl_2, phase_2 = rotation(world, d, plugin, old_user, binding_1)
    expect_kubectl(kubectl_1, "ok")
    expect_kubectl(kubectl_2, "ok")
    # the API server authenticates each certificate as its CN: kubectl used the new one after expiry
    assert (kubectl_1["whoami"]["value"], kubectl_2["whoami"]["value"]) == ("parity-cert-1", "parity-cert-2")
    agree(phase_1, kubectl_1)
    agree(phase_2, kubectl_2)
    assert plugin.runs("trainflow") >= 2, (
        f"trainflow never ran the plugin again after expiry:\n{plugin.log()}"
    )


# --- a token file rotated on disk while both waits run -------------------------------------------------------
def test_token_file_rotated_while_waiting(world: World) -> None:
    d = case_dir(world, "token-file")
    (token_1, user_1), (token_2, user_2) = (world.service_account(f"{d.name}-{i}") for i in (1, 2))
    (d / "token").write_text(token_1)
    cfg = write_kubeconfig(d / "config", world.testbed.server, {"tokenFile": "token"},
                           cluster={"certificate-authority": str(world.ca())}, namespace=world.namespace)  # fmt: skip
    env = base_env(d, {"KUBECONFIG": str(cfg)})
    kubectl_1 = kubectl_ops(world, env)
    expect_kubectl(kubectl_1, "ok")
    assert kubectl_1["whoami"]["value"] == user_1
    steps = [{"op": "backend"}, {"op": "submit", "key": f"parity/{d.name}", "as": "job", "hold": 12},
             {"op": "waits", "job": "job", "timeout": 120}, {"op": "logs", "job": "parity-ref"}]  # fmt: skip
    run = DriverRun(steps, env)
    run.until("WAITING")
    # as the kubelet rotates a projected token: the new file replaces the old one atomically
    (d / "token.new").write_text(token_2)
    (d / "token.new").replace(d / "token")
    world.k8s.core.delete_namespaced_service_account(f"{d.name}-1", world.namespace)  # the old token: 401
    wait_denied(world, {"token": token_1}, d)
    trainflow = run.finish()
    kubectl_2 = kubectl_ops(world, env)
    expect_kubectl(kubectl_2, "ok")
    assert kubectl_2["whoami"]["value"] == user_2
    agree(trainflow, kubectl_2)


# --- in-cluster ------------------------------------------------------------------------------------------------
def test_in_cluster_agrees_with_kubectl(world: World) -> None:
    d = case_dir(world, "in-cluster")
    token, user = world.service_account("in-cluster")
    sa = d / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(token)
    shutil.copy(world.ca(), sa / "ca.crt")
    (sa / "namespace").write_text(world.namespace)
    # the fixed service-account path, in a private mount namespace (nothing outside the process sees it)
    script = (
        "mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount && "
        f'cp {sa}/* /run/secrets/kubernetes.io/serviceaccount/ && exec "$@"'
    )
    wrap = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "in-cluster"]
    probe = subprocess.run([*wrap, "cat", "/var/run/secrets/kubernetes.io/serviceaccount/namespace"],
                           capture_output=True, text=True, timeout=HANG)  # fmt: skip
    assert probe.stdout == world.namespace, f"cannot make a private mount namespace here: {probe.stderr}"
    env = base_env(d, {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(world.port)})
    kubectl = kubectl_ops(world, env, wrap)
    expect_kubectl(kubectl, "ok")
    assert kubectl["whoami"]["value"] == user
    trainflow = DriverRun(plan(f"parity/{d.name}"), env, wrap).finish()
    agree(trainflow, kubectl)
