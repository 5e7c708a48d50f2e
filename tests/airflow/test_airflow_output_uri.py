"""A malformed output URI fails the DAG file: the operator refuses it at parse, naming ``output_uri`` and without
the credential it may hold (issue 32; the table is tests/output_uris.py)."""

from __future__ import annotations

import pytest

from output_uris import CANARY, GOOD, MALFORMED
from trainflow.airflow.operators import TrainJobOperator
from trainflow.core import InvalidRequest


@pytest.mark.parametrize(("uri", "word"), MALFORMED)
def test_the_operator_refuses_it_at_dag_parse(uri: str, word: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        TrainJobOperator(task_id="t", command=["true"], output_uri=uri)
    assert err.value.fields == ["output_uri"], err.value
    assert word in str(err.value) and CANARY not in str(err.value)


@pytest.mark.parametrize("uri", [*GOOD, "s3://bkt/{{ run_id }}"])
def test_a_plain_or_templated_one_parses(uri: str) -> None:
    TrainJobOperator(task_id="t", command=["true"], output_uri=uri)
