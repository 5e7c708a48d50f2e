"""Assets and OpenLineage: a TrainJob task reads ``dataset_uri`` (and ``model_uri``) and writes ``output_uri``.

At DAG parse a literal ``output_uri`` is an outlet ``Asset`` (Airflow records its event when the task succeeds)
and a literal ``dataset_uri`` an inlet. A templated (or request-given) output is known only when the task
runs: the task declares the ``AssetAlias`` ``trainflow-output`` and adds ``Asset(output_uri)`` to it on success,
so DAGs scheduled on that asset run. OpenLineage facets name the same URIs; the OpenLineage provider is an
optional dependency, imported only when its listener asks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

OUTPUT_ALIAS = "trainflow-output"


def literal(value: Any) -> str | None:
    """``value`` when it is a URI known at parse (a string without Jinja), else None."""
    if isinstance(value, str) and value and "{{" not in value and "{%" not in value:
        return value
    return None


def declare(
    inlets: list[Any], outlets: list[Any], dataset_uri: Any, output_uri: Any
) -> tuple[list[Any], list[Any]]:
    """The operator's inlets and outlets with the parse-time assets added (new lists: the user's may be shared)."""
    from trainflow.airflow.compat_sdk import Asset, AssetAlias

    dataset = literal(dataset_uri)
    output = literal(output_uri)
    added_in = [Asset(dataset)] if dataset is not None else []
    added_out = [Asset(output) if output is not None else AssetAlias(OUTPUT_ALIAS)]
    return [*inlets, *added_in], [*outlets, *added_out]


def record_output(context: Mapping[str, Any], outlets: list[Any], outputs: list[str]) -> None:
    """On success: the run's output becomes an asset event through the alias, when the task declared it (a
    parse-time ``Asset`` outlet gets its event from Airflow). Decided by the outlets, not the argument: by now
    templates are rendered, so a templated ``output_uri`` reads like a literal one."""
    from trainflow.airflow.compat_sdk import Asset, AssetAlias

    alias = AssetAlias(OUTPUT_ALIAS)
    events = context.get("outlet_events")
    if events is not None and alias in outlets:
        for uri in outputs:
            events[alias].add(Asset(uri))


@dataclass(frozen=True)
class Lineage:
    """What a task's TrainJob reads (its dataset and base model) and whether the request named an output; the
    output's URI is the result's (where the trainer wrote it). Read from the request once, at execute, and
    carried through a deferral, so resuming never parses the request again."""

    inputs: tuple[str, ...] = ()
    output_named: bool = False

    @classmethod
    def of(cls, request: Any) -> Lineage:
        """From a ``TrainJobRequest``."""
        inputs = tuple(str(uri) for uri in (request.dataset_uri, request.model_uri) if uri)
        return cls(inputs, bool(request.output_uri))

    def outputs(self, result: Any) -> list[str]:
        """The output a ``TrainJobResult`` reports, when the request named one (a local engine's own output
        folder of one run is not an asset)."""
        uri = getattr(result, "output_uri", None)
        return [str(uri)] if self.output_named and uri else []

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": list(self.inputs), "output_named": self.output_named}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Lineage:
        return cls(tuple(data.get("inputs") or ()), bool(data.get("output_named")))


def ol_dataset_name(uri: str) -> tuple[str, str]:
    """OpenLineage (namespace, name) of a URI: ``file`` + path; else ``scheme://authority`` + path."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return "file", parsed.path or uri
    if not parsed.netloc:
        return parsed.scheme, parsed.path or uri
    return f"{parsed.scheme}://{parsed.netloc}", parsed.path.lstrip("/") or "/"


def operator_lineage(inputs: list[str], outputs: list[str]) -> Any:
    """``OperatorLineage`` for the OpenLineage listener (only called when that provider is installed)."""
    from openlineage.client.event_v2 import Dataset

    from airflow.providers.openlineage.extractors import OperatorLineage

    def datasets(uris: list[str]) -> list[Any]:
        return [Dataset(namespace=ns, name=name) for ns, name in map(ol_dataset_name, uris)]

    return OperatorLineage(inputs=datasets(inputs), outputs=datasets(outputs))
