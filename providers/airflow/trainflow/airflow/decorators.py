"""``@task.trainjob``: the decorated function runs as the TrainJob's trainer (a core function trainer).

The function is shipped by source, so it must be defined at module level with its imports inside;
its (templated, XCom-resolvable) arguments travel as JSON ``function_kwargs``. What it returns on rank 0
(JSON, at most 64 KiB) is the task's return value, as with ``@task`` and ``@task.kubernetes``; the
TrainJobResult is the XCom ``trainjob_result``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from trainflow.airflow.compat_sdk import DecoratedOperator, task_decorator_factory
from trainflow.airflow.operators import TrainJobOperator

if TYPE_CHECKING:
    from trainflow.airflow.compat_sdk import Context, TaskDecorator
    from trainflow.core.result import TrainJobResult

RESULT_XCOM_KEY = "trainjob_result"


class _TrainJobDecoratedOperator(DecoratedOperator, TrainJobOperator):
    """TrainJobOperator whose trainer is the decorated function, called with the task's arguments."""

    template_fields: Sequence[str] = (*DecoratedOperator.template_fields, *TrainJobOperator.template_fields)
    template_fields_renderers: ClassVar[dict[str, str]] = {
        **DecoratedOperator.template_fields_renderers,
        **TrainJobOperator.template_fields_renderers,
    }
    custom_operator_name = "@task.trainjob"

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(python_callable=python_callable, op_args=op_args, op_kwargs=op_kwargs, **kwargs)

    def function_arguments(self) -> dict[str, Any]:
        """The call's arguments by parameter name (defaults left to the function itself)."""
        bound = inspect.signature(self.python_callable).bind(*self.op_args, **self.op_kwargs)
        out: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            param = inspect.signature(self.python_callable).parameters[name]
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                out.update(value)
            elif param.kind is inspect.Parameter.VAR_POSITIONAL:
                raise TypeError(
                    f"@task.trainjob function {self.python_callable.__name__}: *{name} is not supported"
                )
            else:
                out[name] = value
        return out

    def execute(self, context: Context) -> Any:
        given: dict[str, Any] = getattr(self, "function_kwargs", None) or {}
        self.function = self.python_callable
        self.function_kwargs = {**given, **self.function_arguments()}
        return TrainJobOperator.execute(self, context)

    def _task_return(self, context: Context, result: TrainJobResult) -> Any:
        """The function's return value (rank 0's); the TrainJobResult goes to XCom ``trainjob_result``."""
        context["ti"].xcom_push(key=RESULT_XCOM_KEY, value=result.to_dict())
        return result.return_value


def trainjob_task(python_callable: Callable[..., Any] | None = None, **kwargs: Any) -> TaskDecorator:
    """``@task.trainjob(runtime=..., num_nodes=..., ...)``: run the function as a TrainJob.

    Accepts every TrainJobOperator argument; the function's own arguments may be templates or XComArgs.
    Returns what the function returned on rank 0 (``multiple_outputs`` as for ``@task``).
    """
    return task_decorator_factory(
        python_callable=python_callable,
        decorated_operator_class=_TrainJobDecoratedOperator,
        **kwargs,
    )
