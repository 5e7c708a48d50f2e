"""The TrainJob page's data, without a web server: a task with no TrainJob, a running one read live from the
local engine through the task's connection (read in Chromium), and one whose connection cannot be used; and
its ownership rule (``task_job``) on a real Airflow metadata database: two teams' DAGs run with ``dag.test()``,
then an XCom of team A's task names team B's job (through B's connection, or A's), or another task's."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG
from browser import chart_points, chromium
from trainflow.airflow.identity import airflow_labels, carries
from trainflow.airflow.job_view import page_path, render_page
from trainflow.airflow.task_job import UNKNOWN, Definition, TaskKey

KEY = TaskKey("d", "r", "t", -1)


def paced(reports: int = 40, seconds: float = 0.25) -> None:
    import time

    from trainflow.core.reporting import report

    for i in range(reports):
        print(f"step {i}", flush=True)
        report(metrics={"loss": 1.0 / (i + 1)}, progress=(i + 1) * 100 // reports)
        time.sleep(seconds)


def twin_line() -> None:
    print("twin-line-of-the-default-namespace", flush=True)


def test_a_task_without_a_trainjob_is_a_404() -> None:
    status, html = render_page(KEY, {}, Definition(True, None))
    assert status == 404 and "has no TrainJob" in html


def test_no_task_instance_is_a_404_naming_nothing_an_xcom_names() -> None:
    status, html = render_page(KEY, {"trainjob": {"name": "job-a", "namespace": "ml"}}, None)
    assert status == 404 and "no task instance d.t of r" in html and "job-a" not in html


def test_a_connection_only_a_template_names_is_not_guessed() -> None:
    status, html = render_page(KEY, {"trainjob": {"name": "job-a", "namespace": "ml"}}, UNKNOWN)
    assert status == 200 and "template not rendered yet" in html and "job-a" not in html


def test_a_connection_that_cannot_be_used_is_said_on_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__TRAINFLOW__DEFAULT_BACKEND", "kubernetes")
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    xcoms = {"trainjob": {"name": "job-a", "namespace": "ml", "conn_id": "nope"}}
    status, html = render_page(KEY, xcoms, Definition(True, "nope"))
    assert status == 200 and "could not use the task&#x27;s connection" in html, html
    assert "job-a" not in html and "ml/" not in html


def test_a_running_job_is_read_live(
    trainflow_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from trainflow.core import TrainJobRequest, get_backend

    monkeypatch.setenv("AIRFLOW__TRAINFLOW__DEFAULT_BACKEND", "local")
    monkeypatch.setenv("TRAINFLOW_HOME", str(trainflow_home))
    backend = get_backend("local", home=str(trainflow_home))
    labels = airflow_labels(KEY.dag_id, KEY.task_id, KEY.run_id, KEY.map_index)  # as the operator sets them
    ref = backend.submit(
        TrainJobRequest(
            runtime="jax-distributed", function=paced, num_nodes=1, idempotency_key="page-live", labels=labels
        )
    )
    xcoms: dict[str, Any] = {"trainjob": {"name": ref.name, "namespace": ref.namespace, "conn_id": "absent"}}
    lines = Path(backend.job_dir(ref)) / "reports.jsonl"
    for _ in range(int(HANG / 0.1)):
        if lines.exists() and len(lines.read_text().splitlines()) >= 5:
            break
        time.sleep(0.1)
    status, html = render_page(KEY, xcoms, Definition(True, "absent"))
    seen = len(lines.read_text().splitlines())
    other = render_page(KEY._replace(task_id="u"), xcoms, Definition(True, "absent"))
    backend.cancel(ref)
    assert status == 200 and 'http-equiv="refresh"' in html
    assert other[0] == 403 and ref.name not in other[1] and "step 0" not in other[1], other
    (tmp_path / "page.html").write_text(html)
    with chromium() as browser:
        page = browser.new_page()
        page.goto((tmp_path / "page.html").as_uri())
        drawn = chart_points(page)
        assert 5 <= drawn["loss"] <= seen and drawn["progress"] == drawn["loss"]
        assert page.locator("#tf-state").inner_text() == "Running"
        assert page.locator("table.nodes td", has_text="node-0").count() == 1
        assert "step 0" in page.locator("#tf-log").inner_text()


def test_page_paths_quote_what_a_run_id_holds() -> None:
    path = page_path("/af", "d", "scheduled__2026-01-01T00:00:00+00:00", "t", 3)
    assert path == "/af/trainflow/jobs/d/scheduled__2026-01-01T00%3A00%3A00%2B00%3A00/t?map_index=3"


def test_a_job_carries_one_task_instance_only() -> None:
    run = "scheduled__2026-01-01T00:00:00+00:00"  # hashed into a label value
    own = airflow_labels("dag_a", "train", run, 1)
    assert carries(own, "dag_a", "train", run, 1)
    assert not carries(own, "dag_a", "train", run, 0)  # another map index
    assert not carries(own, "dag_a", "train", run, -1)  # the unmapped task of the same name
    assert not carries(airflow_labels("dag_a", "train", run, None), "dag_a", "train", run, 0)
    assert not carries(own, "dag_b", "train", run, 1)
    assert not carries(own, "dag_a", "train", "scheduled__2026-01-02T00:00:00+00:00", 1)
    assert not carries({}, "dag_a", "train", run, -1)


# -- on a real Airflow metadata database: the two teams' DAGs (dags/tf_page_dags.py) ---------------------------

LOGICAL = "2026-02-01T00:00:00"
RUNNER = Path(__file__).resolve().parent / "dag_runner.py"


def local_conn(home: Path) -> str:
    import json

    return json.dumps(
        {"conn_type": "kubeflow_trainer", "extra": {"backend": "local", "local_home": str(home)}}
    )


@pytest.fixture(scope="module")
def teams(af: Any, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Team A's and team B's DAGs, run once: their task instances, serialized DAGs, rendered fields, XComs."""
    import json
    import sys

    home_a, home_b = tmp_path_factory.mktemp("team-a"), tmp_path_factory.mktemp("team-b")
    env = af.env(home_a, af.test_dags)
    env["AIRFLOW_CONN_TF_TEAM_B"] = local_conn(home_b)
    runs: dict[str, Any] = {"home_a": home_a, "home_b": home_b}
    for dag in ("tf_page_a", "tf_page_b"):
        log = tmp_path_factory.mktemp("logs") / f"{dag}.log"
        result = af.run([sys.executable, str(RUNNER), dag, LOGICAL, LOGICAL], env, HANG, log)
        assert result.returncode == 0, result.stdout[-6000:]
        summary = json.loads([x for x in result.stdout.splitlines() if x.startswith('{"run_id"')][-1])
        assert summary["state"] == "success", summary
        runs[dag] = summary
    return runs


