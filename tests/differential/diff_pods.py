"""What the real Trainer made from a TrainJob, reduced to what a user's intent decides, and the differences.

A pod view keeps, per pod (``<replicated job>-<job index>-<completion index>``) and container: image,
command, args, env (by name), resources, volume mounts and ports; per pod: user labels and annotations,
node selector, tolerations, service account, volumes. Left out: what the API server, the Job controller,
JobSet and the scheduler set per object (uids, hashes, node names, service-account token volumes).
"""

from __future__ import annotations

import ast
import fnmatch
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from trainflow.core.naming import ATTEMPT_LABEL, KEY_LABEL, MANAGED_BY_LABEL

SYSTEM_PREFIXES = ("jobset.sigs.k8s.io/", "batch.kubernetes.io/", "kwok.x-k8s.io/")
SYSTEM_KEYS = {"controller-uid", "job-name"}
TRAINFLOW_IDENTITY = {MANAGED_BY_LABEL, KEY_LABEL, ATTEMPT_LABEL}
TOKEN_VOLUME = re.compile(r"^kube-api-access-")


def _user_meta(meta: Mapping[str, str] | None) -> dict[str, str]:
    return {
        k: v
        for k, v in (meta or {}).items()
        if not k.startswith(SYSTEM_PREFIXES) and k not in SYSTEM_KEYS and k not in TRAINFLOW_IDENTITY
    }


def _env_value(env: Mapping[str, Any]) -> Any:
    """A plain value, or ("valueFrom", <json>): one leaf either way."""
    if "valueFrom" in env:
        return ("valueFrom", json.dumps(env["valueFrom"], sort_keys=True))
    return env.get("value", "")


def _container(c: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "image": c.get("image"),
        "command": c.get("command"),
        "args": c.get("args"),
        "env": {e["name"]: _env_value(e) for e in c.get("env") or []},
        "envFrom": c.get("envFrom"),
        "resources": c.get("resources") or {},
        "volumeMounts": [m for m in c.get("volumeMounts") or [] if not TOKEN_VOLUME.match(m.get("name", ""))],
        "ports": c.get("ports"),
    }


def pod_key(pod: Mapping[str, Any]) -> str:
    labels = pod["metadata"].get("labels") or {}
    index = labels.get("batch.kubernetes.io/job-completion-index", "0")
    return f"{labels['jobset.sigs.k8s.io/replicatedjob-name']}-{labels.get('jobset.sigs.k8s.io/job-index', '0')}-{index}"


def pod_view(pod: Mapping[str, Any]) -> dict[str, Any]:
    spec = pod["spec"]
    return {
        "labels": _user_meta(pod["metadata"].get("labels")),
        "annotations": _user_meta(pod["metadata"].get("annotations")),
        "serviceAccountName": spec.get("serviceAccountName"),
        "nodeSelector": spec.get("nodeSelector"),
        "tolerations": spec.get("tolerations"),
        "volumes": [v for v in spec.get("volumes") or [] if not TOKEN_VOLUME.match(v.get("name", ""))],
        "initContainers": {c["name"]: _container(c) for c in spec.get("initContainers") or []},
        "containers": {c["name"]: _container(c) for c in spec.get("containers") or []},
    }


def job_view(pods: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """All pods of one TrainJob, newest per key (a retried pod replaces its predecessor)."""
    out: dict[str, Any] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"]):
        out[pod_key(pod)] = pod_view(pod)
    return out


def flatten(node: Any, path: str = "") -> dict[str, Any]:
    """Leaf paths of nested mappings; an empty or missing mapping has no leaves."""
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{path}/{key}" if path else str(key)))
        return out
    return {} if node is None else {path: node}


def differences(sdk: Mapping[str, Any], tf: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """path -> (SDK value, trainflow value) wherever the two views differ."""
    a, b = flatten(sdk), flatten(tf)
    return {p: (a.get(p), b.get(p)) for p in sorted(set(a) | set(b)) if a.get(p) != b.get(p)}


def matching(diff: Mapping[str, Any], *patterns: str) -> dict[str, Any]:
    return {p: v for p, v in diff.items() if any(fnmatch.fnmatchcase(p, pat) for pat in patterns)}


# --- function trainers (rows F1-F3) --------------------------------------------------------------------
SDK_SCRIPT = re.compile(r"read -r -d '' SCRIPT << EOM\n\n(?P<code>.*)\nEOM\n", re.S)
SDK_LAUNCH = re.compile(r'printf "%s" "\$SCRIPT" > "(?P<file>[^"]+)"\n(?P<launcher>\S+) "(?P=file)"')


def sdk_function(command: list[str]) -> dict[str, Any]:
    """The SDK's function command: launcher, shipped source, call kwargs, pip packages and indexes."""
    script = command[-1]
    code = SDK_SCRIPT.search(script)
    launch = SDK_LAUNCH.search(script)
    assert code and launch, script[:400]
    source, _, call = code["code"].rstrip("\n").rpartition("\n")
    name, _, rest = call.partition("(")
    kwargs = ast.literal_eval(rest[2:-1]) if rest.startswith("**") else {}
    packages = re.search(r"PACKAGES=\((?P<p>[^)]*)\)", script)
    indexes = re.findall(r"--(?:extra-)?index-url ([^\s)]+)", script)
    return {
        "launcher": " ".join([*command[: command.index("bash")], launch["launcher"]]),
        "source": source.strip("\n") + "\n",
        "function": name,
        "kwargs": kwargs,
        "packages": [p.strip("'") for p in packages["p"].split()] if packages else [],
        "indexes": [i.strip("'") for i in indexes],
    }


def tf_function(command: list[str]) -> dict[str, Any]:
    """trainflow's function command, in the same terms."""
    packages: list[str] = []
    indexes: list[str] = []
    argv = list(command)
    if "import fcntl" in " ".join(argv):
        at = next(i for i, a in enumerate(argv) if a.startswith("import fcntl"))
        spec = json.loads(argv[at + 1])
        packages, indexes = spec["packages"], spec["index_urls"]
        argv = argv[: at - 2] + argv[at + 2 :]
    while "-x" in argv:  # mpirun's -x NAME: the env trainflow forwards to every rank (docs/fidelity.md F1)
        at = argv.index("-x")
        argv = argv[:at] + argv[at + 2 :]
    code = argv[-2]
    header = "from __future__ import annotations\n"
    assert code.startswith(header), code[:200]
    source, _, call_part = code[len(header) :].partition("\nimport json as _tf_json")
    call = call_part.strip().splitlines()[-1]
    for wrapper in ("_tf_return(", "_tf_asyncio.run("):  # rank 0's return value is printed (row F1)
        call = call.removeprefix(wrapper)
    return {
        "launcher": " ".join(argv[: argv.index("-c")]),
        "source": source.strip("\n") + "\n",
        "function": call.partition("(")[0],
        "kwargs": json.loads(argv[-1]),
        "packages": packages,
        "indexes": indexes,
    }


def without_decorators(source: str) -> str:
    lines = source.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(("def ", "async def ")))
    return "".join(lines[start:])
