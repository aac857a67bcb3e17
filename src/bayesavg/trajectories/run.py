"""The shared run every trajectory kind goes through: a kind says what it trains, its
step and what it collects (a ``Plan``); this module owns the rest.

That is: the schedule, the training data on the device, the step context
(precision, data parallelism, draws shared by the ranks), snapshot timing,
monitoring curves, and resume. A run's mutable state is one tree
(``_Run.state_dict``: network, optimizer, collector, shuffling generator,
RNG streams, progress) that a checkpoint saves at epoch boundaries; loading
it and training on gives, on CPU, the bytes of an uninterrupted run.

Under N processes every rank holds the network and optimizer and takes its
share of each batch; collectors, monitoring and checkpoints live on rank 0.
Rank r seeds torch's global stream (dropout masks) from (run, r), while
draws that define the step (VI's epsilon, SGLD's noise) come from one
generator seeded alike on every rank. A checkpoint of an N-process run
holds every rank's stream and resumes under the same N.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..config import PretrainParams, Trajectory
from ..data.inputs import Inputs
from ..data.prepared import Prepared
from ..models import has_batchnorm
from ..posteriors.file import load_theta
from ..runtime.checkpoint import Resumable
from ..seeding import derive_seed, generator, rng_state, set_rng_state
from ..training.batches import batches_per_epoch
from ..training.batchnorm import bn_modules, update_bn
from ..training.compiled import CompiledStep
from ..training.distributed import World
from ..training.graphs import unsupported
from ..training.monitoring import EVERY_EPOCH, Monitoring
from ..training.optim import Optimizer
from ..training.schedules import lr_at
from ..training.steps import Step, StepContext, sgd_step
from ..training.train import Compute, Progress, loss_and_accuracy, train
from .common import train_data, watched

log = logging.getLogger(__name__)

# The parts every rank holds; collectors and kept samples live on rank 0 alone and are
# not sent to the others (a WideResNet's SWAG collector is gigabytes).
REPLICATED = ("net", "optimizer", "scaler")


@dataclass
class Plan:
    """What one trajectory kind contributes to a run.

    ``trained``: the module the loop trains (the network, or VI's (mu, rho)
    around it); ``parts``: what else the run changes and saves with it (a
    collector, kept samples; rank 0 only); ``collect``: called after each
    snapshot iteration (rank 0); ``average``: the running average of the
    weights, for the monitoring curves; ``template``: the plain network that
    average is loaded into (default ``trained``).
    """

    trained: nn.Module
    optimizer: Optimizer
    step: Step = sgd_step
    parts: dict[str, Any] = field(default_factory=dict)
    collect: Callable[[], None] | None = None
    average: Callable[[], torch.Tensor | None] | None = None
    template: nn.Module | None = None


def step_context(compute: Compute, run_seed: int) -> StepContext:
    """The run's step context; call it where one process would start drawing.

    Under N processes the draws that define a step (VI's epsilon, SGLD's
    noise) come from a generator that continues torch's global stream as it
    stands here, the same on every rank: without dropout, those draws are
    exactly the ones a single process takes from its global stream, so N
    processes differ from one only by the order of float sums. The global
    stream is then reseeded per rank, for dropout masks of each rank's examples.
    """
    world = compute.world
    shared = None
    if world is not None and world.size > 1:
        device = compute.device
        shared = torch.Generator(device=device)
        if device.type == "cuda":
            shared.set_state(torch.cuda.get_rng_state(device))
        else:
            shared.set_state(torch.get_rng_state())
        torch.manual_seed(derive_seed(run_seed, "rank", world.rank))
    return StepContext(compute.precision, world, shared)


class _Run:
    """One run's mutable state as a single tree: ``parts`` (objects with
    ``state_dict``/``load_state_dict``), the shuffling generator, torch's RNG
    streams and the loop's progress; under N processes also every rank's
    stream and the shared generator."""

    def __init__(self, parts: dict[str, Any], shuffle: torch.Generator, ctx: StepContext):
        self.parts = parts
        self.shuffle = shuffle
        self.ctx = ctx
        self.device = next(iter(parts["net"].parameters())).device
        self.progress = Progress()

    def state_dict(self) -> dict[str, Any]:
        state = {
            "parts": {name: part.state_dict() for name, part in self.parts.items()},
            "shuffle": self.shuffle.get_state(),
            "rng": rng_state(self.device),
            "progress": self.progress.state_dict(),
        }
        if self.ctx.world is not None:
            import torch.distributed as dist

            ranks: list[Any] = [None] * self.ctx.world.size
            dist.all_gather_object(ranks, state["rng"])
            state["rng"] = ranks
            assert self.ctx.shared is not None
            state["shared"] = self.ctx.shared.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, part in self.parts.items():
            part.load_state_dict(state["parts"][name])
        self.shuffle.set_state(state["shuffle"])
        world = self.ctx.world
        rng = state["rng"]
        if world is not None:
            if not isinstance(rng, list) or len(rng) != world.size:
                saved = len(rng) if isinstance(rng, list) else 1
                raise ValueError(
                    f"the checkpoint is of {saved} processes, this run of {world.size}"
                )
            rng = rng[world.rank]
            assert self.ctx.shared is not None
            self.ctx.shared.set_state(state["shared"])
        set_rng_state(rng, self.device)
        self.progress = Progress.from_state_dict(state["progress"])


def _replicated(
    world: World | None, resume: Resumable | None, epochs: int
) -> tuple[dict[str, Any] | None, list[int]]:
    """The state to resume from and the epochs to checkpoint after, as every rank sees them.

    Only rank 0 holds the checkpoint; the others get its tree without rank 0's
    own parts (collectors), which they do not keep.
    """
    state = resume.state if resume is not None else None
    due = [e for e in range(1, epochs + 1) if resume is not None and resume.due(e)]
    if world is None:
        return state, due
    import torch.distributed as dist

    box: list[Any] = [None]
    if world.is_main:
        shared = None
        if state is not None:
            kept = {k: v for k, v in state["parts"].items() if k in REPLICATED}
            shared = dict(state, parts=kept)
        box[0] = (shared, due)
    dist.broadcast_object_list(box, src=0)
    shared_state, due = box[0]
    return (state if world.is_main else shared_state), due


def run_plan(
    plan: Plan,
    opts: PretrainParams | Trajectory,
    prepared: Prepared,
    compute: Compute,
    ctx: StepContext,
    run_seed: int,
    desc: str,
    *,
    snapshots: Trajectory | None = None,
    monitor: bool = False,
    monitoring: Monitoring = EVERY_EPOCH,
    resume: Resumable | None = None,
) -> list[dict[str, float]]:
    """Train ``plan`` on ``opts``' schedule; return the history (rank 0's is complete).

    ``snapshots``: the trajectory whose ``collect`` section times
    ``plan.collect``; ``monitor``: add test curves of the iterate and the
    running average to the validation curves; ``monitoring``: at which epochs
    and on which share of the images; ``resume``: a checkpoint to continue from
    and save to.
    """
    data = train_data(prepared, compute)
    per_epoch = batches_per_epoch(len(data), opts.batch_size, bool(bn_modules(plan.trained)))
    s = opts.schedule
    rate = lr_at(
        s.kind, s.lr, s.lr_end, s.cycle_length, opts.epochs * per_epoch, per_epoch, s.decay_epochs
    )
    parts: dict[str, Any] = {"net": plan.trained, "optimizer": plan.optimizer, **plan.parts}
    if ctx.scaler is not None:
        parts["scaler"] = ctx.scaler
    run = _Run(parts, generator(run_seed), ctx)
    state, due = _replicated(compute.world, resume, opts.epochs)
    if state is not None:
        run.load_state_dict(state)
        log.info("%s: resuming from the checkpoint after epoch %d", desc, run.progress.epoch)

    def on_epoch(progress: Progress) -> None:
        if progress.epoch in due:
            tree = run.state_dict()
            if resume is not None:
                resume.save(tree)

    after_step = None
    if snapshots is not None and plan.collect is not None:
        collect = plan.collect

        def after_step(i: int) -> None:
            if snapshots.collects_after(i, per_epoch):
                collect()

    compiled = None
    if compute.compile if opts.compile is None else opts.compile:
        compiled = CompiledStep(plan.trained)
    graphs = compute.cuda_graphs if opts.cuda_graphs is None else opts.cuda_graphs
    if graphs:
        why = unsupported(
            sam=getattr(opts, "sam_rho", 0.0) > 0,
            sgld=getattr(opts, "kind", "sgd") == "sgld",
            precision=compute.precision.name,
            processes=compute.size,
        )
        if why is not None:
            log.warning("%s: cuda_graphs: steps not captured: %s", desc, why)
            graphs = False
    metrics = None
    if monitor and compute.is_main:
        metrics = _monitor(plan, prepared, data.inputs, compute, monitoring)
    return train(
        plan.trained,
        plan.optimizer,
        data,
        step=plan.step,
        epochs=opts.epochs,
        batch_size=opts.batch_size,
        lr=rate,
        generator=run.shuffle,
        val_data=watched(prepared.val, prepared, compute.device) if compute.is_main else None,
        after_step=after_step,
        epoch_metrics=metrics,
        desc=desc,
        progress=run.progress,
        on_epoch=on_epoch,
        ctx=ctx,
        augment_seed=run_seed,
        monitoring=monitoring,
        compiled=compiled,
        graphs=graphs,
    )


def _monitor(
    plan: Plan,
    prepared: Prepared,
    train_inputs: Callable[[], Inputs],
    compute: Compute,
    monitoring: Monitoring,
) -> Callable[[], dict[str, float]]:
    """Test loss/accuracy of the iterate and of the running average, at the training
    precision, on ``monitoring``'s share of the test images.

    For monitoring curves only (the report says so): no choice reads them.
    The iterate is evaluated as is (for VI: at mu); the running average is
    loaded into a copy of the plain network, whose BatchNorm statistics are
    recomputed on the same share of the (not augmented) training images.
    """
    net = plan.trained
    average = plan.average
    device = compute.device
    precision = compute.precision
    test = monitoring.subset(watched(prepared.test, prepared, device))
    avg_net = copy.deepcopy(plan.template or net) if average is not None else None

    def metrics() -> dict[str, float]:
        loss, acc = loss_and_accuracy(net, test, precision=precision)
        row = {"test_loss": loss.item(), "test_accuracy": acc.item()}
        if avg_net is not None and average is not None:
            mean = average()
            row["avg_test_loss"] = row["avg_test_accuracy"] = math.nan
            if mean is not None:
                load_theta(avg_net, mean.to(device=device, dtype=torch.float32), {})
                if has_batchnorm(avg_net):
                    with precision.autocast():
                        update_bn(avg_net, monitoring.inputs(train_inputs()))
                loss, acc = loss_and_accuracy(avg_net, test, precision=precision)
                row["avg_test_loss"], row["avg_test_accuracy"] = loss.item(), acc.item()
        return row

    return metrics
