"""Launching a TrainJob: one identity rule, one attempt rule and one adoption rule for every backend and adapter.

``launch(backend, request)`` looks at what earlier tries left (one LIST by the identity label), decides, and
creates at most one TrainJob (one runtime read, cached by the backend, and one render):

* a TrainJob of this identity still running (or queued) -> reattach to it;
* one that completed with the same spec -> reuse it: nothing is created, its result stands (unless the
  caller says this is a new run of the same identity, ``reuse_completed=False``: an Airflow task cleared
  after it succeeded trains again);
* otherwise (none, all failed, deleted, or the spec changed) -> create the next attempt: attempt ``n + 1``
  after the highest attempt seen, attempt 1 when none is left. A fixed ``name`` cannot change per attempt:
  the old TrainJob of that name is deleted first (only if it is ours).

Identity = the idempotency key (label ``trainflow.dev/key``) or, without one, the fixed name. Names are
deterministic (``naming.derive_name(key, attempt)``), so a try that crashed after its create reattaches.
A create that finds the name taken, or loses its answer, adopts what is there only if it is the same
request (identity labels and the spec fields the Trainer makes immutable); anything else is a conflict.
Airflow, KFP and the CLI all launch through here.

Create first: when nothing can be there to adopt, the LIST is skipped and attempt 1 is created at once (one
request); a name already taken sends the launch down the full rule above. That is the case for a request
without identity, for a fixed name without a key (the name is the whole identity: a taken name is found by
the create itself), and when the caller says this is the identity's first try (``first_try``: an Airflow
task's try 1). A launch that may follow earlier tries lists first, so a later attempt still running is found
even when attempt 1 was deleted (creating attempt 1 again would then run the request twice).

A recorded TrainJob first: a caller that kept the identity of its last TrainJob (Airflow 3.3's task state
store, ``recorded``) has it read by name before anything is listed. It is reattached only when it is still the
same object (uid), carries this request's identity labels and is still running, as the rule above would
decide over it; anything else (gone, replaced, finished) goes on to the full rule, so both paths adopt alike.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from trainflow.core.errors import AlreadyExists, BackendError, OutcomeUnknown, TrainJobConflict
from trainflow.core.manifest import build_trainjob
from trainflow.core.naming import ATTEMPT_LABEL, KEY_LABEL, MANAGED_BY_LABEL, MANAGED_BY_VALUE, key_label
from trainflow.core.request import TrainJobRequest
from trainflow.core.result import JobRef, JobState, TrainJobResult, result_from_trainjob
from trainflow.core.runtimes import Runtime
from trainflow.core.validation import immutable_differences, parse_request

if TYPE_CHECKING:
    from trainflow.core.backend import Backend

log = logging.getLogger(__name__)

IDENTITY_LABELS = (MANAGED_BY_LABEL, KEY_LABEL, ATTEMPT_LABEL)
CREATE_TRIES = 3
REPLACE_WAIT_SECONDS = 120.0


@dataclass(frozen=True)
class Launch:
    """What ``launch`` did: the TrainJob to wait on, its attempt, and whether it already existed."""

    ref: JobRef
    attempt: int
    adopted: bool
    state: JobState | None = None
    manifest: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    previous: tuple[TrainJobResult, ...] = ()
    dry_run: bool = False
    runtime: Runtime | None = field(default=None, compare=False, repr=False)
    recorded: bool = False  # found through the caller's record of an earlier try, not by listing

    @property
    def reused(self) -> bool:
        """An earlier attempt already completed: its result stands, nothing was created."""
        return self.adopted and self.state is JobState.COMPLETE

    def history(self) -> list[str]:
        """One line per earlier attempt of this identity (for a task or step log)."""
        return [
            f"Earlier attempt {r.attempt or 1}: TrainJob {r.namespace}/{r.name} {r.state.value}"
            + (f" ({r.reason})" if r.reason else "")
            for r in self.previous
            if r.name != self.ref.name or self.ref.uid not in (None, r.uid)
        ]

    @property
    def summary(self) -> str:
        """One line for a task or step log, the same from every adapter."""
        if self.dry_run:
            return f"Dry run: TrainJob {self.ref} is valid; nothing was created"
        if self.reused:
            return f"TrainJob {self.ref} already completed: returning its result without resubmitting"
        if self.adopted:
            how = ", as an earlier try recorded it" if self.recorded else ""
            return f"Reattaching to running TrainJob {self.ref} (attempt {self.attempt}{how})"
        return f"Submitted TrainJob {self.ref} (attempt {self.attempt})"


@dataclass(frozen=True)
class Decision:
    """The outcome of the attempt rule, before any create."""

    kind: str  # "reattach" | "reuse" | "create"
    attempt: int
    existing: Mapping[str, Any] | None = None
    replace: Mapping[str, Any] | None = None  # a fixed-name TrainJob to delete before the create


def attempt_of(obj: Mapping[str, Any]) -> int:
    text = str(((obj.get("metadata") or {}).get("labels") or {}).get(ATTEMPT_LABEL, ""))
    return int(text) if text.isdigit() else 1


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def label_problems(
    existing: Mapping[str, Any], wanted: Mapping[str, Any], keys: Sequence[str] = IDENTITY_LABELS
) -> list[str]:
    """Identity labels of ``existing`` that differ from ``wanted``'s."""
    have = (existing.get("metadata") or {}).get("labels") or {}
    want = (wanted.get("metadata") or {}).get("labels") or {}
    return [f"label {k}={have.get(k)!r} (wanted {want.get(k)!r})" for k in keys if have.get(k) != want.get(k)]


