"""The shape of the code: no import cycles, modules of a readable size (the trainflow packages and the scripts
beside them: testbed/, benchmarks/, scripts/), adapters whose request arguments follow
``TrainJobRequest.model_fields``."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from trainflow.core.request import TrainJobRequest

REPO = Path(__file__).resolve().parents[2]
ROOTS = [REPO / "src", REPO / "providers" / "airflow", REPO / "components" / "kfp"]
# Each group is one import namespace: the directories its programs put on sys.path, with the files they hold.
# The testbed runs with testbed/ and its node/, kueue/ and objstore/ on sys.path, so they share one namespace.
GROUPS: dict[str, list[tuple[Path, str]]] = {
    "trainflow": [(root, "trainflow/**/*.py") for root in ROOTS],
    "testbed": [(REPO / "testbed" / d, "*.py") for d in ("", "node", "kueue", "objstore")],
    "benchmarks": [(REPO / "benchmarks", "**/*.py")],
    "scripts": [(REPO / "scripts", "**/*.py")],
}
SCRIPT_DIRS = ("testbed", "benchmarks", "scripts")
THIRD_PARTY = REPO / "testbed" / "upstream"  # vendored third-party sources, not project code (*/README.md)
MAX_LINES = 400
LONG_REASON = re.compile(r"over 400 lines", re.IGNORECASE)


def modules(group: str = "trainflow") -> dict[str, Path]:
    out: dict[str, Path] = {}
    for root, pattern in GROUPS[group]:
        for path in sorted(root.glob(pattern)):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            assert name not in out, f"{group}: {path} and {out[name]} are both module {name!r}"
            out[name] = path
    return out


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """trainflow modules a module imports when it runs (TYPE_CHECKING blocks excluded, lazy imports included)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in known and m != name}


def cycles_of(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                walk(dep)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name)
    return cycles


def import_graph(group: str) -> dict[str, set[str]]:
    mods = modules(group)
    graph = {name: imports(path, name, set(mods)) for name, path in mods.items()}
    # a package's __init__ that lazily re-exports (PEP 562) is not a dependency of what it exports
    for pkg in ("trainflow.core", "trainflow.airflow", "trainflow.kfp"):
        for deps in graph.values():
            deps.discard(pkg)
    return graph


def test_no_import_cycles() -> None:
    found = {group: cycles_of(import_graph(group)) for group in GROUPS}
    assert found == {group: [] for group in GROUPS}


def test_the_cycle_check_sees_bare_imports_in_scripts() -> None:
    # the testbed's modules import each other by bare name (testbed/ on sys.path), lazy imports included
    graph = import_graph("testbed")
    assert {"layout", "procs"} <= graph["instance"], graph["instance"]
    assert "pods" in graph["instance"]  # imported inside a function, after testbed/node/ joins sys.path
    assert cycles_of({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]


def test_every_script_file_is_in_a_group() -> None:
    grouped = {path for group in GROUPS for path in modules(group).values()}
    on_disk = {p for d in SCRIPT_DIRS for p in (REPO / d).rglob("*.py") if not p.is_relative_to(THIRD_PARTY)}
    assert on_disk - grouped == set()


def test_modules_stay_readable() -> None:
    too_long = []
    for group in GROUPS:
        for path in modules(group).values():
            text = path.read_text()
            lines = text.count("\n")
            doc = ast.get_docstring(ast.parse(text)) or ""
            if lines > MAX_LINES and not LONG_REASON.search(doc):
                too_long.append(f"{path.relative_to(REPO)}: {lines} lines")
    assert too_long == [], "split them, or say in the module docstring why one is over 400 lines"


def test_airflow_operator_arguments_follow_the_request_model() -> None:
    from trainflow.airflow.arguments import OPERATOR_OWNED, REQUEST_ARGS, REQUEST_FIELDS, TEMPLATED_ARGS
    from trainflow.airflow.base import TrainJobBaseOperator
    from trainflow.airflow.operators import TrainJobOperator

    assert tuple(TrainJobRequest.model_fields) == REQUEST_FIELDS
    accepted = set(inspect.signature(TrainJobOperator.__init__).parameters)
    accepted |= set(inspect.signature(TrainJobBaseOperator.__init__).parameters)
    assert set(REQUEST_ARGS) <= accepted, set(REQUEST_ARGS) - accepted
    assert set(TEMPLATED_ARGS) <= set(TrainJobOperator.template_fields)
    assert OPERATOR_OWNED == ("idempotency_key",)
    # Airflow renders each template field from the attribute of that name: a field never set fails every task
    op = TrainJobOperator(task_id="t", image="img", command=["train"])
    assert [f for f in TrainJobOperator.template_fields if not hasattr(op, f)] == []


def test_kfp_step_parameters_reach_the_request() -> None:
    from trainflow.kfp import _bodies
    from trainflow.kfp.params import build_request_fields

    params = set(inspect.signature(_bodies.train_job).parameters)
    fields = set(TrainJobRequest.model_fields)
    # what the step takes as parameters of the same name is forwarded; everything else travels in ``extra``
    sample = {name: f"value-{name}" for name in params & fields if name not in ("idempotency_key",)}
    assert set(build_request_fields(sample)) == set(sample)
    extra = build_request_fields({"extra": {name: 1 for name in fields - params}})
    assert set(extra) == fields - params


def test_cli_has_an_option_for_every_request_field() -> None:
    from trainflow.core.cli import submit

    names = {p.name for p in submit.params}
    assert {f"opt_{f}" for f in TrainJobRequest.model_fields if f != "command"} <= names
    assert "command" in names


# --- layering (docs/architecture.md, "Layers") ----------------------------------------------------------------
# The doc's table, top to bottom, in its notation (``core/...`` is src/trainflow/core/...). A module imports modules
# of its own layer and of the layers above it, never below. A file named exactly wins over a ``*``.
LAYERS: list[tuple[str, list[str]]] = [
    (
        "shared",
        [
            "core/errors.py",
            "core/naming.py",
            "core/reporting.py",
            "core/storage.py",
            "core/storage_errors.py",
            "core/artifact.py",
            "core/output_uri.py",
            "core/publish.py",
            "core/hf.py",
            "core/torchtune_logger.py",
        ],
    ),
    (
        "request",
        [
            "core/request.py",
            "core/validation.py",
            "core/manifest.py",
            "core/fields.py",
            "core/quantity.py",
            "core/schema.py",
            "core/function_trainer.py",
            "core/runtimes.py",
            "core/torchtune.py",
            "core/initializers.py",
            "core/patches.py",
            "core/credentials.py",
        ],
    ),
    (
        "status",
        [
            "core/result.py",
            "core/kueue.py",
            "core/observe.py",
            "core/history.py",
            "core/failure_lines.py",
            "core/report_lines.py",
            "core/ending.py",
        ],
    ),
    ("lifecycle", ["core/lifecycle.py"]),
    (
        "API boundary",
        [
            "core/kube/calls.py",
            "core/kube/client.py",
            "core/kube/aio.py",
            "core/kube/http.py",
            "core/kube/lines.py",
            "core/kube/config.py",
            "core/kube/auth.py",
            "core/kube/connect.py",
            "core/kube/apierrors.py",
            "core/kube/retry.py",
        ],
    ),
    ("backends", ["core/backend.py", "core/connection.py", "core/logsink.py", "core/kube/*", "core/local/*"]),
    ("views", ["core/charts.py", "core/job_page.py"]),
    (
        "adapters",
        [
            "core/cli.py",
            "core/cli_output.py",
            "core/cli_progress.py",
            "core/cli_options.py",
            "core/request_text.py",
            "core/links.py",
            "providers/airflow/trainflow/airflow/*",
            "components/kfp/trainflow/kfp/*",
        ],
    ),
]
# Imports of a layer below that the code has, each with the reason it stays.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("trainflow.core.reporting", "trainflow.core.local.store"): (
        "report() runs in the training process; under the local engine it merges metrics into the job's state "
        "file with the engine's own lock and atomic write, and appends the report to the job's reports file "
        "(local.store owns both formats), imported lazily only when TRAINFLOW_LOCAL_JOB_DIR is set"
    ),
}


