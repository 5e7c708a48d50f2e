"""Dataset and model initializers: ``spec.initializer`` from a request, and the checks the Trainer applies.

The initializer images (Trainer v2.3.0, ``pkg/initializers``) read their settings from env: STORAGE_URI,
then per scheme IGNORE_PATTERNS, ENDPOINT, REGION, ROLE_ARN and the credentials ACCESS_TOKEN (hf),
ACCESS_KEY_ID and SECRET_ACCESS_KEY (s3). Settings are named as the Kubeflow SDK names them
(``ignore_patterns``...); credentials only ever travel as Secret references.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from trainflow.core import output_uri
from trainflow.core.errors import FieldIssue
from trainflow.core.request import InitializerOption, SecretKeyRef, TrainJobRequest
from trainflow.core.runtimes import Runtime

URI_CREDENTIALS = output_uri.URI_CREDENTIALS
STORAGE_URI = output_uri.URI
SCHEMES = {"dataset": ("hf", "s3", "cache"), "model": ("hf", "s3")}
STEPS = {"dataset": "dataset-initializer", "model": "model-initializer"}
STORAGE_URI_ENV = "STORAGE_URI"
VOLUME = "initializer"  # the volumeMount Trainer's webhook requires in an initializer container
# Non-secret settings per scheme (the SDK's initializer dataclass fields) and the credentials, which
# are refused as plain options: each is read from env under its upper-case name.
OPTIONS: dict[str, frozenset[str]] = {
    "hf": frozenset({"ignore_patterns"}),
    "s3": frozenset({"ignore_patterns", "endpoint", "region", "role_arn"}),
    "cache": frozenset(
        {"metadata_loc", "num_data_nodes", "head_cpu", "head_mem", "worker_cpu", "worker_mem", "iam_role"}
    ),
}
CREDENTIALS: dict[str, frozenset[str]] = {
    "hf": frozenset({"access_token"}),
    "s3": frozenset({"access_key_id", "secret_access_key", "endpoint", "region", "role_arn"}),
    "cache": frozenset(),
}
PLAIN_CREDENTIALS = frozenset({"access_token", "access_key_id", "secret_access_key"})
# The SDK's (and the model initializer's intended) default: skip duplicate weight formats.
MODEL_IGNORE_PATTERNS = ["*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth"]


def scheme_of(uri: str | None) -> str:
    return uri.split("://", 1)[0].lower() if uri and "://" in uri else ""


def _fields(req: TrainJobRequest, kind: str) -> tuple[str | None, str | None, dict[str, Any], dict[str, Any]]:
    return (
        getattr(req, f"{kind}_uri"),
        getattr(req, f"{kind}_secret"),
        getattr(req, f"{kind}_options"),
        getattr(req, f"{kind}_secret_env"),
    )


def _option_value(name: str, value: InitializerOption) -> str:
    if name == "num_data_nodes" and isinstance(value, int):
        return str(value + 1)  # CLUSTER_SIZE counts the head node too, as the SDK sets it
    if isinstance(value, list):
        return ",".join(value)
    return str(value)


def _env_name(option: str) -> str:
    return "CLUSTER_SIZE" if option == "num_data_nodes" else option.upper()


def initializer_env(req: TrainJobRequest, kind: str) -> list[dict[str, Any]]:
    """The env of one initializer: its settings as values, its credentials as secretKeyRefs."""
    uri, _, options, secret_env = _fields(req, kind)
    settings: dict[str, InitializerOption] = dict(options)
    if kind == "model" and uri and "ignore_patterns" not in settings:
        settings["ignore_patterns"] = list(MODEL_IGNORE_PATTERNS)
    env: list[dict[str, Any]] = [
        {"name": _env_name(k), "value": _option_value(k, v)} for k, v in settings.items()
    ]
    for key, ref in secret_env.items():
        assert isinstance(ref, SecretKeyRef)
        env.append({"name": key.upper(), "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return env


def render(req: TrainJobRequest) -> dict[str, Any]:
    """``spec.initializer``: storage URI, settings env and the Secret for each step the request uses."""
    out: dict[str, Any] = {}
    for kind in ("dataset", "model"):
        uri, secret, _, _ = _fields(req, kind)
        if not uri:
            continue
        out[kind] = {"storageUri": uri}
        env = initializer_env(req, kind)
        if env:
            out[kind]["env"] = env
        if secret:
            out[kind]["secretRef"] = {"name": secret}
    return out


def mounts_volume(runtime: Runtime, step: str) -> bool:
    """Whether the step's container mounts the ``initializer`` volume (the webhook checks the job by name)."""
    for container in runtime.containers(step):
        if container.get("name") == step:
            return any(m.get("name") == VOLUME for m in container.get("volumeMounts") or [])
    return False


def _sets_storage_uri(runtime: Runtime, step: str) -> bool:
    for container in runtime.containers(step):
        if container.get("name") == step:
            return any(e.get("name") == STORAGE_URI_ENV for e in container.get("env") or [])
    return False


def _file_uri_issues(kind: str, uri: str, req: TrainJobRequest, local: bool) -> list[FieldIssue]:
    """A ``file://`` URI: the local engine links the directory in place of the initializer; no cluster can."""
    field, parsed = f"{kind}_uri", urlparse(uri)
    fix = f"use file:///abs/path locally, or one of {', '.join(SCHEMES[kind])} on a cluster"
    issues = []
    if not local:
        issues.append(FieldIssue(field, "file:// URIs exist only on the local engine", fix))
    elif parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
        issues.append(FieldIssue(field, f"{uri[:80]!r} is not file:///absolute/path", fix))
    for extra in ("secret", "options", "secret_env"):
        if getattr(req, f"{kind}_{extra}"):
            issues.append(FieldIssue(f"{kind}_{extra}", "is not used for file:// URIs", "remove it"))
    return issues


