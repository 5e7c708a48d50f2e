"""Example Kubeflow pipeline: TrainJob (torch-distributed, 2 nodes x 2 procs) -> evaluate -> promote if good.

train   trainflow's train_job component runs ``example_training:train_regression`` as a function trainer;
        the trained weights land in the step's Output[Model].
evaluate loads those weights with torch (Input[Model]) and reports held-out MSE as Metrics.
promote  runs only when the MSE is below ``max_mse`` (dsl.If); otherwise ``reject`` records why.

The trainer and evaluate code come from ``dags_examples/example_training.py``: on a cluster, use an image
that has trainflow installed and this folder on PYTHONPATH (see docs/kfp.md). Locally::

    PYTHONPATH=dags_examples python dags_examples/kfp_train_pipeline.py --local
"""

import argparse
import os
from collections.abc import Sequence
from typing import Any

from kfp import dsl

TRAIN_FUNCTION = "example_training:train_regression"
IMAGE = os.environ.get("TRAINFLOW_EXAMPLE_IMAGE", "ghcr.io/trainflow/trainflow-examples:0.1.0")


def evaluate(model: dsl.Input[dsl.Model], metrics: dsl.Output[dsl.Metrics]) -> float:
    """Load the trained weights from the Model artifact and measure held-out MSE."""
    import json
    import os

    from example_training import evaluate_model

    weights = os.path.join(model.path, "model.pt")
    report = evaluate_model(weights)
    print(f"evaluate: loaded {weights} from TrainJob {model.metadata.get('job_name')}: {json.dumps(report)}")
    metrics.log_metric("mse", report["mse"])
    metrics.log_metric("train_loss", float(model.metadata.get("metrics", {}).get("train_loss", float("nan"))))
    return float(report["mse"])


def promote(model: dsl.Input[dsl.Model], mse: float, registration: dsl.Output[dsl.Artifact]) -> str:
    """Register the model (a JSON record standing in for a model registry) and mark it promoted."""
    import json
    import os

    record = {
        "model_uri": model.uri,
        "job_name": model.metadata.get("job_name"),
        "runtime": model.metadata.get("runtime"),
        "files": sorted(os.listdir(model.path)),
        "mse": mse,
        "stage": "production",
    }
    with open(registration.path, "w") as fh:
        json.dump(record, fh, sort_keys=True)
    registration.metadata.update(record)
    print(f"promote: registered {record['job_name']} with mse={mse:.6f}")
    return "promoted"


def reject(mse: float, max_mse: float) -> str:
    print(f"reject: mse={mse:.6f} is not below {max_mse}; model not promoted")
    return "rejected"


def build_pipeline(
    *,
    backend: str = "kubernetes",
    base_image: str = IMAGE,
    packages_to_install: Sequence[str] | None = (),
    install_kfp_package: bool = False,
    backend_config: dict[str, Any] | None = None,
) -> Any:
    """The pipeline for one backend and image. The default image (``make images``: examples) has kfp and
    trainflow installed, so no step installs anything when it starts."""
    from trainflow.kfp import make_train_job_component

    train_op = make_train_job_component(
        base_image=base_image,
        packages_to_install=packages_to_install,
        install_kfp_package=install_kfp_package,
    )

    def light(func: Any) -> Any:
        return dsl.component(func, base_image=base_image, install_kfp_package=install_kfp_package)

    evaluate_op, promote_op, reject_op = light(evaluate), light(promote), light(reject)

    @dsl.pipeline(name="trainflow-train-evaluate-promote")
    def train_evaluate_promote(
        train_kwargs: dict = {"epochs": 60, "lr": 0.1},  # noqa: B006 (KFP pipeline default)
        num_nodes: int = 2,
        proc_per_node: int = 2,
        max_mse: float = 0.01,
    ) -> None:
        train = train_op(
            runtime="torch-distributed",
            function=TRAIN_FUNCTION,
            function_kwargs=train_kwargs,
            num_nodes=num_nodes,
            proc_per_node=proc_per_node,
            resources={"cpu": "1", "memory": "1Gi"},
            labels={"app.kubernetes.io/part-of": "trainflow-example"},
            backend=backend,
            backend_config=backend_config or {},
            timeout=1800.0,  # no identity arguments: a retried step finds its TrainJob by its output folder
        )
        scored = evaluate_op(model=train.outputs["model"])
        with dsl.If(scored.outputs["Output"] < max_mse, name="good-enough"):
            promote_op(model=train.outputs["model"], mse=scored.outputs["Output"])
        with dsl.Else(name="not-good-enough"):
            reject_op(mse=scored.outputs["Output"], max_mse=max_mse)

    return train_evaluate_promote


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", action="store_true", help="run with kfp.local on the local engine")
    parser.add_argument("--compile", metavar="PATH", help="write the pipeline YAML (cluster backend)")
    opts = parser.parse_args(argv)
    if opts.compile:
        from kfp import compiler

        compiler.Compiler().compile(build_pipeline(), opts.compile)
        print(f"wrote {opts.compile}")
    if opts.local:
        import tempfile
        import time

        from kfp import local

        root = tempfile.mkdtemp(prefix="trainflow-kfp-")
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root)
        pipeline = build_pipeline(backend="local", base_image="python:3.11", install_kfp_package=False)
        started = time.monotonic()
        pipeline()
        print(f"pipeline finished in {time.monotonic() - started:.1f}s (artifacts under {root})")


if __name__ == "__main__":
    main()
