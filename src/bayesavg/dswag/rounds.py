"""Distributed SWAG (ALGORITHMS §8) over logical clients, on one process or many.

Phase 1 trains a FedAvg model theta_T over ``rounds`` synchronised rounds;
phase 2 lets a share of the clients explore from theta_T with the paper's
linear rate; phase 3 collects SWAG moments over all their snapshots. The
clients are logical: ``bayesavg.training.distributed`` deals them out over the
processes of a torch.distributed run, and the result is bitwise the same on
1, 2 or 3 processes (CPU), since every client's randomness is its own and
rank 0 takes the clients' results in client order.

Decisions where the paper is vague:

- FedAvg is the data-size-weighted mean over the round's sampled clients
  only, BatchNorm buffers included (an integer buffer: the weighted mean,
  rounded). The weights are float64 ``n_i / sum n`` and the sum runs in
  client order in float64: one sampled client gives its model exactly.
- Clients are stateless: each starts a round (and phase 2) from the global
  model with a fresh optimizer.
- Sampling is without replacement, k = max(1, round(fraction * clients)),
  seeded by (seed, round); phase 2's explorers by (seed, -1).
- A client's shuffling and dropout masks are seeded by (seed, phase,
  round, client) (phase 2: round -1).
- Phase 1's rate is ``phase1.schedule`` over the rounds, one rate a round;
  phase 2's is alpha(t) = (1 - t/c) lr_start + (t/c) lr_end, t the epoch
  from 0, c = epochs, one rate an epoch.
- Each explorer contributes a snapshot at the end of each of its last
  ``snapshots_per_client`` epochs; the "last K" deviations are in (client
  id, snapshot index) order: rank 0 runs ``SWAG.collect`` in that order.
- Phase 1 stops at the end of the round whose global model reaches
  ``target_accuracy`` on all clients' training data (the training split).
- The history has one row per phase-1 round (``epoch`` is the round): the
  global model's loss and accuracy on train, val and test.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import nn

from ..config import DSWAGTrajectory, Params
from ..data.inputs import Inputs
from ..data.prepared import Prepared
from ..posteriors import SWAG
from ..posteriors.file import PosteriorFile
from ..seeding import derive_seed, generator, seed_everything
from ..training.batches import Tensors, batches_per_epoch
from ..training.batchnorm import bn_modules
from ..training.distributed import World, broadcast, in_client_order, joined
from ..training.flat import params_vector
from ..training.monitoring import row_line
from ..training.optim import SGD
from ..training.schedules import lr_at
from ..training.train import train
from ..trajectories import RunResult, posterior_fields, start_model, trajectory_kwargs
from ..trajectories.common import watched
from .federated import dirichlet_split, fedavg_weights, iid_split, phase2_rate, sample_clients

log = logging.getLogger(__name__)

PHASE2_ROUND = -1  # the "round" that seeds phase 2's sample and clients
EVAL_CHUNK = 250  # images per part when the global model is evaluated across ranks (small
# parts keep the ranks evenly loaded; fixed, so the sums do not depend on their number)


def state_vector(net: nn.Module) -> torch.Tensor:
    """Parameters, then buffers, as one float64 vector (exact for float32 and counts)."""
    parts = [p.detach().reshape(-1) for p in net.parameters()]
    parts += [b.detach().reshape(-1) for _, b in net.named_buffers()]
    return torch.cat([p.to(torch.float64) for p in parts])


@torch.no_grad()
def load_state_vector(net: nn.Module, vector: torch.Tensor) -> None:
    """Inverse of ``state_vector``; integer buffers take the nearest integer."""
    offset = 0
    tensors = list(net.parameters()) + [b for _, b in net.named_buffers()]
    for t in tensors:
        part = vector[offset : offset + t.numel()].view_as(t)
        t.copy_(part if t.is_floating_point() else part.round())
        offset += t.numel()


def client_seed(seed: int, phase: int, round_: int, client: int) -> int:
    return derive_seed(seed, "dswag", phase, round_, client)


def shards(traj: DSWAGTrajectory, labels: torch.Tensor, seed: int) -> list[torch.Tensor]:
    """Each client's training indices (deterministic from the seed)."""
    split_seed = derive_seed(seed, "dswag", "split")
    if traj.split.kind == "iid":
        return iid_split(labels, traj.clients, split_seed)
    return dirichlet_split(labels, traj.clients, traj.split.alpha, traj.split.min_size, split_seed)


