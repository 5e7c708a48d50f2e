"""Ship a Python function into a TrainJob command: its own source text (or import path) as code, kwargs as JSON.

A function that starts with ``/workspace/dataset`` or ``/workspace/model`` present and empty fails at once: the
initializer found nothing to download (Trainer v2.3.0's S3 initializer succeeds on a missing prefix).

An ``s3://`` output that the function staged in ``output_dir()`` is published once it returns
(``publish.publish_output``), before its return value is printed: a step that sees the value finds the model. On
several torch nodes every node's files are published and node 0 commits them as one model (docs/artifacts.md).

The function's return value comes back the way metrics do, through rank 0's log: rank 0 prints it as one
``TRAINFLOW_RETURN <json>`` line (at most ``MAX_RETURN_BYTES``) and a wait that ends reads it from the log's
tail (``reporting.return_value``). A value that is not JSON, or too big, fails the trainer with the reason, as the
XCom sidecar of ``@task.kubernetes`` fails its pod.

The source is the user's text with the decorators cut off (found with tokenize), never regenerated from
an AST: ``ast.unparse`` on a Python >= 3.12 client writes PEP 701 f-strings that the Python 3.10 runtime
images cannot parse. ``from __future__ import annotations`` keeps annotations from being evaluated in
the trainer, where the caller's imports do not exist. The kwargs never become code: they travel as one
JSON argument (the Kubeflow SDK renders a repr'd dict into the script instead).
"""

from __future__ import annotations

import inspect
import io
import json
import re
import textwrap
import tokenize
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trainflow.core.errors import FieldIssue, InvalidRequest
from trainflow.core.reporting import MAX_RETURN_BYTES, OUTPUT_ENV, RANK_VARS, RETURN_PREFIX

if TYPE_CHECKING:  # not at run time: this module stays loadable alone (no pydantic), on any Python
    from trainflow.core.request import TrainJobRequest

FUNCTION_REF = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
)
MPI_HOSTFILE = "/etc/mpi/hostfile"
# Where the Trainer's initializers put the dataset and the model (pkg/initializers/utils: /workspace/<kind>).
# An S3 initializer that finds nothing under its URI still succeeds, leaving its directory empty: a function
# trainer fails at start then, naming the step, rather than training on nothing.
WORKSPACE = "/workspace"
PIP_INDEX_URL = re.compile(r"^(https?|file)://\S+$")
URL_CREDENTIALS = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#@]*:[^/?#@]*@")


_HEADER = "from __future__ import annotations\n"
_CALL = f"""
import json as _tf_json, os as _tf_os, sys as _tf_sys
_tf_kwargs = _tf_json.loads(_tf_sys.argv[1]) if len(_tf_sys.argv) > 1 else {{}}
for _tf_kind in ("dataset", "model"):
    _tf_dir = "{WORKSPACE}/" + _tf_kind
    if _tf_os.path.isdir(_tf_dir) and not _tf_os.listdir(_tf_dir):
        raise SystemExit("trainflow: the %s-initializer left %s empty: no object under %s_uri, or every one "
                         "matched its ignore_patterns; check the URI" % (_tf_kind, _tf_dir, _tf_kind))
def _tf_return(value):
    _tf_rep = _tf_sys.modules.get("trainflow.core.reporting")
    _tf_nodes = _tf_os.environ.get("PET_NNODES", "1").strip() not in ("", "0", "1")
    _tf_s3 = _tf_os.environ.get("{OUTPUT_ENV}", "").lower().startswith("s3://")
    if _tf_nodes and _tf_s3 and _tf_rep is None:
        import importlib.util as _tf_util
        _tf_s3 = _tf_util.find_spec("trainflow") is not None
    if (_tf_rep is not None and getattr(_tf_rep, "output_staged", lambda: False)()) or (_tf_nodes and _tf_s3):
        from trainflow.core.publish import publish_output as _tf_publish
        _tf_publish(every_node=True)  # rank 0 alone on one node; each node's local rank 0 on several
    for _tf_var in {RANK_VARS!r}:
        _tf_rank = _tf_os.environ.get(_tf_var, "").strip()
        if _tf_rank:
            if _tf_rank != "0":
                return
            break
    if value is None:
        return
    try:
        _tf_text = _tf_json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError) as _tf_exc:
        raise TypeError("trainflow: the function's return value is not JSON (%s): return plain data "
                        "(dict, list, str, numbers) or write it to trainflow.core.output_dir()" % _tf_exc) from None
    if len(_tf_text) > {MAX_RETURN_BYTES}:
        raise ValueError("trainflow: the function's return value is %d bytes of JSON, over {MAX_RETURN_BYTES}: "
                         "write it to trainflow.core.output_dir() and return its path" % len(_tf_text))
    print({RETURN_PREFIX!r} + _tf_text, flush=True)
"""

