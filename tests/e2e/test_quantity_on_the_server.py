"""The quantity grammar (core/quantity.py) against the API server: a TrainJob whose resourcesPerNode holds the
quantity is accepted by a server-side dry run (the CRD's pattern, then the Trainer's webhook, which parses it
with resource.ParseQuantity) exactly when trainflow's parser accepts it; the value is the one the server
computes (a ResourceQuota's canonical form)."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from typing import Any

import pytest

from conftest import TRAINER_GROUP, TRAINER_VERSION
from trainflow.core.quantity import MAX_EXPONENT, parse_quantity

pytestmark = pytest.mark.e2e

EDGES = [
    "1K", "1e3k", "1e3Ki", "1mi", "1ki", "1e", "1e1.5", ".", "-", "+", "k", "Ki", "1.", ".5", "+.5", "1e3",
    "1E3", "1e-3", "1E+3", "1E", "1Ei", "1.5Gi", "5n", "0x10", "1 ", " 1", "NaN", "1_000", "\u0663", "1.2.3",
    "9223372036854775807", "99999999999999999999999", "1e999", "1e-999",
]  # fmt: skip
# Past trainflow's exponent bound the server still takes a quantity; nothing there is a resource anyone has.
BEYOND_BOUND = [f"1e{MAX_EXPONENT + 1}"]


def generated(n: int, seed: int = 19) -> list[str]:
    """Strings over the grammar's pieces and near misses (tests/unit/test_quantity.py draws the same kind)."""
    rng = random.Random(seed)
    suffixes = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
    near = ["K", "ki", "mi", "i", "e", "E+", "B", "g"]
    out = []
    for _ in range(n):
        whole = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 6)))
        frac = rng.choice(
            ["", ".", "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 4)))]
        )
        exponent = rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 30))
        suffix = rng.choice([rng.choice(suffixes), exponent, rng.choice(near)])
        out.append(rng.choice(["", "+", "-"]) + whole + frac + suffix + rng.choice(["", "", "", "k", "1"]))
    return out


def dry_run(api: Any, path: str, body: dict[str, Any]) -> tuple[bool, Any]:
    from kubernetes.client import ApiException

    try:
        out = api.call_api(
            path, "POST", query_params=[("dryRun", "All")], body=body, response_type="object",
            _return_http_data_only=True, auth_settings=["BearerToken"],
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
        )  # fmt: skip
        return True, out
    except ApiException as exc:
        assert exc.status in (400, 403, 422), exc
        return False, json.loads(exc.body).get("message")


def trainjob_accepts(api: Any, namespace: str, quantity: str) -> bool:
    body = {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": "quantity-probe"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"resourcesPerNode": {"limits": {"cpu": quantity}}},
        },
    }
    return dry_run(api, f"/apis/{TRAINER_GROUP}/{TRAINER_VERSION}/namespaces/{namespace}/trainjobs", body)[0]


def server_value(api: Any, namespace: str, quantity: str) -> Fraction:
    """The server's value, from a ResourceQuota's canonical form (rounded up to a thousandth, capped at 2**63-1:
    compared where neither applies)."""
    body = {"metadata": {"name": "quantity-probe"}, "spec": {"hard": {"cpu": quantity}}}
    ok, out = dry_run(api, f"/api/v1/namespaces/{namespace}/resourcequotas", body)
    assert ok, out
    value = parse_quantity(out["spec"]["hard"]["cpu"])
    assert value is not None, out
    return value


def test_the_api_server_accepts_what_the_grammar_accepts(testbed: Any, namespace: str) -> None:
    api = testbed.api_client
    wrong, valued = [], 0
    for quantity in dict.fromkeys([*EDGES, *generated(150)]):
        ours = parse_quantity(quantity)
        if trainjob_accepts(api, namespace, quantity) != (ours is not None):
            wrong.append(
                f"{quantity!r}: server {'accepts' if ours is None else 'refuses'}, trainflow does not"
            )
        elif ours is not None and ours >= 0 and (ours * 1000).denominator == 1 and ours < 2**63:
            valued += 1
            if server_value(api, namespace, quantity) != ours:
                wrong.append(
                    f"{quantity!r}: trainflow reads {ours}, the server {server_value(api, namespace, quantity)}"
                )
    assert wrong == []
    assert valued >= 30
    for quantity in BEYOND_BOUND:  # stated, not skipped: the server takes it, trainflow refuses it
        assert trainjob_accepts(api, namespace, quantity) and parse_quantity(quantity) is None
