"""What goes into trainflow's images: one staged venv per family, cut into layers shared across images."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERSION: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
REGISTRY = "ghcr.io/trainflow"
EXAMPLES_DIR = "opt/trainflow-examples"
_CUDA = re.compile(r"^(nvidia-.*|cuda-.*|triton)$")


@dataclass(frozen=True)
class LayerSpec:
    """A layer of a family: ``deps`` (trainflow[kfp]'s dependencies + venv skeleton), ``cuda`` (CUDA
    libraries and triton), ``own`` (what ``requirements`` add beyond the family's other requirements),
    ``rest`` (what is left: torch and its own dependencies), ``trainflow`` (the wheel) or ``examples``
    (files from the repository)."""

    name: str
    role: str
    comment: str
    requirements: tuple[str, ...] = ()  # role "own" only


@dataclass(frozen=True)
class Family:
    """Images built from one staged venv; they share every layer they have in common."""

    name: str
    extras_requirements: tuple[str, ...]  # besides trainflow[kfp] from the wheel
    layers: tuple[LayerSpec, ...]

    def requirements(self, wheel: Path) -> list[str]:
        return [f"trainflow[kfp] @ {wheel.resolve().as_uri()}", *self.extras_requirements]


@dataclass(frozen=True)
class ImageSpec:
    id: str
    family: str
    layers: tuple[str, ...]  # layer names of the family, after the base
    repository: str
    title: str
    description: str
    env: tuple[str, ...] = ()

    @property
    def default_name(self) -> str:
        return f"{REGISTRY}/{self.repository}:{VERSION}"


DEPS = LayerSpec("deps", "deps", "trainflow[kfp] dependencies and the /opt/venv skeleton (uv.lock versions)")
TRAINFLOW = LayerSpec("trainflow", "trainflow", "trainflow from the built wheel")

FAMILIES = {
    "torch": Family(
        "torch",
        ("torch", "numpy", "xgboost-cpu"),
        (
            DEPS,
            LayerSpec("cuda", "cuda", "CUDA libraries (nvidia-*, cuda-*) and triton, from PyPI"),
            LayerSpec("torch", "rest", "torch and its remaining dependencies, numpy"),
            # its own layer, so adding it left the 1.4 GB torch layer's digest as it was
            LayerSpec("xgboost", "own", "xgboost-cpu (the CPU build of XGBoost) and scipy", ("xgboost-cpu",)),
            TRAINFLOW,
            LayerSpec("examples", "examples", f"dags_examples/example_training.py in /{EXAMPLES_DIR}"),
        ),
    ),
    "kfp": Family("kfp", (), (DEPS, TRAINFLOW)),
}

IMAGES = {
    "trainer": ImageSpec(
        "trainer",
        "torch",
        ("deps", "cuda", "torch", "xgboost", "trainflow"),
        "trainflow-trainer",
        "trainflow trainer",
        "Python 3.11, torch (PyPI build, CUDA or CPU), xgboost-cpu and trainflow[kfp]: a trainer image for "
        "TrainJobs",
    ),
    "kfp": ImageSpec(
        "kfp",
        "kfp",
        ("deps", "trainflow"),
        "trainflow-kfp",
        "trainflow KFP step",
        "Python 3.11 and trainflow[kfp]: the image of trainflow's KFP components (nothing installed at start)",
    ),
    "examples": ImageSpec(
        "examples",
        "torch",
        ("deps", "cuda", "torch", "xgboost", "trainflow", "examples"),
        "trainflow-examples",
        "trainflow examples",
        "The trainer image plus the example training code (module example_training) on PYTHONPATH",
        env=(f"PYTHONPATH=/{EXAMPLES_DIR}",),
    ),
}

EXAMPLE_FILES = ("dags_examples/example_training.py",)

BASE_ENV = (
    "PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "VIRTUAL_ENV=/opt/venv",
    "LANG=C.UTF-8",
    "PYTHONUNBUFFERED=1",
)
WORKDIR = "/workspace"
CMD = ("python3",)


def cuda_dist(name: str) -> bool:
    return bool(_CUDA.match(name))
