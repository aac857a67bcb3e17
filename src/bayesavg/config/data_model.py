"""Sections `data` and `model`: the dataset, its splits and augmentation; the network."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from .base import DATASETS, DEFAULT_DROPOUT, Fraction, NonNegInt, PosInt, _Section


class AugmentParams(_Section):
    """Per-epoch augmentation of the training split on the device (``bayesavg.training.augment``):
    torchvision ``RandomCrop(H, padding=crop_padding)`` with zero padding, then a random
    horizontal flip. Off for the MNIST default (digits are not mirror-symmetric)."""

    crop_padding: NonNegInt = 0
    flip: bool = False
    resized_crop: bool = False  # RandomResizedCrop (scale 0.08-1) at the training size

    @model_validator(mode="after")
    def _check(self) -> AugmentParams:
        if self.crop_padding and self.resized_crop:
            raise ValueError("resized_crop: one crop or the other; set crop_padding: 0")
        return self


class DataParams(_Section):
    dataset: str = "mnist5k"
    test_fraction: Fraction = 0.2
    val_fraction: Fraction = 0.1
    raw_dir: str = "data/raw"
    # Images resized (shorter side to resize_size) and centre-cropped to image_size at
    # load, as torchvision's weights' transforms do; None: as the dataset ships them.
    # resize_size None: torchvision weights' own ratio (model.weights), else 256/224.
    image_size: PosInt | None = None
    resize_size: PosInt | None = None
    augment: AugmentParams = AugmentParams()
    # memory: each split one .pt, on the device whole while training; stream: uint8
    # .npy arrays memory-mapped and streamed to the device with prefetching; auto:
    # stream when the training split exceeds a quarter of the RAM or GPU memory.
    storage: Literal["auto", "memory", "stream"] = "auto"

    @model_validator(mode="after")
    def _check(self) -> DataParams:
        if self.dataset not in DATASETS and not self.dataset.startswith("imagefolder:"):
            raise ValueError(
                f"dataset: unknown {self.dataset!r}; allowed: {', '.join(DATASETS)}, "
                "imagefolder:<DIR>"
            )
        if self.resize_size is not None and (
            self.image_size is None or self.resize_size < self.image_size
        ):
            raise ValueError("resize_size: needs image_size, and at least as large")
        if self.test_fraction + self.val_fraction > 0.9 + 1e-9:  # 0.5 + 0.4 leaves 10%
            raise ValueError("test_fraction + val_fraction must leave at least 10% for training")
        return self


DropoutRate = Annotated[float, Field(ge=0, lt=1)]


BUILT_IN = ("mlp", "lenet5", "vgg16", "vgg16_bn", "preresnet20", "preresnet", "wideresnet28x10")
# torchvision builders whose ImageNet weights (ported from TensorFlow) expect inputs in
# [-1, 1]: with those weights torchvision builds them with ``transform_input=True``, which
# maps the weights' own normalisation onto that range. So does ``kwargs`` here, for a
# weights name (``GoogLeNet_Weights.IMAGENET1K_V1``); a local file's origin is unknown.
TRANSFORM_INPUT = ("torchvision:googlenet", "torchvision:inception_v3")
_WEIGHTS_NAME = re.compile(r"\w+_Weights\.\w+")
_FACTORY = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$"


class ModelParams(_Section):
    """The network: a built-in ``name``, ``torchvision:<builder>`` (any torchvision
    classification builder, its head sized for the data), or ``factory``
    (``package.module:function`` in the repository, under the folder ``code``, on which
    every stage that builds the model depends). ``options``: keyword arguments of the
    torchvision builder or the factory. ``weights``: pretrained weights for
    ``pretrain.kind: weights``, a torchvision weights name (``ResNet18_Weights.DEFAULT``)
    or a local ``state_dict`` file (``torch.save``, or ``.safetensors``)."""

    name: str = "lenet5"
    factory: Annotated[str, Field(pattern=_FACTORY)] | None = None
    code: str = "networks"
    options: dict[str, Any] = Field(default_factory=dict)
    weights: str | None = None
    hidden: list[PosInt] = Field(default_factory=lambda: [512, 256])
    dropout: DropoutRate | None = None  # None: the model's own (0.5 for vgg16[_bn], else 0)
    batch_norm: bool = False  # mlp only: BatchNorm after each hidden layer
    depth: PosInt | None = None  # preresnet only (default 20): 6n+2 below 44, else 9n+2

    @model_validator(mode="after")
    def _check(self) -> ModelParams:
        self._check_name()
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

    def _check_name(self) -> None:
        code = PurePosixPath(self.code)
        if code.is_absolute() or ".." in code.parts or not code.parts:
            raise ValueError(
                f"code: a folder inside the repository, e.g. networks; got {self.code!r}"
            )
        if self.factory is not None:
            if "name" in self.model_fields_set:
                raise ValueError("factory: give model.name or model.factory, not both")
            module = PurePosixPath(*self.factory.partition(":")[0].split("."))
            if module.parts[: len(code.parts)] != code.parts:
                raise ValueError(
                    f"factory: {self.factory} must live under model.code ({self.code}/), "
                    "the folder every stage that builds the model depends on"
                )
            return
        if self.name.startswith("torchvision:"):
            if not self.name.removeprefix("torchvision:").isidentifier():
                raise ValueError(
                    f"name: torchvision:<builder>, e.g. torchvision:resnet18; got {self.name!r}"
                )
            return
        if self.name not in BUILT_IN:
            raise ValueError(
                f"name: unknown model {self.name!r}; choose one of {', '.join(BUILT_IN)}, "
                "torchvision:<builder>, or set model.factory"
            )
        if self.options:
            raise ValueError(
                f"options: only torchvision and factory models take them ({self.name})"
            )
        if self.weights is not None:
            raise ValueError(
                f"weights: pretrained weights need a torchvision or factory model, not {self.name}"
            )

    @property
    def external(self) -> bool:
        return self.factory is not None or self.name.startswith("torchvision:")

    def model_name(self) -> str:
        """The name the model registry builds: ``factory:<module>:<function>`` for a factory."""
        return f"factory:{self.factory}" if self.factory is not None else self.name

    def kwargs(self) -> dict[str, Any]:
        """Constructor arguments beyond shape and classes, per model."""
        if self.external:
            out: dict[str, Any] = dict(self.options)
            if self.name in TRANSFORM_INPUT and _WEIGHTS_NAME.fullmatch(self.weights or ""):
                out.setdefault("transform_input", True)
        else:
            out = {"hidden": list(self.hidden)} if self.name == "mlp" else {}
        if self.batch_norm:
            out["batch_norm"] = True
        if self.depth is not None:
            out["depth"] = self.depth
        if self.dropout is not None:
            out["dropout"] = self.dropout
        return out

    def effective_dropout(self) -> float | None:
        """The rate the network trains with; None where only the network knows (its own
        dropout layers: checked when a predictor samples it)."""
        if self.dropout is not None:
            return self.dropout
        if self.external:
            return None
        return DEFAULT_DROPOUT.get(self.name, 0.0)
