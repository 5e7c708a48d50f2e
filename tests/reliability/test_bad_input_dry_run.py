"""Case 4: hypothesis-generated requests against trainflow's validation AND the real server's dry-run.

Each request is either accepted by trainflow and by the API server (CRD schema, CEL, Trainer/JobSet
webhooks, via a server-side dry-run create), or rejected by trainflow with an error naming a request field.
Asserted: zero requests accepted by trainflow but refused by the server. Counted and published: requests
trainflow refuses although the server would take them (trainflow is stricter, e.g. pod-hostname length).

``RELIABILITY_DRY_RUN_EXAMPLES`` sets the count (CI 5,000; ``make reliability-long`` 50,000);
``RELIABILITY_SEED`` picks the sequence (default fixed, so CI is repeatable; ``random`` for a fresh one).
"""

from __future__ import annotations

import collections
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from trainflow.core import InvalidRequest, TrainJobRequest, build_trainjob, parse_request
from trainflow.core.kube import calls, retry
from trainflow.core.runtimes import RESERVED_ENV
from trainflow.core.torchtune import IMMUTABLE_CONFIGS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

EXAMPLES = int(os.environ.get("RELIABILITY_DRY_RUN_EXAMPLES", "5000"))
SEED = os.environ.get("RELIABILITY_SEED", "20240601")
WORKERS = int(os.environ.get("RELIABILITY_DRY_RUN_WORKERS", "6"))
OUT = os.environ.get("TRAINFLOW_RELIABILITY_OUT", "/tmp/trainflow-reliability")
REQUEST_FIELDS = set(TrainJobRequest.model_fields) | {"request"}

# Mostly plausible values with edge cases mixed in: unicode, Airflow run-id characters, boundaries.
weird = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=20)
airflowish = st.sampled_from(
    [
        "manual__2024-06-01T00:00:00+00:00",
        "scheduled__2024-06-01T10:00:00.123+00:00",
        "dag/task/run:1",
        "Ünïcødé",
    ]
)
dns_label = st.from_regex(r"[a-z][a-z0-9-]{0,40}[a-z0-9]", fullmatch=True)
names = st.one_of(dns_label, st.from_regex(r"[a-z][a-z0-9]{40,62}", fullmatch=True), weird, airflowish)
keys = st.one_of(dns_label, weird, airflowish)
env_names = st.one_of(
    st.from_regex(r"[A-Z_][A-Z0-9_]{0,15}", fullmatch=True),
    st.sampled_from(["PET_NNODES", "HF_TOKEN", "A-B", "a.b", "1X", "OMPI_MCA_x", "TRAINFLOW_OUTPUT_URI"]),
    weird,
)
quantity = st.one_of(
    st.sampled_from(
        [
            "1",
            "500m",
            "4Gi",
            "2.5",
            "1e3",
            "0.5",
            ".5",
            "+1",
            "1E",
            "1Ei",
            "1e100",
            "0",
            "-1",
            "x",
            "",
            "1.5Gi",
        ]
    ),
    st.integers(-2, 10**12),
    st.floats(min_value=-1, max_value=1e6, allow_nan=False),
)
resource_names = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "example.com/foo", "bad name", "a/b/c"])
label_keys = st.one_of(
    st.from_regex(r"([a-z]{1,8}\.[a-z]{2,4}/)?[a-zA-Z][-a-zA-Z0-9_.]{0,20}[a-zA-Z0-9]", fullmatch=True),
    weird,
)
label_values = st.one_of(
    st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", fullmatch=True), weird
)
uris = st.one_of(
    st.sampled_from(
        ["hf://org/model", "s3://bucket/key", "cache://store/ds", "gs://x/y", "hf://", "/abs/path"]
    ),
    weird,
)
tolerations = st.fixed_dictionaries(
    {},
    optional={
        "key": label_keys,
        "operator": st.sampled_from(["Exists", "Equal", "In"]),
        "value": label_values,
        "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute", "", "Never"]),
        "tolerationSeconds": st.integers(-1, 2**40),
    },
)
volumes = st.fixed_dictionaries(
    {"claim_name": st.one_of(dns_label, weird), "mount_path": st.sampled_from(["/data", "rel", "/a/b", "/"])},
    optional={
        "name": st.one_of(dns_label, weird),
        "read_only": st.booleans(),
        "sub_path": st.sampled_from(["x", "../x", "/abs"]),
    },
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | weird,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(weird, inner, max_size=3),
    max_leaves=6,
)


