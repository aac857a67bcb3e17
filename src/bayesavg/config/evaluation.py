"""Section `evaluate`: predictors by trajectory, and the analyses that read them."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from .base import _NAME, NonNegFloat, PosFloat, PosInt, _Section
from .methods import METHODS, REGISTRY


class Predictor(_Section):
    """A predictor (``evaluate.predictors.<trajectory>.<name>``): a method over the posterior
    of the trajectory it is listed under, which its ``trajectory`` names."""

    method: Literal[METHODS]  # type: ignore[valid-type]
    scale: NonNegFloat | None = None
    # "fit": temperature scaling, T fitted on the validation split
    # (``bayesavg.predictors.calibration``).
    temperature: Literal["fit"] | None = None
    # S for this predictor (None: evaluate.n_samples); MultiSWAG draws S from each member.
    n_samples: PosInt | None = None
    _trajectory: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _one_network(self) -> Predictor:
        """Each sampled network is tempered, which is temperature scaling of the predictive
        only when there is one network."""
        if self.temperature is not None and REGISTRY[self.method].samples != "one":
            one = [name for name, method in REGISTRY.items() if method.samples == "one"]
            raise ValueError(
                f"temperature scaling tempers one network's predictive; method "
                f"{self.method} averages several networks (use it with {', '.join(one)})"
            )
        return self

    @property
    def trajectory(self) -> str:
        return self._trajectory

    def samples_or(self, default: int) -> int:
        """This predictor's S, else ``default`` (``evaluate.n_samples``)."""
        return self.n_samples if self.n_samples is not None else default

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
    # images per forward and (double) backward; None: evaluate.batch_size. One batch's
    # graph is held twice over (Hessian-vector products), about 80 MiB an image for a
    # ResNet-50 at 224 x 224 once: there, a training-sized batch
    batch_size: PosInt | None = None


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
            raise ValueError("workers: each number of clients once (one run of the sweep each)")
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
    n_points: PosInt = 200  # the names are checked against bayesavg.data.shift by stage validate
    # CIFAR-10-C (RGB images only): corruption names of bayesavg.data.cifar_c, or the groups
    # all (19) and standard (15), each at every severity listed; the official arrays are
    # used where data/raw holds them (cifar10, cifar100), the corruptions generated if not.
    cifar_c: list[str] = Field(default_factory=list)
    cifar_c_severities: list[Annotated[int, Field(ge=1, le=5)]] = Field(
        default_factory=lambda: [1, 2, 3, 4, 5]
    )


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
