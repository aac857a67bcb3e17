"""The report over seeds and the baselines section: mean ± std against numpy, claims
decided in each seed's paired test, MultiSWAG against the ensemble under shift."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bayesavg.report import Predictions, PredictorResult, ReportInputs, SeedRun, write_report
from bayesavg.report.sections import baselines, seeds
from bayesavg.report.uncertainty import compute

N, C = 400, 10
NAMES = ("map", "ensemble", "multiswag", "swag")


def _log_probs(rng: np.random.Generator, y: np.ndarray, confidence: float) -> np.ndarray:
    """Noisy predictions whose true-class probability is about ``confidence``."""
    logits = rng.normal(0.0, 1.0, (N, C))
    logits[np.arange(N), y] += confidence
    logits -= logits.max(1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(1, keepdims=True))


def _metrics(logp: np.ndarray, y: np.ndarray) -> dict[str, float]:
    nll = float(-logp[np.arange(N), y].mean())
    accuracy = float((logp.argmax(1) == y).mean())
    return {"accuracy": accuracy, "nll": nll, "ece": 0.01, "brier": 0.1, "n": float(N)}


def _inputs(strength: dict[int, dict[str, float]], shift_gain: float = 0.0) -> ReportInputs:
    """Predictors at seed 0 (their predictions) and seeds 1.. (SeedRuns): ``strength``
    maps seed -> predictor -> how strongly it favours the true class."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, C, N)
    runs, predictors = [], []
    for seed, by_name in strength.items():
        found = {name: _log_probs(rng, y, by_name[name]) for name in NAMES}
        metrics = {name: _metrics(lp, y) for name, lp in found.items()}
        if seed == 0:
            runs.append(SeedRun(0, metrics))
            for name, lp in found.items():
                shifted = {"rotate_0": lp}
                boost = shift_gain if name == "multiswag" else 0.0
                shifted["shot_noise"] = _log_probs(rng, y, by_name[name] - 2.0 + boost)
                pred = Predictions(y, lp, y, shifted)
                predictors.append(
                    PredictorResult(name, name, name, 0.0, metrics[name], [], [], pred)
                )
        else:
            runs.append(
                SeedRun(seed, metrics, {k: v.astype(np.float32) for k, v in found.items()}, y)
            )
    params = {"seed": 0, "report": {"bootstrap": {"resamples": 500, "seed": 0}}}
    return ReportInputs("seeds", predictors, {}, params, [], "map", seeds=runs)


STRONG = {"map": 1.0, "ensemble": 2.0, "multiswag": 3.0, "swag": 2.5}


def test_mean_and_std_over_seeds_are_numpys() -> None:
    inputs = _inputs({0: STRONG, 1: STRONG, 2: {**STRONG, "swag": 2.0}})
    unc = compute(inputs)
    table = seeds.table(inputs, unc)
    row = next(r for r in table.rows if r[0].text == "swag")
    values = [run.metrics["swag"]["nll"] for run in inputs.seeds]
    nll = row[table.header.index("NLL mean ± std")].text
    assert nll == f"{np.mean(values):.4f} ± {np.std(values, ddof=1):.4f}"
    own = row[table.header.index("NLL seed 0 [95% CI]")].text
    found = unc.estimate("swag", "nll")
    assert own == f"{values[0]:.4f} [{found.low:.4f}, {found.high:.4f}]"
    assert len(table.rows) == len(NAMES)


def test_a_claim_holds_across_seeds_only_if_every_seeds_test_finds_it() -> None:
    weak_seed = {**STRONG, "swag": 0.5}  # swag far worse than map at seed 2
    inputs = _inputs({0: STRONG, 1: STRONG, 2: weak_seed})
    unc = compute(inputs)
    multi = seeds.seeds_claim(inputs, unc, "p", "multiswag", "ensemble")
    assert multi is not None and multi.holds is True
    assert multi.number.startswith("better in 3 of 3 seeds")
    swag = seeds.seeds_claim(inputs, unc, "p", "swag", "map")
    assert swag is not None and swag.holds is False
    assert "better in 2 of 3 seeds" in swag.number and "worse in 1" in swag.evidence
    tests = seeds.per_seed(inputs, unc, "map", "swag")
    assert [t.verdict() for t in tests] == ["better", "better", "worse"]


def test_one_seed_adds_no_section_and_many_seeds_show_in_the_report(tmp_path) -> None:
    one = _inputs({0: STRONG})
    assert seeds.build(one, compute(one)).blocks == []
    many = _inputs({0: STRONG, 1: STRONG})
    html = write_report(many, tmp_path)["html"].read_text()
    assert (
        "Results over 2 seeds" in html and "multiswag beats ensemble on NLL in every seed" in html
    )


@pytest.mark.parametrize(("gain", "holds"), [(1.5, True), (-1.5, False)])
def test_multiswag_shift_claim_follows_the_paired_growth(gain: float, holds: bool) -> None:
    inputs = _inputs({0: {**STRONG, "multiswag": 2.0}}, shift_gain=gain)
    found = {c.statement: c for c in baselines.claims(inputs, compute(inputs))}
    clean = found["MultiSWAG beats a deep ensemble of the same members on NLL"]
    assert clean.holds is None, clean.evidence  # equal strength on clean data: within noise
    shift = found["MultiSWAG's NLL advantage over the deep ensemble grows under shift"]
    assert shift.holds is holds, shift.evidence
    value, low, high, n_shifts, n_points = baselines.shift_growth(
        inputs.predictors[1], inputs.predictors[2], (500, 0)
    )
    assert low <= value <= high and (n_shifts, n_points) == (1, N)
    assert shift.number == f"gap growth {value:+.4f} [{low:+.4f}, {high:+.4f}]"


def test_a_decided_nll_claim_says_how_many_images_carry_it() -> None:
    """MultiSWAG far stronger than the ensemble: the claim holds, and its evidence gives
    the fewest test images whose removal erases the gain (``intervals.carried_by``)."""
    from bayesavg.report.intervals import PER_POINT, carried_by

    inputs = _inputs({0: STRONG})
    unc = compute(inputs)
    found = {c.statement: c for c in baselines.claims(inputs, unc)}
    claim = found["MultiSWAG beats a deep ensemble of the same members on NLL"]
    assert claim.holds is True
    by_name = {p.name: p.predictions for p in inputs.predictors}
    y = torch.as_tensor(by_name["map"].y)
    nll = {n: PER_POINT["nll"](torch.as_tensor(by_name[n].log_probs), y) for n in by_name}
    k = carried_by(nll["multiswag"] - nll["ensemble"])
    assert k > 1 and f"it rests on {k} test images (without them: gone)" in claim.evidence
