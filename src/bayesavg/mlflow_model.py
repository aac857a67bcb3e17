"""The MLflow pyfunc model of a predictor, logged as code ("models from code"): MLflow
stores this file, not a pickle, and loading it reads the posterior with
``weights_only=True`` (``bayesavg.predict``). Kept free of heavy imports: MLflow
runs the file when the model is saved."""

from __future__ import annotations

import tempfile

import mlflow.pyfunc
import numpy as np
from mlflow.models import set_model


class PosteriorModel(mlflow.pyfunc.PythonModel):
    """Images (uint8, N x C x H x W) -> probabilities, predicted_class, entropy,
    mutual_info. The posterior is the model's own artifact ``posterior`` or, when the
    run that trained it already stored it, ``model_config["posterior_uri"]``."""

    def load_context(self, context):
        from bayesavg.predict import Predictor, PredictorConfig

        config = dict(context.model_config or {})
        bn = (context.artifacts or {}).get("bn_images")
        images = None
        if bn is not None:
            import torch

            images = torch.load(bn, weights_only=True)
        predictor = PredictorConfig.from_mapping(config)
        path = (context.artifacts or {}).get("posterior")
        if path is not None:
            self._predict = Predictor(path, predictor, images)
            return
        # Downloaded into a folder removed once the posterior is in memory: without a
        # destination MLflow downloads into a new temporary folder on every load and
        # leaves it (a posterior's size, each time).
        with tempfile.TemporaryDirectory(prefix="bayesavg-posterior-") as tmp:
            path = mlflow.artifacts.download_artifacts(config["posterior_uri"], dst_path=tmp)
            self._predict = Predictor(path, predictor, images)

    def predict(self, context, model_input: np.ndarray, params=None):
        """The input as the logged signature gives it (a uint8 tensor: an array). The
        hint is one MLflow infers no schema from (the signature is the schema) and, unlike
        none, it does not warn on every load."""
        return self._predict(model_input)


set_model(PosteriorModel())
