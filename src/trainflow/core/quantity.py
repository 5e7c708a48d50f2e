"""Kubernetes resource quantities (``resource.Quantity``): one grammar for every check and every count.

    <quantity> ::= <sign>? <number> <suffix>?      <number> ::= D | D.D | D. | .D   (D: ASCII digits)
    <suffix>   ::= Ki | Mi | Gi | Ti | Pi | Ei      binary SI (powers of 1024)
                 | n | u | m | k | M | G | T | P | E    decimal SI
                 | (e | E) <sign>? D                decimal exponent

Anything else is refused: ``K`` or ``ki``, an exponent followed by a suffix, spaces, ``_``, non-ASCII digits.
Written here rather than taken from ``kubernetes.utils.parse_quantity``, which accepts what the API server
refuses (``1K``, ``1e3k``, ``NaN``, ``1_000``, `` 1 ``) and would load the kubernetes client for a string check.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_GRAMMAR = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<binary>[KMGTPE])i|(?P<decimal>[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?",
    re.ASCII,
)
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"K": 10, "M": 20, "G": 30, "T": 40, "P": 50, "E": 60}
# The API server keeps a quantity's scale in an int32; past a few hundred digits no resource means anything, and
# 10**exponent of an unbounded exponent is unbounded work.
MAX_EXPONENT = 1000


def parse_quantity(value: object) -> Fraction | None:
    """The exact value of a quantity (a string, or an int as YAML gives it), or None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        value = repr(value)  # 2.5, 1e-05, nan (refused): the text a user's YAML float stands for
    if not isinstance(value, str):
        return None
    match = _GRAMMAR.fullmatch(value)
    if match is None:
        return None
    number = Fraction(match["number"] if not match["number"].endswith(".") else match["number"][:-1])
    if match["sign"] == "-":
        number = -number
    if match["binary"]:
        return number * (1 << _BINARY[match["binary"]])
    exponent = _DECIMAL[match["decimal"]] if match["decimal"] else int(match["exponent"] or 0)
    if abs(exponent) > MAX_EXPONENT:
        return None
    return number * Fraction(10) ** exponent


def is_quantity(value: object) -> bool:
    return parse_quantity(value) is not None


def quantity_value(value: object) -> int:
    """A quantity as a whole number, rounded up away from zero as ``Quantity.Value()`` does (0 if invalid)."""
    parsed = parse_quantity(value)
    if parsed is None:
        return 0
    return math.ceil(parsed) if parsed >= 0 else math.floor(parsed)