# Installs packages_to_install once per node (a lock + marker shared by the ranks of a pod), per user
# first and system-wide if that fails (as the Kubeflow SDK does), then execs the rest of argv.
_INSTALL = """import fcntl, hashlib, json, os, subprocess, sys, tempfile
spec = json.loads(sys.argv[1])
base = os.path.join(tempfile.gettempdir(), "trainflow-pip-" + hashlib.sha256(sys.argv[1].encode()).hexdigest()[:16])
with open(base + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(base + ".done"):
        env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_BREAK_SYSTEM_PACKAGES="1")
        for extra in ([], ["--user"]):  # no pip in the image: bootstrap it (system, else per user)
            if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode:
                subprocess.run([sys.executable, "-m", "ensurepip", *extra], capture_output=True)
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-warn-script-location"]
        for i, url in enumerate(spec["index_urls"]):
            pip += ["--index-url" if i == 0 else "--extra-index-url", url]
        out = []
        for extra in (["--user"], []):
            run = subprocess.run(pip + extra + spec["packages"], env=env, capture_output=True, text=True)
            out.append(run.stdout + run.stderr)
            if run.returncode == 0:
                break
        else:
            sys.stderr.write("".join(out) + "trainflow: pip could not install " + " ".join(spec["packages"]) + "\\n")
            sys.exit(1)
        print("trainflow: installed " + " ".join(spec["packages"]), flush=True)
        open(base + ".done", "w").close()
os.execvp(sys.argv[2], sys.argv[2:])
"""


def _without_decorators(source: str) -> str:
    """The source from the ``def`` / ``async def`` line on: decorator lines (and comments among them) cut."""
    depth = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        elif tok.type == tokenize.NAME and tok.string in ("def", "async") and depth == 0:
            return "".join(source.splitlines(keepends=True)[tok.start[0] - 1 :])
    raise ValueError("no def statement in the source")


def function_source(fn: Callable[..., Any]) -> tuple[str, str]:
    """The user's own source text of a top-level function, decorators removed, and its name."""
    name = getattr(fn, "__name__", "")
    if name == "<lambda>" or "<locals>" in getattr(fn, "__qualname__", ""):
        raise InvalidRequest.one(
            "function", f"{fn!r} is a lambda or nested function", "define it at module top level"
        )
    target = inspect.unwrap(fn)
    try:
        source = _without_decorators(textwrap.dedent(inspect.getsource(target)))
    except (OSError, TypeError, ValueError, SyntaxError, tokenize.TokenError) as exc:
        raise InvalidRequest.one(
            "function", f"cannot read the source of {fn!r} ({exc})", "pass 'module:function' instead"
        ) from exc
    if getattr(target, "__name__", name) != name:
        raise InvalidRequest.one(
            "function",
            f"{fn!r} wraps {target.__name__!r} under another name",
            "pass 'module:function' instead",
        )
    return source if source.endswith("\n") else source + "\n", name


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
            "    _tf_fn = getattr(_tf_fn, _tf_part)\n" + _CALL + "_tf_return(_tf_fn(**_tf_kwargs))\n"
        )
    source, name = function_source(function)
    call = f"_tf_return({name}(**_tf_kwargs))"
    if inspect.iscoroutinefunction(inspect.unwrap(function)):
        call = f"import asyncio as _tf_asyncio\n_tf_return(_tf_asyncio.run({name}(**_tf_kwargs)))"
    return _HEADER + source + _CALL + call + "\n"