# Prebuilt values where a draw would cost more than the variety it adds (generation dominates the run time).
initializer_options = st.sampled_from(
    [
        {},
        {"endpoint": "http://minio:9000", "region": "us-east-1"},
        {"ignore_patterns": ["*.md", "*.bin"]},
        {"ignore_patterns": "*.bin"},
        {"role_arn": "arn:aws:iam::1:role/r", "endpoint": "http://s3"},
        {"access_token": "hf_plain"},
        {"secret_access_key": "plain"},
        {"bogus": "x"},
        {"ignore_patterns": 3},
        {"region": ["a", "b"]},
        {"metadata_loc": "s3://m/meta.json", "num_data_nodes": 2},
    ]
)
initializer_secrets = st.sampled_from(
    [
        {},
        {"access_token": "creds/token"},
        {"access_key_id": "creds/id", "secret_access_key": "creds/key"},
        {"endpoint": "creds/endpoint", "region": "creds/region"},
        {"bogus": "creds/x"},
        {"access_token": "Bad_Name/k"},
        {"access_key_id": "creds/ke y"},
    ]
)

# Runtime-specific strategies: what users of each runtime family send, plausible and edge cases mixed.
LORA = "model.lora_attn_modules=[q_proj,v_proj,output_proj]"
TUNE_ARGS = st.sampled_from(
    [
        "epochs=1", "batch_size=2", "dtype=bf16", LORA, "model.lora_rank=8", "model.quantize_base=True",
        "model.quantize_base=False", "model.use_dora=True", "dataset.source=json",
        "dataset=torchtune.datasets.alpaca_dataset", "epochs", "--config", *(f"{k}=/x" for k in sorted(IMMUTABLE_CONFIGS)),
    ]
)  # fmt: skip
TORCHTUNE: dict[str, st.SearchStrategy[Any]] = {
    "args": st.lists(TUNE_ARGS, max_size=4),
    "command": st.sampled_from([["tune", "run"], ["tune", "run", "lora_finetune_single_device"], ["torchrun", "x.py"]]),
    "num_nodes": st.integers(1, 3),
    "proc_per_node": st.integers(1, 4),
    "resources": st.fixed_dictionaries({}, optional={"gpu": st.integers(0, 4), "cpu": st.sampled_from(["4", "500m"])}),
    "dataset_uri": st.sampled_from(["hf://tatsu-lab/alpaca", "hf://org/ds/data/train.json", "s3://b/ds", "cache://s/t"]),
    "model_uri": st.sampled_from(["hf://meta-llama/Llama-3.2-1B-Instruct", "s3://b/m"]),
    "dataset_options": initializer_options,
    "model_options": initializer_options,
    "dataset_secret_env": initializer_secrets,
    "model_secret_env": initializer_secrets,
}  # fmt: skip
MPI_ENV = [
    *sorted(RESERVED_ENV["mpi"]),
    "OMPI_MCA_btl_tcp_if_include",
    "OMPI_MCA_pml",
    "OMPI_ALLOW_RUN_AS_ROOT",
]
MPI: dict[str, st.SearchStrategy[Any]] = {
    "command": st.sampled_from(
        [["mpirun", "python3", "t.py"], ["mpirun", "--hostfile", "/etc/mpi/hostfile", "t"]]
    ),
    "env": st.dictionaries(st.sampled_from(MPI_ENV), st.sampled_from(["eth0", "1", "ob1"]), max_size=3),
    "num_nodes": st.integers(1, 4),
    "proc_per_node": st.one_of(st.integers(1, 4), st.just("auto")),
    "function": st.just("pkg.mod:train"),
}
XGBOOST_ENV = [*sorted(RESERVED_ENV["xgboost"]), "DMLC_WORKER_CONNECT_RETRY", "DMLC_LOG_LEVEL"]
XGBOOST: dict[str, st.SearchStrategy[Any]] = {
    "env": st.dictionaries(st.sampled_from(XGBOOST_ENV), st.sampled_from(["5", "debug"]), max_size=3),
}
SPECIFIC = {"torchtune": TORCHTUNE, "mpi": MPI, "xgboost": XGBOOST}


