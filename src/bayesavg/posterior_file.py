"""The posterior file: everything needed to rebuild and sample a trained model.

Only tensors and plain Python values, so ``torch.load(weights_only=True)``
reads it and loading never executes code. The same format serves the
pretrained network (no collector) and every fine-tuning trajectory.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from .data import to_input
from .errors import UserError
from .io import save_torch
from .models import build_model

FORMAT = "bayesavg.posterior/1"


@dataclass
class PosteriorFile:
    trajectory: str
    model_name: str
    model_kwargs: dict[str, Any]
    input_shape: tuple[int, int, int]
    mean: list[float]
    std: list[float]
    num_classes: int
    data: dict[str, Any]
    theta: torch.Tensor
    buffers: dict[str, torch.Tensor]
    collector: dict[str, Any] | None = None
    rho: torch.Tensor | None = None
    hwa: dict[str, Any] | None = None
    # Stored weight vectors for BMA over an explicit set: ensemble members (with
    # their own BatchNorm buffers) or SGLD samples (buffers None: BN is recomputed).
    samples: dict[str, Any] | None = None
    # The weights a snapshot-collecting trajectory started from, so the loss
    # plane can show where the run began without reading another stage's file.
    start_theta: torch.Tensor | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Check the parts agree (sizes, keys), so use never fails half-way."""
        for key in ("dataset", "seed", "test_fraction", "val_fraction"):
            if key not in self.data:
                raise KeyError(f"data.{key}")
        model = build_model(self.model_name, self.input_shape, self.num_classes, self.model_kwargs)
        expected = sum(p.numel() for p in model.parameters())
        if not isinstance(self.theta, torch.Tensor) or self.theta.shape != (expected,):
            raise ValueError(f"theta must have {expected} values for {self.model_name}")
        if set(self.buffers) != {name for name, _ in model.named_buffers()}:
            raise ValueError("buffers do not match the model's")
        if self.collector is not None and self.collector.get("num_params") != expected:
            raise ValueError(f"collector must cover {expected} parameters")
        if self.rho is not None and self.rho.shape != (expected,):
            raise ValueError(f"rho must have {expected} values")
        if self.start_theta is not None and self.start_theta.shape != (expected,):
            raise ValueError(f"start_theta must have {expected} values")
        if self.hwa is not None and self.hwa["mu"].get("num_params") != expected:
            raise ValueError(f"hwa collector must cover {expected} parameters")
        if self.samples is not None:
            stack = self.samples["theta"]
            if not isinstance(stack, torch.Tensor) or stack.shape[1:] != (expected,):
                raise ValueError(f"samples.theta must be (k, {expected})")
            if stack.shape[0] < 1:
                raise ValueError("samples.theta holds no samples")
            buffers = self.samples["buffers"]
            if buffers is not None and (
                len(buffers) != stack.shape[0] or any(set(b) != set(self.buffers) for b in buffers)
            ):
                raise ValueError("samples.buffers must match samples.theta and the model")

    def provides(self) -> set[str]:
        """What predictors can use from this file (keys of ``methods.PROVIDES``)."""
        out = {"weights"}
        if self.collector is not None:
            out.add("snapshots")
        if self.rho is not None:
            out.add("variational")
        if self.hwa is not None:
            out.add("hwa")
        if self.samples is not None:
            out.add("members" if self.samples["buffers"] is not None else "samples")
        return out

    @property
    def has_batchnorm(self) -> bool:
        return any(name.endswith("running_mean") for name in self.buffers)

    def model_input(self, x: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
        """uint8 images normalised the way this posterior's network was trained."""
        return to_input(x, self.mean, self.std, device)

    def build_model(self, device: torch.device | str = "cpu") -> nn.Module:
        """The network at the last iterate (parameters and buffers), in eval mode.

        The throw-away random initialisation draws from a forked stream, so
        building a model never shifts the caller's random numbers.
        """
        with torch.random.fork_rng(devices=[]):
            model = build_model(
                self.model_name, self.input_shape, self.num_classes, self.model_kwargs
            )
        load_theta(model, self.theta, self.buffers)
        return model.to(device).eval()

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "trajectory": self.trajectory,
            "model": {"name": self.model_name, "kwargs": self.model_kwargs},
            "input": {"shape": list(self.input_shape), "mean": self.mean, "std": self.std},
            "num_classes": self.num_classes,
            "data": self.data,
            "theta": self.theta.detach().cpu(),
            "buffers": {k: v.detach().cpu() for k, v in self.buffers.items()},
            "collector": self.collector,
            "rho": None if self.rho is None else self.rho.detach().cpu(),
            "hwa": self.hwa,
            "samples": self.samples,
            "start_theta": None if self.start_theta is None else self.start_theta.detach().cpu(),
            "extra": self.extra,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PosteriorFile:
        return cls(
            trajectory=d["trajectory"],
            model_name=d["model"]["name"],
            model_kwargs=d["model"]["kwargs"],
            input_shape=tuple(d["input"]["shape"]),
            mean=d["input"]["mean"],
            std=d["input"]["std"],
            num_classes=d["num_classes"],
            data=d["data"],
            theta=d["theta"],
            buffers=d["buffers"],
            collector=d["collector"],
            rho=d.get("rho"),
            hwa=d.get("hwa"),
            samples=d.get("samples"),
            start_theta=d.get("start_theta"),
            extra=d.get("extra", {}),
        )

    @classmethod
    def from_model(cls, model: nn.Module, **fields: Any) -> PosteriorFile:
        theta = parameters_to_vector(model.parameters()).detach().cpu()
        buffers = {k: v.detach().cpu().clone() for k, v in model.named_buffers()}
        return cls(theta=theta, buffers=buffers, **fields)


@torch.no_grad()
def load_theta(model: nn.Module, theta: torch.Tensor, buffers: dict[str, torch.Tensor]) -> None:
    """Copy a flat parameter vector and named buffers into ``model``.

    Copies, unlike ``vector_to_parameters``, which makes the parameters views
    of ``theta`` so that training the model would silently edit ``theta``.
    """
    offset = 0
    for param in model.parameters():
        param.copy_(theta[offset : offset + param.numel()].view_as(param))
        offset += param.numel()
    own = dict(model.named_buffers())
    for name, value in buffers.items():
        own[name].copy_(value)


def save_posterior(path: str | Path, posterior: PosteriorFile) -> None:
    save_torch(path, posterior.to_dict())


def load_posterior(path: str | Path) -> PosteriorFile:
    """Load with ``weights_only=True``; an unreadable file is a ``UserError``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"posterior file {path} does not exist")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch's unpickler raises many types on corrupt bytes
        raise UserError(
            f"cannot read posterior file {path} ({type(err).__name__}): not a file written by "
            "bayesavg, or corrupt; re-create it with the finetune stage"
        ) from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise UserError(f"{path} is not a bayesavg posterior file (expected format {FORMAT})")
    try:
        posterior = PosteriorFile.from_dict(d)
        posterior.validate()
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        raise UserError(f"{path}: malformed posterior file ({type(err).__name__}: {err})") from None
    return posterior
