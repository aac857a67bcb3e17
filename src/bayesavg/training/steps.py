"""What a training step is, and the plain one: the step's context (precision, ranks,
shared random draws) and SGD's forward, loss and backward.

Steps are what plug into the loop (``train.train``): SAM's and VI's steps build on the
same context, and a compiled or graph-captured run (``compiled``, ``graphs``) calls the
same step, so this module stands below all of them.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

import torch
from torch import nn

from .distributed import World
from .optim import SGD
from .precision import Precision


class StepContext:
    """What a step needs from the loop: autocast, (scaled) backward, gradients averaged
    over ranks, and random draws that every rank shares.

    One process in fp32 (``StepContext()``) is exactly plain autograd and
    torch's global stream, so steps called outside the loop behave as before.
    Under data parallelism each rank's loss is the mean over its share of the
    global batch; ``weight`` is that share's fraction of the batch, so the
    weighted sum of the ranks' gradients is the gradient of the batch mean.
    """

    def __init__(
        self,
        precision: Precision | None = None,
        world: World | None = None,
        shared: torch.Generator | None = None,
    ) -> None:
        self.precision = precision or Precision()
        self.scaler = self.precision.scaler()
        self.world = world if world is not None and world.size > 1 else None
        self.shared = shared
        self.weight = 1.0

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        return self.precision.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def grad(self, loss: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """d loss / d inputs, unscaled and averaged over ranks (SAM's ascent direction)."""
        scaled = self.scaler.scale(loss) if self.scaler is not None else loss
        grads = list(torch.autograd.grad(scaled, inputs))
        if self.scaler is not None:
            # 1/scale on the device (get_scale() reads it on the host: a sync per step);
            # the scale is a power of two, so its reciprocal is exact either way
            scale = self.scaler.scale(torch.ones((), dtype=torch.float32, device=loss.device))
            inv = torch.reciprocal(scale)
            grads = [g * inv for g in grads]
        if self.world is not None:
            grads = self._all_reduce(grads)
        return grads

    def reduce_grads(self, params: list[torch.Tensor]) -> None:
        """Average ``.grad`` over ranks (a no-op on one process)."""
        if self.world is None:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        for p, g in zip(params, self._all_reduce(grads), strict=True):
            p.grad = g

    def _all_reduce(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        import torch.distributed as dist

        flat = torch.cat([g.reshape(-1) for g in grads]).mul_(self.weight)
        dist.all_reduce(flat)
        out, offset = [], 0
        for g in grads:
            out.append(flat[offset : offset + g.numel()].view(g.shape).to(memory_format=_layout(g)))
            offset += g.numel()
        return out

    def randn(self, like: torch.Tensor) -> torch.Tensor:
        """Standard normal noise shaped like ``like``, the same on every rank (VI's epsilon,
        SGLD's noise): from the shared generator, or torch's global stream on one process."""
        return torch.randn(like.shape, generator=self.shared, dtype=like.dtype, device=like.device)


PLAIN = StepContext()


def _layout(t: torch.Tensor) -> torch.memory_format:
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


class Step(Protocol):
    def __call__(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, ctx: StepContext = PLAIN
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill ``.grad`` of the optimised tensors; return (loss, logits), detached."""
        ...


def sgd_step(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, ctx: StepContext = PLAIN
) -> tuple[torch.Tensor, torch.Tensor]:
    with ctx.autocast():
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.float(), y)
    ctx.backward(loss)
    return loss.detach(), logits.detach()


def sgd(params: list[torch.Tensor] | nn.Module, momentum: float, weight_decay: float) -> SGD:
    """SGD whose rate the loop sets per iteration (the initial lr is a placeholder)."""
    tensors = list(params.parameters()) if isinstance(params, nn.Module) else params
    return SGD(tensors, lr=0.0, momentum=momentum, weight_decay=weight_decay)
