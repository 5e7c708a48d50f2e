"""docs/fidelity.md lists every difference the differential suite allows, each with its checker (fast suite)."""

from __future__ import annotations

import re
from pathlib import Path

from diff_intents import INTENTS
from test_pods_match_the_sdk import ROWS

DOC = Path(__file__).resolve().parents[2] / "docs" / "fidelity.md"


def doc_rows() -> set[str]:
    return set(re.findall(r"^\| ([A-Z]\d) \|", DOC.read_text(), re.M))


def test_every_allowed_difference_is_a_documented_row_with_a_checker() -> None:
    used = {row for intent in INTENTS for row in intent.rows}
    assert used <= set(ROWS) <= doc_rows()
    assert doc_rows() - set(ROWS) == {"L2"}  # checked for every intent, not per difference
    assert set(ROWS) <= used, "a documented row no intent exercises"


def test_the_doc_counts_match_the_intents() -> None:
    text = DOC.read_text()
    identical = sum(1 for i in INTENTS if not i.rows)
    assert f"**{len(INTENTS)} intents**" in text
    assert f"**{identical} identical**, **{len(INTENTS) - identical} differing" in text
    assert len(INTENTS) >= 25
    assert len({i.name for i in INTENTS}) == len(INTENTS) and len({i.id for i in INTENTS}) == len(INTENTS)


def test_every_vendored_runtime_has_an_intent() -> None:
    from trainflow.core import local_catalog

    runtimes = {r.name for r in local_catalog()} - {"torch-distributed-with-cache"}  # unusable as shipped
    assert runtimes <= {i.runtime for i in INTENTS}
