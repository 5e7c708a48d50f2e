"""Plans: read sequences written once and run on the sync ``KubeApi`` or the ``AsyncKubeApi``.

A plan is a generator that yields ``Call`` steps (kube/calls.py) and receives each answer, or the error raised,
back; its return value is the outcome. ``run`` and ``arun`` drive it.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeVar

from trainflow.core.kube.calls import Call

T = TypeVar("T")

Plan = Generator[Call, Any, T]


def run(plan: Plan[T], api: Any) -> T:
    """Drive a plan on a sync API."""
    try:
        step = next(plan)
        while True:
            try:
                value = api.run(step)
            except Exception as exc:
                step = plan.throw(exc)
                continue
            step = plan.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def arun(plan: Plan[T], api: Any) -> T:
    """Drive a plan on an async API (each step awaited on the event loop)."""
    try:
        step = next(plan)
        while True:
            try:
                value = await api.run(step)
            except Exception as exc:
                step = plan.throw(exc)
                continue
            step = plan.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
