"""Plans: read sequences written once and run on the sync ``KubeApi`` or the ``AsyncKubeApi``.

A plan is a generator that yields ``Read`` steps (a method name of both APIs and its arguments) and receives
each answer, or the error raised, back; its return value is the outcome. ``run`` and ``arun`` drive it.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Read:
    """One API call of a plan: ``getattr(api, method)(*args, **kwargs)``."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


Plan = Generator[Read, Any, T]


def read(method: str, *args: Any, **kwargs: Any) -> Read:
    return Read(method, args, kwargs)


def run(plan: Plan[T], api: Any) -> T:
    """Drive a plan on a sync API."""
    try:
        step = next(plan)
        while True:
            try:
                value = getattr(api, step.method)(*step.args, **step.kwargs)
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
                value = await getattr(api, step.method)(*step.args, **step.kwargs)
            except Exception as exc:
                step = plan.throw(exc)
                continue
            step = plan.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
