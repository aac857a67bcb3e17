"""What every params section shares: the base model (unknown keys are errors), bounded number
types, the dataset and model names."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

DATASETS = ("mnist5k", "mnist", "fashion_mnist", "cifar10", "cifar100")
MODEL_NAMES = ("mlp", "lenet5", "vgg16", "vgg16_bn", "preresnet20", "preresnet", "wideresnet28x10")
DEFAULT_DROPOUT = {"vgg16": 0.5, "vgg16_bn": 0.5}  # the models' own default rate; 0 elsewhere
_NAME = r"^[a-z][a-z0-9_]*$"

PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
# A seed as torch's generators take it and ``seeding.derive_seed`` makes them: 63 bits.
SEED_MAX = 2**63 - 1
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, lt=1)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