def _doc_path(path: Path) -> str:
    rel = path.relative_to(REPO).as_posix()
    return rel.removeprefix("src/trainflow/")


def layer_of(path: Path) -> str:
    rel = _doc_path(path)
    exact = [name for name, patterns in LAYERS if rel in patterns]
    if exact:
        assert len(exact) == 1, f"{rel} is named in two layers: {exact}"
        return exact[0]
    folder = [
        name for name, patterns in LAYERS for p in patterns if p.endswith("/*") and rel.startswith(p[:-1])
    ]
    assert len(folder) == 1, (
        f"{rel} belongs to {folder or 'no layer'}: name it in LAYERS and in docs/architecture.md"
    )
    return folder[0]


def imports_below(graph: dict[str, set[str]], layers: dict[str, str]) -> list[str]:
    """Every import of a module in a layer below the importer's, as a message naming both."""
    rank = {name: i for i, (name, _) in enumerate(LAYERS)}
    out = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            if dep in layers and rank[layers[dep]] > rank[layers[mod]] and (mod, dep) not in KNOWN_EXCEPTIONS:
                out.append(f"{mod} ({layers[mod]}) imports {dep} ({layers[dep]}), a layer below it")
    return out


def _layering() -> tuple[dict[str, set[str]], dict[str, str]]:
    mods = modules()
    graph = import_graph("trainflow")
    # a package whose __init__ holds only a docstring or lazy (PEP 562) exports is no dependency of a module
    # that names it in ``from pkg import mod``
    hollow = {name for name, path in mods.items() if path.name == "__init__.py" and not graph[name]}
    graph = {name: deps - hollow for name, deps in graph.items() if name not in hollow}
    return graph, {name: layer_of(mods[name]) for name in graph}


def test_no_module_imports_a_layer_below_its_own() -> None:
    graph, layers = _layering()
    assert imports_below(graph, layers) == []
    # every known exception is still in the code (a fixed one leaves the list)
    assert [edge for edge in KNOWN_EXCEPTIONS if edge[1] not in graph.get(edge[0], set())] == []


def test_an_import_of_a_layer_below_names_both_modules() -> None:
    _, layers = _layering()
    found = imports_below({"trainflow.core.request": {"trainflow.core.lifecycle"}}, layers)
    assert found == [
        "trainflow.core.request (request) imports trainflow.core.lifecycle (lifecycle), a layer below it"
    ]


def test_the_layers_are_the_ones_docs_architecture_states() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split("## Layers", 1)[1].split("\n\n", 2)[1]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    documented = [(name.strip(), re.findall(r"`([^`]+)`", cell)) for name, cell in rows]
    assert documented == LAYERS
    assert "imports modules of its own layer and of the layers above it, never below" in " ".join(
        text.split()
    )


def test_test_modules_have_unique_basenames() -> None:
    """pytest imports test modules by basename (no packages under tests/): two files of one name in different
    suites fail collection of whichever comes second ('import file mismatch')."""
    seen: dict[str, list[str]] = {}
    for path in (REPO / "tests").rglob("*.py"):
        if path.name != "conftest.py" and ".venv" not in path.parts:
            seen.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
