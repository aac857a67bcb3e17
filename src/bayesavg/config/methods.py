"""The predictor methods: one registry entry per method.

Config validation, evaluation, the CLI and the report all read this table;
nothing else lists methods. Adding a method means one ``Method`` entry here
and one sampling function registered under its name in
``bayesavg.predictors.sampling``. This module imports no torch, so validating
params.yaml stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a trajectory's posterior file can provide (``config.Trajectory.provides``)
# and what each item means in an error message.
PROVIDES = {
    "weights": "the final weights (every trajectory)",
    "snapshots": "SWAG snapshots (an sgd trajectory with 'collect')",
    "variational": "a variational posterior (a vi or hwa trajectory)",
    "hwa": "HWA snapshots (an hwa trajectory)",
    "members": "ensemble members (an ensemble trajectory)",
    "member_snapshots": "SWAG snapshots of every ensemble member (an ensemble trajectory with "
    "'collect')",
    "samples": "SGLD samples (an sgld trajectory)",
    "laplace": "a last-layer Laplace posterior (a laplace trajectory)",
}

# Where sharpness is measured (``bayesavg.predictors.sampling.CENTRES``).
CENTRES = ("weights", "snapshot_mean", "hwa_mean", "samples_mean", "members", "member_means")
# Where a variational method's per-weight sigma comes from
# (``bayesavg.predictors.sampling.SIGMAS``).
SIGMAS = ("rho", "hwa_var", "hwa_rho")


@dataclass(frozen=True)
class Method:
    """How one predictor method turns a trajectory's posterior file into predictions.

    ``needs``: what the trajectory must provide (a key of ``PROVIDES``).
    ``default_scale``: the covariance scale when the predictor sets none.
    ``samples``: "one" (a single network), "members" (all stored networks),
    "draws" (``n_samples`` draws) or "member_draws" (``n_samples`` draws per member).
    ``own_buffers``: predict with the file's BatchNorm statistics instead of
    recomputing them for each network (ALGORITHMS §6).
    ``stochastic_dropout``: dropout stays on at prediction time (MC dropout);
    the trajectory must train with a dropout rate above 0.
    ``centre``: where sharpness is measured (one of ``CENTRES``).
    ``label``: what it is, in a phrase, for the report and the CLI help.
    ``baseline``: the method it is compared with in the report, found on the
    trajectory this one's trajectory starts from (HWA continues VI); None:
    compared with the report's overall baseline only.
    ``sigma``: for variational methods, where the per-weight sigma comes from
    (one of ``SIGMAS``); the report shows its distribution relative to the
    sigma the variational run started from.
    ``closed_form``: one pass gives the posterior predictive itself (the Laplace
    probit): Bayesian, though without the samples mutual information needs.
    """

    name: str
    needs: str
    label: str
    default_scale: float = 0.0
    samples: str = "draws"
    own_buffers: bool = False
    stochastic_dropout: bool = False
    centre: str = "weights"
    baseline: str | None = None
    sigma: str | None = None
    closed_form: bool = False

    def __post_init__(self) -> None:
        if self.needs not in PROVIDES:
            raise ValueError(f"method {self.name}: needs {self.needs!r} is not one of {PROVIDES}")
        if self.centre not in CENTRES:
            raise ValueError(f"method {self.name}: centre {self.centre!r} is not one of {CENTRES}")
        if self.sigma is not None and self.sigma not in SIGMAS:
            raise ValueError(f"method {self.name}: sigma {self.sigma!r} is not one of {SIGMAS}")
        if self.samples not in ("one", "members", "draws", "member_draws"):
            raise ValueError(f"method {self.name}: samples {self.samples!r}")

    @property
    def has_scale(self) -> bool:
        """Whether a ``scale`` param changes this method's predictions."""
        return self.default_scale > 0


REGISTRY: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "map",
            needs="weights",
            label="the fine-tuned point estimate",
            samples="one",
            own_buffers=True,
        ),
        Method(
            "swa",
            needs="snapshots",
            label="the SWA mean of the fine-tuning iterates",
            samples="one",
            centre="snapshot_mean",
        ),
        Method(
            "swag_diag",
            needs="snapshots",
            label="SWAG with a diagonal Gaussian",
            default_scale=1.0,
            centre="snapshot_mean",
        ),
        Method(
            "swag",
            needs="snapshots",
            label="SWAG with a low-rank plus diagonal Gaussian",
            default_scale=0.5,
            centre="snapshot_mean",
        ),
        Method("vi", needs="variational", label="the last mean-field VI iterate", sigma="rho"),
        Method(
            "hwa",
            needs="hwa",
            label="HWA, moment-matched mixture of the averaged Gaussians",
            default_scale=0.5,
            centre="hwa_mean",
            baseline="vi",
            sigma="hwa_var",
        ),
        Method(
            "hwa_mf",
            needs="hwa",
            label="HWA with averaged mean-field hyperparameters",
            centre="hwa_mean",
            baseline="vi",
            sigma="hwa_var",
        ),
        Method(
            "hwa_rho",
            needs="hwa",
            label="HWA averaged in rho-space",
            centre="hwa_mean",
            baseline="vi",
            sigma="hwa_rho",
        ),
        Method(
            "mc_dropout",
            needs="weights",
            label="MC dropout: S stochastic passes with dropout on",
            own_buffers=True,
            stochastic_dropout=True,
        ),
        Method(
            "ensemble",
            needs="members",
            label="deep ensemble of M independently pretrained and fine-tuned members",
            samples="members",
            own_buffers=True,
            centre="members",
        ),
        Method(
            "multiswa",
            needs="member_snapshots",
            label="MultiSWA: an ensemble of the members' SWA means",
            samples="members",
            centre="member_means",
        ),
        Method(
            "multiswag",
            needs="member_snapshots",
            label="MultiSWAG: the equal mixture of S SWAG samples from each member",
            default_scale=0.5,
            samples="member_draws",
            centre="member_means",
        ),
        Method(
            "laplace",
            needs="laplace",
            label="last-layer KFAC Laplace, probit (GLM) predictive",
            samples="one",
            closed_form=True,
            own_buffers=True,
        ),
        Method(
            "laplace_mc",
            needs="laplace",
            label="last-layer KFAC Laplace, S draws of the last layer",
            own_buffers=True,
        ),
        Method(
            "sgld",
            needs="samples",
            label="SGLD samples along the chain after burn-in",
            centre="samples_mean",
        ),
    )
}

METHODS = tuple(REGISTRY)


def method(name: str) -> Method:
    """The registry entry of ``name``; a ``KeyError`` names the known methods."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}") from None
