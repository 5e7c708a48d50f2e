"""Read the provider's ``[trainflow]`` options, falling back to the defaults declared in provider_info."""

from __future__ import annotations

from typing import Any

from trainflow.airflow.provider_info import CONFIG_OPTIONS

SECTION = "trainflow"


def _conf() -> Any:
    from trainflow.airflow.compat_sdk import conf

    return conf


_TRUE = ("1", "true", "yes", "on", "t", "y")


def get(option: str) -> str:
    default = str(CONFIG_OPTIONS[option]["default"] or "")
    try:
        value = _conf().get(SECTION, option, fallback=default)
    except Exception:  # config not initialised (unit tests, odd processes): use the declared default
        return default
    return default if value is None else str(value)


def airflow_option(section: str, option: str, fallback: str = "") -> str:
    """One of Airflow's own options (``fallback`` when unset or config is not initialised)."""
    try:
        value = _conf().get(section, option, fallback=fallback)
    except Exception:
        return fallback
    return fallback if value is None else str(value)


def default_deferrable() -> bool:
    """``deferrable=None``: ``[trainflow] default_deferrable`` when set, else ``[operators] default_deferrable``
    (Airflow's own switch, False unless the deployment turns it on), as cncf.kubernetes operators do."""
    own = get("default_deferrable").strip() or airflow_option("operators", "default_deferrable", "False")
    return own.strip().lower() in _TRUE


def get_int(option: str) -> int:
    try:
        return int(get(option))
    except ValueError:
        return int(CONFIG_OPTIONS[option]["default"])
