"""The one training loop over tensors on the device; steps and kinds plug in.

A *step* (``steps``) computes the gradients of whatever the optimizer holds and
returns the detached loss and logits: plain SGD, SAM and SVI steps reuse the same
loop. Everything that makes a run fast at scale lives here and in
``batches``, once, for every trajectory kind (``Compute``): the training
split stays on the device as uint8 (or streams there from a memory-mapped
file, ``batches.StreamedData``) and is augmented per batch (``augment``),
forward and loss run under autocast (``precision``), conv nets train
channels-last (unless ``channels_last: false``), and under torchrun each rank
takes a deterministic share of every global batch (``batches.shard``) and
gradients are averaged across ranks before the optimizer steps
(``steps.StepContext``). Metrics are accumulated on the device and read once
per epoch, so there is no host sync per iteration. Learning rates are plain
functions of the iteration (``schedules``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from ..runtime.errors import UserError
from ..seeding import derive_seed
from .augment import Augment, draw_epoch
from .batches import Order, Tensors, TrainData, batches_per_epoch, check_shards, epoch_bounds
from .batchnorm import bn_modules
from .compiled import CompiledStep
from .distributed import World
from .graphs import GraphStep
from .monitoring import EVERY_EPOCH, Monitoring, row_line
from .optim import Optimizer
from .precision import Precision
from .steps import Step, StepContext, sgd_step

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Compute:
    """How a run computes, the same for every trajectory kind."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    precision: Precision = field(default_factory=Precision)
    channels_last: bool = False
    world: World | None = None
    augment: Augment = field(default_factory=Augment)
    compile: bool = False
    cuda_graphs: bool = False

    @property
    def size(self) -> int:
        return 1 if self.world is None else self.world.size

    @property
    def is_main(self) -> bool:
        return self.world is None or self.world.is_main

    def prepare(self, model: nn.Module) -> nn.Module:
        """``model`` on the device, channels-last if asked (4-D weights only change)."""
        model = model.to(self.device)
        return model.to(memory_format=torch.channels_last) if self.channels_last else model


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


