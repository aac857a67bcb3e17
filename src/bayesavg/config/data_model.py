"""Sections `data` and `model`: the dataset, its splits and augmentation; the network."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from .base import DATASETS, DEFAULT_DROPOUT, Fraction, NonNegInt, PosInt, _Section


class AugmentParams(_Section):
    """Per-epoch augmentation of the training split on the device (``bayesavg.training.augment``):
    torchvision ``RandomCrop(H, padding=crop_padding)`` with zero padding, then a random
    horizontal flip. Off for the MNIST default (digits are not mirror-symmetric)."""

    crop_padding: NonNegInt = 0
    flip: bool = False


class DataParams(_Section):
    dataset: str = "mnist5k"
    test_fraction: Fraction = 0.2
    val_fraction: Fraction = 0.1
    raw_dir: str = "data/raw"
    augment: AugmentParams = AugmentParams()

    @model_validator(mode="after")
    def _check(self) -> DataParams:
        if self.dataset not in DATASETS and not self.dataset.startswith("imagefolder:"):
            raise ValueError(
                f"dataset: unknown {self.dataset!r}; allowed: {', '.join(DATASETS)}, "
                "imagefolder:<DIR>"
            )
        if self.test_fraction + self.val_fraction >= 0.9:
            raise ValueError("test_fraction + val_fraction must leave at least 10% for training")
        return self


DropoutRate = Annotated[float, Field(ge=0, lt=1)]


class ModelParams(_Section):
    name: Literal[
        "mlp", "lenet5", "vgg16", "vgg16_bn", "preresnet20", "preresnet", "wideresnet28x10"
    ] = "lenet5"
    hidden: list[PosInt] = Field(default_factory=lambda: [512, 256])
    dropout: DropoutRate | None = None  # None: the model's own (0.5 for vgg16[_bn], else 0)
    batch_norm: bool = False  # mlp only: BatchNorm after each hidden layer
    depth: PosInt | None = None  # preresnet only (default 20): 6n+2 below 44, else 9n+2

    @model_validator(mode="after")
    def _check(self) -> ModelParams:
        if self.batch_norm and self.name != "mlp":
            raise ValueError(
                f"batch_norm: only mlp takes it ({self.name} has its own normalisation or none)"
            )
        if self.depth is not None and self.name != "preresnet":
            raise ValueError(f"depth: only preresnet takes it ({self.name} has a fixed depth)")
        if self.depth is not None and (
            self.depth < 8 or (self.depth - 2) % (9 if self.depth >= 44 else 6)
        ):  # the rule of bayesavg.models.preresnet_blocks, checked here without torch
            raise ValueError(
                f"depth: preresnet depth must be 6n+2 below 44 (basic blocks) or 9n+2 "
                f"from 44 on (bottlenecks), e.g. 20, 56, 110, 164; got {self.depth}"
            )
        return self

    def kwargs(self) -> dict[str, Any]:
        """Constructor arguments beyond shape and classes, per model."""
        out: dict[str, Any] = {"hidden": list(self.hidden)} if self.name == "mlp" else {}
        if self.batch_norm:
            out["batch_norm"] = True
        if self.depth is not None:
            out["depth"] = self.depth
        if self.dropout is not None:
            out["dropout"] = self.dropout
        return out

    def effective_dropout(self) -> float:
        if self.dropout is not None:
            return self.dropout
        return DEFAULT_DROPOUT.get(self.name, 0.0)
