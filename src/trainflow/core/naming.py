"""Deterministic, valid Kubernetes names and label values derived from pipeline identities."""

from __future__ import annotations

import hashlib
import re
import uuid

MAX_NAME = 40  # pods are <trainjob>-<replicatedJob>-<jobIdx>-<podIdx>: keep room under 63
NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE_PATTERN = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_KEY_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
TRAINER_CONTAINER = "node"  # the trainer container of every Trainer runtime

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "trainflow"
KEY_LABEL = "trainflow.dev/key"
ATTEMPT_LABEL = "trainflow.dev/attempt"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue's LocalQueue of the job
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"  # Kueue's WorkloadPriorityClass of the job
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"  # JobSet's, on every pod of the TrainJob's JobSet
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"  # JobSet's: the step a pod runs
MAX_QUEUE_ANNOTATION = "trainflow.dev/max-queue-seconds"  # the queue budget, read by every waiter
FIELD_MANAGER = "trainflow"
PATCH_MANAGER = "trainflow.dev/trainflow"
OUTPUT_URI_ANNOTATION = "trainflow.dev/output-uri"
RETURNS_ANNOTATION = "trainflow.dev/returns"  # a function trainer: rank 0's log ends with its return value


def stable_hash(text: str, length: int = 10) -> str:
    """A short, stable, lowercase hex digest (same input, same output, on every machine)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if not slug or not slug[0].isalpha():
        slug = "tj-" + slug
    return slug.strip("-")


def derive_name(key: str, attempt: int = 1, max_length: int = MAX_NAME) -> str:
    """RFC 1035 name from an idempotency key: readable prefix, stable hash, attempt suffix after the first."""
    suffix = "-" + stable_hash(key)
    if attempt > 1:
        suffix += f"-{attempt}"
    prefix = _slug(key)[: max_length - len(suffix)].rstrip("-") or "tj"
    return prefix + suffix


def random_name(prefix: str = "tj") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def key_label(key: str) -> str:
    """The label value that marks every TrainJob made for one idempotency key."""
    return stable_hash(key, 16)


def label_value(text: str) -> str:
    """Make any text a valid label value (<= 63, alphanumeric ends); changed values get a hash suffix."""
    if LABEL_VALUE_PATTERN.match(text) and len(text) <= 63:
        return text
    cleaned = re.sub(r"[^-A-Za-z0-9_.]+", "-", text).strip("-_.")
    suffix = stable_hash(text, 8)
    cleaned = cleaned[: 63 - len(suffix) - 1].strip("-_.")
    return f"{cleaned}-{suffix}" if cleaned else suffix


def label_key_problem(key: str) -> str | None:
    """Why a label/annotation key is invalid, or None when it is valid."""
    prefix, sep, name = key.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
        return f"prefix {prefix!r} is not a DNS subdomain"
    if not name or len(name) > 63 or not LABEL_KEY_NAME.match(name):
        return f"name part {name!r} must be 1-63 characters [A-Za-z0-9-_.] starting and ending alphanumeric"
    return None