@torch.inference_mode()
def loss_and_accuracy(
    model: nn.Module, data: Tensors, batch_size: int = 1000, precision: Precision | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy and accuracy in eval mode, as device tensors; the forward under
    ``precision``'s autocast (monitoring at the training precision), the loss in fp32."""
    was_training = model.training
    model.eval()
    loss = torch.zeros((), dtype=torch.float64, device=data.x.device)
    correct = torch.zeros((), dtype=torch.int64, device=data.x.device)
    autocast = precision.autocast if precision is not None else contextlib.nullcontext
    for start in range(0, len(data), batch_size):
        with autocast():
            logits = model(data.x[start : start + batch_size]).float()
        yb = data.y[start : start + batch_size]
        loss += nn.functional.cross_entropy(logits, yb, reduction="sum").double()
        correct += (logits.argmax(1) == yb).sum()
    model.train(was_training)
    return loss / len(data), correct.double() / len(data)


def train(
    model: nn.Module,
    optimizer: Optimizer,
    train_data: Tensors | TrainData,
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
    ctx: StepContext | None = None,
    augment_seed: int = 0,
    monitoring: Monitoring = EVERY_EPOCH,
    compiled: CompiledStep | None = None,
    graphs: bool | GraphStep = False,
) -> list[dict[str, float]]:
    """Run ``epochs`` of minibatch training; return one history row per epoch.

    ``generator`` (CPU) shuffles; ``after_step(i)`` runs after optimizer step
    i (0-based), e.g. to collect SWAG snapshots; ``epoch_metrics()`` adds
    columns to each epoch's row (monitoring, e.g. test curves). ``monitoring``
    says at which epochs validation and ``epoch_metrics`` run, and on which
    subset of ``val_data``; other rows hold the training columns. A non-finite
    epoch loss stops training with a ``UserError`` naming the epoch.
    ``progress`` continues a run from an epoch boundary (the caller restores
    the model, optimizer, generator and RNG states that go with it) and is
    updated in place; ``on_epoch(progress)`` runs after each epoch, e.g. to
    write a checkpoint. ``log_epochs`` False keeps a run quiet (a logical
    client of distributed SWAG; there may be thousands).

    ``ctx`` carries precision and data parallelism (default: one process,
    fp32). Under N processes every rank shuffles with the same generator and
    takes its share of each global batch (``shard``); validation, epoch
    metrics and logging run on rank 0 only, the others' rows hold the
    training columns. Augmentation (``TrainData.augment``) is drawn per epoch
    from a generator seeded by (``augment_seed``, epoch): a resumed run
    augments exactly as an uninterrupted one.

    ``compiled``: steps call its compiled view of ``model``, every batch shape
    compiled before the first epoch (``CompiledStep.warm_up``); the first row of
    this call holds the seconds that took (``compile_seconds``). ``graphs``: the
    graph-ready step (``graphs.GraphStep``), captured as a CUDA graph on CUDA; a
    ``GraphStep`` of ``model`` and ``optimizer`` is used as it is (its graphs are
    kept from one call to the next).
    """
    ctx = ctx or StepContext()
    world = ctx.world
    main = world is None or world.is_main
    n = len(train_data)
    batch_norm = bool(bn_modules(model))
    if batch_norm and n == 1:
        raise UserError(f"{desc}: one training example cannot train a BatchNorm network")
    iters_per_epoch = batches_per_epoch(n, batch_size, batch_norm)
    check_shards(n, batch_size, iters_per_epoch, 1 if world is None else world.size, batch_norm)
    bounds = epoch_bounds(n, batch_size, iters_per_epoch)
    augment = isinstance(train_data, TrainData) and train_data.augment.active
    device = train_data.y.device
    if val_data is not None:
        val_data = monitoring.subset(val_data)
    progress = progress if progress is not None else Progress()
    history = progress.history
    iteration = progress.iteration
    bar = tqdm(
        range(progress.epoch + 1, epochs + 1),
        desc=desc,
        disable=None if log_epochs and main else True,
        leave=False,
        initial=progress.epoch,
        total=epochs,
    )
    stepper, compile_seconds = model, 0.0
    if compiled is not None:
        model.train()
        stepper = compiled.view
        compile_seconds = compiled.warm_up_epoch(step, train_data, batch_size, iters_per_epoch, ctx)
    graph = graphs if isinstance(graphs, GraphStep) else None
    if graphs is True:
        graph = GraphStep(stepper, optimizer, step, ctx, device)
    for epoch in bar:
        started = time.perf_counter()
        model.train()
        host = torch.randperm(n, generator=generator)
        order = Order(host, host.to(device))
        draws = None
        if augment:
            assert isinstance(train_data, TrainData)
            seed = derive_seed(augment_seed, "augment", epoch)
            draws = draw_epoch(n, train_data.augment, torch.Generator().manual_seed(seed)).to(
                device
            )
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        if graph is not None:
            graph.new_epoch()
            loss_sum, correct = graph.loss_sum, graph.correct
        for xb, yb, share in train_data.epoch(order, bounds, world, draws):
            ctx.weight = share
            rate = lr(iteration)
            if graph is not None:
                graph(xb, yb, rate)
            else:
                for group in optimizer.param_groups:
                    group["lr"] = rate
                optimizer.zero_grad(set_to_none=True)
                loss, logits = step(stepper, xb, yb, ctx)
                ctx.reduce_grads(optimizer.params)
                if ctx.scaler is not None:
                    ctx.scaler.step(optimizer)
                    ctx.scaler.update()
                else:
                    optimizer.step()
                loss_sum += loss.double() * yb.shape[0]
                correct += (logits.argmax(1) == yb).sum()
            if after_step is not None:
                after_step(iteration)
            iteration += 1
        if world is not None:
            loss_sum, correct = _sum_over_ranks(loss_sum, correct)
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
        watch = main and monitoring.due(epoch, epochs)
        if watch and val_data is not None:
            val_loss, val_acc = loss_and_accuracy(model, val_data, precision=ctx.precision)
            row["val_loss"], row["val_accuracy"] = val_loss.item(), val_acc.item()
        if watch and epoch_metrics is not None:
            row.update(epoch_metrics())
        row["seconds"] = time.perf_counter() - started
        if compile_seconds:
            row["compile_seconds"], compile_seconds = compile_seconds, 0.0
        history.append(row)
        progress.epoch, progress.iteration = epoch, iteration
        if log_epochs and main:
            log.info(
                "%s epoch %d/%d: %s",
                desc,
                epoch,
                epochs,
                row_line(row),
            )
        if on_epoch is not None:
            on_epoch(progress)
    return history


def _sum_over_ranks(
    loss_sum: torch.Tensor, correct: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch.distributed as dist

    both = torch.stack([loss_sum, correct.double()])
    dist.all_reduce(both)
    return both[0], both[1].round().long()
