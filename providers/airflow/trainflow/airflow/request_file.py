"""``request_file``: a TrainJob request as a YAML/JSON file next to the DAG, rendered by Jinja like any template.

Airflow loads every templated string that ends in one of ``template_ext`` as a template file, so with the
extensions declared, ``dataset_uri="s3://b/train.json"`` or ``args=["--config", "c.yaml"]`` would fail as
missing templates (cncf.kubernetes' ``KubernetesPodOperator`` has that trap). Here only ``request_file`` is
looked up as a file; every other field renders as a plain template.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from trainflow.airflow.arguments import REQUEST_FILE_EXT as TEMPLATE_EXT

log = logging.getLogger(__name__)

FILE_FIELDS = ("request_file",)


def parse_request_file(content: str | None) -> dict[str, Any]:
    """The rendered file's request fields ({} without one); InvalidRequest naming ``request_file``."""
    if not content:
        return {}
    from trainflow.core.request_text import parse_request_text

    return parse_request_text(str(content), "request_file")


class RequestFileTemplates:
    """Operator mixin: ``template_ext`` applies to ``request_file`` only."""

    template_ext: Sequence[str] = TEMPLATE_EXT
    template_fields: Sequence[str]

    def resolve_template_files(self) -> None:
        """At DAG load Airflow swaps a file path for the file's text: for ``request_file`` only."""
        for field in FILE_FIELDS:
            content = getattr(self, field, None)
            if isinstance(content, str) and content.endswith(TEMPLATE_EXT):
                env = self.get_template_env()  # type: ignore[attr-defined]
                try:
                    setattr(self, field, env.loader.get_source(env, content)[0])
                except Exception:  # as Airflow does: the render names the missing file if it still is
                    log.exception("Could not read %s=%r", field, content)
        self.prepare_template()  # type: ignore[attr-defined]

    def _do_render_template_fields(
        self, parent: Any, template_fields: Iterable[str], context: Any, jinja_env: Any, seen_oids: set[int]
    ) -> None:
        fields = list(template_fields)
        render = super()._do_render_template_fields  # type: ignore[misc]
        if parent is not self:
            render(parent, fields, context, jinja_env, seen_oids)
            return
        render(parent, [f for f in fields if f in FILE_FIELDS], context, jinja_env, seen_oids)
        self.__dict__["_plain_templates"] = True
        try:
            render(parent, [f for f in fields if f not in FILE_FIELDS], context, jinja_env, seen_oids)
        finally:
            self.__dict__["_plain_templates"] = False

    def render_template(
        self, content: Any, context: Any, jinja_env: Any = None, seen_oids: set[int] | None = None
    ) -> Any:
        if self.__dict__.get("_plain_templates") and isinstance(content, str):
            env = jinja_env or self.get_template_env()  # type: ignore[attr-defined]
            return self._render(env.from_string(content), context)  # type: ignore[attr-defined]
        return super().render_template(content, context, jinja_env, seen_oids)  # type: ignore[misc]
