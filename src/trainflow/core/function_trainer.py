"""Ship a Python function into a TrainJob command: source (or import path) as code, kwargs as JSON argv.

The kwargs never become code: they travel as one JSON argument and are decoded with json.loads, so
a kwarg value cannot execute anything in the trainer (the Kubeflow SDK renders a repr'd dict instead).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

from trainflow.core.errors import InvalidRequest

FUNCTION_REF = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
)

_CALL = """
import json as _tf_json, sys as _tf_sys
_tf_kwargs = _tf_json.loads(_tf_sys.argv[1]) if len(_tf_sys.argv) > 1 else {}
"""


def function_source(fn: Callable[..., Any]) -> tuple[str, str]:
    """Self-contained source of a top-level function, without its decorators, and its name."""
    name = getattr(fn, "__name__", "")
    if name == "<lambda>" or "<locals>" in getattr(fn, "__qualname__", ""):
        raise InvalidRequest.one(
            "function", f"{fn!r} is a lambda or nested function", "define it at module top level"
        )
    try:
        source = textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))
    except (OSError, TypeError) as exc:
        raise InvalidRequest.one(
            "function", f"cannot read the source of {fn!r} ({exc})", "pass 'module:function' instead"
        ) from exc
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            node.decorator_list = []
            _strip_annotations(node)  # names like 'Any' from the caller's module do not exist in the trainer
            return ast.unparse(node), name
    raise InvalidRequest.one("function", f"no top-level def {name!r} in its source", "pass 'module:function'")


def _strip_annotations(node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    args = node.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None:
            arg.annotation = None
    node.returns = None


def function_code(function: str | Callable[..., Any]) -> str:
    """Python code that defines or imports the function and calls it with kwargs from argv[1]."""
    if isinstance(function, str):
        if not FUNCTION_REF.match(function):
            raise InvalidRequest.one(
                "function", f"{function!r} is not 'module:function'", "e.g. 'mypkg.train:main'"
            )
        module, _, attr = function.partition(":")
        return (
            "import importlib as _tf_importlib\n"
            f"_tf_fn = _tf_importlib.import_module({module!r})\n"
            f"for _tf_part in {attr!r}.split('.'):\n"
            "    _tf_fn = getattr(_tf_fn, _tf_part)\n" + _CALL + "_tf_fn(**_tf_kwargs)\n"
        )
    source, name = function_source(function)
    if inspect.iscoroutinefunction(function):
        return (
            source + "\n" + _CALL + f"import asyncio as _tf_asyncio\n_tf_asyncio.run({name}(**_tf_kwargs))\n"
        )
    return source + "\n" + _CALL + f"{name}(**_tf_kwargs)\n"


def encode_kwargs(kwargs: Mapping[str, Any]) -> str:
    return json.dumps(dict(kwargs), sort_keys=True, separators=(",", ":"))


def function_command(
    function: str | Callable[..., Any], kwargs: Mapping[str, Any], policy: str | None
) -> list[str]:
    """The argv that runs the function under the runtime's launcher (torchrun, mpirun, or python3)."""
    code = function_code(function)
    payload = encode_kwargs(kwargs)
    if policy == "torch":
        return ["torchrun", "--no-python", "python3", "-c", code, payload]
    if policy == "mpi":
        return ["mpirun", "--hostfile", "/etc/mpi/hostfile", "python3", "-c", code, payload]
    return ["python3", "-c", code, payload]
