"""Typed params.yaml with validation before any work starts.

pydantic checks types, ranges and unknown keys (strict: ``"0.1"`` is not a
float, ``1`` is not a bool); cross-field rules are model validators. Any
problem becomes a ``UserError`` naming the key and what is allowed.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    model_validator,
)

from .methods import METHODS, PROVIDES, REGISTRY
from .runtime.errors import UserError

DATASETS = ("mnist5k", "mnist", "fashion_mnist", "cifar10", "cifar100")
MODEL_NAMES = ("mlp", "lenet5", "vgg16", "vgg16_bn", "preresnet20", "preresnet", "wideresnet28x10")
DEFAULT_DROPOUT = {"vgg16": 0.5, "vgg16_bn": 0.5}  # the models' own default rate; 0 elsewhere
_NAME = r"^[a-z][a-z0-9_]*$"

PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, lt=1)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class AugmentParams(_Section):
    """Per-epoch augmentation of the training split on the device (``bayesavg.training.augment``):
    torchvision ``RandomCrop(H, padding=crop_padding)`` with zero padding, then a random
    horizontal flip. Off for the MNIST default (digits are not mirror-symmetric)."""

    crop_padding: NonNegInt = 0
    flip: bool = False


class DataParams(_Section):
    dataset: str = "mnist5k"
    test_fraction: Fraction = 0.2
    val_fraction: Fraction = 0.1
    raw_dir: str = "data/raw"
    augment: AugmentParams = AugmentParams()

    @model_validator(mode="after")
    def _check(self) -> DataParams:
        if self.dataset not in DATASETS and not self.dataset.startswith("imagefolder:"):
            raise ValueError(
                f"dataset: unknown {self.dataset!r}; allowed: {', '.join(DATASETS)}, "
                "imagefolder:<DIR>"
            )
        if self.test_fraction + self.val_fraction >= 0.9:
            raise ValueError("test_fraction + val_fraction must leave at least 10% for training")
        return self


DropoutRate = Annotated[float, Field(ge=0, lt=1)]


class ModelParams(_Section):
    name: Literal[
        "mlp", "lenet5", "vgg16", "vgg16_bn", "preresnet20", "preresnet", "wideresnet28x10"
    ] = "lenet5"
    hidden: list[PosInt] = Field(default_factory=lambda: [512, 256])
    dropout: DropoutRate | None = None  # None: the model's own (0.5 for vgg16[_bn], else 0)
    batch_norm: bool = False  # mlp only: BatchNorm after each hidden layer
    depth: PosInt | None = None  # preresnet only (default 20): 6n+2 below 44, else 9n+2

    @model_validator(mode="after")
    def _check(self) -> ModelParams:
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

    def kwargs(self) -> dict[str, Any]:
        """Constructor arguments beyond shape and classes, per model."""
        out: dict[str, Any] = {"hidden": list(self.hidden)} if self.name == "mlp" else {}
        if self.batch_norm:
            out["batch_norm"] = True
        if self.depth is not None:
            out["depth"] = self.depth
        if self.dropout is not None:
            out["dropout"] = self.dropout
        return out

    def effective_dropout(self) -> float:
        if self.dropout is not None:
            return self.dropout
        return DEFAULT_DROPOUT.get(self.name, 0.0)


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


class PretrainParams(Optim):
    """Pretraining; ``members`` > 1 also pretrains networks 2..M from their own seeds,
    stored in the same posterior file, for ensemble trajectories to fine-tune."""

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


class Trajectory(Optim):
    """One fine-tuning run from ``start`` (``pretrain`` or another trajectory).

    kind sgd: SGD (SWAG snapshots with ``collect``); vi: SVI on (mu, rho) from
    the start's weights; hwa: SVI continued from a vi trajectory, collecting
    (mu, sigma) snapshots; ensemble: the first ``members`` pretrained networks
    (``pretrain.members``), each fine-tuned like an sgd trajectory; sgld: Langevin dynamics
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
        if self.kind == "ensemble" and self.collect is not None:
            raise ValueError("collect: ensemble members keep their final weights, not snapshots")
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


def _trajectory_tag(value: Any) -> str:
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return "dswag" if kind == "dswag" else "trajectory"


AnyTrajectory = Annotated[
    Annotated[Trajectory, Tag("trajectory")] | Annotated[DSWAGTrajectory, Tag("dswag")],
    Discriminator(_trajectory_tag),
]
STARTS = ("pretrain", "init")  # the stages a trajectory can start from besides trajectories


