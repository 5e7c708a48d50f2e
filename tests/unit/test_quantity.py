"""One quantity grammar (core/quantity.py), held to the kubernetes client's parse_quantity over generated
quantities, and used by every check and count (validation, TorchTune's GPUs, the local engine's processes).
The API server's own parser is the oracle for the cases where the client is laxer (tests/e2e/test_quantity_on_the_server.py)."""

from __future__ import annotations

import re
from decimal import Decimal, localcontext
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as reference

from trainflow.core.errors import InvalidRequest
from trainflow.core.quantity import parse_quantity, quantity_value

DIGITS = "0123456789"
SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
# near misses: case, an i too many or too few, a lone exponent, units that are not Kubernetes'
NEAR = ["K", "ki", "mi", "Kib", "KiB", "i", "e", "E+", "e-", "B", "g", "x", "h", "Mb", "μ"]


@st.composite
def quantities(draw: st.DrawFn) -> str:
    sign = draw(st.sampled_from(["", "", "+", "-"]))
    whole = draw(st.text(DIGITS, max_size=9))
    frac = draw(
        st.one_of(st.just(""), st.just("."), st.text(DIGITS, min_size=1, max_size=6).map(".".__add__))
    )
    exponent = st.builds(
        lambda e, sign, digits: e + sign + digits,
        st.sampled_from("eE"),
        st.sampled_from(["", "+", "-"]),
        st.text(DIGITS, min_size=1, max_size=2),
    )
    suffix = draw(st.one_of(st.sampled_from(SUFFIXES), exponent, st.sampled_from(NEAR)))
    extra = draw(st.one_of(st.just(""), st.just(""), st.sampled_from(SUFFIXES[1:] + NEAR + ["1", "."])))
    return sign + whole + frac + suffix + extra


# Where kubernetes.utils.parse_quantity accepts what resource.Quantity refuses: an uppercase K for kilo, binary
# milli, micro and nano ("1mi" is 1/1024), and an exponent followed by an SI suffix (it reads "1e3k" as 1e3 x
# 1000). The API server refuses all three (tests/e2e/test_quantity_on_the_server.py).
LAX = re.compile(r"^[+-]?[0-9.]*(?:[0-9.][eE][+-]?[0-9]+(?:[numkKMGTPE]|[KMGTPEmnu]i)|K|[mnu]i)$")


def theirs(text: str) -> Fraction | None:
    with localcontext() as ctx:
        ctx.prec = 200  # exact for every generated value; the client multiplies in the current context
        try:
            value = reference(text)
        except (ValueError, ArithmeticError):
            return None
    assert isinstance(value, Decimal)
    return Fraction(value) if value.is_finite() else None


@settings(max_examples=1000, deadline=None)
@given(quantities())
def test_the_grammar_agrees_with_the_kubernetes_client(text: str) -> None:
    ours, ref = parse_quantity(text), theirs(text)
    if LAX.match(text) and ref is not None:
        assert ours is None, f"{text!r}: the client's laxness, refused here as the API server refuses it"
    else:
        assert ours == ref, f"{text!r}: ours {ours}, kubernetes.utils.parse_quantity {ref}"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e3", 1000),
        ("1E3", 1000),
        ("1e-3", Fraction(1, 1000)),
        ("+.5", Fraction(1, 2)),
        ("5.", 5),
        ("1.5Gi", 3 * 2**29),
        ("100m", Fraction(1, 10)),
        ("2u", Fraction(2, 10**6)),
        ("3E", 3 * 10**18),
        ("3Ei", 3 * 2**60),
        (7, 7),
        (2.5, Fraction(5, 2)),
        (1e-05, Fraction(1, 10**5)),
    ],
)
def test_values(text: object, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1K",
        "1ki",
        "1e3k",
        "1e",
        "1.5.5",
        "1 ",
        " 1",
        "2\n",
        "1_000",
        "NaN",
        "inf",
        "\u0663",
        "0x10",
        "1e1001",
    ],
)
def test_refusals(text: str) -> None:
    assert parse_quantity(text) is None
    assert parse_quantity(True) is None and parse_quantity(float("nan")) is None


def test_counts_round_up_away_from_zero_as_quantity_value_does() -> None:
    assert [quantity_value(q) for q in ("1e3", "500m", "1.2", "-1.5", "0", "x")] == [1000, 1, 2, -2, 0, 0]


def test_torchtune_counts_gpus_with_the_grammar() -> None:
    from trainflow.core import local_catalog
    from trainflow.core.request import TrainJobRequest
    from trainflow.core.runtimes import find_runtime
    from trainflow.core.torchtune import gpus_per_node

    runtime = find_runtime(local_catalog(), "torchtune-llama3.2-1b")
    request = TrainJobRequest.model_validate(
        {"runtime": runtime.name, "resources": {"limits": {"nvidia.com/gpu": "1e0"}}}
    )
    assert gpus_per_node(request, runtime) == 1  # was 0: the exponent form was not read


def test_validation_refuses_what_the_grammar_refuses() -> None:
    from trainflow.core import local_catalog
    from trainflow.core.manifest import build_trainjob
    from trainflow.core.runtimes import find_runtime

    runtime = find_runtime(local_catalog(), "torch-distributed")
    base = {"command": ["python3", "train.py"]}
    for bad in ("2\n", "\u0663", "1K"):
        with pytest.raises(InvalidRequest) as info:
            build_trainjob({**base, "resources": {"cpu": bad, "limits": {"example.com/fpga": bad}}}, runtime)
        assert info.value.fields == ["resources.cpu", "resources.limits.example.com/fpga"], bad
    build_trainjob({**base, "resources": {"cpu": "1e1", "memory": "1.5Gi"}}, runtime)


def test_the_local_engine_counts_processes_with_the_grammar() -> None:
    from trainflow.core.local.policies import _cpu_count, _gpu_count

    assert _gpu_count({"limits": {"nvidia.com/gpu": "2e0"}}) == 2  # was 0
    assert _cpu_count({"requests": {"cpu": "1500m"}}) == 2
    assert _cpu_count({"requests": {"cpu": "1e1"}}) == 10  # was 0
