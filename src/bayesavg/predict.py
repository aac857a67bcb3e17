"""A posterior as a callable predictor: images in, the Bayesian model average out.

What the MLflow model (``bayesavg.mlflow_model``) serves. It runs the same
``bayesavg.evaluation.evaluate.evaluate`` as the pipeline and ``bayesavg evaluate``, with
the same seed, so for the same images the probabilities are the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .runtime.errors import UserError

OUTPUTS = ("probabilities", "predicted_class", "entropy", "mutual_info")
# The MLflow model's code file (models from code): logged as a file, run only where the
# model is loaded, so nothing here imports it.
MODEL_CODE = Path(__file__).with_name("mlflow_model.py")


@dataclass(frozen=True)
class PredictorConfig:
    """How to predict: the registry method, its covariance scale, S samples, the sampling
    seed, the batch size, the fitted temperature (None: none); ``bn_images``: training
    images for BatchNorm models."""

    method: str
    scale: float | None = None
    n_samples: int = 30
    seed: int = 0
    batch_size: int = 1000
    temperature: float | None = None

    @classmethod
    def from_mapping(cls, found: Mapping[str, Any]) -> PredictorConfig:
        return cls(
            method=str(found["method"]),
            scale=None if found.get("scale") is None else float(found["scale"]),
            n_samples=int(found.get("n_samples", 30)),
            seed=int(found.get("seed", 0)),
            batch_size=int(found.get("batch_size", 1000)),
            temperature=None if found.get("temperature") is None else float(found["temperature"]),
        )

    def as_mapping(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "scale": self.scale,
            "n_samples": self.n_samples,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "temperature": self.temperature,
        }


class Predictor:
    """A loaded posterior (``weights_only``) and how to predict with it."""

    def __init__(
        self,
        posterior_path: str | Path,
        config: PredictorConfig,
        bn_images: torch.Tensor | None = None,
        device: str = "cpu",
    ) -> None:
        from .evaluation.evaluate import method_of, needs_bn_data
        from .posteriors.file import load_posterior

        method_of(config.method)
        self.posterior = load_posterior(posterior_path)
        self.config = config
        self.device = torch.device(device)
        self.bn_x = None
        if self.posterior.has_batchnorm and needs_bn_data(config.method):
            if bn_images is None:
                raise UserError(
                    f"predictor {config.method} on a BatchNorm network needs training images "
                    "for its BatchNorm statistics"
                )
            self.bn_x = self.posterior.inputs(bn_images, self.device)

    def __call__(self, images: np.ndarray | torch.Tensor) -> dict[str, np.ndarray]:
        """uint8 images (N, C, H, W) -> BMA class probabilities (N, K), the predicted class,
        the predictive entropy H[p_bar] and the mutual information (0 for one network)."""
        from .evaluation.evaluate import evaluate

        x = torch.as_tensor(np.asarray(images))
        shape = tuple(self.posterior.input_shape)
        if x.dim() != 4 or tuple(x.shape[1:]) != shape:
            raise UserError(f"images of shape {tuple(x.shape)}; the network takes (N, *{shape})")
        if x.dtype != torch.uint8:
            if bool(((x < 0) | (x > 255) | (x != x.round())).any()):
                raise UserError("images must be integer pixel values 0-255")
            x = x.to(torch.uint8)
        c = self.config
        found = evaluate(
            self.posterior,
            c.method,
            {"input": (self.posterior.inputs(x, self.device), torch.zeros(len(x)).long())},
            n_samples=c.n_samples,
            scale=c.scale,
            bn_x=self.bn_x,
            batch_size=c.batch_size,
            seed=c.seed,
            device=self.device,
            ood_reference="input",
            point_scores=True,
            temperature=c.temperature,
            curves=(),
        )["input"]
        scores = found.ood_scores["input"]
        probs = found.log_probs.exp()
        return {
            "probabilities": probs.numpy(),
            "predicted_class": probs.argmax(1).numpy(),
            "entropy": scores["entropy"].cpu().numpy(),
            "mutual_info": scores["mutual_info"].cpu().numpy(),
        }
