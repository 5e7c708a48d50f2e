"""Checks of raw ``runtime_patches`` the Trainer's webhook applies (v2.3.0, JobSet plugin Validate).

A patch's manager must be a domain-prefixed path; each replicated job it names must exist in the runtime,
and each container or initContainer it names must exist in that job; env is refused on the containers
whose env trainflow owns (trainer ``node`` and the initializers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainflow.core.errors import FieldIssue
from trainflow.core.naming import DNS_SUBDOMAIN, PATCH_MANAGER
from trainflow.core.runtimes import Runtime

MAX_PATCHES = 16
ENV_OWNED_CONTAINERS = frozenset({"node", "dataset-initializer", "model-initializer"})
_HTTP_PATH_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/-._~%!$&'()*+,;=:")


def domain_prefixed_path_problem(value: str) -> str | None:
    """apimachinery IsDomainPrefixedPath: ``<dns-subdomain>/<http path>``."""
    host, sep, path = value.partition("/")
    if not sep or not host or not path:
        return "must be a domain-prefixed path (such as 'example.com/my-team')"
    if len(host) > 253 or not DNS_SUBDOMAIN.match(host):
        return f"{host!r} is not a DNS subdomain"
    if not set(path) <= _HTTP_PATH_CHARS:
        return f"path {path!r} has characters outside [A-Za-z0-9/-._~%!$&'()*+,;=:]"
    return None


def _mapping(node: Any, *keys: str) -> Mapping[str, Any]:
    for key in keys:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def _named(items: Any) -> list[Mapping[str, Any]]:
    return [item for item in items or [] if isinstance(item, Mapping)] if isinstance(items, list) else []


def _runtime_containers(runtime: Runtime, job: str) -> set[str]:
    for rj in runtime.replicated_jobs:
        if rj.get("name") == job:
            pod = _mapping(rj, "template", "spec", "template", "spec")
            return {
                str(c.get("name")) for c in _named(pod.get("containers")) + _named(pod.get("initContainers"))
            }
    return set()


def _check_jobs(field: str, patch: Mapping[str, Any], runtime: Runtime) -> list[FieldIssue]:
    issues = []
    jobs = runtime.replicated_job_names
    for j, job in enumerate(
        _named(_mapping(patch, "trainingRuntimeSpec", "template", "spec").get("replicatedJobs"))
    ):
        where = f"{field}.trainingRuntimeSpec.template.spec.replicatedJobs[{j}]"
        name = job.get("name")
        if name not in jobs:
            issues.append(
                FieldIssue(
                    f"{where}.name",
                    f"runtime {runtime.name!r} has no replicated job {name!r}",
                    f"use one of: {', '.join(jobs)}",
                )
            )
            continue
        known = _runtime_containers(runtime, str(name))
        pod = _mapping(job, "template", "spec", "template", "spec")
        for key in ("initContainers", "containers"):
            for k, container in enumerate(_named(pod.get(key))):
                cname = container.get("name")
                if cname not in known:
                    issues.append(
                        FieldIssue(
                            f"{where}.template.spec.template.spec.{key}[{k}].name",
                            f"job {name!r} of runtime {runtime.name!r} has no container {cname!r}",
                            f"patch one of: {', '.join(sorted(known))}",
                        )
                    )
                elif key == "containers" and cname in ENV_OWNED_CONTAINERS and container.get("env"):
                    issues.append(
                        FieldIssue(
                            field,
                            f"sets env on container {cname!r}",
                            "use env / secret_env (trainer) or the initializer options instead",
                        )
                    )
    return issues


def check(patches: list[dict[str, Any]], runtime: Runtime) -> list[FieldIssue]:
    """Every webhook rule on raw runtime patches, each naming ``runtime_patches[i]...``."""
    issues = []
    if len(patches) + 1 > MAX_PATCHES:
        issues.append(
            FieldIssue("runtime_patches", f"more than {MAX_PATCHES - 1} entries (trainflow owns one)")
        )
    managers: set[str] = set()
    for i, patch in enumerate(patches):
        field = f"runtime_patches[{i}]"
        manager = patch.get("manager")
        if not isinstance(manager, str) or not 1 <= len(manager) <= 253:
            issues.append(
                FieldIssue(f"{field}.manager", "is required (1-253 characters)", "e.g. example.com/my-team")
            )
        elif problem := domain_prefixed_path_problem(manager):
            issues.append(FieldIssue(f"{field}.manager", problem, "e.g. example.com/my-team"))
        elif manager == PATCH_MANAGER or manager in managers:
            issues.append(
                FieldIssue(f"{field}.manager", f"{manager!r} is already used", "use a distinct manager name")
            )
        else:
            managers.add(manager)
        unknown = set(patch) - {"manager", "trainingRuntimeSpec"}
        if unknown:
            issues.append(
                FieldIssue(field, f"unknown keys {sorted(unknown)}", "use manager and trainingRuntimeSpec")
            )
        issues += _check_jobs(field, patch, runtime)
    return issues
