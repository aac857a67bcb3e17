"""What every run shares: seeds, the start network, posterior fields, how it computes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config import Params
from ..data.datasets import Split
from ..data.inputs import Inputs
from ..data.prepared import Prepared
from ..models import build_model
from ..posteriors.file import PosteriorFile, load_theta
from ..seeding import derive_seed
from ..training.augment import Augment
from ..training.batches import StreamedData, Tensors, TrainData
from ..training.distributed import World
from ..training.precision import precision_for
from ..training.train import Compute


@dataclass(frozen=True)
class RunResult:
    posterior: PosteriorFile
    history: list[dict[str, float]]

    def state_dict(self) -> dict[str, Any]:
        """A finished run (an ensemble member) as plain values, for its ensemble's checkpoint."""
        return {"posterior": self.posterior.to_dict(), "history": self.history}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> RunResult:
        return cls(PosteriorFile.from_dict(state["posterior"]), list(state["history"]))


def compute_for(params: Params, device: torch.device, world: World | None = None) -> Compute:
    """The params' precision, layout and augmentation on ``device`` (and ``world``).

    ``channels_last: auto`` is on, CPU included (conv nets only: the layout of
    other tensors does not change).
    """
    channels_last = params.channels_last in ("auto", True)
    aug = params.data.augment
    return Compute(
        device=device,
        precision=precision_for(params.precision, device),
        channels_last=channels_last,
        world=world if world is not None and world.size > 1 else None,
        augment=Augment(aug.crop_padding, aug.flip, aug.resized_crop),
        compile=params.compile,
        cuda_graphs=params.cuda_graphs,
    )


def watched(split: Split, prepared: Prepared, device: torch.device) -> Tensors:
    """A split to monitor (validation, test), normalised a batch at a time as it is read
    (``data.inputs``): never whole as float32, on the device or, memory-mapped, in RAM."""
    m = prepared.manifest
    return Tensors(Inputs(split.x, m["mean"], m["std"], device), split.y.to(device))


def train_data(prepared: Prepared, compute: Compute) -> TrainData:
    """The training split as uint8, normalised per batch: on the device whole, or
    streamed from its memory-mapped file when the data stage stored it so."""
    m = prepared.manifest
    split = prepared.train
    streamed = m.get("storage") == "stream"
    return (StreamedData if streamed else TrainData)(
        split.x if streamed else split.x.to(compute.device),
        split.y.to(compute.device),
        m["mean"],
        m["std"],
        compute.augment,
        compute.channels_last,
    )


def pretrain_seed(seed: int, member: int = 0) -> int:
    """Pretraining seed; member > 0 are the extra ensemble members."""
    return derive_seed(seed, "pretrain") if member == 0 else derive_seed(seed, "pretrain", member)


def finetune_seed(seed: int, name: str, member: int = 0) -> int:
    base = ("finetune", name) if member == 0 else ("finetune", name, member)
    return derive_seed(seed, *base)


def trajectory_kwargs(start: PosteriorFile, dropout: float | None) -> dict[str, Any]:
    """The start's model kwargs, with the trajectory's own dropout rate where it sets one."""
    kwargs = dict(start.model_kwargs)
    if dropout is not None:
        kwargs["dropout"] = dropout
    return kwargs


def posterior_fields(
    params: Params, prepared: Prepared, trajectory: str, model_kwargs: dict[str, Any]
) -> dict[str, Any]:
    m = prepared.manifest
    return {
        "trajectory": trajectory,
        "model_name": params.model.model_name(),
        "model_kwargs": model_kwargs,
        "input_shape": prepared.input_shape,
        "mean": m["mean"],
        "std": m["std"],
        "num_classes": prepared.num_classes,
        # resize_size: images were resized and centre-cropped at load (data.image_size)
        "data": {
            k: m[k]
            for k in ("dataset", "seed", "test_fraction", "val_fraction", "resize_size")
            if k in m
        },
    }


def start_model(start: PosteriorFile, kwargs: dict[str, Any], device: torch.device) -> nn.Module:
    """The start's network (weights and buffers) built with this trajectory's kwargs."""
    model = build_model(start.model_name, start.input_shape, start.num_classes, kwargs)
    load_theta(model, start.theta, start.buffers)
    return model.to(device).train()
