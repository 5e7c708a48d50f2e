"""A request written as YAML or JSON text (``trainflow submit -f``, Airflow's ``request_file``) -> request fields.

Keys must be unique (YAML says so; PyYAML would keep the last one silently); errors name the source and line.
"""

from __future__ import annotations

from typing import Any

import yaml

from trainflow.core.errors import InvalidRequest

MAX_REQUEST_FILE_BYTES = 1 << 20


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice."""


def _no_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {str(key)[:80]!r} (line {mark.line + 1})", mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def parse_request_text(text: str, source: str, field: str = "request_file") -> dict[str, Any]:
    """The mapping of request fields in ``text`` (read from ``source``); InvalidRequest naming ``field``."""
    if len(text.encode("utf-8", "replace")) > MAX_REQUEST_FILE_BYTES:
        raise InvalidRequest.one(field, f"{source}: larger than {MAX_REQUEST_FILE_BYTES} bytes", "trim it")
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader) if text.strip() else {}
    except RecursionError:
        raise InvalidRequest.one(field, f"{source}: nested too deeply to be a request") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or exc
        raise InvalidRequest.one(field, f"{source}{where}: not valid YAML/JSON ({problem})") from None
    if not isinstance(data, dict):
        raise InvalidRequest.one(
            field, f"{source}: expected a mapping of request fields, got {type(data).__name__}"
        )
    return data
