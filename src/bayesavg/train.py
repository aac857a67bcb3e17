"""One deterministic training loop over in-memory tensors; steps plug in.

A *step* computes the gradients of whatever the optimizer holds and returns
the detached loss and logits: plain SGD here; SAM and SVI steps reuse the
same loop. Metrics are accumulated on the device and read once per epoch,
so there is no host sync per iteration. Learning rates are plain functions
of the iteration: the cyclic SWA schedule (linear within each cycle) is not
in ``torch.optim.swa_utils``, whose SWALR is epoch-based.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from tqdm.auto import tqdm

from .batchnorm import bn_modules
from .errors import UserError
from .optim import SGD, Optimizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tensors:
    """Model-ready inputs (float, normalised) and labels, already on the device."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return self.x.shape[0]


@dataclass
class Progress:
    """Where a run stands at an epoch boundary: epochs done, optimizer steps, history rows.

    With the model, optimizer, shuffling generator and RNG states this is all
    a run needs to continue exactly where it stopped (``trajectories``
    checkpoints it).
    """

    epoch: int = 0
    iteration: int = 0
    history: list[dict[str, float]] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "iteration": self.iteration,
            "history": [dict(row) for row in self.history],
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Progress:
        return cls(int(state["epoch"]), int(state["iteration"]), list(state["history"]))


