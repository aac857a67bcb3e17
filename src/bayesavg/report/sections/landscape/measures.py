"""The loss landscape's numbers: the line's asymmetry about SGD, ray widths against the
centres' sharpness, the sigma curves' reach; pure over the report inputs, so a test can
plant a landscape and read the verdict back."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ....config.methods import REGISTRY
from ...inputs import LineData, PredictorResult, RayData
from ...sigma_curves import SigmaCurve

# The DSWAG paper's Fig. 6: accuracy "remains almost flat" out to 100 sigma.
PAPER_FLAT_MULTIPLE = 100.0


def line_series(line: LineData, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(t, value) along the line, sorted by t; missing values dropped."""
    pairs = sorted(
        (float(r["t"]), float(r[key])) for r in line.rows if r.get(key) is not None and "t" in r
    )
    if not pairs:
        return np.zeros(0), np.zeros(0)
    t, v = zip(*pairs, strict=True)
    return np.asarray(t), np.asarray(v)


def total_loss(line: LineData) -> tuple[np.ndarray, np.ndarray]:
    """Train loss with the weight-decay term, (t, value)."""
    t, loss = line_series(line, "train_loss")
    t2, wd = line_series(line, "weight_decay_term")
    if len(t2) != len(t) or not np.array_equal(t, t2):
        return np.zeros(0), np.zeros(0)
    return t, loss + wd


@dataclass(frozen=True)
class LineMinimum:
    """Where the train loss is lowest on the line: context for the edge claim, which the
    minimum alone does not decide."""

    t_min: float
    loss_min: float


def line_minimum(line: LineData, key: str = "train_loss") -> LineMinimum | None:
    """The minimum of ``key`` along the line; None without values."""
    t, v = line_series(line, key)
    if len(t) == 0:
        return None
    i = int(np.argmin(v))
    return LineMinimum(float(t[i]), float(v[i]))


# The SWA paper's Fig. 5 picture of SGD at the edge of the basin: over the same |t|, the
# train loss rises at least this many times as much on SGD's far side (t < 0) as towards
# SWA (t > 0). A symmetric bowl around SGD gives 1; noise alone rarely doubles a rise.
ASYMMETRY = 2.0


@dataclass(frozen=True)
class LineAsymmetry:
    """The train loss's rise from t = 0 over the same |t| on both sides of a, and the test
    metric at a (t = 0) and b (t = 1): what the SWA paper's edge picture is made of."""

    ts: tuple[float, ...]
    rise_away: tuple[float, ...]
    rise_towards: tuple[float, ...]
    test_key: str
    test_at_0: float
    test_at_1: float

    @property
    def steeper_away(self) -> int:
        """Symmetric |t| at which the loss rises more away from b than towards it."""
        return sum(a > b for a, b in zip(self.rise_away, self.rise_towards, strict=True))

    @property
    def t_far(self) -> float:
        return self.ts[-1]

    @property
    def ratio(self) -> float:
        """Rise away over rise towards at the farthest symmetric |t|; inf when the loss
        rises away and falls (or stays) towards b, NaN when it does not rise away."""
        away, towards = self.rise_away[-1], self.rise_towards[-1]
        if away <= 0:
            return math.nan
        return away / towards if towards > 0 else math.inf

    @property
    def asymmetric(self) -> bool:
        """Steeper away from b at the farthest |t| by ASYMMETRY and at most symmetric |t|
        (the nearest ones sit in SGD's own minimum, where either side may lead)."""
        return self.ratio >= ASYMMETRY and self.steeper_away > len(self.ts) / 2

    @property
    def test_gain(self) -> float:
        """How much lower the test metric is at b than at a (positive: b is better)."""
        return self.test_at_0 - self.test_at_1


def _value_at(t: np.ndarray, v: np.ndarray, at: float) -> float | None:
    hit = np.flatnonzero(np.isclose(t, at, rtol=0.0, atol=1e-9))
    return float(v[hit[0]]) if len(hit) else None