class Predictor(_Section):
    """A predictor (``evaluate.predictors.<trajectory>.<name>``): a method over the posterior
    of the trajectory it is listed under, which its ``trajectory`` names."""

    method: Literal[METHODS]  # type: ignore[valid-type]
    scale: NonNegFloat | None = None
    _trajectory: str = PrivateAttr(default="")

    @property
    def trajectory(self) -> str:
        return self._trajectory

    def effective_scale(self) -> float:
        """The method's default scale (``methods.REGISTRY``) unless set."""
        if self.scale is not None:
            return self.scale
        return REGISTRY[self.method].default_scale


_SIGMA_MULTIPLES = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)


class SharpnessParams(_Section):
    """Sharpness at each predictor's centre, on a fixed subset of the training data."""

    rho: PosFloat = 0.05
    probes: PosInt = 3
    n_points: PosInt = 1000


class PlaneParams(_Section):
    """The loss surface on the plane of the first two principal components of a
    trajectory's snapshots (the HWA paper's figure), for each trajectory listed."""

    trajectories: list[Annotated[str, Field(pattern=_NAME)]] = Field(default_factory=list)
    grid: Annotated[int, Field(ge=3, le=101)] = 21
    margin: NonNegFloat = 0.25
    n_points: PosInt = 1000


class DSWAGSweep(_Section):
    """The DSWAG paper's figures 5-7: trajectory ``trajectory`` (``kind: dswag``) run again
    for each number of clients in ``workers``, from the same start, with phase 1 capped
    at ``rounds`` and stopped at ``target_accuracy`` (train split); the test accuracy at
    theta_bar + m sigma * z (``sigma_draws`` seeded z per multiple m)."""

    trajectory: Annotated[str, Field(pattern=_NAME)] = "dswag"
    workers: list[PosInt] = Field(default_factory=list)
    rounds: PosInt = 40
    target_accuracy: Annotated[float, Field(gt=0, le=1)] = 0.95
    sigma_multiples: list[NonNegFloat] = Field(default_factory=lambda: list(_SIGMA_MULTIPLES))
    sigma_draws: PosInt = 5

    @model_validator(mode="after")
    def _check(self) -> DSWAGSweep:
        if len(set(self.workers)) != len(self.workers):
            raise ValueError("workers: each number of clients once (one DVC stage each)")
        if not self.sigma_multiples:
            raise ValueError("sigma_multiples: at least one multiple")
        return self


class ShiftParams(_Section):
    """Dataset shift: rotations and MNIST-C-style corruptions of a fixed seeded subset of
    the test split, predicted in the same forward pass as the clean split."""

    angles: list[Annotated[float, Field(ge=0, le=360)]] = Field(
        default_factory=lambda: [float(a) for a in range(0, 181, 15)]
    )
    corruptions: list[str] = Field(
        default_factory=lambda: [
            "shot_noise",
            "impulse_noise",
            "translate",
            "shear",
            "scale",
            "brightness",
            "stripe",
        ]
    )
    severity: Annotated[int, Field(ge=1, le=5)] | None = None  # None: each corruption's own
    n_points: PosInt = 200  # the names are checked against bayesavg.shift by stage validate


class OODParams(_Section):
    """Out-of-distribution sets scored against the clean test split (OOD the positive class):
    a packaged set (animal_mnist) or any dataset spec's test split (fashion_mnist,
    imagefolder:<DIR>); ``n_points`` images of each, a fixed seeded subset."""

    sets: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=lambda: ["animal_mnist"]
    )
    n_points: PosInt = 1000

    @model_validator(mode="after")
    def _check(self) -> OODParams:
        if len(set(self.sets)) != len(self.sets):
            raise ValueError("sets: each OOD set once")
        return self


class LineSpec(_Section):
    """A line w(t) = w_a + t (w_b - w_a) between two trajectories' centres."""

    a: Annotated[str, Field(pattern=_NAME)]
    b: Annotated[str, Field(pattern=_NAME)]


class Grid(_Section):
    start: float
    stop: float
    points: Annotated[int, Field(ge=2)]

    @model_validator(mode="after")
    def _check(self) -> Grid:
        if not self.stop > self.start:
            raise ValueError("stop: must exceed start")
        return self

    def values(self) -> list[float]:
        step = (self.stop - self.start) / (self.points - 1)
        return [round(self.start + i * step, 12) for i in range(self.points)]