def family(runtime: str) -> str:
    if runtime.startswith("torchtune-"):
        return "torchtune"
    return {"deepspeed-distributed": "mpi", "mlx-distributed": "mpi", "xgboost-distributed": "xgboost"}.get(
        runtime, "other"
    )


VALID: dict[str, st.SearchStrategy[Any]] = {
    "name": dns_label.filter(lambda n: len(n) <= 30),
    "idempotency_key": st.one_of(airflowish, st.text(min_size=1, max_size=80).filter(str.strip)),
    "image": st.sampled_from(["pytorch/pytorch:2.13.0", "ghcr.io/org/img@sha256:" + "a" * 64]),
    "command": st.lists(
        st.sampled_from(["torchrun", "python3", "train.py", "--x=1"]), min_size=1, max_size=3
    ),
    "args": st.lists(st.sampled_from(["--epochs=1", "lr=0.1"]), max_size=2),
    "num_nodes": st.integers(1, 8),
    "proc_per_node": st.integers(1, 8),
    "resources": st.fixed_dictionaries(
        {},
        optional={
            "cpu": st.sampled_from(["1", "500m", 2]),
            "memory": st.sampled_from(["1Gi", "512Mi"]),
            "gpu": st.integers(0, 4),
        },
    ),
    "env": st.dictionaries(
        st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True).filter(
            lambda n: (
                "TOKEN" not in n
                and "KEY" not in n
                and not n.startswith(("PET_", "OMPI_", "DMLC_", "JAX_", "TRAINFLOW_"))
            )
        ),
        weird,
        max_size=3,
    ),
    "secret_env": st.dictionaries(
        st.sampled_from(["HF_TOKEN", "WANDB_API_KEY"]), st.sampled_from(["hf/token", "wandb/key"]), max_size=2
    ),
    "output_uri": st.sampled_from(["s3://b/m", "/mnt/m", "pvc://c/p"]),
    "labels": st.dictionaries(
        st.from_regex(r"[a-z]{1,8}", fullmatch=True),
        st.from_regex(r"[a-z0-9]{0,20}", fullmatch=True),
        max_size=2,
    ),
    "annotations": st.dictionaries(
        st.from_regex(r"([a-z]{1,5}\.io/)?[a-z]{1,8}", fullmatch=True), weird, max_size=2
    ),
    "node_selector": st.dictionaries(
        st.from_regex(r"[a-z]{1,8}", fullmatch=True),
        st.from_regex(r"[a-z0-9]{1,10}", fullmatch=True),
        max_size=2,
    ),
    "tolerations": st.lists(
        st.fixed_dictionaries(
            {
                "key": st.from_regex(r"[a-z]{1,8}", fullmatch=True),
                "operator": st.just("Exists"),
                "effect": st.sampled_from(["NoSchedule", "NoExecute"]),
            }
        ),
        max_size=2,
    ),
    "service_account": dns_label,
    "volumes": st.lists(
        st.fixed_dictionaries({"claim_name": dns_label, "mount_path": st.sampled_from(["/data", "/a/b"])}),
        max_size=1,
    ),
    "image_pull_secrets": st.lists(dns_label, max_size=2, unique=True),
    "queue": dns_label,
    "suspend": st.booleans(),
    "deadline_seconds": st.integers(1, 10**6),
}
ANY: dict[str, st.SearchStrategy[Any]] = {
    "name": names,
    "idempotency_key": st.one_of(keys, st.text(max_size=300)),
    "image": st.one_of(weird, st.just("x" * 600)),
    "command": st.lists(st.one_of(st.sampled_from(["torchrun", "python3", "train.py"]), weird), max_size=4),
    "args": st.lists(st.one_of(st.sampled_from(["--epochs=1", "epochs=1", "lr=0.1"]), weird), max_size=4),
    "function": st.one_of(st.just("pkg.mod:train"), weird),
    "function_kwargs": st.dictionaries(weird, json_values, max_size=3),
    "num_nodes": st.one_of(st.integers(-1, 12), st.integers(2**31 - 2, 2**31 + 1), st.integers(100, 10**6)),
    "proc_per_node": st.one_of(st.integers(-1, 64), st.just("auto"), st.integers(2**31 - 1, 2**31)),
    "resources": st.fixed_dictionaries(
        {},
        optional={
            "cpu": quantity,
            "memory": quantity.map(str),
            "gpu": st.integers(-1, 16),
            "requests": st.dictionaries(resource_names, quantity, max_size=2),
            "limits": st.dictionaries(resource_names, quantity, max_size=2),
        },
    ),
    "env": st.dictionaries(env_names, weird, max_size=4),
    "secret_env": st.dictionaries(
        env_names, st.one_of(st.sampled_from(["hf/token", "s/k", "Bad_Name/k", "s/k:x"]), weird), max_size=2
    ),
    "dataset_uri": uris,
    "dataset_secret": st.one_of(dns_label, weird),
    "model_uri": uris,
    "model_secret": st.one_of(dns_label, weird),
    "output_uri": uris,
    "labels": st.dictionaries(label_keys, label_values, max_size=3),
    "annotations": st.dictionaries(label_keys, st.one_of(weird, st.text(max_size=2000)), max_size=3),
    "node_selector": st.dictionaries(label_keys, label_values, max_size=2),
    "tolerations": st.lists(tolerations, max_size=2),
    "service_account": st.one_of(dns_label, weird),
    "volumes": st.lists(volumes, max_size=2),
    "image_pull_secrets": st.lists(st.one_of(dns_label, weird), max_size=2),
    "queue": st.one_of(dns_label, weird),
    "suspend": st.booleans(),
    "deadline_seconds": st.one_of(st.integers(-1, 10**6), st.integers(2**63 - 2, 2**64)),
    "packages_to_install": st.lists(
        st.one_of(st.sampled_from(["numpy", "x==1.0", "--index-url=x"]), weird), max_size=2
    ),
    "pip_index_urls": st.lists(
        st.sampled_from(["https://pypi.org/simple", "u:p@x", "https://u:p@x/simple"]), max_size=2
    ),
    "dataset_options": initializer_options,
    "model_options": initializer_options,
    "dataset_secret_env": initializer_secrets,
    "model_secret_env": initializer_secrets,
    "runtime_patches": st.lists(
        st.fixed_dictionaries(
            {
                "manager": st.one_of(
                    st.sampled_from(
                        [
                            "example.com/team",
                            "team",
                            "Example.com/x",
                            "a.io/",
                            "trainflow.dev/trainflow",
                            "a.io/p q",
                        ]
                    ),
                    weird,
                )
            },
            optional={"trainingRuntimeSpec": st.just({"template": {"metadata": {"labels": {"team": "a"}}}})},
        ),
        max_size=2,
    ),
}


