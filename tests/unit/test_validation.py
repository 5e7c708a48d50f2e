"""Bad input is rejected offline with one message per problem naming the field and the fix."""

from __future__ import annotations

import pytest

from trainflow.core import InvalidRequest, RuntimeNotFound, build_trainjob, local_catalog, parse_request
from trainflow.core.runtimes import find_runtime

CATALOG = local_catalog()


def rt(name: str = "torch-distributed"):
    return find_runtime(CATALOG, name)


def rejected(data: dict, runtime: str = "torch-distributed") -> InvalidRequest:
    with pytest.raises(InvalidRequest) as err:
        build_trainjob(data, rt(runtime))
    return err.value


BASE = {"name": "job", "command": ["torchrun", "train.py"]}


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"num_nodes": 0}, "num_nodes"),
        ({"num_nodes": -3}, "num_nodes"),
        ({"num_nodes": 2**40}, "num_nodes"),
        ({"num_nodes": "two"}, "num_nodes"),
        ({"proc_per_node": 0}, "proc_per_node"),
        ({"proc_per_node": "many"}, "proc_per_node"),
        ({"env": {"PET_NNODES": "4"}}, "env.PET_NNODES"),
        ({"env": {"PET_MASTER_PORT": "1"}}, "env.PET_MASTER_PORT"),
        ({"env": {"HF_TOKEN": "hf_abc"}}, "env.HF_TOKEN"),
        ({"env": {"AWS_SECRET_ACCESS_KEY": "x"}}, "env.AWS_SECRET_ACCESS_KEY"),
        ({"env": {"TRAINFLOW_OUTPUT_URI": "x"}}, "env.TRAINFLOW_OUTPUT_URI"),
        ({"env": {"1BAD": "x"}}, "env.1BAD"),
        ({"env": {"A": "x"}, "secret_env": {"A": "s/k"}}, "env.A"),
        ({"secret_env": {"TOKEN": "no-slash"}}, "secret_env.TOKEN"),
        ({"secret_env": {"TOKEN": "Bad_Secret/key"}}, "secret_env.TOKEN.name"),
        ({"name": "x" * 55}, "name"),
        ({"name": "Upper"}, "name"),
        ({"namespace": "Not_A_Namespace"}, "namespace"),
        ({"command": "torchrun train.py"}, "command"),
        ({"args": "--lr 1"}, "args"),
        ({"command": []}, "command"),
        ({"command": ["x"] * 129}, "command"),
        ({"output_uri": "relative/path"}, "output_uri"),
        ({"resources": {"cpu": "two"}}, "resources.cpu"),
        ({"resources": {"memory": "4 GB"}}, "resources.memory"),
        ({"resources": {"gpu": -1}}, "resources.gpu"),
        ({"resources": {"limits": {"cpu": "1x"}}}, "resources.limits.cpu"),
        ({"labels": {"bad key!": "v"}}, "labels.bad key!"),
        ({"labels": {"team": "has spaces"}}, "labels.team"),
        ({"labels": {"team": "x" * 64}}, "labels.team"),
        ({"node_selector": {"a": "b c"}}, "node_selector.a"),
        ({"tolerations": [{"key": "k", "operator": "Sometimes"}]}, "tolerations[0].operator"),
        ({"tolerations": [{"key": "k", "colour": "red"}]}, "tolerations[0]"),
        ({"service_account": "Bad SA"}, "service_account"),
        ({"volumes": [{"claim_name": "c", "mount_path": "rel"}]}, "volumes[0].mount_path"),
        ({"image_pull_secrets": ["Bad Secret"]}, "image_pull_secrets[0]"),
        ({"runtime_patches": [{"trainingRuntimeSpec": {}}]}, "runtime_patches[0].manager"),
        ({"runtime_patches": [{"manager": "trainflow.dev/trainflow"}]}, "runtime_patches[0].manager"),
        ({"queue": "Bad Queue"}, "queue"),
        ({"deadline_seconds": 0}, "deadline_seconds"),
        ({"dataset_uri": "hf://x"}, "dataset_uri"),
        ({"image": ""}, "image"),
        ({"unknown_field": 1}, "unknown_field"),
        ({"runtime_kind": "Runtime"}, "runtime_kind"),
    ],
)
def test_each_bad_field_is_named(patch: dict, field: str) -> None:
    err = rejected({**BASE, **patch})
    assert field in err.fields, str(err)
    assert field in str(err)


def test_function_and_command_are_exclusive() -> None:
    err = rejected({**BASE, "function": "m:f"})
    assert "function" in str(err) and "command" in str(err)


def test_bad_function_reference() -> None:
    err = rejected({"name": "j", "function": "not a ref"})
    assert err.fields == ["function"]


def test_credential_opt_in_allows_plain_value() -> None:
    manifest = build_trainjob({**BASE, "env": {"PUBLIC_API_KEY": "x"}, "allow_plain_credentials": True}, rt())
    assert {"name": "PUBLIC_API_KEY", "value": "x"} in manifest["spec"]["trainer"]["env"]