class RaysParams(_Section):
    """Seeded random rays w(s) = w_0 + s d / |d| from each centre, the same d for all."""

    centres: list[Annotated[str, Field(pattern=_NAME)]] = Field(default_factory=list)
    directions: PosInt = 3
    distances: Grid = Grid(start=0.0, stop=20.0, points=11)
    filter_normalise: bool = False
    delta: PosFloat = 0.1  # width: distance where the train loss first rises by delta

    @model_validator(mode="after")
    def _check(self) -> RaysParams:
        if self.distances.start != 0:
            raise ValueError("distances.start: rays start at the centre (0)")
        return self


class SwagDirectionsParams(_Section):
    """For each SWAG-kind trajectory: the loss along its top principal directions (in
    multiples of the standard deviation along each) and the test accuracy at
    theta_bar + m sigma * z (``sigma_draws`` seeded z per multiple m)."""

    trajectories: list[Annotated[str, Field(pattern=_NAME)]] = Field(default_factory=list)
    directions: PosInt = 2
    offsets: Grid = Grid(start=-10.0, stop=10.0, points=11)
    sigma_multiples: list[NonNegFloat] = Field(default_factory=lambda: list(_SIGMA_MULTIPLES))
    sigma_draws: PosInt = 5


class LandscapeParams(_Section):
    """Loss-landscape geometry (ALGORITHMS §6: BatchNorm recomputed at every point): train
    loss on ``n_points`` fixed training images, test error and NLL on the test split."""

    n_points: PosInt = 1000
    t: Grid = Grid(start=-1.0, stop=2.0, points=31)
    lines: dict[str, LineSpec] = Field(default_factory=dict)
    rays: RaysParams = RaysParams()
    swag: SwagDirectionsParams = SwagDirectionsParams()

    @model_validator(mode="after")
    def _check(self) -> LandscapeParams:
        for name in self.lines:
            if not re.fullmatch(_NAME, name):
                raise ValueError(f"lines.{name}: line names are lower-case identifiers")
        return self


class EvaluateParams(_Section):
    n_samples: PosInt = 30
    sharpness: SharpnessParams = SharpnessParams()
    plane: PlaneParams = PlaneParams()
    dswag_sweep: DSWAGSweep = DSWAGSweep()
    shift: ShiftParams = ShiftParams()
    ood: OODParams = OODParams()
    landscape: LandscapeParams = LandscapeParams()
    batch_size: PosInt = 1000
    bn_update_fraction: Annotated[float, Field(gt=0, le=1)] = 1.0
    ece_bins: Annotated[int, Field(ge=2)] = 20
    # by trajectory: stage evaluate@<trajectory> evaluates the predictors listed under it
    predictors: dict[str, dict[str, Predictor]]

    @model_validator(mode="before")
    @classmethod
    def _grouped(cls, raw: Any) -> Any:
        """The flat layout of earlier versions (``predictors.<name>: {trajectory, method}``)
        gets an error that shows the grouped one."""
        found = raw.get("predictors") if isinstance(raw, dict) else None
        if not isinstance(found, dict):
            return raw
        for name, entry in found.items():
            if isinstance(entry, dict) and "method" in entry:
                where = entry.get("trajectory", "<trajectory>")
                raise ValueError(
                    f"predictors.{name}: predictors are listed under their trajectory: "
                    f"evaluate.predictors.{where}.{name}: {{method: {entry['method']}}}"
                )
        return raw

    @model_validator(mode="after")
    def _bind(self) -> EvaluateParams:
        """Tell each predictor its trajectory; predictor names are unique across them."""
        seen: dict[str, str] = {}
        for trajectory, group in self.predictors.items():
            if not group:
                raise ValueError(
                    f"predictors.{trajectory}: no predictors; list one or remove the entry"
                )
            for name, pred in group.items():
                if name in seen:
                    raise ValueError(
                        f"predictors.{trajectory}.{name}: {name!r} is also listed under "
                        f"{seen[name]}; predictor names are unique"
                    )
                seen[name] = trajectory
                pred._trajectory = trajectory
        return self

    @property
    def by_name(self) -> dict[str, Predictor]:
        """Every predictor by its name, in the order params.yaml lists them."""
        return {name: pred for group in self.predictors.values() for name, pred in group.items()}


class CheckpointParams(_Section):
    """How often pretraining and fine-tuning stages save a checkpoint to resume from.

    Not a DVC param of any stage: it never changes a result, so changing it
    reruns nothing.
    """

    every: NonNegInt = 1  # epochs between checkpoints; 0 turns them off


class TrackingParams(_Section):
    experiment: Annotated[str, Field(min_length=1)] = "bayesavg"


