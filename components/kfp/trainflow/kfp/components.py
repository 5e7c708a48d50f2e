"""KFP v2 components that run Kubeflow Trainer TrainJobs: train_job, wait_train_job, get_train_job.

Each component body is a shim: KFP embeds only the function source, so the body imports
``trainflow.kfp.runner`` inside the container. The default image is trainflow's KFP step image (``make images``),
which has trainflow and kfp installed: nothing is installed when a step starts. The ``make_*_component``
factories choose another image, or packages to pip-install at start. Every task of these components starts with
KFP's execution cache off (``trainflow.kfp.caching``); ``task.set_caching_options(True)`` opts in.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from kfp import dsl
from trainflow.kfp import _bodies
from trainflow.kfp.caching import uncached

IMAGE_REPOSITORY = "ghcr.io/trainflow/trainflow-kfp"
IMAGE_ENV = "TRAINFLOW_KFP_IMAGE"  # a mirror of the step image, for the default components


def published_image() -> str:
    """The name ``make images`` gives the KFP step image of this trainflow version (docs/images.md)."""
    return f"{IMAGE_REPOSITORY}:{metadata.version('trainflow')}"


def default_image() -> str:
    """``$TRAINFLOW_KFP_IMAGE`` when set (the step image pushed to your registry), else the published name."""
    return os.environ.get(IMAGE_ENV, "").strip() or published_image()


DEFAULT_PACKAGES: tuple[str, ...] = ()  # the step image has trainflow[kfp]: nothing to install at start

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
    component = dsl.component(
        func,
        base_image=base_image,
        packages_to_install=list(packages_to_install) if packages_to_install else None,
        pip_index_urls=list(pip_index_urls) if pip_index_urls else None,
        install_kfp_package=install_kfp_package,
        task_config_passthroughs=list(task_config_passthroughs) if task_config_passthroughs else None,
    )
    return uncached(component)  # a cache hit would train nothing / return a stale state: opt-in per task


def make_train_job_component(
    base_image: str | None = None,
    packages_to_install: Sequence[str] | None = DEFAULT_PACKAGES,
    install_kfp_package: bool = False,
    pip_index_urls: Sequence[str] | None = None,
    task_config_passthroughs: Sequence[Any] | None = DEFAULT_PASSTHROUGHS,
) -> Any:
    """The train_job component for an image (default: ``default_image()``). An image without trainflow needs
    ``packages_to_install=["trainflow[kfp]==<version>"]`` and ``install_kfp_package=True``."""
    return _decorate(
        _bodies.train_job,
        base_image=base_image or default_image(),
        packages_to_install=packages_to_install,
        install_kfp_package=install_kfp_package,
        pip_index_urls=pip_index_urls,
        task_config_passthroughs=task_config_passthroughs,
    )


def make_wait_train_job_component(
    base_image: str | None = None,
    packages_to_install: Sequence[str] | None = DEFAULT_PACKAGES,
    install_kfp_package: bool = False,
    pip_index_urls: Sequence[str] | None = None,
) -> Any:
    return _decorate(
        _bodies.wait_train_job,
        base_image=base_image or default_image(),
        packages_to_install=packages_to_install,
        install_kfp_package=install_kfp_package,
        pip_index_urls=pip_index_urls,
    )


def make_get_train_job_component(
    base_image: str | None = None,
    packages_to_install: Sequence[str] | None = DEFAULT_PACKAGES,
    install_kfp_package: bool = False,
    pip_index_urls: Sequence[str] | None = None,
) -> Any:
    return _decorate(
        _bodies.get_train_job,
        base_image=base_image or default_image(),
        packages_to_install=packages_to_install,
        install_kfp_package=install_kfp_package,
        pip_index_urls=pip_index_urls,
    )


FACTORIES = {
    "train_job": make_train_job_component,
    "wait_train_job": make_wait_train_job_component,
    "get_train_job": make_get_train_job_component,
}


# Default instances: the KFP step image (or $TRAINFLOW_KFP_IMAGE), nothing installed at run time.
train_job = make_train_job_component()
wait_train_job = make_wait_train_job_component()
get_train_job = make_get_train_job_component()