def _train_client(
    client: int,
    net: nn.Module,
    data: Tensors,
    traj: DSWAGTrajectory,
    epochs: int,
    rate: Any,
    seed: int,
    after_step: Any = None,
) -> None:
    """Local SGD of one client: its own shuffling and dropout stream, a fresh optimizer."""
    seed_everything(seed, data.x.device)
    optimizer = SGD(list(net.parameters()), momentum=traj.momentum, weight_decay=traj.weight_decay)
    train(
        net,
        optimizer,
        data,
        epochs=epochs,
        batch_size=traj.batch_size,
        lr=rate,
        generator=generator(seed),
        after_step=after_step,
        desc=f"client {client}",
        log_epochs=False,
    )


@torch.inference_mode()
def _sums(net: nn.Module, data: Tensors) -> torch.Tensor:
    """(summed cross-entropy, correct, count) of ``net`` in eval mode, float64."""
    net.eval()
    logits = net(data.x)
    loss = nn.functional.cross_entropy(logits, data.y, reduction="sum").double()
    correct = (logits.argmax(1) == data.y).sum().double()
    return torch.stack([loss, correct, loss.new_tensor(len(data))])


def _evaluate(world: World, net: nn.Module, splits: dict[str, Tensors]) -> dict[str, float]:
    """Loss and accuracy of the global model on each split, the work spread over ranks.

    Every split is cut into fixed chunks; rank 0 sums the chunks in order, so
    the numbers are the same for any world size, and broadcasts them so every
    rank takes the same decisions (early stop).
    """
    parts = [
        (name, Tensors(t.x[i : i + EVAL_CHUNK], t.y[i : i + EVAL_CHUNK]))
        for name, t in splits.items()
        for i in range(0, len(t), EVAL_CHUNK)
    ]
    totals = torch.zeros(len(splits), 3, dtype=torch.float64)
    names = list(splits)

    def take(index: int, sums: torch.Tensor) -> None:
        totals[names.index(parts[index][0])] += sums.cpu()

    in_client_order(world, range(len(parts)), lambda i: _sums(net, parts[i][1]), take, (3,))
    broadcast(world, totals)
    row = {}
    for name, (loss, correct, n) in zip(names, totals.tolist(), strict=True):
        row[f"{name}_loss"], row[f"{name}_accuracy"] = loss / n, correct / n
    return row


def finetune_dswag(
    params: Params,
    name: str,
    prepared: Prepared,
    start: PosteriorFile,
    device: torch.device,
    traj: DSWAGTrajectory | None = None,
) -> RunResult | None:
    """Trajectory ``name`` (``kind: dswag``) from ``start``, or ``traj`` in its place (the
    worker sweep's variants); None on ranks other than 0, which leave the outputs to
    rank 0. Not checkpointed: a run is minutes."""
    traj = traj or params.finetune[name]
    if not isinstance(traj, DSWAGTrajectory):
        raise TypeError(f"finetune.{name}: not a dswag trajectory")
    kwargs = trajectory_kwargs(start, traj.dropout)
    fields = posterior_fields(params, prepared, name, kwargs)
    net = start_model(start, kwargs, device)
    splits = {s: watched(getattr(prepared, s), prepared, device) for s in ("train", "val", "test")}
    out = run_dswag(params.seed, name, traj, net, splits, prepared.train.y, fields)
    if out is None:
        return None
    posterior, history = out
    posterior.start_theta = start.theta.clone()
    return RunResult(posterior, history)


def run_dswag(
    seed: int,
    name: str,
    traj: DSWAGTrajectory,
    net: nn.Module,
    splits: dict[str, Tensors],
    labels: torch.Tensor,
    fields: dict[str, Any],
) -> tuple[PosteriorFile, list[dict[str, float]]] | None:
    """Run trajectory ``name`` from ``net`` on this process's share of the clients.

    ``splits``: model-ready train, val and test inputs (tensors, or ``Inputs`` read a
    batch at a time) on the device;
    ``labels``: the training labels on the CPU (for the split). Joins the
    torch.distributed run if there is one, and leaves it after unless the caller
    joined first (``distributed.joined``). Returns (posterior, history) on rank 0,
    None on other ranks.
    """
    threads = torch.get_num_threads()
    try:
        with joined(next(net.parameters()).device) as world:
            return _run(seed, name, traj, net, splits, labels, world, fields)
    finally:
        torch.set_num_threads(threads)


