"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from trainflow.core import get_backend
from trainflow.core.local.engine import LocalBackend


@pytest.fixture
def tests_backend(tmp_path: Path) -> Iterator[LocalBackend]:
    """A local engine of this test's own (namespace ``tests``); its jobs are cancelled afterwards."""
    be = get_backend("local", home=tmp_path / "home", namespace="tests")
    assert isinstance(be, LocalBackend)
    yield be
    for job in be.list():
        be.cancel(job.name)
