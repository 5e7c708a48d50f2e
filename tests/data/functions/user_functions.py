"""Functions as users write them, for the shipped-source tests (imported by path, never collected)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping


def traced(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


def tagged(*_tags: str, **_options: Any) -> Any:
    return lambda fn: fn


@traced
@tagged(
    "def",  # a decorator spanning lines, holding the word def
    owner="team",
)
# a comment between the decorators and the def
def train(cfg: Mapping[str, Any], steps: int = 2) -> dict[str, Any]:
    """Nested quotes in f-strings: valid on 3.10, rewritten by ast.unparse on 3.12+."""
    # the user's comment stays
    name = f"{cfg['name']}"
    shown = f'{cfg["name"]!r:>12}'  # fmt: skip
    print("trained", name, shown.strip(), steps)
    return {"name": name}


async def train_async(lr: float) -> None:
    print(f"lr={lr}")
