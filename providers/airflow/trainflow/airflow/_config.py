"""Read the provider's ``[trainflow]`` options, falling back to the defaults declared in provider_info."""

from __future__ import annotations

from typing import Any

from trainflow.airflow.provider_info import CONFIG_OPTIONS

SECTION = "trainflow"


def _conf() -> Any:
    try:
        from airflow.sdk.configuration import conf
    except ImportError:  # pragma: no cover - Airflow 3.0/3.1 layout
        from airflow.configuration import conf
    return conf


def get(option: str) -> str:
    default = str(CONFIG_OPTIONS[option]["default"])
    try:
        value = _conf().get(SECTION, option, fallback=default)
    except Exception:  # config not initialised (unit tests, odd processes): use the declared default
        return default
    return default if value is None else str(value)


def get_bool(option: str) -> bool:
    return get(option).strip().lower() in ("1", "true", "yes", "on", "t", "y")


def get_int(option: str) -> int:
    try:
        return int(get(option))
    except ValueError:
        return int(CONFIG_OPTIONS[option]["default"])
