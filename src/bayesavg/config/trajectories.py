"""Sections `pretrain` and `finetune`: schedules, collection, and every trajectory kind."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from .base import _NAME, NonNegFloat, NonNegInt, PosFloat, PosInt, _Section
from .data_model import DropoutRate


class Schedule(_Section):
    """Learning rate per iteration.

    cosine: lr -> lr_end over the whole run (the decaying SGD baseline);
    constant: lr throughout (SWA);
    cyclic: within each cycle of ``cycle_length`` iterations, linear from lr to lr_end
    (SWA paper); snapshots are then taken at cycle ends, where the rate is lr_end;
    swag: the SWAG paper's CIFAR schedule (reference ``run_swag.py``), per epoch e
    (0-based) with t = e / ``decay_epochs`` (default: the run's epochs): lr while
    t <= 0.5, linear to lr_end at t = 0.9, then lr_end.
    """

    kind: Literal["cosine", "constant", "cyclic", "swag"] = "constant"
    lr: PosFloat = 0.01
    lr_end: NonNegFloat = 0.0
    cycle_length: PosInt = 100
    decay_epochs: PosInt | None = None

    @model_validator(mode="after")
    def _check(self) -> Schedule:
        if self.kind == "cyclic" and self.lr_end <= 0:
            raise ValueError(
                "lr_end: a cyclic schedule needs lr_end > 0 (the rate never decays to 0)"
            )
        if self.decay_epochs is not None and self.kind != "swag":
            raise ValueError("decay_epochs: only the swag schedule takes it")
        if self.kind != "constant" and self.lr_end > self.lr:
            raise ValueError(f"lr_end: must not exceed lr ({self.lr}) for a {self.kind} schedule")
        return self


class Collect(_Section):
    """When to take SWAG snapshots during fine-tuning."""

    start_epoch: NonNegInt = 0
    every: NonNegInt = 0
    max_rank: Annotated[int, Field(ge=2)] = 20


class Optim(_Section):
    epochs: PosInt = 10
    batch_size: PosInt = 64
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.9
    weight_decay: NonNegFloat = 5e-4
    compile: bool | None = None  # the step through torch.compile; unset: the global `compile`
    cuda_graphs: bool | None = None  # the step as a CUDA graph; unset: the global one


class PretrainParams(Optim):
    """Pretraining; ``members`` > 1 also pretrains networks 2..M from their own seeds,
    stored in the same posterior file, for ensemble trajectories to fine-tune.

    ``kind: weights`` trains nothing but starts from ``model.weights`` with a new head
    seeded per member, fitted alone for ``head_epochs`` (0: left as initialised) on this
    section's schedule, batch size and optimizer."""

    kind: Literal["train", "weights"] = "train"
    head_epochs: NonNegInt = 0
    schedule: Schedule = Schedule(kind="cosine", lr=0.05, lr_end=0.0005)
    members: PosInt = 1


class VIParams(_Section):
    """Mean-field VI (ALGORITHMS §3): q = N(mu, softplus(rho)^2), prior N(0, prior_sigma^2).

    ``optimizer``: adam (as Bayes by Backprop; the schedule's rate is Adam's
    step size) or sgd (with the trajectory's momentum). Plain SGD barely
    moves rho: its gradient is scaled by sigmoid(rho), about sigma, so with
    sigma_init 0.03 a step moves rho by ~1e-5 and sigma stays at sigma_init.
    """

    sigma_init: PosFloat = 0.001
    prior_sigma: PosFloat = 1.0
    mc_samples: PosInt = 1
    kl_weight: NonNegFloat = 1.0
    optimizer: Literal["adam", "sgd"] = "adam"


class PosteriorScope(_Section):
    """The parameters a trajectory's posterior covers: those whose name (as
    ``model.named_parameters()`` gives it, e.g. ``layer4.1.conv2.weight``, ``fc.bias``)
    matches the regular expression ``params`` (``re.search``). The rest keep the start's
    weights (``rest: frozen``) or train with them (``rest: train``) without entering the
    posterior: a SWAG over the last block and the head of a large network."""

    params: str
    rest: Literal["frozen", "train"] = "frozen"

    @model_validator(mode="after")
    def _check(self) -> PosteriorScope:
        try:
            re.compile(self.params)
        except re.error as err:
            raise ValueError(f"params: not a regular expression ({err})") from None
        return self


class Trajectory(Optim):
    """One fine-tuning run from ``start`` (``pretrain`` or another trajectory).

    kind sgd: SGD (SWAG snapshots with ``collect``); vi: SVI on (mu, rho) from
    the start's weights; hwa: SVI continued from a vi trajectory, collecting
    (mu, sigma) snapshots; ensemble: the first ``members`` pretrained networks
    (``pretrain.members``), each fine-tuned like an sgd trajectory (with ``collect``, each
    member collects its own SWAG snapshots: MultiSWAG); sgld: Langevin dynamics
    (SGD without momentum plus Gaussian noise), keeping the last
    ``collect.max_rank`` samples taken after ``collect.start_epoch`` (burn-in).
    ``sam_rho`` > 0 turns on the SAM gradient (F-variants); ``dropout`` sets
    the network's dropout rate for this trajectory (MC dropout).
    """

    kind: Literal["sgd", "vi", "hwa", "ensemble", "sgld"] = "sgd"
    start: Annotated[str, Field(pattern=_NAME)]
    schedule: Schedule = Schedule()
    collect: Collect | None = None
    sam_rho: NonNegFloat = 0.0
    vi: VIParams | None = None
    reset_to_average: bool = False
    dropout: DropoutRate | None = None
    members: PosInt | None = None
    posterior: PosteriorScope | None = None

    def snapshots(self, iters_per_epoch: int) -> int:
        """How many snapshots this trajectory will collect (0 without ``collect``)."""
        if self.collect is None:
            return 0
        every = self.collect_every(iters_per_epoch)
        first = self.collect.start_epoch * iters_per_epoch
        return self.epochs * iters_per_epoch // every - first // every

    def collects_after(self, iteration: int, iters_per_epoch: int) -> bool:
        """Whether a snapshot is taken right after optimizer step ``iteration`` (0-based).

        From the end of epoch ``collect.start_epoch`` on, after every step
        whose count is a multiple of ``collect_every``, counted from the first
        step of the run, the count the rate schedule uses: with a cyclic
        rate every snapshot follows a step at ``lr_end`` (ALGORITHMS §1, §4),
        whatever the start epoch.
        """
        if self.collect is None:
            return False
        every = self.collect_every(iters_per_epoch)
        first = self.collect.start_epoch * iters_per_epoch
        return iteration >= first and (iteration + 1) % every == 0

    def collect_every(self, iters_per_epoch: int) -> int:
        """Iterations between snapshots: ``every``, else a cycle (cyclic) or an epoch."""
        assert self.collect is not None
        if self.collect.every:
            return self.collect.every
        if self.schedule.kind == "cyclic":
            return self.schedule.cycle_length
        return iters_per_epoch

    @model_validator(mode="after")
    def _check(self) -> Trajectory:
        if self.collect is not None and self.collect.start_epoch >= self.epochs:
            raise ValueError(
                f"collect.start_epoch: must be < epochs ({self.epochs}) so snapshots are taken"
            )
        if self.kind in ("vi", "hwa") and self.vi is None:
            raise ValueError(f"vi: a {self.kind} trajectory needs a 'vi' section")
        if self.kind in ("vi", "hwa") and self.weight_decay:
            raise ValueError(
                "weight_decay: must be 0 for vi/hwa; the prior (vi.prior_sigma) regularises"
            )
        if self.vi is not None and self.vi.optimizer == "adam" and self.momentum:
            raise ValueError(
                "momentum: Adam (vi.optimizer: adam) has its own; set it to 0 or use "
                "vi.optimizer: sgd"
            )
        if self.kind == "hwa" and self.collect is None:
            raise ValueError("collect: an hwa trajectory needs a 'collect' section")
        if self.reset_to_average and self.kind != "hwa":
            raise ValueError("reset_to_average: only hwa trajectories average and restart")
        if (self.members is not None) != (self.kind == "ensemble"):
            raise ValueError("members: set it for ensemble trajectories, and only for them")
        if self.posterior is not None and self.kind in ("vi", "hwa", "sgld"):
            raise ValueError(
                f"posterior: a {self.kind} trajectory's posterior covers every parameter; "
                "posterior.params is for sgd and ensemble trajectories"
            )
        if self.kind == "ensemble" and self.start != "pretrain":
            raise ValueError("start: ensemble members start from pretraining (start: pretrain)")
        if self.kind == "sgld":
            if self.momentum:
                raise ValueError(
                    "momentum: must be 0 for sgld (the noise scale sqrt(2 lr / N) assumes "
                    "plain SGD steps)"
                )
            if self.collect is None:
                raise ValueError(
                    "collect: an sgld trajectory needs a 'collect' section (burn-in epochs, "
                    "thinning, samples kept)"
                )
        return self

    def provides(self) -> set[str]:
        """What predictors can use from this trajectory's posterior file
        (keys of ``methods.PROVIDES``; ``PosteriorFile.provides`` reads the same from a file)."""
        out = {"weights"}
        if self.collect is not None and self.kind == "sgd":
            out.add("snapshots")
        if self.kind in ("vi", "hwa"):
            out.add("variational")
        if self.kind == "hwa":
            out.add("hwa")
        if self.kind == "ensemble":
            out.add("members")
            if self.collect is not None:
                out.add("member_snapshots")
        if self.kind == "sgld":
            out.add("samples")
        return out


class ClientSplit(_Section):
    """How the training split is dealt to the clients: ``iid`` (equal random shards) or
    ``dirichlet`` (per-class proportions over clients drawn from Dirichlet(alpha); every
    client gets at least ``min_size`` examples, or the stage stops with a params error)."""

    kind: Literal["iid", "dirichlet"] = "iid"
    alpha: PosFloat = 0.5
    min_size: NonNegInt = 1


Share = Annotated[float, Field(gt=0, le=1)]


class Phase1(_Section):
    """Synchronised FedAvg rounds (ALGORITHMS §8): each round samples
    max(1, round(client_fraction * clients)) clients, each trains ``local_epochs``
    from the global model at the round's rate (``schedule`` over the rounds), and
    the server averages them weighted by data size. ``target_accuracy``: stop at
    the end of the round whose global model reaches it on all clients' data."""

    rounds: PosInt = 20
    client_fraction: Share = 1.0
    local_epochs: PosInt = 1
    schedule: Schedule = Schedule(kind="constant", lr=0.05)
    target_accuracy: Share | None = None


class Phase2(_Section):
    """Independent exploration from the FedAvg model: a ``client_fraction`` of the clients
    each trains ``epochs`` epochs at alpha(t) = (1 - t/c) lr_start + (t/c) lr_end
    (t the epoch, c = epochs) and contributes a snapshot at the end of each of its last
    ``snapshots_per_client`` epochs."""

    client_fraction: Share = 1.0
    epochs: PosInt = 10
    lr_start: PosFloat = 0.05
    lr_end: PosFloat = 0.005
    snapshots_per_client: PosInt = 2

    @model_validator(mode="after")
    def _check(self) -> Phase2:
        if self.snapshots_per_client > self.epochs:
            raise ValueError(
                f"snapshots_per_client: at most epochs ({self.epochs}), one per epoch at the end"
            )
        return self


class DSWAGTrajectory(_Section):
    """Distributed SWAG (``kind: dswag``, ALGORITHMS §8) over ``clients`` logical clients.

    Phase 1 trains the FedAvg model theta_T, phase 2 explores from it, phase 3
    collects SWAG moments over every snapshot in (client, snapshot) order. The
    posterior file is a SWAG trajectory's: theta_T is its weights (map) and the
    moments its collector (swa, swag_diag, swag). ``start``: ``init`` (the
    pipeline's fresh network, the paper's setting), ``pretrain`` or a trajectory.
    """

    kind: Literal["dswag"]
    start: Annotated[str, Field(pattern=_NAME)] = "init"
    clients: PosInt = 10
    split: ClientSplit = ClientSplit()
    phase1: Phase1 = Phase1()
    phase2: Phase2 = Phase2()
    batch_size: PosInt = 32
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.9
    weight_decay: NonNegFloat = 5e-4
    max_rank: Annotated[int, Field(ge=2)] = 20
    dropout: DropoutRate | None = None

    def explorers(self) -> int:
        """How many clients explore in phase 2."""
        return max(1, round(self.phase2.client_fraction * self.clients))

    def snapshots(self) -> int:
        return self.explorers() * self.phase2.snapshots_per_client

    def provides(self) -> set[str]:
        """What predictors can use from this trajectory's posterior file."""
        return {"weights", "snapshots"}


class LaplaceTrajectory(_Section):
    """A last-layer Laplace approximation (``kind: laplace``; Daxberger et al. 2021, the
    SWAG paper's "SGD + Laplace" baseline) at the final weights of ``start``: a
    Kronecker-factored (KFAC) Gauss-Newton Hessian of the last linear layer over the
    training split, fitted with laplace-torch, and the prior precision chosen by
    maximising the marginal likelihood (``marglik``) or fixed. Nothing trains: the
    weights are the start's, the posterior file adds the factors."""

    kind: Literal["laplace"]
    start: Annotated[str, Field(pattern=_NAME)]
    prior_precision: Literal["marglik"] | PosFloat = "marglik"
    batch_size: PosInt = 256
    dropout: None = None  # the start's network, as it is

    def provides(self) -> set[str]:
        """What predictors can use from this trajectory's posterior file."""
        return {"weights", "laplace"}


def _trajectory_tag(value: Any) -> str:
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if kind in ("dswag", "laplace") else "trajectory"


AnyTrajectory = Annotated[
    Annotated[Trajectory, Tag("trajectory")]
    | Annotated[DSWAGTrajectory, Tag("dswag")]
    | Annotated[LaplaceTrajectory, Tag("laplace")],
    Discriminator(_trajectory_tag),
]
STARTS = ("pretrain", "init")  # the starts besides trajectories (both written by stage pretrain)
