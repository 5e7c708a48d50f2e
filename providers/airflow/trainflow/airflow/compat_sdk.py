"""The Airflow names that moved between lines, each imported from where this line keeps it.

Through ``airflow.providers.common.compat.sdk`` wherever the installed common-compat has it (1.8 and later), as
every Apache provider does. Airflow 3.0.6's constraints file pins common-compat 1.7.3, which has no ``sdk``
module, and users install under their release's full constraints file (MWAA, Composer): there each name is
imported from the places common-compat's own table names for it, newest first. Resolved on first use and kept.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.providers.common.compat.sdk import (
        AirflowException as AirflowException,
    )
    from airflow.providers.common.compat.sdk import (
        AirflowFailException as AirflowFailException,
    )
    from airflow.providers.common.compat.sdk import (
        AirflowNotFoundException as AirflowNotFoundException,
    )
    from airflow.providers.common.compat.sdk import (
        AirflowSensorTimeout as AirflowSensorTimeout,
    )
    from airflow.providers.common.compat.sdk import (
        AirflowSkipException as AirflowSkipException,
    )
    from airflow.providers.common.compat.sdk import (
        AirflowTaskTimeout as AirflowTaskTimeout,
    )
    from airflow.providers.common.compat.sdk import Asset as Asset
    from airflow.providers.common.compat.sdk import AssetAlias as AssetAlias
    from airflow.providers.common.compat.sdk import BaseHook as BaseHook
    from airflow.providers.common.compat.sdk import BaseOperator as BaseOperator
    from airflow.providers.common.compat.sdk import BaseOperatorLink as BaseOperatorLink
    from airflow.providers.common.compat.sdk import BaseSensorOperator as BaseSensorOperator
    from airflow.providers.common.compat.sdk import Connection as Connection
    from airflow.providers.common.compat.sdk import Context as Context
    from airflow.providers.common.compat.sdk import DecoratedOperator as DecoratedOperator
    from airflow.providers.common.compat.sdk import PokeReturnValue as PokeReturnValue
    from airflow.providers.common.compat.sdk import TaskDecorator as TaskDecorator
    from airflow.providers.common.compat.sdk import XCom as XCom
    from airflow.providers.common.compat.sdk import conf as conf
    from airflow.providers.common.compat.sdk import task_decorator_factory as task_decorator_factory

_EXCEPTIONS = ("airflow.sdk.exceptions", "airflow.exceptions")
# name -> (module, name there) in the order tried: common-compat 1.14's table for the names the provider uses
WHERE: dict[str, tuple[tuple[str, str], ...]] = {
    **{
        name: tuple((module, name) for module in _EXCEPTIONS)
        for name in (
            "AirflowException",
            "AirflowFailException",
            "AirflowNotFoundException",
            "AirflowSensorTimeout",
            "AirflowSkipException",
            "AirflowTaskTimeout",
        )
    },
    "Asset": (("airflow.sdk", "Asset"), ("airflow.datasets", "Dataset")),
    "AssetAlias": (("airflow.sdk", "AssetAlias"), ("airflow.datasets", "DatasetAlias")),
    "BaseHook": (("airflow.sdk", "BaseHook"), ("airflow.hooks.base", "BaseHook")),
    "BaseOperator": (("airflow.sdk", "BaseOperator"), ("airflow.models.baseoperator", "BaseOperator")),
    "BaseOperatorLink": (
        ("airflow.sdk", "BaseOperatorLink"),
        ("airflow.models.baseoperatorlink", "BaseOperatorLink"),
    ),
    "BaseSensorOperator": (
        ("airflow.sdk", "BaseSensorOperator"),
        ("airflow.sensors.base", "BaseSensorOperator"),
    ),
    "Connection": (("airflow.sdk", "Connection"), ("airflow.models.connection", "Connection")),
    "Context": (("airflow.sdk", "Context"), ("airflow.utils.context", "Context")),
    "DecoratedOperator": (
        ("airflow.sdk.bases.decorator", "DecoratedOperator"),
        ("airflow.decorators.base", "DecoratedOperator"),
    ),
    "PokeReturnValue": (("airflow.sdk", "PokeReturnValue"), ("airflow.sensors.base", "PokeReturnValue")),
    "TaskDecorator": (
        ("airflow.sdk.bases.decorator", "TaskDecorator"),
        ("airflow.decorators", "TaskDecorator"),
    ),
    "XCom": (("airflow.sdk.execution_time.xcom", "XCom"), ("airflow.models.xcom", "XCom")),
    "conf": (("airflow.sdk.configuration", "conf"), ("airflow.configuration", "conf")),
    "task_decorator_factory": (
        ("airflow.sdk.bases.decorator", "task_decorator_factory"),
        ("airflow.decorators.base", "task_decorator_factory"),
    ),
}


def _common_compat_sdk() -> Any:
    try:
        return importlib.import_module("airflow.providers.common.compat.sdk")
    except ImportError:
        return None


def resolve(name: str, *, through_common_compat: bool = True) -> Any:
    """``name`` from common-compat's ``sdk`` when it has one, else from the first place of WHERE that has it."""
    sdk = _common_compat_sdk() if through_common_compat else None
    if sdk is not None:
        return getattr(sdk, name)
    tried = []
    for module, attribute in WHERE[name]:
        try:
            return getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError):
            tried.append(f"{module}.{attribute}")
    raise ImportError(
        f"{name} is in none of {', '.join(tried)}: this Airflow is older than trainflow supports"
    )


def __getattr__(name: str) -> Any:
    if name not in WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = resolve(name)
    globals()[name] = value
    return value
