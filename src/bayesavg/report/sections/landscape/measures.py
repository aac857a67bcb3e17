"""The loss landscape's numbers: minima along lines, ray widths, the sigma curves' reach;
pure over the report inputs, so a test can plant a landscape and read the verdict back."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...inputs import LineData, RayData
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
    """Where the train loss is lowest on the line and whether t = 0 lies on a slope."""

    t_min: float
    loss_min: float
    loss_at_0: float
    loss_next: float
    t_next: float
    t_last: float = math.inf

    @property
    def on_slope(self) -> bool:
        """The loss falls from t = 0 towards the next t on the b side."""
        return self.loss_next < self.loss_at_0


def line_minimum(line: LineData, key: str = "train_loss") -> LineMinimum | None:
    """The minimum of ``key`` along the line; None without t = 0 and a later t."""
    t, v = line_series(line, key)
    if len(t) == 0 or 0.0 not in t:
        return None
    i0 = int(np.flatnonzero(t == 0.0)[0])
    if i0 + 1 >= len(t):
        return None
    i = int(np.argmin(v))
    return LineMinimum(
        float(t[i]), float(v[i]), float(v[i0]), float(v[i0 + 1]), float(t[i0 + 1]), float(t[-1])
    )


def edge_verdict(m: LineMinimum) -> bool | None:
    """SGD at the edge of the basin, SWA near its centre: the minimum on the SWA side
    (t > 0.5) and t = 0 on a slope. A minimum at the grid's last t (beyond SWA) leaves it
    undecided: the loss still falls past SWA, so SWA is no centre along this line either."""
    if m.t_min > 0.5 and m.on_slope:
        return None if m.t_min >= m.t_last else True
    return False


def ray_grid_end(ray: RayData) -> float:
    return max((float(r["distance"]) for r in ray.rows), default=math.nan)


def ray_widths(ray: RayData) -> list[float]:
    """Widths per direction; a direction whose loss never rose by delta counts as the grid's
    end (a lower bound)."""
    end = ray_grid_end(ray)
    return [end if w is None else float(w) for w in ray.widths]


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

    @property
    def verdict(self) -> bool | None:
        """True: wider on average and in most directions; False: not wider on average
        and narrower in most; None: the directions disagree."""
        half = self.directions / 2
        if self.mean_wide > self.mean_narrow and self.wider > half:
            return True
        if self.mean_wide <= self.mean_narrow and self.narrower > half:
            return False
        return None


def compare_widths(narrow: RayData, wide: RayData) -> WidthComparison | None:
    """``wide``'s widths against ``narrow``'s, direction by direction (the same directions)."""
    a, b = ray_widths(narrow), ray_widths(wide)
    n = min(len(a), len(b))
    if n == 0:
        return None
    a, b = a[:n], b[:n]
    censored = sum(w is None for w in [*narrow.widths[:n], *wide.widths[:n]])
    return WidthComparison(
        narrow.trajectory,
        wide.trajectory,
        float(np.mean(a)),
        float(np.mean(b)),
        sum(y > x for x, y in zip(a, b, strict=True)),
        sum(y < x for x, y in zip(a, b, strict=True)),
        n,
        censored,
    )


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
