"""Property test: any request is either rendered to a schema-valid manifest or rejected naming a field.

Never another exception, never a manifest the CRD schema or the CEL rules would refuse.
Raise the example count with HYPOTHESIS_MAX_EXAMPLES (the CI reliability run uses thousands).
"""

from __future__ import annotations

import os
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainflow.core import InvalidRequest, build_trainjob, local_catalog
from trainflow.core.runtimes import find_runtime
from trainflow.core.schema import schema_errors

CATALOG = local_catalog()
NAME_RULE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
URI_RULE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$")
MAX_EXAMPLES = int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "300"))

text = st.text(min_size=0, max_size=30)
names = st.one_of(st.from_regex(r"[a-z][-a-z0-9]{0,50}", fullmatch=True), text)
env_names = st.one_of(
    st.from_regex(r"[A-Z_][A-Z0-9_]{0,12}", fullmatch=True),
    st.sampled_from(
        ["PET_NNODES", "HF_TOKEN", "DMLC_X", "OMPI_MCA_y", "JAX_PROCESS_ID", "TRAINFLOW_OUTPUT_URI"]
    ),
    text,
)
quantities = st.one_of(
    st.sampled_from(["1", "500m", "4Gi", "2.5", "1e3", "x", "", "-1"]), st.integers(-5, 10**6)
)
requests = st.fixed_dictionaries(
    {"runtime": st.sampled_from([r.name for r in CATALOG])},
    optional={
        "name": names,
        "idempotency_key": text,
        "namespace": names,
        "image": text,
        "command": st.lists(text, max_size=4),
        "args": st.lists(text, max_size=4),
        "function": st.one_of(st.just("pkg.mod:train"), text),
        "function_kwargs": st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), text), max_size=3),
        "num_nodes": st.integers(-3, 2**33),
        "proc_per_node": st.one_of(st.integers(-2, 64), st.just("auto"), text),
        "resources": st.fixed_dictionaries(
            {}, optional={"cpu": quantities, "memory": quantities, "gpu": st.integers(-1, 8)}
        ),
        "env": st.dictionaries(env_names, text, max_size=4),
        "secret_env": st.dictionaries(env_names, st.one_of(st.just("s/k"), text), max_size=2),
        "dataset_uri": st.one_of(st.sampled_from(["hf://a/b", "s3://b/k", "cache://s/t", "gs://x"]), text),
        "model_uri": st.one_of(st.sampled_from(["hf://a/b", "s3://b/k"]), text),
        "output_uri": st.one_of(st.sampled_from(["s3://b/m", "/mnt/m", "pvc://c/p"]), text),
        "labels": st.dictionaries(
            st.one_of(st.from_regex(r"[a-z]{1,8}", fullmatch=True), text), text, max_size=3
        ),
        "node_selector": st.dictionaries(st.from_regex(r"[a-z]{1,8}", fullmatch=True), text, max_size=2),
        "service_account": names,
        "queue": names,
        "suspend": st.booleans(),
        "deadline_seconds": st.integers(-1, 2**64),
    },
)


@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(requests)
def test_request_is_rendered_valid_or_rejected_by_field(data: dict) -> None:
    runtime = find_runtime(CATALOG, data["runtime"])
    try:
        manifest = build_trainjob(data, runtime)
    except InvalidRequest as err:
        assert err.issues, "an InvalidRequest must name at least one field"
        for issue in err.issues:
            assert issue.field and issue.problem
        return
    assert list(schema_errors(manifest)) == []
    name = manifest["metadata"]["name"]
    assert NAME_RULE.match(name) and len(name) <= 63
    for key in ("dataset", "model"):
        uri = manifest["spec"].get("initializer", {}).get(key, {}).get("storageUri")
        assert uri is None or URI_RULE.match(uri)
    reserved = runtime.reserved_env()
    for env in manifest["spec"].get("trainer", {}).get("env", []):
        assert env["name"] not in reserved
        if "valueFrom" not in env:
            assert env["name"] not in data.get("secret_env", {})
