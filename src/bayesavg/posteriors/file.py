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

from ..data.inputs import Inputs
from ..data.prepared import to_input
from ..models import build_model
from ..runtime.errors import UserError
from ..runtime.io import save_torch, torch_damage
from ..training.flat import params_vector
from .checks import (
    PosteriorFileError,
    as_block,
    check_buffers,
    check_collector,
    check_covers,
    check_data,
    check_hwa,
    check_input,
    check_int,
    check_laplace,
    check_samples,
    check_str,
    check_tensor,
    get,
)

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
    # their own BatchNorm buffers, and with "collectors", each member's SWAG moments:
    # MultiSWAG) or SGLD samples (buffers None: BN is recomputed).
    samples: dict[str, Any] | None = None
    # The weights a snapshot-collecting trajectory started from, so the loss
    # plane can show where the run began without reading another stage's file.
    start_theta: torch.Tensor | None = None
    # A last-layer Laplace posterior at theta (``posteriors.last_layer_laplace`` state: tensors).
    laplace: dict[str, Any] | None = None
    # The parameter tensors the collectors cover (``finetune.<t>.posterior.params``), in
    # the model's order; None: all. theta and every sample stay whole.
    covers: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Check every block completely, so a bad file fails at load, not half-way through use.

        Raises ``PosteriorFileError`` with one line naming the block and key.
        """
        check_str(self.trajectory, "trajectory")
        model = self._skeleton()
        check_data(self.data)
        num_params = sum(p.numel() for p in model.parameters())
        model_buffers = dict(model.named_buffers())
        check_tensor(self.theta, "theta", (num_params,), f" ({self.model_name}'s parameter count)")
        check_buffers(self.buffers, "buffers", model_buffers)
        covered = num_params
        if self.covers is not None:
            check_covers(self.covers, [name for name, _ in model.named_parameters()])
            sizes = dict(model.named_parameters())
            covered = sum(sizes[name].numel() for name in self.covers)
        if self.collector is not None:
            check_collector(self.collector, "collector", covered)
        if self.rho is not None:
            check_tensor(self.rho, "rho", (num_params,), " (one per parameter)")
        if self.hwa is not None:
            check_hwa(self.hwa, num_params)
        if self.start_theta is not None:
            check_tensor(self.start_theta, "start_theta", (num_params,), " (one per parameter)")
        if self.samples is not None:
            check_samples(self.samples, num_params, model_buffers, covered)
        if self.laplace is not None:
            check_laplace(self.laplace, model)
        as_block(self.extra, "extra")

    def _skeleton(self) -> nn.Module:
        """The model on the meta device: its parameter and buffer shapes, built without
        memory or random numbers."""
        check_str(self.model_name, "model.name")
        as_block(self.model_kwargs, "model.kwargs")
        check_input(self.input_shape, self.mean, self.std)
        check_int(self.num_classes, "num_classes", minimum=1)
        try:
            with torch.device("meta"):
                return build_model(
                    self.model_name, self.input_shape, self.num_classes, self.model_kwargs
                )
        except Exception as err:  # the arguments come from the file: any failure is the file's
            reason = " ".join(str(err).split())  # one line, whatever the constructor said
            raise PosteriorFileError(
                f"model {self.model_name!r} cannot be built with kwargs {self.model_kwargs!r} "
                f"for input {self.input_shape} and {self.num_classes} classes ({reason})"
            ) from None

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
            if self.samples.get("collectors") is not None:
                out.add("member_snapshots")
        if self.laplace is not None:
            out.add("laplace")
        return out

    def covered_index(self, device: torch.device | str = "cpu") -> torch.Tensor | None:
        """Where the covered parameters sit in theta (int64 positions), None if all."""
        if self.covers is None:
            return None
        return covered_positions(self._skeleton(), self.covers, device)

    @property
    def has_batchnorm(self) -> bool:
        return any(name.endswith("running_mean") for name in self.buffers)

    def model_input(self, x: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
        """uint8 images normalised the way this posterior's network was trained, whole."""
        return to_input(x, self.mean, self.std, device)

    def inputs(
        self, x: torch.Tensor, device: torch.device | str = "cpu", rows: torch.Tensor | None = None
    ) -> Inputs:
        """``model_input`` of ``x`` (or of its ``rows``, in that order) made a batch at a
        time as it is read (``data.inputs``): what the pipeline evaluates, so that a split
        is never whole as float32, on the device or, memory-mapped, in RAM."""
        return Inputs(x, self.mean, self.std, device, rows)

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
            "laplace": self.laplace,
            # only where set: a file covering everything keeps the bytes it always had
            **({} if self.covers is None else {"covers": self.covers}),
            "extra": self.extra,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PosteriorFile:
        """The fields of a loaded file; a missing key is a ``PosteriorFileError``.

        Values are taken as stored; ``validate`` checks them.
        """
        model = as_block(get(d, "model"), "model")
        inp = as_block(get(d, "input"), "input")
        shape = get(inp, "shape", "input")
        return cls(
            trajectory=get(d, "trajectory"),
            model_name=get(model, "name", "model"),
            model_kwargs=get(model, "kwargs", "model"),
            input_shape=tuple(shape) if isinstance(shape, list | tuple) else shape,
            mean=get(inp, "mean", "input"),
            std=get(inp, "std", "input"),
            num_classes=get(d, "num_classes"),
            data=get(d, "data"),
            theta=get(d, "theta"),
            buffers=get(d, "buffers"),
            collector=get(d, "collector"),
            rho=d.get("rho"),
            hwa=d.get("hwa"),
            samples=d.get("samples"),
            start_theta=d.get("start_theta"),
            laplace=d.get("laplace"),
            covers=d.get("covers"),
            extra=d.get("extra", {}),
        )

    @classmethod
    def from_model(cls, model: nn.Module, **fields: Any) -> PosteriorFile:
        theta = params_vector(model.parameters()).detach().cpu()
        buffers = {k: v.detach().cpu().clone() for k, v in model.named_buffers()}
        return cls(theta=theta, buffers=buffers, **fields)


