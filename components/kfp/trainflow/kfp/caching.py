"""trainflow's KFP steps are not served from KFP's execution cache unless a pipeline asks for it, task by task.

kfp caches every task by default, and a cache hit runs nothing: a recurring run with the same arguments would
train nothing and pass the previous run's Model on, and a state step would return a stale state. So every task
of these components starts with caching off, and so does a component compiled on its own (``components/yaml``:
a one-task pipeline a backend can run as it is). ``task.set_caching_options(True)`` opts one task in.
kfp 2.17 has no per-component caching default, hence these two subclasses of its own classes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kfp.dsl import structures
from kfp.dsl.pipeline_task import PipelineTask, TaskState
from kfp.dsl.python_component import PythonComponent


class UncachedSpec(structures.ComponentSpec):  # type: ignore[misc]  # kfp ships no type hints
    """A component spec whose own pipeline spec (the component compiled on its own: one task) is uncached."""

    def to_pipeline_spec(self) -> Any:
        spec = super().to_pipeline_spec()
        for task in spec.root.dag.tasks.values():
            task.caching_options.enable_cache = False
        return spec


class UncachedComponent(PythonComponent):  # type: ignore[misc]
    """A Python component whose tasks in a pipeline start with caching off."""

    def __call__(self, *args: Any, **kwargs: Any) -> PipelineTask:
        task = super().__call__(*args, **kwargs)
        if task.state is TaskState.FUTURE:  # in a pipeline; a step kfp.local ran already is FINAL
            task.set_caching_options(enable_caching=False)
        return task


def uncached(component: PythonComponent) -> UncachedComponent:
    """The same component, with caching off by default."""
    spec = component.component_spec
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    return UncachedComponent(component_spec=UncachedSpec(**fields), python_func=component.python_func)
