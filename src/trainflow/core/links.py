"""A TrainJob's page in the user's dashboard, from a URL template: the Airflow extra link and the KFP summary."""

from __future__ import annotations

PLACEHOLDERS = ("name", "namespace", "uid")


def dashboard_url(
    template: str | None, name: str | None, namespace: str | None, uid: str | None = None
) -> str:
    """``template`` with ``{name}``, ``{namespace}`` and ``{uid}`` filled in; "" when either is missing or the
    template names anything else (a bad template costs the link, never the task)."""
    template = (template or "").strip()
    if not template or not name:
        return ""
    try:
        return template.format(name=name, namespace=namespace or "", uid=uid or "")
    except (KeyError, IndexError, ValueError, AttributeError):
        return ""