def encode_kwargs(kwargs: Mapping[str, Any]) -> str:
    return json.dumps(dict(kwargs), sort_keys=True, separators=(",", ":"))


def install_prefix(packages: Sequence[str], index_urls: Sequence[str]) -> list[str]:
    """argv that installs the packages on the node, then runs the argv that follows it."""
    spec = json.dumps({"packages": list(packages), "index_urls": list(index_urls)}, separators=(",", ":"))
    return ["python3", "-c", _INSTALL, spec]


def function_command(
    function: str | Callable[..., Any],
    kwargs: Mapping[str, Any],
    policy: str | None,
    packages: Sequence[str] = (),
    index_urls: Sequence[str] = (),
    forward_env: Sequence[str] = (),
) -> list[str]:
    """The argv that runs the function under the runtime's launcher (torchrun, mpirun, or python3).

    Packages are installed once per node before torchrun / python3 start; under mpirun each rank runs
    the install step on its own node (the lock makes the ranks of one node share one install). mpirun starts
    the other nodes' ranks over SSH, where the pod's env is not: ``forward_env`` (the variables trainflow sets
    on the launcher) goes to every rank with ``-x``.
    """
    run = ["python3", "-c", function_code(function), encode_kwargs(kwargs)]
    install = install_prefix(packages, index_urls) if packages else []
    if policy == "torch":
        return [*install, "torchrun", "--no-python", *run]
    if policy == "mpi":
        exports = [arg for name in sorted(set(forward_env)) for arg in ("-x", name)]
        return ["mpirun", "--hostfile", MPI_HOSTFILE, *exports, *install, *run]
    return [*install, *run]


def argv_field(argv: Sequence[str], index: int) -> str | None:
    """The request field behind ``argv[index]`` of a rendered function command (None: not a function's part)."""
    for i, item in enumerate(argv):
        if item == _INSTALL and index == i + 1:
            return "packages_to_install"
        if _CALL in item and index in (i, i + 1):
            return "function" if index == i else "function_kwargs"
    return None


def check_packages(req: TrainJobRequest) -> list[FieldIssue]:
    """packages_to_install and pip_index_urls: a function trainer's, pip requirements, index URLs."""
    issues = []
    if req.packages_to_install and req.function is None:
        issues.append(
            FieldIssue(
                "packages_to_install",
                "needs 'function'",
                "for a container trainer, install them in the image",
            )
        )
    if req.pip_index_urls and not req.packages_to_install:
        issues.append(FieldIssue("pip_index_urls", "has no effect without packages_to_install", "drop it"))
    for i, spec in enumerate(req.packages_to_install):
        if not spec.strip() or spec.startswith("-") or "\0" in spec or len(spec) > 1000:
            fix = "e.g. 'transformers==4.57.1'; give index URLs in pip_index_urls"
            issues.append(
                FieldIssue(f"packages_to_install[{i}]", f"{spec[:80]!r} is not a pip requirement", fix)
            )
    for i, url in enumerate(req.pip_index_urls):
        if URL_CREDENTIALS.match(url):
            issues.append(
                FieldIssue(
                    f"pip_index_urls[{i}]",
                    "holds credentials (user:password@); they would be stored in the TrainJob in plain text",
                    "drop it and give the URL as secret_env {'PIP_INDEX_URL': 'secret-name/key'}",
                )
            )
        elif not PIP_INDEX_URL.match(url) or len(url) > 2048:
            issues.append(
                FieldIssue(
                    f"pip_index_urls[{i}]",
                    f"{url[:80]!r} is not an index URL",
                    "e.g. https://pypi.org/simple",
                )
            )
    return issues