def _check_uri(kind: str, uri: str, runtime: Runtime) -> list[FieldIssue]:
    field, step, schemes = f"{kind}_uri", STEPS[kind], SCHEMES[kind]
    if URI_CREDENTIALS.match(uri):
        return [
            FieldIssue(
                field,
                "holds credentials (user:password@); they would be stored in the TrainJob in plain text",
                f"remove them and put them in a Secret named by {kind}_secret",
            )
        ]
    issues = []
    if len(uri) > 2048 or not STORAGE_URI.match(uri):
        issues.append(
            FieldIssue(
                field, f"{uri[:80]!r} is not a storage URI", f"use scheme://path with one of {schemes}"
            )
        )
    elif scheme_of(uri) not in schemes:
        issues.append(
            FieldIssue(
                field,
                f"scheme of {uri[:80]!r} is not supported",
                f"use one of: {', '.join(s + '://' for s in schemes)}",
            )
        )
    if step not in runtime.replicated_job_names:
        issues.append(
            FieldIssue(
                field,
                f"runtime {runtime.name!r} has no {step} step, and the Trainer refuses an initializer it cannot run",
                "pick a runtime with that initializer, or drop the field",
            )
        )
    elif not mounts_volume(runtime, step):
        issues.append(
            FieldIssue(
                field,
                f"runtime {runtime.name!r}: its {step} container has no {VOLUME!r} volumeMount, "
                "so the Trainer refuses an initializer URI for it",
                "drop the field (the runtime brings its own data), or pick another runtime",
            )
        )
    return issues


def _check_settings(kind: str, req: TrainJobRequest) -> list[FieldIssue]:
    uri, _, options, secret_env = _fields(req, kind)
    scheme = scheme_of(uri)
    issues = []
    if (options or secret_env) and not uri:
        field = f"{kind}_options" if options else f"{kind}_secret_env"
        return [FieldIssue(field, f"given without {kind}_uri", f"set {kind}_uri")]
    allowed, secret = OPTIONS.get(scheme, frozenset()), CREDENTIALS.get(scheme, frozenset())
    for name, value in options.items():
        field = f"{kind}_options.{name}"
        values = value if isinstance(value, list) else [value]
        if name in PLAIN_CREDENTIALS:
            fix = f"give it as {kind}_secret_env {{'{name}': 'secret-name/key'}}"
            issues.append(FieldIssue(field, "is a credential; the TrainJob would hold it in plain text", fix))
        elif name not in allowed:
            fix = f"use one of: {', '.join(sorted(allowed)) or 'none for this scheme'}"
            issues.append(FieldIssue(field, f"is not a {scheme or 'storage'} initializer setting", fix))
        elif name == "ignore_patterns" and isinstance(value, int):
            issues.append(
                FieldIssue(field, f"{value!r} is not a pattern", "a list of patterns, e.g. ['*.bin']")
            )
        elif name == "num_data_nodes" and (not isinstance(value, int) or value < 2):
            issues.append(
                FieldIssue(field, f"{str(value)[:80]!r} is not a whole number of 2 or more", "e.g. 2")
            )
        elif name != "ignore_patterns" and isinstance(value, list):
            issues.append(FieldIssue(field, "is a list; this setting takes one value"))
        elif any("\0" in str(v) for v in values):
            issues.append(FieldIssue(field, "contains a NUL character"))
    for name in secret_env:
        if name not in secret:
            issues.append(
                FieldIssue(
                    f"{kind}_secret_env.{name}",
                    f"is not a credential the {scheme or 'storage'} initializer reads",
                    f"use one of: {', '.join(sorted(secret)) or 'none for this scheme'}",
                )
            )
        elif name in options:
            issues.append(
                FieldIssue(
                    f"{kind}_secret_env.{name}", f"is also in {kind}_options", "keep it in one of them"
                )
            )
    return issues


def check(req: TrainJobRequest, runtime: Runtime, *, local: bool = False) -> list[FieldIssue]:
    """URIs, settings and credentials of both initializers, and steps that could only fail.

    ``local``: the local engine, where ``file://`` URIs stand in for the initializers.
    """
    issues: list[FieldIssue] = []
    for kind in ("dataset", "model"):
        uri, secret, _, _ = _fields(req, kind)
        if uri is not None and uri.lower().startswith("file://"):
            issues += _file_uri_issues(kind, uri, req, local)
            continue
        if uri is not None:
            issues += _check_uri(kind, uri, runtime)
        issues += _check_settings(kind, req)
        if secret and not uri:
            issues.append(FieldIssue(f"{kind}_secret", f"given without {kind}_uri", f"set {kind}_uri"))
        step = STEPS[kind]
        if not uri and step in runtime.replicated_job_names and not _sets_storage_uri(runtime, step):
            hint = (
                f"set {kind}_uri"
                if mounts_volume(runtime, step)
                else "this runtime cannot be used as it is (the Trainer refuses a URI for a step without "
                f"the {VOLUME!r} volumeMount): use a runtime whose {step} mounts it"
            )
            issues.append(
                FieldIssue(
                    "runtime" if not mounts_volume(runtime, step) else f"{kind}_uri",
                    f"runtime {runtime.name!r}: its {step} step reads {STORAGE_URI_ENV}, which neither the "
                    "runtime nor the request sets, so the step would exit at once",
                    hint,
                )
            )
    return issues