class BootstrapParams(_Section):
    """Paired bootstrap over test points for every comparison in the report."""

    resamples: Annotated[int, Field(ge=100)] = 2000
    seed: NonNegInt = 0


class ReportParams(_Section):
    title: Annotated[str, Field(min_length=1)] = "bayesavg report"
    notes: str = ""
    bootstrap: BootstrapParams = BootstrapParams()


class Params(_Section):
    seed: NonNegInt = 0
    device: str = "auto"
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    channels_last: Literal["auto"] | bool = "auto"
    data: DataParams = DataParams()
    model: ModelParams = ModelParams()
    pretrain: PretrainParams = PretrainParams()
    finetune: dict[str, AnyTrajectory]
    evaluate: EvaluateParams
    checkpoint: CheckpointParams = CheckpointParams()
    tracking: TrackingParams = TrackingParams()
    report: ReportParams = ReportParams()

    @model_validator(mode="after")
    def _check(self) -> Params:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device: {self.device!r} is not one of auto, cpu, cuda, cuda:N")
        if self.precision == "fp16" and self.device == "cpu":
            raise ValueError("precision: fp16 needs a CUDA device; use bf16 or fp32 on the CPU")
        for name, traj in self.finetune.items():
            if not re.fullmatch(_NAME, name):
                raise ValueError(f"finetune.{name}: trajectory names are lower-case identifiers")
            if name in STARTS:
                raise ValueError(f"finetune.{name}: the name {name!r} is a stage's, not free")
            if getattr(traj, "members", None) is not None and traj.members > self.pretrain.members:
                raise ValueError(
                    f"finetune.{name}.members: {traj.members} members need pretrain.members "
                    f">= {traj.members} (it is {self.pretrain.members})"
                )
            if traj.start not in STARTS:
                origin = self.finetune.get(traj.start)
                if origin is None or traj.start == name:
                    raise ValueError(
                        f"finetune.{name}.start: {traj.start!r} is not pretrain, init or "
                        "another trajectory"
                    )
                if origin.start not in STARTS:
                    raise ValueError(
                        f"finetune.{name}.start: {traj.start} must itself start from pretrain "
                        "or init"
                    )
                if traj.kind == "hwa" and origin.kind != "vi":
                    raise ValueError(f"finetune.{name}.start: hwa continues a vi trajectory")
        for name in self.evaluate.plane.trajectories:
            traj = self.finetune.get(name)
            if traj is None or not traj.provides() & {"snapshots", "hwa"}:
                raise ValueError(
                    f"evaluate.plane.trajectories: {name!r} is not a finetune trajectory that "
                    "collects snapshots"
                )
        sweep = self.evaluate.dswag_sweep
        if sweep.workers and not isinstance(self.finetune.get(sweep.trajectory), DSWAGTrajectory):
            raise ValueError(
                f"evaluate.dswag_sweep.trajectory: {sweep.trajectory!r} is not a finetune "
                "trajectory of kind dswag (or set workers: [])"
            )
        if sweep.workers and f"{sweep.trajectory}_sweep" in self.finetune:
            raise ValueError(
                f"finetune.{sweep.trajectory}_sweep: the name is the worker sweep's "
                f"(models/{sweep.trajectory}_sweep); rename the trajectory"
            )
        if sweep.workers and self.finetune[sweep.trajectory].start != "init":
            raise ValueError(
                f"evaluate.dswag_sweep.trajectory: {sweep.trajectory} must start from init "
                "(the sweep trains every W from the same fresh network, as the paper)"
            )
        for trajectory in self.evaluate.predictors:
            if trajectory not in self.finetune:
                raise ValueError(
                    f"evaluate.predictors.{trajectory}: {trajectory!r} is not a finetune "
                    f"trajectory ({', '.join(self.finetune)})"
                )
        for name, pred in self.evaluate.by_name.items():
            key = f"evaluate.predictors.{pred.trajectory}.{name}"
            if not re.fullmatch(_NAME, name):
                raise ValueError(f"{key}: predictor names are lower-case identifiers")
            traj = self.finetune[pred.trajectory]
            method = REGISTRY[pred.method]
            if method.stochastic_dropout and self.dropout_of(pred.trajectory) == 0:
                raise ValueError(
                    f"{key}.method: {pred.method} needs dropout; set finetune.{pred.trajectory}"
                    ".dropout (or model.dropout) above 0"
                )
            if method.needs not in traj.provides():
                raise ValueError(
                    f"{key}.method: {pred.method} needs {PROVIDES[method.needs]}, but finetune."
                    f"{pred.trajectory} is kind {traj.kind}"
                    + ("" if traj.collect is not None else " with no 'collect' section")
                )
            if pred.scale is not None and not method.has_scale:
                raise ValueError(
                    f"{key}.scale: {pred.method} has no covariance scale; remove the key"
                )
            if isinstance(traj, DSWAGTrajectory):
                if pred.method == "swag" and traj.snapshots() < 2:
                    raise ValueError(
                        f"finetune.{pred.trajectory}.phase2: {key} needs >= 2 snapshots; "
                        "raise snapshots_per_client or client_fraction"
                    )
                continue
            per_epoch = traj.collect is not None and not traj.collect.every
            few = traj.collect is not None and traj.epochs - traj.collect.start_epoch < 2
            if pred.method == "swag" and per_epoch and traj.schedule.kind != "cyclic" and few:
                raise ValueError(
                    f"finetune.{pred.trajectory}.collect.start_epoch: {key} needs >= 2 "
                    "snapshots; collect from an earlier epoch or set collect.every"
                )
        self._check_landscape()
        return self

    def _check_landscape(self) -> None:
        """Every landscape entry names a trajectory with a centre (an ensemble has none)."""
        land = self.evaluate.landscape
        named = [
            *(
                (f"evaluate.landscape.lines.{n}.{end}", getattr(spec, end))
                for n, spec in land.lines.items()
                for end in ("a", "b")
            ),
            *(("evaluate.landscape.rays.centres", t) for t in land.rays.centres),
        ]
        for key, name in named:
            traj = self.finetune.get(name)
            if traj is None or "members" in traj.provides():
                raise ValueError(
                    f"{key}: {name!r} is not a finetune trajectory with one centre "
                    "(an ensemble has none)"
                )
        for name in land.swag.trajectories:
            traj = self.finetune.get(name)
            if traj is None or "snapshots" not in traj.provides():
                raise ValueError(
                    f"evaluate.landscape.swag.trajectories: {name!r} is not a finetune "
                    "trajectory that collects SWAG snapshots"
                )
            if isinstance(traj, DSWAGTrajectory) and traj.snapshots() < 2:
                raise ValueError(
                    f"evaluate.landscape.swag.trajectories: {name!r} has {traj.snapshots()} "
                    "snapshot; principal directions need >= 2"
                )

    def dropout_of(self, trajectory: str) -> float:
        """The dropout rate a trajectory trains with: its own, its start's, or the model's."""
        traj = self.finetune[trajectory]
        if traj.dropout is not None:
            return traj.dropout
        if traj.start not in STARTS:
            return self.dropout_of(traj.start)
        return self.model.effective_dropout()