class Step(Protocol):
    def __call__(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill ``.grad`` of the optimised tensors; return (loss, logits), detached."""
        ...


def sgd_step(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    return loss.detach(), logits.detach()


def lr_at(
    kind: str, lr: float, lr_end: float, cycle_length: int, total_iters: int
) -> Callable[[int], float]:
    """Learning rate for 0-based iteration i.

    cosine: lr -> lr_end over ``total_iters``; constant: lr; cyclic: the SWA
    paper's alpha(i) = (1 - t) lr + t lr_end, t = ((i mod c) + 1) / c, so the
    last iteration of each cycle runs at lr_end.
    """
    if kind == "constant":
        return lambda i: lr
    if kind == "cosine":
        span = max(total_iters - 1, 1)
        return lambda i: (
            lr_end + (lr - lr_end) * 0.5 * (1 + math.cos(math.pi * min(i, span) / span))
        )
    if kind == "cyclic":

        def cyclic(i: int) -> float:
            t = ((i % cycle_length) + 1) / cycle_length
            return (1 - t) * lr + t * lr_end

        return cyclic
    raise ValueError(f"unknown schedule {kind!r}")


def sgd(params: list[torch.Tensor] | nn.Module, momentum: float, weight_decay: float) -> SGD:
    """SGD whose rate the loop sets per iteration (the initial lr is a placeholder)."""
    tensors = list(params.parameters()) if isinstance(params, nn.Module) else params
    return SGD(tensors, lr=0.0, momentum=momentum, weight_decay=weight_decay)


@torch.inference_mode()
def loss_and_accuracy(
    model: nn.Module, data: Tensors, batch_size: int = 1000
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy and accuracy in eval mode, as device tensors."""
    was_training = model.training
    model.eval()
    loss = torch.zeros((), dtype=torch.float64, device=data.x.device)
    correct = torch.zeros((), dtype=torch.int64, device=data.x.device)
    for start in range(0, len(data), batch_size):
        logits = model(data.x[start : start + batch_size])
        yb = data.y[start : start + batch_size]
        loss += nn.functional.cross_entropy(logits, yb, reduction="sum").double()
        correct += (logits.argmax(1) == yb).sum()
    model.train(was_training)
    return loss / len(data), correct.double() / len(data)


def batches_per_epoch(n: int, batch_size: int, batch_norm: bool = False) -> int:
    """Minibatches in an epoch of ``n`` examples: ceil(n / batch_size), except that a
    BatchNorm network takes a last batch of one example together with the batch before
    (BatchNorm cannot normalise a single example in training; among DSWAG's clients a
    shard of k * batch_size + 1 examples is common)."""
    count = math.ceil(n / batch_size)
    return count - 1 if batch_norm and count > 1 and n % batch_size == 1 else count


def train(
    model: nn.Module,
    optimizer: Optimizer,
    train_data: Tensors,
    *,
    epochs: int,
    batch_size: int,
    lr: Callable[[int], float],
    generator: torch.Generator,
    step: Step = sgd_step,
    val_data: Tensors | None = None,
    after_step: Callable[[int], None] | None = None,
    epoch_metrics: Callable[[], dict[str, float]] | None = None,
    desc: str = "train",
    progress: Progress | None = None,
    on_epoch: Callable[[Progress], None] | None = None,
    log_epochs: bool = True,
) -> list[dict[str, float]]:
    """Run ``epochs`` of minibatch training; return one history row per epoch.

    ``generator`` (CPU) shuffles; ``after_step(i)`` runs after optimizer step
    i (0-based), e.g. to collect SWAG snapshots; ``epoch_metrics()`` adds
    columns to each epoch's row (monitoring, e.g. test curves). A non-finite
    epoch loss stops training with a ``UserError`` naming the epoch.
    ``progress`` continues a run from an epoch boundary (the caller restores
    the model, optimizer, generator and RNG states that go with it) and is
    updated in place; ``on_epoch(progress)`` runs after each epoch, e.g. to
    write a checkpoint. ``log_epochs`` False keeps a run quiet (a logical
    client of distributed SWAG; there may be thousands).
    """
    n = len(train_data)
    batch_norm = bool(bn_modules(model))
    if batch_norm and n == 1:
        raise UserError(f"{desc}: one training example cannot train a BatchNorm network")
    iters_per_epoch = batches_per_epoch(n, batch_size, batch_norm)
    device = train_data.x.device
    progress = progress if progress is not None else Progress()
    history = progress.history
    iteration = progress.iteration
    bar = tqdm(
        range(progress.epoch + 1, epochs + 1),
        desc=desc,
        disable=None if log_epochs else True,
        leave=False,
        initial=progress.epoch,
        total=epochs,
    )
    for epoch in bar:
        started = time.perf_counter()
        model.train()
        order = torch.randperm(n, generator=generator).to(device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        for b in range(iters_per_epoch):
            end = (b + 1) * batch_size if b < iters_per_epoch - 1 else n
            idx = order[b * batch_size : end]
            xb, yb = train_data.x[idx], train_data.y[idx]
            rate = lr(iteration)
            for group in optimizer.param_groups:
                group["lr"] = rate
            optimizer.zero_grad(set_to_none=True)
            loss, logits = step(model, xb, yb)
            optimizer.step()
            loss_sum += loss.double() * yb.shape[0]
            correct += (logits.argmax(1) == yb).sum()
            if after_step is not None:
                after_step(iteration)
            iteration += 1
        row = {
            "epoch": epoch,
            "lr": rate,
            "train_loss": (loss_sum / n).item(),
            "train_accuracy": (correct.double() / n).item(),
        }
        if not math.isfinite(row["train_loss"]):
            raise UserError(
                f"{desc}: training loss became {row['train_loss']} in epoch {epoch}; "
                "lower the learning rate (schedule.lr) or check the data"
            )
        if val_data is not None:
            val_loss, val_acc = loss_and_accuracy(model, val_data)
            row["val_loss"], row["val_accuracy"] = val_loss.item(), val_acc.item()
        if epoch_metrics is not None:
            row.update(epoch_metrics())
        row["seconds"] = time.perf_counter() - started
        history.append(row)
        progress.epoch, progress.iteration = epoch, iteration
        if log_epochs:
            log.info(
                "%s epoch %d/%d: %s",
                desc,
                epoch,
                epochs,
                ", ".join(f"{k}={v:.4g}" for k, v in row.items() if k not in ("epoch", "seconds")),
            )
        if on_epoch is not None:
            on_epoch(progress)
    return history