@st.composite
def requests(draw: st.DrawFn, runtimes: list[str]) -> dict[str, Any]:
    """A plausible request (a random subset of valid fields) with 0-3 fields drawn from anything goes."""
    data: dict[str, Any] = {"runtime": draw(st.sampled_from(runtimes))}
    data.update(draw(st.fixed_dictionaries({}, optional=VALID)))
    specific = SPECIFIC.get(family(data["runtime"]))
    if specific and draw(st.integers(0, 3)):  # mostly: the runtime family's own fields on top
        if family(data["runtime"]) == "torchtune":
            data.pop("command", None)
        data.update(draw(st.fixed_dictionaries({}, optional=specific)))
    for field in draw(st.lists(st.sampled_from(sorted(ANY)), max_size=3, unique=True)):
        data[field] = draw(ANY[field])
    return data


def _field_named(issue_field: str) -> bool:
    head = issue_field.split(".", 1)[0].split("[", 1)[0]
    return head in REQUEST_FIELDS


def _unchecked_manifest(data: dict[str, Any], runtime: Any, namespace: str) -> dict[str, Any] | None:
    """What trainflow would send if it skipped its own checks (to count where it is stricter)."""
    try:
        req = parse_request(data)
        with mock.patch("trainflow.core.manifest.validate_request"):
            return build_trainjob(req, runtime, namespace=namespace)
    except Exception:
        return None  # not representable as a request / refused by the CRD schema itself