_TAGS = ("trajectory", "dswag")  # the trajectory union's tags: not keys of params.yaml


def _location(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a params.yaml key (validator names and union tags dropped)."""
    parts = [str(p) for p in loc]
    kept = [p for i, p in enumerate(parts) if not p.startswith("function-")]
    if len(kept) > 2 and kept[0] == "finetune" and kept[2] in _TAGS:
        del kept[2]
    return ".".join(kept)


def _format_error(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = _location(first["loc"])
    if first["type"] == "extra_forbidden":
        return f"params.yaml: unknown key {loc!r}; remove it or fix its spelling"
    if first["type"] == "missing":
        return f"params.yaml: missing key {loc!r}"
    msg = first["msg"].removeprefix("Value error, ")
    named = re.match(r"^([\w.]+): (.*)$", msg)
    if named:
        loc, msg = ".".join(filter(None, [loc, named[1]])), named[2]
    got = first.get("input")
    shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
    return f"params.yaml: {loc}: {msg}{shown}"


def parse_params(raw: Any) -> Params:
    """Validate a params mapping; raise ``UserError`` with one line on the first problem."""
    if not isinstance(raw, dict):
        raise UserError("params.yaml: the top level must be a mapping of sections")
    try:
        params = Params.model_validate(raw)
    except ValidationError as err:
        raise UserError(_format_error(err)) from None
    _check_finite(raw, "")
    return params


def _check_finite(node: Any, path: str) -> None:
    if isinstance(node, float) and not math.isfinite(node):
        raise UserError(f"params.yaml: {path}: must be a finite number (got {node})")
    if isinstance(node, dict):
        for k, v in node.items():
            _check_finite(v, f"{path}.{k}" if path else str(k))


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``params.yaml``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    return parse_params(raw)
