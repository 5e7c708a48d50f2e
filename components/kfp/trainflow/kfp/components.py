"""KFP v2 components that run Kubeflow Trainer TrainJobs: train_job, wait_train_job, get_train_job.

Each component body is a shim: KFP embeds only the function source, so the body imports
``trainflow.kfp.runner`` inside the container (the image or ``packages_to_install`` must provide trainflow).
Use the ``make_*_component`` factories to choose the base image and what gets pip-installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kfp import dsl
from trainflow.kfp import _bodies

DEFAULT_BASE_IMAGE = "python:3.11-slim"
DEFAULT_PACKAGES: tuple[str, ...] = ("trainflow[kfp]==0.1.0",)

# TaskConfig fields forwarded to the TrainJob by the default train_job component. Nothing changes unless the
# pipeline sets them on the task (set_cpu_limit, add_toleration, ...): that is the opt-in. ENV and VOLUMES
# also apply to the launcher pod, so it sees the same env and the workspace it copies the model from.
DEFAULT_PASSTHROUGHS: tuple[Any, ...] = (
    dsl.TaskConfigField.RESOURCES,
    dsl.TaskConfigField.KUBERNETES_TOLERATIONS,
    dsl.TaskConfigField.KUBERNETES_NODE_SELECTOR,
    dsl.TaskConfigField.KUBERNETES_AFFINITY,
    dsl.TaskConfigPassthrough(field=dsl.TaskConfigField.ENV, apply_to_task=True),
    dsl.TaskConfigPassthrough(field=dsl.TaskConfigField.KUBERNETES_VOLUMES, apply_to_task=True),
)


def _decorate(
    func: Any,
    *,
    base_image: str,
    packages_to_install: Sequence[str] | None,
    install_kfp_package: bool,
    pip_index_urls: Sequence[str] | None = None,
    task_config_passthroughs: Sequence[Any] | None = None,
) -> Any:
    return dsl.component(
        func,
        base_image=base_image,
        packages_to_install=list(packages_to_install) if packages_to_install else None,
        pip_index_urls=list(pip_index_urls) if pip_index_urls else None,
        install_kfp_package=install_kfp_package,
        task_config_passthroughs=list(task_config_passthroughs) if task_config_passthroughs else None,
    )


def make_train_job_component(
    base_image: str = DEFAULT_BASE_IMAGE,
    packages_to_install: Sequence[str] | None = DEFAULT_PACKAGES,
    install_kfp_package: bool = True,
    pip_index_urls: Sequence[str] | None = None,
    task_config_passthroughs: Sequence[Any] | None = DEFAULT_PASSTHROUGHS,
) -> Any:
    """The train_job component for an image: an image with trainflow installed needs packages_to_install=()."""
    return _decorate(
        _bodies.train_job,
        base_image=base_image,
        packages_to_install=packages_to_install,
        install_kfp_package=install_kfp_package,
        pip_index_urls=pip_index_urls,
        task_config_passthroughs=task_config_passthroughs,
    )


def make_wait_train_job_component(
    base_image: str = DEFAULT_BASE_IMAGE,
    packages_to_install: Sequence[str] | None = DEFAULT_PACKAGES,
    install_kfp_package: bool = True,
    pip_index_urls: Sequence[str] | None = None,
) -> Any:
    return _decorate(
        _bodies.wait_train_job,
        base_image=base_image,
        packages_to_install=packages_to_install,
        install_kfp_package=install_kfp_package,
        pip_index_urls=pip_index_urls,
    )


def make_get_train_job_component(
    base_image: str = DEFAULT_BASE_IMAGE,
    packages_to_install: Sequence[str] | None = DEFAULT_PACKAGES,
    install_kfp_package: bool = True,
    pip_index_urls: Sequence[str] | None = None,
) -> Any:
    return _decorate(
        _bodies.get_train_job,
        base_image=base_image,
        packages_to_install=packages_to_install,
        install_kfp_package=install_kfp_package,
        pip_index_urls=pip_index_urls,
    )


FACTORIES = {
    "train_job": make_train_job_component,
    "wait_train_job": make_wait_train_job_component,
    "get_train_job": make_get_train_job_component,
}


# Default instances (base image DEFAULT_BASE_IMAGE, trainflow pip-installed at run time).
train_job = make_train_job_component()
wait_train_job = make_wait_train_job_component()
get_train_job = make_get_train_job_component()