def line_value(line: LineData, key: str, at: float) -> float | None:
    """``key`` at t = ``at``; None when the line has no such point."""
    return _value_at(*line_series(line, key), at)


def line_asymmetry(
    line: LineData, key: str = "train_loss", test_key: str = "test_nll"
) -> LineAsymmetry | None:
    """The rises at every |t| in (0, 1] the grid has on both sides of t = 0; None without
    t = 0, t = 1 or such a pair."""
    t, v = line_series(line, key)
    tt, tv = line_series(line, test_key)
    at_0, test_0, test_1 = _value_at(t, v, 0.0), _value_at(tt, tv, 0.0), _value_at(tt, tv, 1.0)
    if at_0 is None or test_0 is None or test_1 is None:
        return None
    ts, away, towards = [], [], []
    for s in sorted(float(x) for x in t if 0 < x <= 1 + 1e-9):
        minus = _value_at(t, v, -s)
        plus = _value_at(t, v, s)
        if minus is not None and plus is not None:
            ts.append(s)
            away.append(minus - at_0)
            towards.append(plus - at_0)
    if not ts:
        return None
    return LineAsymmetry(tuple(ts), tuple(away), tuple(towards), test_key, test_0, test_1)


def edge_verdict(a: LineAsymmetry) -> bool:
    """SGD at the edge of the basin, SWA towards its centre: the train loss rises much more
    steeply on SGD's far side than towards SWA, and the test metric is better at SWA. A
    train-loss minimum at SGD is what the paper reports ("SGD achieves better train loss"),
    so it decides nothing by itself."""
    return a.asymmetric and a.test_gain > 0


def ray_grid_end(ray: RayData) -> float:
    return max((float(r["distance"]) for r in ray.rows), default=math.nan)


def ray_widths(ray: RayData) -> list[float]:
    """Widths per direction; a direction whose loss never rose by delta counts as the grid's
    end (a lower bound)."""
    end = ray_grid_end(ray)
    return [end if w is None else float(w) for w in ray.widths]


# A one-sided sign test must reach this for the rays to decide a width claim: with no
# ties, 5 directions all one way (p = 1/32), never 3 (p = 1/8).
SIGN_TEST_P = 0.05


def ray_step(ray: RayData) -> float:
    """The largest spacing of the ray's distance grid: the scan for a width checks only
    these points, so a width is known to one step (an excursion between two points goes
    unseen), however finely the last step is bisected."""
    grid = sorted({float(r["distance"]) for r in ray.rows})
    return max((b - a for a, b in itertools.pairwise(grid)), default=0.0)