def _fedavg_round(
    world: World,
    net: nn.Module,
    data: list[Tensors],
    traj: DSWAGTrajectory,
    seed: int,
    round_: int,
    rate: float,
    sampled: list[int],
    global_state: torch.Tensor,
) -> torch.Tensor:
    """One phase-1 round: the sampled clients train from the global model, rank 0 takes
    their states in client order into the weighted mean, every rank gets the result."""
    weights = dict(zip(sampled, fedavg_weights([len(data[c]) for c in sampled]), strict=True))
    total = torch.zeros_like(global_state)

    def work(client: int) -> torch.Tensor:
        load_state_vector(net, global_state)
        seed_ = client_seed(seed, 1, round_, client)
        _train_client(
            client, net, data[client], traj, traj.phase1.local_epochs, lambda i: rate, seed_
        )
        return state_vector(net)

    def take(client: int, state: torch.Tensor) -> None:
        total.add_(state, alpha=weights[client])

    in_client_order(world, sampled, work, take, tuple(global_state.shape))
    return broadcast(world, total)


def explore(
    world: World,
    net: nn.Module,
    data: list[Tensors],
    traj: DSWAGTrajectory,
    seed: int,
    theta_t: torch.Tensor,
    explorers: list[int],
) -> SWAG | None:
    """Phases 2 and 3: each explorer trains from theta_T at the linear rate alpha(t); rank 0
    collects their snapshots in (client, snapshot) order and returns the SWAG moments
    (None on other ranks)."""
    d = sum(p.numel() for p in net.parameters())
    p2 = traj.phase2
    collector = SWAG(d, traj.max_rank, device=world.device) if world.is_main else None

    def work(client: int) -> torch.Tensor:
        load_state_vector(net, theta_t)
        steps = batches_per_epoch(len(data[client]), traj.batch_size, bool(bn_modules(net)))
        snaps: list[torch.Tensor] = []

        def rate(i: int) -> float:
            return phase2_rate(i // steps, p2.epochs, p2.lr_start, p2.lr_end)

        def after_step(i: int) -> None:
            if (i + 1) % steps == 0 and (i + 1) // steps > p2.epochs - p2.snapshots_per_client:
                snaps.append(params_vector(net.parameters()).detach().double())

        seed_ = client_seed(seed, 2, PHASE2_ROUND, client)
        _train_client(client, net, data[client], traj, p2.epochs, rate, seed_, after_step)
        return torch.stack(snaps)

    def take(client: int, snaps: torch.Tensor) -> None:
        assert collector is not None
        for snap in snaps:
            collector.collect(snap)

    in_client_order(world, explorers, work, take, (p2.snapshots_per_client, d))
    return collector


def _rows(x: torch.Tensor | Inputs, rows: torch.Tensor) -> torch.Tensor | Inputs:
    """A client's shard of the training inputs: rows read when batched (``Inputs``, so
    a streamed split is never whole as float32) or, for tensors, a copy of them."""
    return x.subset(rows) if isinstance(x, Inputs) else x[rows]


def _run(
    seed: int,
    name: str,
    traj: DSWAGTrajectory,
    net: nn.Module,
    splits: dict[str, Tensors],
    labels: torch.Tensor,
    world: World,
    fields: dict[str, Any],
) -> tuple[PosteriorFile, list[dict[str, float]]] | None:
    device, train_t = world.device, splits["train"]
    indices = [i.to(device) for i in shards(traj, labels, seed)]
    data = [Tensors(_rows(train_t.x, i), train_t.y[i]) for i in indices]
    global_state = state_vector(net)
    s1 = traj.phase1.schedule
    round_rate = lr_at(s1.kind, s1.lr, s1.lr_end, s1.cycle_length, traj.phase1.rounds)
    history: list[dict[str, float]] = []

    for round_ in range(traj.phase1.rounds):
        started = time.perf_counter()
        rate = round_rate(round_)
        sampled = sample_clients(traj.clients, traj.phase1.client_fraction, seed, round_)
        global_state = _fedavg_round(
            world, net, data, traj, seed, round_, rate, sampled, global_state
        )
        load_state_vector(net, global_state)
        row = {"epoch": round_ + 1, "lr": rate, "clients": len(sampled)}
        row.update(_evaluate(world, net, splits))
        row["seconds"] = time.perf_counter() - started
        history.append(row)
        if world.is_main:
            log.info(
                "%s round %d/%d: %s",
                name,
                round_ + 1,
                traj.phase1.rounds,
                row_line(row),
            )
        target = traj.phase1.target_accuracy
        if target is not None and row["train_accuracy"] >= target:
            break

    theta_t = global_state.clone()
    explorers = sample_clients(traj.clients, traj.phase2.client_fraction, seed, PHASE2_ROUND)
    collector = explore(world, net, data, traj, seed, theta_t, explorers)
    if collector is None:
        return None
    load_state_vector(net, theta_t)
    posterior = PosteriorFile.from_model(net, **fields)
    posterior.collector = collector.state_dict()
    log.info(
        "%s: FedAvg model after %d rounds; %d snapshots from %d explorers",
        name,
        len(history),
        collector.n_collected,
        len(explorers),
    )
    return posterior, history
