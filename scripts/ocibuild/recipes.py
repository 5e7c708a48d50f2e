"""What goes into trainflow's images: one staged venv per family, cut into layers shared across images."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERSION: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
REGISTRY = "ghcr.io/trainflow"
EXAMPLES_DIR = "opt/trainflow-examples"
WORKDIR = "/workspace"
_CUDA = re.compile(r"^(nvidia-.*|cuda-.*|triton)$")
# What only a GPU ever loads, of the CUDA layer's distributions (site-packages-relative patterns): the cuDNN
# engines and sub-libraries (libcudnn.so.9 opens them on first GPU use), cuSOLVER (needed only by torch's
# CUDA linear algebra library, itself opened on first use), NVSHMEM's transports and bootstraps, device
# bitcode, static archives, profiler and BLAS-compat libraries, and triton (torch's GPU kernel compiler).
# They go to the ``gpu`` layer: a CPU-only image (``runtimes``) leaves it out; every library torch, NCCL
# and cuSPARSE link at load time stays in ``cuda``, so ``import torch`` and gloo work there.
GPU_ONLY = (
    "nvidia/cudnn/lib/libcudnn_*.so*",
    "nvidia/cu*/lib/libcusolver*.so*",
    "nvidia/nvshmem/lib/nvshmem_*.so*",
    "nvidia/*/lib/*.a",
    "nvidia/*/lib/*.bc",
    "nvidia/cu*/lib/libcufftw.so*",
    "nvidia/cu*/lib/libnvblas.so*",
    "nvidia/cu*/lib/libnvperf_*.so*",
    "nvidia/cu*/lib/libpcsamplingutil.so*",
    "nvidia/cu*/lib/libcheckpoint.so*",
    "nvidia/cu*/lib/libcufile_rdma.so*",
    "triton/*",
    "triton-*.dist-info/*",
)


@dataclass(frozen=True)
class LayerSpec:
    """A layer of a family: ``deps`` (trainflow[kfp]'s dependencies, or the projects', + venv skeleton),
    ``cuda`` (CUDA libraries), ``gpu`` (the files of ``cuda``'s distributions that match GPU_ONLY), ``own``
    (what ``requirements`` add beyond the family's other requirements), ``rest`` (what is left: torch and its
    own dependencies), ``trainflow`` (the wheel), ``examples`` (files from the repository) or ``files`` (the
    repository directory ``copy[0]`` as ``copy[1]``)."""

    name: str
    role: str
    comment: str
    requirements: tuple[str, ...] = ()  # role "own" only
    copy: tuple[str, str] = ("", "")  # role "files" only: (repository directory, rootfs-relative directory)


@dataclass(frozen=True)
class Family:
    """Images built from one staged venv; they share every layer they have in common."""

    name: str
    # besides trainflow[kfp] from the wheel (or the projects' dependencies)
    extras_requirements: tuple[str, ...]
    layers: tuple[LayerSpec, ...]
    # Python projects (repository directories with a pyproject.toml and a uv.lock): when set, the venv holds
    # their dependencies at the versions their locks pin, instead of trainflow[kfp] under uv.lock's
    projects: tuple[str, ...] = ()
    workdir: str = WORKDIR  # the directory the ``deps`` layer creates (the images' working directory)
    # What the family's programs import at start: when set, the distribution layers but ``deps`` and
    # ``trainflow`` (which other families share) hold byte code only for the modules importing these loads;
    # any other module compiles when a program first imports it. Empty: every source is byte-compiled.
    imports: tuple[str, ...] = ()

    def base_requirements(self, wheel: Path) -> list[str]:
        """What the ``deps`` layer holds with its dependencies."""
        if self.projects:
            return sorted({d for p in self.projects for d in project_dependencies(REPO / p)})
        return [f"trainflow[kfp] @ {wheel.resolve().as_uri()}"]

    def requirements(self, wheel: Path) -> list[str]:
        return [*self.base_requirements(wheel), *self.extras_requirements]


def project_dependencies(project: Path) -> list[str]:
    deps: list[str] = tomllib.loads((project / "pyproject.toml").read_text())["project"]["dependencies"]
    return deps


@dataclass(frozen=True)
class ImageSpec:
    id: str
    family: str
    layers: tuple[str, ...]  # layer names of the family, after the base
    repository: str
    title: str
    description: str
    env: tuple[str, ...] = ()
    workdir: str = ""  # default: the family's workdir
    entrypoint: tuple[str, ...] = ()  # set: the image has this Entrypoint and no Cmd
    registry: str = REGISTRY
    version: str = VERSION  # the tag and the version label

    @property
    def default_name(self) -> str:
        return f"{self.registry}/{self.repository}:{self.version}"


DEPS = LayerSpec("deps", "deps", "trainflow[kfp] dependencies and the /opt/venv skeleton (uv.lock versions)")
TRAINFLOW = LayerSpec("trainflow", "trainflow", "trainflow from the built wheel")

# The MPI frameworks of the Trainer's runtimes, CPU builds, pinned here (they are not trainflow dependencies,
# so uv.lock does not pin them): DeepSpeed (its sdist; no ops compiled: DS_BUILD_OPS unset), mpi4py (its
# wheel loads the system Open MPI), MLX (Linux CPU build) and JAX (CPU).
FRAMEWORKS = ("deepspeed==0.19.8", "mpi4py==4.1.2", "mlx[cpu]==0.32.4", "jax==0.10.2")
# Hugging Face Transformers with its torch extra (its Trainer needs accelerate), for trainflow.core.hf's
# TrainflowCallback in HF training code: the versions uv.lock holds for the dev extra, where the local tests run
HF = ("transformers[torch]==5.24.0", "accelerate==1.15.0")
# Kubeflow Trainer v2.3.0's TorchTune image requirements (cmd/trainers/torchtune/requirements.txt): torchtune and
# torchao as it pins them, bitsandbytes and kagglehub at the versions its ranges resolved to on 2026-12-03. Its
# torch (2.9.1, from its pytorch/pytorch base) is not taken: this layer sits on the family's torch (docs/images.md).
TORCHTUNE = ("torchtune==0.6.1", "torchao==0.15.0", "bitsandbytes==0.50.2", "kagglehub==1.0.3")

# What the torch family's programs import at start: the Trainer's launchers (torchrun, TorchTune's ``tune``),
# the frameworks its default runtimes run and the training APIs examples use. Byte-compiling every installed
# source instead (about four times the files: Transformers', JAX's and torch's unused parts) was a third to a
# half of a cold image build (CONTRIBUTING.md). mpi4py.MPI is left out: it loads Open MPI, which is a Debian layer of its own.
TORCH_IMPORTS = (
    "torch",
    "torch.distributed.run",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "torch.nn.parallel",
    "torch.utils.data",
    "torch.optim",
    "numpy",
    "xgboost",
    "deepspeed",
    "mpi4py",
    "mlx.core",
    "mlx.nn",
    "mlx.optimizers",
    "jax",
    "jax.numpy",
    "transformers.trainer",
    "accelerate",
    "torchtune",
    "torchtune._cli.tune",
    "torchtune.training",
    "torchao",
)

FAMILIES = {
    "torch": Family(
        "torch",
        ("torch", "numpy", "xgboost-cpu", *FRAMEWORKS, *HF, *TORCHTUNE),
        (
            DEPS,
            LayerSpec("cuda", "cuda", "CUDA libraries (nvidia-*, cuda-*) that torch loads, from PyPI"),
            LayerSpec(
                "cuda-gpu",
                "gpu",
                "what only a GPU loads: cuDNN engines, cuSOLVER, NVSHMEM transports, triton",
            ),
            LayerSpec("torch", "rest", "torch and its remaining dependencies, numpy"),
            # its own layer, so adding it left the 1.4 GB torch layer's digest as it was
            LayerSpec("xgboost", "own", "xgboost-cpu (the CPU build of XGBoost) and scipy", ("xgboost-cpu",)),
            # after xgboost: what they add beyond every layer above (so the layers above kept their digests)
            LayerSpec("frameworks", "own", "DeepSpeed, mpi4py, MLX (CPU) and JAX (CPU)", FRAMEWORKS),
            # after the frameworks, so every layer above kept its digest
            LayerSpec("hf", "own", "Hugging Face Transformers and its own dependencies", HF),
            # after hf, for the same reason; only the torchtune image has it
            LayerSpec(
                "torchtune", "own", "torchtune, torchao, bitsandbytes, kagglehub and what they add", TORCHTUNE
            ),
            TRAINFLOW,
            LayerSpec("examples", "examples", f"dags_examples/example_training.py in /{EXAMPLES_DIR}"),
        ),
        imports=TORCH_IMPORTS,
    ),
    "kfp": Family("kfp", (), (DEPS, TRAINFLOW)),
}

# Kubeflow Trainer's dataset and model initializers, from its v2.3.0 sources vendored unmodified (third party,
# Apache-2.0): the two projects' dependencies at their uv.lock versions, and pkg/initializers in /app, as the
# upstream Dockerfiles (cmd/initializers/*/Dockerfile) lay them out. No trainflow in them.
TRAINER_TAG = "v2.3.0"  # the tag the Trainer's runtimes overlay gives these images (the testbed installs it)
TRAINER_SOURCES = f"testbed/upstream/trainer-{TRAINER_TAG}"
INITIALIZERS_DIR = "app"
FAMILIES["initializers"] = Family(
    "initializers",
    (),
    (
        LayerSpec(
            "initializer-deps",
            "deps",
            "huggingface-hub, opendal, kubernetes and their dependencies (Trainer uv.lock versions), /opt/venv",
        ),
        LayerSpec(
            "initializers",
            "files",
            f"Kubeflow Trainer {TRAINER_TAG} pkg/initializers in /{INITIALIZERS_DIR}",
            copy=(f"{TRAINER_SOURCES}/pkg/initializers", f"{INITIALIZERS_DIR}/pkg/initializers"),
        ),
    ),
    projects=tuple(f"{TRAINER_SOURCES}/cmd/initializers/{kind}" for kind in ("dataset", "model")),
    workdir=f"/{INITIALIZERS_DIR}",
)


@dataclass(frozen=True)
class DebianSpec:
    """Debian packages over the base, as one layer; ``hooks`` run after them (mmdebstrap customize hooks,
    ``$1`` is the root)."""

    name: str
    packages: tuple[str, ...]
    hooks: tuple[str, ...] = ()


MPI_USER_HOME = "/home/mpiuser"
# What the MPI runtimes expect of their image (the Trainer's deepspeed/mlx Dockerfiles build on
# mpi-operator's base): user mpiuser (uid 1000), whose sshd runs unprivileged on port 2222 with the host key
# the Trainer mounts in ~/.ssh, StrictModes off (the Secret's files are group-readable), clients that trust
# any host key. ``SetEnv``: the ranks mpirun starts over ssh get the image's PATH (its venv first; sshd
# would give them its default PATH) and Python settings. No host keys ship (sshd uses the mounted one; ssh-keygen's are per build).
MPI_HOOKS = (
    'chroot "$1" useradd --create-home --uid 1000 --shell /bin/bash mpiuser',
    'sed -i "s/^#\\?\\s*StrictHostKeyChecking .*/    StrictHostKeyChecking no/; s/^#\\?\\s*Port .*/    Port 2222/"'
    ' "$1/etc/ssh/ssh_config" && printf "    UserKnownHostsFile /dev/null\\n" >> "$1/etc/ssh/ssh_config"',
    'sed -i "s/^#StrictModes .*/StrictModes no/; s/^#Port .*/Port 2222/" "$1/etc/ssh/sshd_config"',
    f'printf "PidFile {MPI_USER_HOME}/sshd.pid\\nHostKey {MPI_USER_HOME}/.ssh/id_rsa\\nStrictModes no\\n'
    f'Port 2222\\nSetEnv PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin PYTHONUNBUFFERED=1 LANG=C.UTF-8\\n" > "$1{MPI_USER_HOME}/.sshd_config"'
    f' && mkdir -p "$1{MPI_USER_HOME}/.cache" && chroot "$1" chown -R mpiuser:mpiuser {MPI_USER_HOME}',
    'rm -f "$1"/etc/ssh/ssh_host_*',
    # MLX loads Open MPI as "libmpi.so", the name libopenmpi-dev links (as the Trainer's MLX image has it); that
    # package would also bring gcc and gfortran (+250 MB), so only the link
    'ln -s libmpi.so.40 "$1/usr/lib/x86_64-linux-gnu/libmpi.so"',
)
DEBIAN_LAYERS = {"mpi": DebianSpec("mpi", ("openmpi-bin", "openssh-server", "openssh-client"), MPI_HOOKS)}

IMAGES = {
    "trainer": ImageSpec(
        "trainer",
        "torch",
        ("deps", "cuda", "cuda-gpu", "torch", "xgboost", "trainflow"),
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
        ("deps", "cuda", "cuda-gpu", "torch", "xgboost", "trainflow", "examples"),
        "trainflow-examples",
        "trainflow examples",
        "The trainer image plus the example training code (module example_training) on PYTHONPATH",
        env=(f"PYTHONPATH=/{EXAMPLES_DIR}",),
    ),
}

# One image for every default runtime's trainer (torch-, deepspeed-, mlx-, jax-, xgboost-distributed) on CPU:
# the trainer image's layers but ``cuda-gpu`` (2.2 GB no CPU run loads), plus Open MPI + sshd and the
# MPI/JAX frameworks (layers shared with `trainer`).
IMAGES["runtimes"] = ImageSpec(
    "runtimes",
    "torch",
    ("deps", "cuda", "torch", "xgboost", "mpi", "frameworks", "hf", "trainflow"),
    "trainflow-runtimes",
    "trainflow runtimes",
    "The trainer image plus Open MPI, an unprivileged sshd (user mpiuser, port 2222), DeepSpeed, mpi4py, "
    "MLX, JAX (CPU) and Hugging Face Transformers: the image of the Trainer's default runtimes on CPU",
    env=(f"HOME={MPI_USER_HOME}",),
    workdir=MPI_USER_HOME,
)


def _initializer(kind: str) -> ImageSpec:
    """The Trainer's ``kind`` initializer, named as its runtimes reference it once the overlay tags it."""
    return ImageSpec(
        f"{kind}-initializer",
        "initializers",
        ("initializer-deps", "initializers"),
        f"{kind}-initializer",
        f"Kubeflow Trainer {kind} initializer",
        f"Kubeflow Trainer {TRAINER_TAG}'s {kind} initializer (pkg.initializers.{kind}), built from its "
        "sources on Python 3.11",
        entrypoint=("python", "-m", f"pkg.initializers.{kind}"),
        registry="ghcr.io/kubeflow/trainer",
        version=TRAINER_TAG,
    )


IMAGES |= {spec.id: spec for spec in (_initializer("dataset"), _initializer("model"))}

IMAGES["torchtune"] = ImageSpec(
    "torchtune",
    "torch",
    ("deps", "cuda", "torch", "xgboost", "frameworks", "hf", "torchtune", "trainflow"),
    "trainflow-torchtune",
    "trainflow TorchTune trainer",
    "The runtimes image's Python layers plus torchtune 0.6.1, torchao 0.15.0, bitsandbytes and kagglehub (Kubeflow "
    "Trainer v2.3.0's TorchTune image requirements) and trainflow (trainflow.core.torchtune_logger.TrainflowLogger): the "
    "TorchTune runtimes on CPU",
)

EXAMPLE_FILES = ("dags_examples/example_training.py",)

BASE_ENV = (
    "PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "VIRTUAL_ENV=/opt/venv",
    "LANG=C.UTF-8",
    "PYTHONUNBUFFERED=1",
)
CMD = ("python3",)


def cuda_dist(name: str) -> bool:
    return bool(_CUDA.match(name))


def gpu_only(site_relative: str) -> bool:
    """Whether a file of a ``cuda`` distribution belongs to the ``gpu`` layer (GPU_ONLY)."""
    return any(fnmatch.fnmatchcase(site_relative, pattern) for pattern in GPU_ONLY)