def covered_positions(
    model: nn.Module, names: list[str], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The positions in ``parameters_to_vector(model)`` of the parameters ``names``, on
    ``device`` (where the vectors they index live)."""
    wanted, parts, offset = set(names), [], 0
    for name, param in model.named_parameters():
        if name in wanted:
            parts.append(torch.arange(offset, offset + param.numel(), device=device))
        offset += param.numel()
    return torch.cat(parts)


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
    """Load with ``weights_only=True`` and validate every block.

    An unreadable, damaged (a zip member's CRC-32 fails: torch's reader would load a
    flipped byte as another number) or malformed file is a ``UserError`` of one line
    naming the file, the block and key, and what is wrong.
    """
    path = Path(path)
    if path.is_dir():
        raise UserError(f"posterior file {path} is a folder: give the .pt file inside it")
    if not path.is_file():
        raise UserError(f"posterior file {path} does not exist")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch's unpickler raises many types on corrupt bytes
        raise UserError(
            f"cannot read posterior file {path} ({type(err).__name__}): not a file written by "
            "bayesavg, or corrupt; re-create it with the stage or command that wrote it"
        ) from None
    damage = torch_damage(path)  # after loading: a file torch cannot read says so first
    if damage is not None:
        raise UserError(
            f"posterior file {path} is damaged ({damage}): its bytes are not those saved; "
            "re-create it with the stage or command that wrote it"
        )
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise UserError(f"{path} is not a bayesavg posterior file (expected format {FORMAT})")
    try:
        posterior = PosteriorFile.from_dict(d)
        posterior.validate()
    except PosteriorFileError as err:
        raise UserError(f"{path}: {err}") from None
    return posterior
