"""Credentials given as plain values: names that look secret, URL userinfo and known token shapes.

Anything plain in a request ends up in the TrainJob object, readable by whoever may read TrainJobs; a
credential belongs in a Kubernetes Secret (``secret_env``). Errors never show the value.
``allow_plain_credentials`` turns every check here off.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from trainflow.core.errors import FieldIssue

if TYPE_CHECKING:
    from trainflow.core.request import TrainJobRequest

_NAME = re.compile(
    r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIALS?)(_|$)|_(PASS|KEY)$",
    re.IGNORECASE,
)
# scheme://user:password@ anywhere in the text (also after "--dsn=" or inside a longer value); every repeat is
# bounded so a long value (up to the request size cap) is scanned in linear time, not quadratic
URL_USERINFO = re.compile(
    r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,31}://[^/?#@\s:]{0,256}:[^/?#@\s]{1,256}@"
)
# Formats documented by their issuers (prefixes that cannot be an ordinary word), so matches are real tokens.
TOKEN_SHAPES = (
    ("an AWS access key id", re.compile(r"\b(AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("a GitHub token", re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})")),
    ("a GitLab token", re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}")),
    ("a Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("an API secret key (sk-...)", re.compile(r"\b(sk-(proj-|ant-)?|sk_live_|rk_live_)[A-Za-z0-9_-]{20,}")),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}")),
    ("a private key", re.compile(r"-----BEGIN ([A-Z0-9]+ )*PRIVATE KEY-----")),
    ("a JSON Web Token", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
)
FIX = "give it through secret_env {'NAME': 'secret-name/key'}, or set allow_plain_credentials"


def looks_like_credential(name: str) -> bool:
    """An environment variable name that usually holds a secret (``*_TOKEN``, ``*_PASS``, ``*_KEY``, ...)."""
    return bool(_NAME.search(name))


def credential_in(text: str) -> str | None:
    """What kind of credential ``text`` holds (URL userinfo, a known token shape), or None."""
    if "://" in text and URL_USERINFO.search(text):
        return "credentials in a URL (user:password@)"
    for what, shape in TOKEN_SHAPES:
        if shape.search(text):
            return what
    return None


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(path, text) of every string inside a JSON value, keys included, depth first."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            yield where, item
        elif isinstance(item, dict):
            for key, inner in reversed(list(item.items())):
                yield f"{where}.{key}", str(key)
                stack.append((f"{where}.{key}", inner))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", inner) for i, inner in reversed(list(enumerate(item))))


def check(req: TrainJobRequest) -> list[FieldIssue]:
    """Plain credentials anywhere a request carries free text: env names and values, argv, function kwargs."""
    if req.allow_plain_credentials:
        return []
    issues: list[FieldIssue] = []
    for name, value in req.env.items():
        what = credential_in(value)
        if what:
            issues.append(FieldIssue(f"env.{name}", f"value holds {what} (value not shown)", FIX))
        elif looks_like_credential(name):
            issues.append(FieldIssue(f"env.{name}", "looks like a credential given as a plain value", FIX))
    places: list[tuple[str, str]] = []
    for field in ("command", "args"):
        places += [(f"{field}[{i}]", arg) for i, arg in enumerate(getattr(req, field) or [])]
    places += list(_strings(req.function_kwargs, "function_kwargs"))
    for where, text in places:
        what = credential_in(text)
        if what:
            issues.append(FieldIssue(where, f"holds {what} (value not shown)", FIX))
    return issues
