"""The operator's arguments are checked at DAG parse exactly as the run checks them (issue 19, the front door).

Property: for every TrainJobRequest field and any generated value of any type (whole numbers written with
signs, underscores, spaces, other scripts' digits or a fraction; booleans; floats; function references;
lists; mappings; None), building the operator in a DAG file succeeds exactly when the task's run accepts the
same value: ``TrainJobRequest`` through the core's ``parse_request``, then the rules validation applies to that
value without a runtime (the ranges of ``COUNT_RANGES``, the ``module:function`` form). A value Airflow fills
in later (a template, an XComArg) fails the parse only for what no rendering of it can fix: a plain entry
beside a template (``{"": None, "A": "{{ x }}"}`` for ``env``) is refused as the run would refuse it.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trainflow.airflow.arguments import (
    NOT_TEMPLATED,
    OPERATOR_OWNED,
    REQUEST_FIELDS,
    build,
    deferred,
    operator_arg,
)
from trainflow.airflow.identity import ti_identity
from trainflow.airflow.operators import TrainJobOperator
from trainflow.core import InvalidRequest, local_catalog
from trainflow.core.request import COUNT_RANGES
from trainflow.core.runtimes import find_runtime
from trainflow.core.validation import validate_request

MAX_EXAMPLES = int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "400"))
RUNTIME = find_runtime(local_catalog(), "torch-distributed")
VALUE_RULE_FIELDS = (*COUNT_RANGES, "function", "output_uri")  # the rules of validation the parse applies too
CONTEXT = {
    "ti": SimpleNamespace(
        dag_id="d",
        task_id="t",
        run_id="r",
        map_index=-1,
        try_number=1,
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
    )
}

digits = st.characters(categories=["Nd"])  # every script's decimal digits (Arabic-Indic, Devanagari, ...)
whole_texts = st.one_of(
    st.from_regex(r"[ ]?[+-]?[0-9]{1,3}(_[0-9]{1,3})?(\.0+)?[ ]?", fullmatch=True),
    st.builds(lambda a, b: f"{a}{b}", digits, st.sampled_from(["", "0", "1"])),
    st.sampled_from(["60.0", "60.5", "1e3", "0x10", "2.", ".5", "", " ", "-0", "9" * 30, "auto", "all"]),
)
function_refs = st.one_of(
    st.from_regex(
        r"[A-Za-z_][A-Za-z0-9_]{0,6}(\.[A-Za-z_][A-Za-z0-9_]{0,6}){0,2}:[A-Za-z_]\w{0,6}(\.\w{1,6})?",
        fullmatch=True,
    ),
    st.sampled_from(["pkg.mod:Class.method", "train", "m:", ":f", "a-b:c", "m:f()", "1m:f"]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.integers(2**31 - 2, 2**31 + 1),
    st.integers(2**63 - 1, 2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([2.0, 1.5, -1.0]),
    whole_texts,
    function_refs,
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
FIELDS = [f for f in REQUEST_FIELDS if f not in OPERATOR_OWNED]


def run_accepts(fields: dict[str, Any]) -> bool:
    """What the task's run says of these request fields: the model, then validation's runtime-free rules."""
    try:
        request = build(fields, ti_identity(CONTEXT))  # what TrainJobOperator.build_request does at execute
    except InvalidRequest:
        return False
    try:
        validate_request(request, RUNTIME)
    except InvalidRequest as err:
        named = [i.field for i in err.issues if i.field.split(".")[0].split("[")[0] in VALUE_RULE_FIELDS]
        return not [n for n in named if n.split(".")[0].split("[")[0] in fields]
    return True


# what a template may render to (render_template_as_native_obj: any type); a parse refusal of a value holding a
# template must hold for every one of them
RENDERINGS = (1, 2.0, "x", "m:f", "s3://b/p", True, [1], {"k": "v"})


def rendered(value: Any, to: Any) -> Any:
    """``value`` with every template in it (a string Airflow renders: a mapping's values, never its keys)
    replaced by ``to``."""
    if isinstance(value, str):
        return to if deferred(value) else value
    if isinstance(value, dict):
        return {k: rendered(v, to) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(rendered(v, to) for v in value)
    return value


def expected_at_parse(fields: dict[str, Any], parsed: bool) -> bool:
    """What the parse must say of ``fields``: the run's verdict for plain values; for values holding a
    template, a refusal only where the run refuses every rendering of them (else acceptance)."""
    if not any(deferred(v) for v in fields.values()):
        return run_accepts(fields)
    if parsed:
        return True
    return any(run_accepts({f: rendered(v, to) for f, v in fields.items()}) for to in RENDERINGS)


def parse_accepts(**kwargs: Any) -> bool:
    try:
        TrainJobOperator(task_id="t", **kwargs)
    except InvalidRequest:
        return False
    return True


@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(FIELDS), value=values)
def test_an_argument_is_refused_at_parse_exactly_when_the_run_refuses_it(field: str, value: Any) -> None:
    arg = operator_arg(field)
    literal = arg in NOT_TEMPLATED  # not rendered: a "{{ }}" there is the value itself
    if value is None or value is False:
        return  # an unset argument (the operator leaves it out)
    parsed = parse_accepts(**{arg: value})
    expected = run_accepts({field: value}) if literal else expected_at_parse({field: value}, parsed)
    assert parsed == expected, (arg, value)


@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from([*FIELDS, *OPERATOR_OWNED]), value=values)
@example(field="env", value={"": None, "0": "{{"})  # a plain entry no rendering fixes, beside a template
@example(field="labels", value={"a": "{{ x }}"})
def test_a_request_field_is_refused_at_parse_exactly_when_the_run_refuses_it(field: str, value: Any) -> None:
    """``request`` is templated as a whole: any value in it may be a template."""
    parsed = parse_accepts(request={field: value})
    assert parsed == expected_at_parse({field: value}, parsed), (field, value)


@pytest.mark.parametrize(
    ("arg", "value"),
    [
        ("num_nodes", "+2"),
        ("num_nodes", "2_0"),
        ("num_nodes", True),
        ("deadline_seconds", "60.0"),
        ("proc_per_node", " 4 "),
        ("function", "pkg.mod:Class.method"),
    ],
)
def test_what_the_model_reads_is_accepted_at_parse(arg: str, value: Any) -> None:
    """The cases the earlier hand-written check refused though the run accepts them."""
    assert parse_accepts(**{arg: value}) and run_accepts({arg: value})


@pytest.mark.parametrize("value", ["\u0663", "\u0969", "\uff13", "\u00b2"])  # ٣ ३ fullwidth 3, superscript 2
def test_digits_of_other_scripts_are_refused_at_parse_as_at_run(value: str) -> None:
    with pytest.raises(InvalidRequest, match=r"num_nodes: '.' is not a whole number of 1 or more"):
        TrainJobOperator(task_id="t", num_nodes=value)
    assert not run_accepts({"num_nodes": value})


def test_templates_and_xcom_args_are_left_for_the_run() -> None:
    from airflow.sdk import DAG, task

    with DAG("d", schedule=None, start_date=datetime(2026, 1, 1)):

        @task
        def n() -> int:
            return 2

        TrainJobOperator(task_id="t", num_nodes=n(), env={"A": n()}, deadline_seconds="{{ params.d }}")
    with pytest.raises(InvalidRequest, match=re.escape("function: '{{ x }}' is not 'module:function'")):
        TrainJobOperator(task_id="u", function="{{ x }}")  # not templated: the text is the value


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(InvalidRequest) as err:
        TrainJobOperator(
            task_id="t",
            num_nodes=0,
            command="python train.py",
            env=["A=1"],
            request={"num_node": 2, "secret_env": {"TOKEN": "hunter2-is-not-a-ref"}},
            on_kill_action="destroy",
        )
    text = str(err.value)
    assert err.value.fields == [
        "on_kill_action",
        "request.num_node",
        "request.secret_env.TOKEN",
        "command",
        "num_nodes",
        "env",
    ], text
    assert "hunter2" not in text  # a value that may be a secret is never echoed


def test_a_mappings_keys_are_never_templates() -> None:
    """Airflow renders a mapping's values, not its keys (its templater, 2.x and 3.x): a "{{" key is literal."""
    assert not deferred({"{{ ds }}": "x"}) and deferred({"x": "{{ ds }}"})
    assert deferred([{"x": "{% if 1 %}a{% endif %}"}]) and not deferred([{"{%": 1}])