def test_generated_requests_agree_with_the_servers_dry_run(kube_backend, namespace) -> None:
    backend = kube_backend
    runtimes = {r.name: r for r in backend.runtimes() if r.kind == "ClusterTrainingRuntime"}
    assert len(runtimes) >= 9, sorted(runtimes)
    accepted: list[tuple[dict[str, Any], dict[str, Any]]] = []
    rejected: list[tuple[dict[str, Any], InvalidRequest]] = []
    unnamed: list[tuple[dict[str, Any], str]] = []
    crashes: list[tuple[dict[str, Any], str]] = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        derandomize=False,
    )
    @given(requests(sorted(runtimes)))
    def generate(data: dict[str, Any]) -> None:
        data = {**data, "namespace": None}
        try:
            manifest = build_trainjob(data, runtimes[data["runtime"]], namespace=namespace)
        except InvalidRequest as err:
            if not err.issues or not all(_field_named(i.field) and i.problem for i in err.issues):
                unnamed.append((data, str(err)))
            rejected.append((data, err))
            return
        except Exception as exc:  # a traceback for the user: always a bug
            crashes.append((data, repr(exc)))
            return
        accepted.append((data, manifest))

    if SEED != "random":
        generate = seed(int(SEED))(generate)
    t0 = time.time()
    generate()
    t_gen = time.time() - t0

    def dry_run(manifest: dict[str, Any]) -> str | None:
        for attempt in range(1, 6):
            try:
                backend.api.run(calls.create_trainjob(namespace, manifest, dry_run=True))
                return None
            except Exception as exc:
                if retry.is_retryable(exc) and attempt < 5:
                    time.sleep(retry.backoff(attempt))
                    continue
                body = getattr(exc, "body", None) or repr(exc)
                return f"{retry.status_of(exc)}: {str(body)[:400]}"
        return "unreachable"

    stricter_candidates = [
        (d, m)
        for d, _ in rejected
        if (m := _unchecked_manifest(d, runtimes[d["runtime"]], namespace)) is not None
    ]
    t1 = time.time()
    with ThreadPoolExecutor(WORKERS) as pool:
        verdicts = list(pool.map(dry_run, [m for _, m in accepted]))
        stricter_verdicts = list(pool.map(dry_run, [m for _, m in stricter_candidates]))
    t_dry = time.time() - t1

    server_refused = [(d, v) for (d, _), v in zip(accepted, verdicts, strict=True) if v is not None]
    stricter = [d for (d, _), v in zip(stricter_candidates, stricter_verdicts, strict=True) if v is None]
    stricter_fields = collections.Counter(
        f.split(".", 1)[0].split("[", 1)[0]
        for d in stricter
        for f in next(err for dd, err in rejected if dd is d).fields
    )
    summary = {
        "examples": len(accepted) + len(rejected) + len(crashes),
        "seed": SEED,
        "accepted_by_trainflow": len(accepted),
        "accepted_by_server": len(accepted) - len(server_refused),
        "accepted_by_trainflow_rejected_by_server": len(server_refused),
        "rejected_by_trainflow": len(rejected),
        "rejected_without_a_named_field": len(unnamed),
        "crashes": len(crashes),
        "rejected_by_trainflow_but_server_would_accept": len(stricter),
        "stricter_fields": dict(stricter_fields.most_common(10)),
        "dry_runs": len(accepted) + len(stricter_candidates),
        "generate_seconds": round(t_gen, 1),
        "dry_run_seconds": round(t_dry, 1),
        "server_refusals_sample": [v for _, v in server_refused[:5]],
        "by_family": {
            fam: {
                "accepted": sum(1 for d, _ in accepted if family(d["runtime"]) == fam),
                "rejected": sum(1 for d, _ in rejected if family(d["runtime"]) == fam),
            }
            for fam in ("torchtune", "mpi", "xgboost", "other")
        },
    }
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "bad_input_dry_run.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print("\n" + json.dumps(summary, indent=2))
    assert not crashes, crashes[:3]
    assert not unnamed, unnamed[:3]
    assert not server_refused, "trainflow accepted what the server refused:\n" + "\n".join(
        f"{json.dumps(d, default=str)[:600]}\n  -> {v}" for d, v in server_refused[:5]
    )
    assert summary["examples"] >= EXAMPLES * 0.95
    assert len(accepted) >= EXAMPLES * 0.1, "the strategy produced too few valid requests to mean anything"
    for fam in ("torchtune", "mpi"):  # the runtime-specific strategies reach the server both ways
        assert summary["by_family"][fam]["accepted"] >= EXAMPLES * 0.01, summary["by_family"]
        assert summary["by_family"][fam]["rejected"] >= EXAMPLES * 0.01, summary["by_family"]
