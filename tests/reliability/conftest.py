"""Fixtures for the reliability suite: the e2e testbed fixtures (reused, not copied) plus kube helpers.

Tests that need the testbed are marked ``e2e`` (``make e2e`` runs them on the default instance); every
test here is marked ``reliability``. The testbed instance comes from ``TRAINFLOW_TESTBED_DIR``.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path) -> Any:
    """A helper module of another test folder, by path (registered, so ``from <name> import`` works after)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_e2e = _load("trainflow_e2e_fixtures", TESTS / "e2e" / "conftest.py")
# the loopback API server of the watch tests; the credential helpers and proxy thread of the parity suite
_load("fake_apiserver", TESTS / "unit" / "fake_apiserver.py")
_load("credential_helpers", TESTS / "e2e" / "credential_helpers.py")
_load("forward_proxy", TESTS / "e2e" / "forward_proxy.py")
# the same fixtures as tests/e2e (testbed must be up; never skipped)
testbed = _e2e.testbed
k8s = _e2e.k8s
namespace = _e2e.namespace
pytest_runtest_makereport = _e2e.pytest_runtest_makereport
Testbed = _e2e.Testbed
create_namespace = _e2e.create_namespace
delete_namespace = _e2e.delete_namespace
dump_namespace = _e2e.dump_namespace
request_totals = _e2e.request_totals
sa_kubeconfig = _e2e.sa_kubeconfig

TRAINER_GROUP, TRAINER_VERSION = "trainer.kubeflow.org", "v1alpha1"
KWOK_FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
KWOK_COMPLETE_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"
IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.reliability)


@pytest.fixture
def kube_backend(testbed: Any, namespace: str) -> Iterator[Any]:
    from trainflow.core.kube.backend import KubernetesBackend

    b = KubernetesBackend(kubeconfig=str(testbed.kubeconfig), context=testbed.context, namespace=namespace)
    yield b
    b.close()


def trainjobs(k8s: Any, ns: str) -> list[dict[str, Any]]:
    return list(
        k8s.custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs")["items"]
    )


def held_request(key: str, seconds: int = 0, **kw: Any) -> dict[str, Any]:
    """A one-node torch TrainJob request; ``seconds`` keeps its kwok pod Running that long."""
    base: dict[str, Any] = dict(
        runtime="torch-distributed",
        idempotency_key=key,
        num_nodes=1,
        image=IMAGE,
        command=["torchrun", "train.py"],
    )
    if seconds:
        base["annotations"] = {KWOK_COMPLETE_DELAY: f"{seconds}s"}
    base.update(kw)
    return base
