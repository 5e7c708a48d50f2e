"""Training functions both clients ship (the Kubeflow SDK and trainflow): read from this file's source text."""

from __future__ import annotations

from typing import Any


def noted(fn: Any) -> Any:
    """A decorator that exists only in the client's module (the trainer image does not have it)."""
    return fn


def train(lr: float = 0.1, epochs: int = 1, layers: list[int] | None = None, name: str = "run") -> None:
    import os

    rank = os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
    print(f"{name}: rank {rank} lr={lr} epochs={epochs} layers={layers or []}")


@noted
def train_noted(steps: int = 1) -> None:
    for step in range(steps):
        print(f"step {step}")
