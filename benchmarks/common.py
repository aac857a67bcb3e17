"""Settings, data and models shared by the benchmarks of ``run.py``.

Every figure starts from the same seeded data and initial weights, so that a
difference between variants is the code's, not the workload's.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bayesavg import models
from bayesavg.data.prepared import Prepared, prepare, to_input
from bayesavg.posteriors import SWAG
from bayesavg.posteriors.file import PosteriorFile
from bayesavg.seeding import derive_seed, generator
from bayesavg.training.schedules import lr_at
from bayesavg.training.steps import sgd
from bayesavg.training.train import Tensors, train

SEED = 0
INPUT_SHAPE = (1, 28, 28)
NUM_CLASSES = 10
MOMENTUM, WEIGHT_DECAY = 0.9, 0.0005
POSTERIOR_LR = 0.05
POSTERIOR_EPOCHS = 2
MAX_RANK = 20
SNAPSHOTS = 10
TARGET_RATIO = 1.10


@dataclass(frozen=True)
class Settings:
    """Work per measurement; ``--quick`` shrinks it for a smoke run."""

    epochs: int
    finetune_rounds: int
    n_samples: int
    eval_rounds: int
    bn_images: int | None = None
    batch_size: int = 64
    eval_batch_size: int = 1000
    collect_every: int = 10


FULL = Settings(epochs=1, finetune_rounds=9, n_samples=30, eval_rounds=3)
QUICK = Settings(epochs=1, finetune_rounds=2, n_samples=5, eval_rounds=2, bn_images=1000)


def mnist5k() -> Prepared:
    """The embedded mnist5k, split by the pipeline's code (seed 0, test 0.2, val 0.1; the
    pipeline's params.yaml keeps 0.2 for validation)."""
    with tempfile.TemporaryDirectory() as tmp:
        return prepare("mnist5k", tmp, Path(tmp) / "prepared", SEED, 0.2, 0.1)


def load_data(device: torch.device) -> tuple[Tensors, Tensors]:
    """mnist5k train and test splits, normalised, on the device (as the pipeline does)."""
    prep = mnist5k()
    mean, std = prep.manifest["mean"], prep.manifest["std"]
    return (
        Tensors(to_input(prep.train.x, mean, std, device), prep.train.y.to(device)),
        Tensors(to_input(prep.test.x, mean, std, device), prep.test.y.to(device)),
    )


def init_model(name: str, device: torch.device) -> nn.Module:
    """A registry model from a seeded random initialisation."""
    torch.manual_seed(derive_seed(SEED, "bench", name))
    return models.build_model(name, INPUT_SHAPE, NUM_CLASSES).to(device)


def theta(model: nn.Module) -> torch.Tensor:
    return nn.utils.parameters_to_vector(model.parameters()).detach().cpu()


def swag_posterior(name: str, train_data: Tensors, s: Settings) -> PosteriorFile:
    """Train ``name`` from a seeded random init, collecting SNAPSHOTS SWAG snapshots.

    The inputs are already normalised, so the file records identity normalisation.
    """
    model = init_model(name, train_data.x.device).train()
    total = POSTERIOR_EPOCHS * math.ceil(len(train_data) / s.batch_size)
    every = total // SNAPSHOTS
    collector = SWAG(theta(model).numel(), MAX_RANK, device=train_data.x.device)

    def after_step(i: int) -> None:
        if (i + 1) % every == 0 and collector.n_collected < SNAPSHOTS:
            collector.collect(model)

    train(
        model,
        sgd(model, MOMENTUM, WEIGHT_DECAY),
        train_data,
        epochs=POSTERIOR_EPOCHS,
        batch_size=s.batch_size,
        lr=lr_at("constant", POSTERIOR_LR, POSTERIOR_LR, 1, total),
        generator=generator(SEED),
        after_step=after_step,
        desc=f"posterior {name}",
    )
    posterior = PosteriorFile.from_model(
        model,
        trajectory="bench",
        model_name=name,
        model_kwargs={},
        input_shape=INPUT_SHAPE,
        mean=[0.0],
        std=[1.0],
        num_classes=NUM_CLASSES,
        data={"dataset": "mnist5k", "seed": SEED, "test_fraction": 0.2, "val_fraction": 0.1},
    )
    posterior.collector = collector.state_dict()
    return posterior
