"""The shape of the code: no import cycles among trainflow modules, modules of a readable size, adapters whose
request arguments follow ``TrainJobRequest.model_fields``."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from trainflow.core.request import TrainJobRequest

REPO = Path(__file__).resolve().parents[2]
ROOTS = [REPO / "src", REPO / "providers" / "airflow", REPO / "components" / "kfp"]
MAX_LINES = 400
LONG_REASON = re.compile(r"over 400 lines", re.IGNORECASE)


def modules() -> dict[str, Path]:
    out = {}
    for root in ROOTS:
        for path in (root / "trainflow").rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
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


def test_no_import_cycles() -> None:
    mods = modules()
    graph = {name: imports(path, name, set(mods)) for name, path in mods.items()}
    # a package's __init__ that lazily re-exports (PEP 562) is not a dependency of what it exports
    for pkg in ("trainflow.core", "trainflow.airflow", "trainflow.kfp"):
        for deps in graph.values():
            deps.discard(pkg)
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
    assert cycles == [], cycles


def test_modules_stay_readable() -> None:
    too_long = []
    for name, path in modules().items():
        text = path.read_text()
        lines = text.count("\n")
        doc = ast.get_docstring(ast.parse(text)) or ""
        if lines > MAX_LINES and not LONG_REASON.search(doc):
            too_long.append(f"{name}: {lines} lines")
    assert too_long == [], "split them, or say in the module docstring why one is over 400 lines"


def test_airflow_operator_arguments_follow_the_request_model() -> None:
    from trainflow.airflow.base import TrainJobBaseOperator
    from trainflow.airflow.operators import TrainJobOperator
    from trainflow.airflow.request_args import OPERATOR_OWNED, REQUEST_ARGS, REQUEST_FIELDS, TEMPLATED_ARGS

    assert tuple(TrainJobRequest.model_fields) == REQUEST_FIELDS
    accepted = set(inspect.signature(TrainJobOperator.__init__).parameters)
    accepted |= set(inspect.signature(TrainJobBaseOperator.__init__).parameters)
    assert set(REQUEST_ARGS) <= accepted, set(REQUEST_ARGS) - accepted
    assert set(TEMPLATED_ARGS) <= set(TrainJobOperator.template_fields)
    assert OPERATOR_OWNED == ("idempotency_key",)


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