@pytest.fixture
def web(teams: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The web server's connections: the default one on team A's engine, ``tf_team_b`` on team B's."""
    monkeypatch.setenv("AIRFLOW_CONN_KUBEFLOW_TRAINER_DEFAULT", local_conn(teams["home_a"]))
    monkeypatch.setenv("AIRFLOW_CONN_TF_TEAM_B", local_conn(teams["home_b"]))
    return teams


def ti_key(teams: dict[str, Any], dag: str, task: str, map_index: int = -1) -> TaskKey:
    return TaskKey(dag, teams[dag]["run_id"], task, map_index)


def ref_of(teams: dict[str, Any], key: TaskKey) -> dict[str, Any]:
    ref: dict[str, Any] = teams[key.dag_id]["xcoms"][f"{key.task_id}[{key.map_index}].trainjob"]
    return ref


def forge(key: TaskKey, value: dict[str, Any]) -> None:
    """The task instance's XComs become one ``trainjob`` XCom holding ``value``: what anyone who may write an
    XCom of the task (the REST API, a DAG author) can do; without a result the page reads the job live."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    ids = {"dag_id": key.dag_id, "task_id": key.task_id, "run_id": key.run_id, "map_index": key.map_index}
    with create_session() as session:
        XComModel.clear(**ids, session=session)
        XComModel.set("trainjob", value, **ids, session=session)


def served(key: TaskKey) -> tuple[int, str]:
    """The page as both web stacks serve it (``job_app``, ``job_flask``): the definition, the XComs, the page."""
    from airflow.utils.session import create_session

    from trainflow.airflow.job_view import xcom_values
    from trainflow.airflow.task_job import task_connection

    with create_session() as session:
        definition = task_connection(session, key)
        xcoms = xcom_values(session, *key) if definition else {}
    return render_page(key, xcoms, definition)


def test_an_xcom_naming_another_teams_job_shows_nothing_of_it(web: dict[str, Any]) -> None:
    own = ti_key(web, "tf_page_a", "train")
    theirs = ref_of(web, ti_key(web, "tf_page_b", "train"))  # on team A's engine, namespace team-b
    elsewhere = ref_of(web, ti_key(web, "tf_page_b", "elsewhere"))  # on team B's engine, through tf_team_b
    assert theirs["namespace"] == elsewhere["namespace"] == "team-b"
    assert elsewhere["conn_id"] == "tf_team_b"
    forged = [
        theirs,
        elsewhere,
        {**theirs, "conn_id": "tf_team_b"},
        {**elsewhere, "conn_id": "kubeflow_trainer_default"},
        {**ref_of(web, own), "namespace": "team-b"},  # its own name, another namespace: nothing there
    ]
    for value in forged:
        forge(own, value)
        status, html = served(own)
        assert status == 403, (value, html)
        assert "TOPSECRET" not in html and value["name"] not in html and "team-b" not in html, html
        assert "not this task instance&#x27;s" in html


def test_the_tasks_own_job_renders_with_its_namespaces_nodes(web: dict[str, Any]) -> None:
    from trainflow.core import TrainJobRequest, get_backend

    own = ti_key(web, "tf_page_a", "train")
    ref = ref_of(web, own)
    assert ref["namespace"] == "team-a"
    # a job of the same name in the connection's namespace, on two nodes: the page must not list its nodes
    backend = get_backend("local", home=str(web["home_a"]))
    twin = backend.submit(
        TrainJobRequest(
            name=ref["name"], namespace="default", runtime="jax-distributed", function=twin_line, num_nodes=2
        )
    )
    assert backend.wait(twin, timeout=HANG).state.value == "Complete"
    forge(own, ref)
    status, html = served(own)
    assert status == 200, html
    assert "own-line-of-team-a" in html and "Complete (AllJobsCompleted)</span>" in html, html
    assert html.count("<td>node-0</td>") == 1 and "node-1" not in html, html
    assert "twin-line" not in html


def test_a_mapped_task_shows_its_own_job_only(web: dict[str, Any]) -> None:
    first, second = ti_key(web, "tf_page_a", "mapped", 0), ti_key(web, "tf_page_a", "mapped", 1)
    unmapped = ref_of(web, ti_key(web, "tf_page_a", "train"))
    for value in (ref_of(web, first), unmapped):
        forge(second, value)
        status, html = served(second)
        assert status == 403 and value["name"] not in html and "mapped-line-0" not in html, html
    forge(second, ref_of(web, second))  # its connection is a template: the rendered value is the definition's
    status, html = served(second)
    assert status == 200 and "mapped-line-1" in html, html
    status, html = served(ti_key(web, "tf_page_a", "mapped", 2))  # no such task instance
    assert status == 404 and "mapped-line" not in html


def test_the_page_reads_through_the_definitions_connection(web: dict[str, Any]) -> None:
    """Team B's own page shows its job on its own connection (tf_team_b), whatever connection its XCom names."""
    key = ti_key(web, "tf_page_b", "elsewhere")
    forge(key, {**ref_of(web, key), "conn_id": "kubeflow_trainer_default"})
    status, html = served(key)
    assert status == 200 and "TOPSECRET-of-team-b-elsewhere" in html, html


def test_the_connection_is_the_definitions_own_or_its_rendered_value() -> None:
    """What a serialized task (as the web server reads it) says its connection is."""
    from airflow.providers.common.compat.sdk import DAG

    from trainflow.airflow import TrainJobOperator
    from trainflow.airflow.task_job import definition_conn_id

    try:
        from airflow.serialization.serialized_objects import DagSerialization as Serializer
    except ImportError:  # before Airflow 3.1
        from airflow.serialization.serialized_objects import SerializedDAG as Serializer

    args: dict[str, Any] = {"runtime": "jax-distributed", "function": twin_line}
    with DAG("d", schedule=None) as dag:
        TrainJobOperator(task_id="plain", conn_id="c1", **args)
        TrainJobOperator(task_id="default", **args)
        TrainJobOperator(task_id="templated", conn_id="{{ params.c }}", **args)
        TrainJobOperator.partial(task_id="mapped", conn_id="c2", **args).expand(namespace=["a", "b"])
        TrainJobOperator.partial(task_id="expanded", **args).expand(conn_id=["c3", "c4"])
    served = Serializer.from_dict(Serializer.to_dict(dag))
    rendered = {"conn_id": "c5"}
    assert definition_conn_id(served.get_task("plain"), rendered) == Definition(
        True, "c1"
    )  # never the rendered
    assert definition_conn_id(served.get_task("default"), None) == Definition(
        True, "kubeflow_trainer_default"
    )
    assert definition_conn_id(served.get_task("templated"), None) == UNKNOWN
    assert definition_conn_id(served.get_task("templated"), rendered) == Definition(True, "c5")
    assert definition_conn_id(served.get_task("templated"), {"conn_id": "{{ x }}"}) == UNKNOWN
    assert definition_conn_id(served.get_task("mapped"), rendered) == Definition(True, "c2")
    assert definition_conn_id(served.get_task("expanded"), None) == UNKNOWN
    assert definition_conn_id(served.get_task("expanded"), {"conn_id": "c4"}) == Definition(True, "c4")
