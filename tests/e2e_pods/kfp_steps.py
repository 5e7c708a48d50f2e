"""A downstream KFP step for tests/e2e_pods/test_objstore_pods.py (no ``from __future__ import annotations``: kfp
reads the artifact annotations as objects)."""

from kfp import dsl


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def load_weight(model: dsl.Input[dsl.Model]) -> float:
    """Downloads the Model artifact's object (its uri) with this step's own credentials (AWS_* env)."""
    import json
    import tempfile
    from pathlib import Path

    from trainflow.core import download

    where = Path(tempfile.mkdtemp())
    assert model.uri == model.metadata["model_uri"], (model.uri, model.metadata)
    download(model.uri, where)
    return float(json.loads((where / "weights.json").read_text())["w"])


def retrain_pipeline(train: object, train_kwargs: dict) -> object:
    """A pipeline: ``train`` (trainflow's train_job component) with ``train_kwargs``, then ``load_weight`` on its
    Model artifact; it returns the weight the downstream step read."""

    @dsl.pipeline
    def retrain() -> float:
        step = train(**train_kwargs)  # type: ignore[operator]
        return load_weight(model=step.outputs["model"]).output

    return retrain