def is_ours(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """Why ``existing`` is not the TrainJob ``wanted`` describes ([] when it is): labels, immutable fields."""
    return label_problems(existing, wanted) + [
        f"{f} differs" for f in immutable_differences(existing, wanted)
    ]


def decide(
    candidates: Sequence[Mapping[str, Any]],
    wanted: Mapping[str, Any],
    fixed_name: bool,
    reuse_completed: bool = True,
) -> Decision:
    """The attempt rule over the TrainJobs of one identity (pure; see the module docstring)."""
    live = [c for c in candidates if not (c.get("metadata") or {}).get("deletionTimestamp")]
    by_attempt = sorted(live, key=attempt_of, reverse=True)
    for obj in by_attempt:
        if not result_from_trainjob(obj).state.terminal:
            return Decision("reattach", attempt_of(obj), existing=obj)
    for obj in by_attempt if reuse_completed else ():
        if result_from_trainjob(obj).succeeded and not immutable_differences(obj, wanted):
            return Decision("reuse", attempt_of(obj), existing=obj)
    attempt = max((attempt_of(c) for c in candidates), default=0) + 1
    replace = None
    if fixed_name:
        replace = next((c for c in candidates if _name(c) == _name(wanted)), None)
    return Decision("create", attempt, replace=replace)


def render(
    backend: Backend, request: TrainJobRequest | Mapping[str, Any], *, attempt: int = 1
) -> dict[str, Any]:
    """The validated TrainJob manifest the backend would create (one runtime read); creates nothing."""
    req = parse_request(request)
    return _build(backend, req, _runtime(backend, req), attempt)


def _runtime(backend: Backend, req: TrainJobRequest) -> Runtime:
    return backend.get_runtime(req.runtime, req.runtime_kind, req.namespace or backend.namespace)


def _build(backend: Backend, req: TrainJobRequest, runtime: Runtime, attempt: int) -> dict[str, Any]:
    return build_trainjob(
        req,
        runtime,
        namespace=backend.namespace,
        attempt=attempt,
        local=backend.is_local,
        picture=backend.schema_picture(),
    )


def launch(
    backend: Backend,
    request: TrainJobRequest | Mapping[str, Any],
    *,
    dry_run: bool = False,
    before_create: Callable[[JobRef], None] | None = None,
    reuse_completed: bool = True,
    first_try: bool = False,
    recorded: JobRef | None = None,
) -> Launch:
    """Validate the request, then reattach, reuse or create, as the rules above say. See ``Launch``.

    ``dry_run``: validate everything the backend can (a server-side dry-run create on a cluster) and
    create nothing, anywhere. ``before_create`` learns the name about to be created (so a step being
    terminated meanwhile can delete it). ``reuse_completed=False``: this is a new run of the identity, so a
    completed TrainJob is history, not the result (a running one is still reattached: never two at once).
    ``recorded``: the TrainJob an earlier try recorded, looked at before anything is listed.
    """
    req = parse_request(request)
    runtime = _runtime(backend, req)
    launched = _launch(backend, req, runtime, dry_run, before_create, reuse_completed, first_try, recorded)
    return replace(launched, runtime=runtime)


def _launch(
    backend: Backend,
    req: TrainJobRequest,
    runtime: Runtime,
    dry_run: bool,
    before_create: Callable[[JobRef], None] | None,
    reuse_completed: bool,
    first_try: bool = False,
    recorded: JobRef | None = None,
) -> Launch:
    manifest = _build(backend, req, runtime, 1)
    namespace = str(manifest["metadata"].get("namespace") or backend.namespace)
    if dry_run:
        backend.dry_run(manifest)
        return Launch(
            JobRef(name=_name(manifest), namespace=namespace), 1, False, None, manifest, dry_run=True
        )
    if not req.idempotency_key and not req.name:
        return _create(backend, manifest, namespace, 1, (), before_create)
    if recorded is not None and (
        found := _reattach_recorded(backend, recorded, manifest, namespace, bool(req.name))
    ):
        return found
    if first_try or not req.idempotency_key:  # nothing to adopt but what the create itself finds
        with contextlib.suppress(_Taken):
            return _create(backend, manifest, namespace, 1, (), before_create, adopt=False)
    candidates = _candidates(backend, req, manifest, namespace)
    previous = tuple(result_from_trainjob(c) for c in sorted(candidates, key=attempt_of))
    decision = decide(candidates, manifest, fixed_name=bool(req.name), reuse_completed=reuse_completed)
    if decision.existing is not None:
        return _adopt(backend, decision, manifest, namespace, previous)
    if decision.replace is not None:
        _replace(backend, decision.replace, namespace)
    if decision.attempt != 1:
        manifest = _build(backend, req, runtime, decision.attempt)
    return _create(backend, manifest, namespace, decision.attempt, previous, before_create)


def _adopt(
    backend: Backend,
    decision: Decision,
    wanted: Mapping[str, Any],
    namespace: str,
    previous: tuple[TrainJobResult, ...],
    recorded: bool = False,
) -> Launch:
    """Reattach to (or reuse) the TrainJob the attempt rule chose; a running one must hold the same spec."""
    obj = decision.existing or {}
    if decision.kind == "reattach" and (problems := immutable_differences(obj, wanted)):
        raise TrainJobConflict(
            f"TrainJob {namespace}/{_name(obj)} of this request is still running with a different "
            f"{', '.join(problems)}; wait for it or cancel it, then retry"
        )
    backend.adopt(obj)
    state = result_from_trainjob(obj).state
    return Launch(_ref(obj, namespace), decision.attempt, True, state, dict(obj), previous, recorded=recorded)


def _reattach_recorded(
    backend: Backend, recorded: JobRef, wanted: Mapping[str, Any], namespace: str, fixed_name: bool
) -> Launch | None:
    """The recorded TrainJob, reattached if the attempt rule would reattach it; None: use the full rule."""
    obj = backend.read(recorded.namespace or namespace, recorded.name)
    uid = (obj or {}).get("metadata", {}).get("uid")
    why = (
        "it is gone"
        if obj is None
        else f"it was replaced (uid {uid}, recorded {recorded.uid})"
        if recorded.uid and uid != recorded.uid
        else "; ".join(label_problems(obj, wanted, (MANAGED_BY_LABEL, KEY_LABEL)))
    )
    if obj is not None and not why:
        decision = decide([obj], wanted, fixed_name)
        if decision.kind == "reattach":
            return _adopt(backend, decision, wanted, namespace, (), recorded=True)
        why = f"it is {result_from_trainjob(obj).state.value}"
    log.info(
        "recorded TrainJob %s is not reattached (%s): looking for this request's TrainJobs", recorded, why
    )
    return None


def _ref(obj: Mapping[str, Any], namespace: str) -> JobRef:
    meta = obj.get("metadata") or {}
    return JobRef(
        name=str(meta.get("name")), namespace=str(meta.get("namespace") or namespace), uid=meta.get("uid")
    )


def _candidates(
    backend: Backend, req: TrainJobRequest, manifest: Mapping[str, Any], namespace: str
) -> list[Mapping[str, Any]]:
    """The TrainJobs of this request's identity: by the key label, and the fixed name (only if it is ours)."""
    found: dict[str, Mapping[str, Any]] = {}
    if req.idempotency_key:
        labels = {KEY_LABEL: key_label(req.idempotency_key), MANAGED_BY_LABEL: MANAGED_BY_VALUE}
        found = {_name(o): o for o in backend.find(namespace, labels)}
    if req.name and req.name not in found:
        existing = backend.read(namespace, req.name)
        if existing is not None:
            problems = label_problems(existing, manifest, (MANAGED_BY_LABEL, KEY_LABEL))
            if problems:
                raise TrainJobConflict(
                    f"TrainJob {namespace}/{req.name} already exists and is not this request's "
                    f"({'; '.join(problems)}); use another name, or delete it"
                )
            found[req.name] = existing
    return list(found.values())


def _replace(backend: Backend, obj: Mapping[str, Any], namespace: str) -> None:
    """Delete an earlier attempt that holds a fixed name, and wait until the name is free."""
    name = _name(obj)
    log.info("TrainJob %s/%s (attempt %s) makes way for the next attempt", namespace, name, attempt_of(obj))
    backend.cancel(JobRef(name=name, namespace=namespace))
    end = time.monotonic() + REPLACE_WAIT_SECONDS
    while backend.read(namespace, name) is not None:
        if time.monotonic() > end:
            raise TrainJobConflict(
                f"TrainJob {namespace}/{name} is still being deleted; retry once it is gone"
            )
        time.sleep(0.5)


class _Taken(Exception):
    """A create-first found its name taken: the launch goes on with the full rule."""


def _create(
    backend: Backend,
    manifest: dict[str, Any],
    namespace: str,
    attempt: int,
    previous: tuple[TrainJobResult, ...],
    before_create: Callable[[JobRef], None] | None,
    *,
    adopt: bool = True,
) -> Launch:
    """Create once; after AlreadyExists or a lost answer, adopt what is there only if it is this request
    (``adopt=False``: raise ``_Taken`` instead, for the caller's full rule)."""
    name = _name(manifest)
    if before_create is not None:
        before_create(JobRef(name=name, namespace=namespace))
    for _ in range(CREATE_TRIES):
        try:
            obj = backend.create(manifest)
            return Launch(_ref(obj, namespace), attempt, False, JobState.CREATED, manifest, previous)
        except (AlreadyExists, OutcomeUnknown) as exc:
            log.info("create of TrainJob %s/%s: %s; looking at what exists", namespace, name, exc)
            if not adopt and isinstance(exc, AlreadyExists):
                raise _Taken from None
            existing = backend.read(namespace, name)
        if existing is None:
            continue  # deleted meanwhile, or the lost create never happened: create again
        if not adopt:
            raise _Taken
        meta = existing.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            raise TrainJobConflict(
                f"TrainJob {namespace}/{name} exists but is being deleted; retry once it is gone"
            )
        problems = is_ours(existing, manifest)
        if problems:
            raise TrainJobConflict(
                f"TrainJob {namespace}/{name} already exists and is not this request's ({'; '.join(problems)}); "
                "use another name or idempotency_key, or delete the existing TrainJob"
            )
        backend.adopt(existing)
        state = result_from_trainjob(existing).state
        return Launch(_ref(existing, namespace), attempt, True, state, dict(existing), previous)
    raise BackendError(
        f"could not create TrainJob {namespace}/{name}: the name was taken and freed {CREATE_TRIES} times"
    )