def sign_test_p(k: int, n: int) -> float:
    """One-sided sign test: P(at least k of n fair coin flips come up one way)."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n if n else 1.0


@dataclass(frozen=True)
class WidthComparison:
    narrow: str
    wide: str
    mean_narrow: float
    mean_wide: float
    wider: int
    narrower: int
    directions: int
    censored: int
    tolerance: float = 0.0

    @property
    def ties(self) -> int:
        return self.directions - self.wider - self.narrower

    @property
    def p_wider(self) -> float:
        """The sign test of "wider", ties dropped."""
        return sign_test_p(self.wider, self.wider + self.narrower)

    @property
    def p_narrower(self) -> float:
        return sign_test_p(self.narrower, self.wider + self.narrower)

    @property
    def verdict(self) -> bool | None:
        """True: wider in most directions with the sign test below SIGN_TEST_P; False:
        narrower likewise; None: too few directions or they disagree."""
        half = self.directions / 2
        if self.wider > half and self.p_wider < SIGN_TEST_P:
            return True
        if self.narrower > half and self.p_narrower < SIGN_TEST_P:
            return False
        return None


def compare_widths(
    narrow: RayData, wide: RayData, tolerance: float | None = None
) -> WidthComparison | None:
    """``wide``'s widths against ``narrow``'s, direction by direction (the same directions);
    a difference below ``tolerance`` (default: one step of the coarser distance grid) is a
    tie."""
    a, b = ray_widths(narrow), ray_widths(wide)
    n = min(len(a), len(b))
    if n == 0:
        return None
    a, b = a[:n], b[:n]
    tol = max(ray_step(narrow), ray_step(wide)) if tolerance is None else tolerance
    censored = sum(w is None for w in [*narrow.widths[:n], *wide.widths[:n]])
    return WidthComparison(
        narrow.trajectory,
        wide.trajectory,
        float(np.mean(a)),
        float(np.mean(b)),
        sum(y - x >= tol and y > x for x, y in zip(a, b, strict=True)),
        sum(x - y >= tol and x > y for x, y in zip(a, b, strict=True)),
        n,
        censored,
        tol,
    )


SHARPNESS_MEASURES = (("hessian_trace", "tr(H)"), ("sharpness", "SAM sharpness"))
NOISE_SE = 2.0  # a tr(H) difference within this many standard errors is probe noise


def centre_sharpness(predictors: list[PredictorResult], ray: RayData) -> dict[str, float]:
    """tr(H) and SAM sharpness measured at the ray's own centre: by a predictor of the
    ray's trajectory whose method measures sharpness at that centre (swa at the snapshot
    mean, map at the weights), so both describe the network the rays start from; with
    ``<measure>_se``, its standard error, where the predictor has one (tr(H)'s probes)."""
    found = {}
    for key, _ in SHARPNESS_MEASURES:
        at_centre = [
            p
            for p in predictors
            if p.trajectory == ray.trajectory
            and p.method in REGISTRY
            and REGISTRY[p.method].centre == ray.centre
            and 0 < p.metric(key) < math.inf
        ]
        if at_centre:
            found[key] = at_centre[0].metric(key)
            if math.isfinite(se := at_centre[0].metric(f"{key}_se")):
                found[f"{key}_se"] = se
    return found


@dataclass(frozen=True)
class SharpnessCheck:
    """One sharpness measure at both centres of a width comparison, with the standard
    errors of the two values where the measure has them (else 0: taken as exact)."""

    label: str
    narrow: float
    wide: float
    narrow_se: float = 0.0
    wide_se: float = 0.0

    @property
    def noise(self) -> float:
        """The difference that is noise: ``NOISE_SE`` standard errors of it."""
        return NOISE_SE * math.hypot(self.narrow_se, self.wide_se)

    @property
    def wide_flatter(self) -> bool | None:
        """True: the wide centre is flatter (lower); None: equal, or within the noise."""
        if self.wide == self.narrow or abs(self.wide - self.narrow) <= self.noise:
            return None
        return self.wide < self.narrow


def sharpness_checks(narrow: dict[str, float], wide: dict[str, float]) -> list[SharpnessCheck]:
    """The measures both centres have, in SHARPNESS_MEASURES order."""
    return [
        SharpnessCheck(
            label,
            narrow[key],
            wide[key],
            narrow.get(f"{key}_se", 0.0),
            wide.get(f"{key}_se", 0.0),
        )
        for key, label in SHARPNESS_MEASURES
        if key in narrow and key in wide
    ]


def disagreeing(verdict: bool | None, checks: list[SharpnessCheck]) -> list[SharpnessCheck]:
    """The measures that point against a decided ray verdict (wider but sharper, or
    narrower but flatter)."""
    if verdict is None:
        return []
    return [c for c in checks if c.wide_flatter is (not verdict)]


def flat_verdict(
    curve: SigmaCurve, reach: float, claimed: float = PAPER_FLAT_MULTIPLE
) -> bool | None:
    """True: flat out to the claimed m; False: it drops before; None: flat to the grid's
    end, which stops short of the claimed m."""
    if reach >= claimed:
        return True
    if reach < curve.multiples[-1]:
        return False
    return None
