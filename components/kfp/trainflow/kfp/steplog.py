"""What a step prints: progress lines, and the one failure line that makes the step fail."""

from __future__ import annotations

import sys

EXIT_FAILED = 1


def log(message: str) -> None:
    print(f"[trainflow] {message}", flush=True)


def fail(message: str) -> SystemExit:
    """Print the reason where the KFP UI shows it and make the step fail (non-zero exit)."""
    print(f"[trainflow] ERROR: {message}", file=sys.stderr, flush=True)
    print(f"[trainflow] ERROR: {message}", flush=True)
    return SystemExit(EXIT_FAILED)