def test_secret_env_becomes_secret_key_ref_never_a_value() -> None:
    manifest = build_trainjob({**BASE, "secret_env": {"HF_TOKEN": "hf/token"}}, rt())
    env = manifest["spec"]["trainer"]["env"]
    assert env == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]


def test_unknown_runtime_lists_the_choices() -> None:
    with pytest.raises(RuntimeNotFound) as err:
        find_runtime(CATALOG, "torch-distribted")
    assert err.value.fields == ["runtime"]
    assert "torch-distributed" in str(err.value)


def test_mpi_needs_integer_slots() -> None:
    err = rejected({"name": "m", "command": ["mpirun"], "proc_per_node": "auto"}, "deepspeed-distributed")
    assert err.fields == ["proc_per_node"]


def test_mpi_reserved_env_is_the_four_names_the_trainer_sets() -> None:
    """Issue 11.4: the Trainer reserves exactly MPIReservedEnvNames; other OMPI_MCA_* settings are the user's."""
    err = rejected(
        {
            "name": "m",
            "command": ["mpirun"],
            "env": {"OMPI_MCA_plm_rsh_args": "-x", "OMPI_MCA_orte_set_default_slots": "2"},
        },
        "deepspeed-distributed",
    )
    assert sorted(err.fields) == ["env.OMPI_MCA_orte_set_default_slots", "env.OMPI_MCA_plm_rsh_args"]
    env = {"OMPI_MCA_btl_tcp_if_include": "eth0", "OMPI_MCA_x": "1"}
    manifest = build_trainjob({"name": "m", "command": ["mpirun"], "env": env}, rt("deepspeed-distributed"))
    assert [e["name"] for e in manifest["spec"]["trainer"]["env"]] == list(env)


def test_xgboost_reserved_env_is_the_four_names_the_trainer_sets() -> None:
    """Issue 11.4: XGBoostReservedEnvNames only; DMLC_WORKER_CONNECT_RETRY and friends pass."""
    for name in ("DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER"):
        err = rejected({"name": "x", "command": ["python3"], "env": {name: "1"}}, "xgboost-distributed")
        assert err.fields == [f"env.{name}"]
    env = {"DMLC_WORKER_CONNECT_RETRY": "5", "DMLC_LOG_LEVEL": "debug"}
    build_trainjob({"name": "x", "command": ["python3"], "env": env}, rt("xgboost-distributed"))


def test_jax_reserved_env() -> None:
    err = rejected({"name": "x", "command": ["python3"], "env": {"JAX_PROCESS_ID": "1"}}, "jax-distributed")
    assert err.fields == ["env.JAX_PROCESS_ID"]


def test_torchtune_command_convention() -> None:
    err = rejected({"name": "t", "command": ["python3", "x.py"]}, "torchtune-llama3.2-1b")
    assert err.fields == ["command"]
    err = rejected(
        {"name": "t", "command": ["tune", "run", "full_finetune_distributed"]}, "torchtune-llama3.2-1b"
    )
    assert err.fields == ["command"]
    err = rejected({"name": "t", "args": ["epochs"]}, "torchtune-llama3.2-1b")
    assert err.fields == ["args[0]"]
    ok = build_trainjob(
        {"name": "t", "command": ["tune", "run"], "args": ["epochs=1"]}, rt("torchtune-llama3.2-1b")
    )
    assert ok["spec"]["trainer"]["command"] == ["tune", "run"]
    assert ok["spec"]["trainer"]["args"][-1] == "epochs=1"


def test_name_limit_depends_on_the_runtimes_step_names() -> None:
    name = "a" * 40
    build_trainjob({"name": name, "command": ["x"]}, rt())
    err = rejected({"name": name, "args": ["epochs=1"]}, "torchtune-llama3.2-1b")
    assert err.fields == ["name"] and "pod hostnames" in str(err)


def test_many_problems_are_reported_together() -> None:
    err = rejected({"name": "Bad", "num_nodes": 0, "env": {"PET_NNODES": "1"}, "command": ["x"]})
    assert set(err.fields) == {"name", "num_nodes", "env.PET_NNODES"}


def test_wrong_types_become_invalid_request() -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_request({"num_nodes": [1], "env": {"A": {"nested": 1}}})
    assert "num_nodes" in err.value.fields
    assert any(f.startswith("env.A") for f in err.value.fields)


def test_env_numbers_and_booleans_become_text() -> None:
    req = parse_request({"env": {"A": 1, "B": True, "C": 0.5}})
    assert req.env == {"A": "1", "B": "true", "C": "0.5"}


def test_unicode_and_huge_values_get_clear_errors() -> None:
    err = rejected({**BASE, "name": "ジョブ"})
    assert err.fields == ["name"]
    err = rejected({**BASE, "labels": {"k": "v" * 10_000}})
    assert err.fields == ["labels.k"]
    assert len(str(err)) < 1000
