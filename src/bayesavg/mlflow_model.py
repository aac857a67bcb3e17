"""The MLflow pyfunc model of a predictor, logged as code ("models from code"): MLflow
stores this file, not a pickle, and loading it reads the posterior with
``weights_only=True`` (``bayesavg.predict``). Kept free of heavy imports: MLflow
runs the file when the model is saved."""

from __future__ import annotations

import warnings

import mlflow.pyfunc
from mlflow.models import set_model

# The model's types are its logged signature (uint8 image tensors in, named tensors out);
# MLflow's type-hint inference cannot express them, and says so on every load.
warnings.filterwarnings("ignore", message=r".*type hints to the `predict` method")


class PosteriorModel(mlflow.pyfunc.PythonModel):
    """Images (uint8, N x C x H x W) -> probabilities, predicted_class, entropy,
    mutual_info. The posterior is the model's own artifact ``posterior`` or, when the
    run that trained it already stored it, ``model_config["posterior_uri"]``."""

    def load_context(self, context):
        from bayesavg.predict import Predictor, PredictorConfig

        config = dict(context.model_config or {})
        path = (context.artifacts or {}).get("posterior")
        if path is None:
            path = mlflow.artifacts.download_artifacts(config["posterior_uri"])
        bn = (context.artifacts or {}).get("bn_images")
        images = None
        if bn is not None:
            import torch

            images = torch.load(bn, weights_only=True)
        self._predict = Predictor(path, PredictorConfig.from_mapping(config), images)

    def predict(self, context, model_input, params=None):
        return self._predict(model_input)


set_model(PosteriorModel())
