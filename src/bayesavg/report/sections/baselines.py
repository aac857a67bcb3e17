"""The SWAG paper's baselines and MultiSWAG: SWAG against SGD with temperature scaling
and with a last-layer Laplace, and MultiSWAG against the deep ensemble of the same
members, on clean test data and under shift. MultiSWA (the members' SWA means, no
sampling) splits MultiSWAG's gain under shift into what the SWA means give and what the
sampling adds, which is the paper's argument (marginalising within each basin)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..blocks import Heading, Paragraph, Section, claim_bullets
from ..claims import BMA_PAPER, MULTISWAG_PAPER, Claim
from ..formats import interval_number, interval_text
from ..inputs import PredictorResult, ReportInputs
from ..intervals import Interval, resample_counts
from ..uncertainty import Uncertainty

# (candidate, reference) predictor pairs whose NLL the paper compares.
SWAG_BASELINES = (("swag", "map_ts"), ("swag", "laplace"), ("swag", "laplace_mc"))
MULTISWAG = ("multiswag", "ensemble")
MULTISWA = "multiswa"
# A growth under shift: mean, 95% low, high, number of shifts, number of images.
Growth = tuple[float, float, float, int, int]
CLEAN = "rotate_0"


def _nll_claim(
    inputs: ReportInputs, unc: Uncertainty, cand: str, ref: str, paper: str, statement: str
) -> Claim | None:
    """Holds when the paired NLL interval of cand - ref lies below 0, fails above it."""
    names = {p.name for p in inputs.predictors}
    if cand not in names or ref not in names:
        return None
    comp = unc.comparison(ref, cand)
    if comp is None:
        return Claim(paper, statement, None, "no per-point predictions", "n/a (no predictions)")
    iv: Interval = comp.intervals["nll"]
    holds = {"better": True, "worse": False}.get(iv.verdict())
    evidence = f"{cand} - {ref} on the test split: {interval_number(iv)}"
    k = comp.nll_carried_by
    if holds is not None and k is not None:
        evidence += f"; it rests on {k} test image{'s' if k != 1 else ''} (without them: gone)"
    evidence += "."
    return Claim(paper, statement, holds, evidence, interval_number(iv))


def _shift_nll(p: PredictorResult, name: str) -> torch.Tensor | None:
    pred = p.predictions
    if pred is None or pred.shift_y is None or name not in pred.shift_log_probs:
        return None
    logp = torch.from_numpy(np.asarray(pred.shift_log_probs[name])).double()
    y = torch.from_numpy(np.asarray(pred.shift_y)).long()
    return -logp.gather(1, y[:, None])[:, 0]


def shift_growth(
    ref: PredictorResult, cand: PredictorResult, boot: tuple[int, int]
) -> Growth | None:
    """Per shifted image, NLL(ref) - NLL(cand) averaged over every corruption and
    rotation, minus the same on the unshifted images: its mean and percentile bootstrap
    interval over the images (the same subset is shifted every way); None without
    per-point shift predictions."""
    pred = cand.predictions
    if pred is None or CLEAN not in pred.shift_log_probs:
        return None
    shifts = sorted(n for n in pred.shift_log_probs if n != CLEAN)
    gaps = []
    for name in [CLEAN, *shifts]:
        r, c = _shift_nll(ref, name), _shift_nll(cand, name)
        if r is None or c is None or r.shape != c.shape:
            return None
        gaps.append(r - c)
    if not shifts:
        return None
    growth = torch.stack(gaps[1:]).mean(0) - gaps[0]
    counts = resample_counts(growth.shape[0], *boot)
    means = counts @ growth / growth.shape[0]
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return float(growth.mean()), low, high, len(shifts), growth.shape[0]


def _growth_text(found: Growth) -> str:
    return interval_text(*found[:3])


def _verdict(found: Growth) -> bool | None:
    return True if found[1] > 0 else False if found[2] < 0 else None


def _growth_claim(
    statement: str,
    ref: PredictorResult,
    cand: PredictorResult,
    unc: Uncertainty,
    meaning: str,
    more: Callable[[Growth], str],
) -> Claim:
    """A claim that ``cand``'s NLL advantage over ``ref`` grows under shift, decided by
    the paired growth; ``more`` adds to the evidence from the growth found."""
    found = shift_growth(ref, cand, (unc.settings.resamples, unc.settings.seed))
    if found is None:
        why = "no per-point shift predictions"
        return Claim(MULTISWAG_PAPER, statement, None, why, "n/a (no shift predictions)")
    _, _, _, n_shifts, n_points = found
    number = f"gap growth {_growth_text(found)}"
    evidence = (
        f"NLL({ref.name}) - NLL({cand.name}) averaged over {n_shifts} shifts minus the same "
        f"on the unshifted images, paired over {n_points} images: {number} ({meaning})."
    )
    return Claim(MULTISWAG_PAPER, statement, _verdict(found), evidence + more(found), number)


def _shift_claim(inputs: ReportInputs, unc: Uncertainty) -> Claim | None:
    """The paper's comparison as stated (against the ensemble); its evidence says how much
    of the growth MultiSWA already shows without sampling."""
    by_name = {p.name: p for p in inputs.predictors}
    cand, ref = (by_name.get(n) for n in MULTISWAG)
    if cand is None or ref is None:
        return None
    multiswa = by_name.get(MULTISWA)
    boot = (unc.settings.resamples, unc.settings.seed)
    without = shift_growth(ref, multiswa, boot) if multiswa is not None else None

    def share(found: Growth) -> str:
        if without is None:
            return (
                " No multiswa with shift predictions: how much of it comes without sampling "
                "is unknown."
            )
        part = f" ({100 * without[0] / found[0]:.0f}% of it)" if found[0] > 0 else ""
        return (
            f" Of it, {_growth_text(without)}{part} comes without sampling (multiswa, the "
            "members' SWA means, against the ensemble); see the sampling's own claim."
        )

    statement = "MultiSWAG's NLL advantage over the deep ensemble grows under shift"
    return _growth_claim(statement, ref, cand, unc, "positive: the advantage grows", share)


def _sampling_claim(inputs: ReportInputs, unc: Uncertainty) -> Claim | None:
    """MultiSWAG against MultiSWA (the same members' SWA means): the growth the sampling
    itself adds, which the comparison with the ensemble confounds with SWA averaging."""
    by_name = {p.name: p for p in inputs.predictors}
    cand, ref = by_name.get(MULTISWAG[0]), by_name.get(MULTISWA)
    if cand is None or ref is None:
        return None
    ensemble = by_name.get(MULTISWAG[1])
    boot = (unc.settings.resamples, unc.settings.seed)
    total = shift_growth(ensemble, cand, boot) if ensemble is not None else None
    without = shift_growth(ensemble, ref, boot) if ensemble is not None else None

    def against_ensemble(found: Growth) -> str:
        if total is None or without is None:
            return ""
        return (
            f" Against the ensemble: multiswag {_growth_text(total)}, of which multiswa "
            f"{_growth_text(without)} without any sampling."
        )

    statement = (
        "MultiSWAG's sampling adds to its NLL advantage under shift beyond MultiSWA's "
        "(the same members' SWA means, no sampling)"
    )
    meaning = "positive: sampling within each member's SWAG posterior adds to the growth"
    return _growth_claim(statement, ref, cand, unc, meaning, against_ensemble)


def claims(inputs: ReportInputs, unc: Uncertainty) -> list[Claim]:
    """The baselines' claims that this run's predictors can check."""
    found = [
        _nll_claim(
            inputs,
            unc,
            *MULTISWAG,
            MULTISWAG_PAPER,
            "MultiSWAG beats a deep ensemble of the same members on NLL",
        ),
        _shift_claim(inputs, unc),
        _sampling_claim(inputs, unc),
        *(
            _nll_claim(inputs, unc, cand, ref, BMA_PAPER, f"{cand} beats {ref} on NLL")
            for cand, ref in SWAG_BASELINES
        ),
    ]
    return [c for c in found if c is not None]


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    found = claims(inputs, unc)
    if not found:
        return Section([])
    note = (
        "Temperature scaling (map_ts, swa_ts: one T fitted on the validation split), the "
        "last-layer KFAC Laplace at the sgd weights (laplace: probit predictive; laplace_mc: "
        "S draws of the last layer; prior precision by marginal likelihood) and MultiSWAG "
        "(S SWAG draws from each ensemble member's own trajectory) are the SWAG papers' "
        "baselines; MultiSWA (the members' SWA means) is MultiSWAG without its sampling, so "
        "MultiSWAG against it is the sampling's own share. Differences are paired "
        "bootstraps over the test points; 'holds' only where the interval excludes 0."
    )
    return Section(
        [
            Heading(2, "Baselines: temperature scaling, Laplace, MultiSWAG"),
            Paragraph(note),
            claim_bullets(found),
        ],
        found,
    )
