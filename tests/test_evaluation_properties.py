"""Properties the other metric tests left unchecked, found by hand-made mutation testing:
each test here fails for a plausible slip in the code (named in its docstring) and holds
for the definitions in ALGORITHMS §7, §9-§11 (sharpness: test_sharpness.py)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from bayesavg.evaluation.calibrated import calibrated_metrics, deep_ensemble_equivalent
from bayesavg.evaluation.metrics import (
    adaptive_ece,
    brier,
    classwise_ece,
    ece,
    nll,
    protocol_metrics,
)
from bayesavg.evaluation.ood import auroc, fpr_at_tpr, ood_metrics, ood_scores_from_log
from bayesavg.evaluation.selective import risk_coverage, selective_metrics
from bayesavg.predictors.calibration import fit_temperature
from bayesavg.report import auroc_intervals, stats
from bayesavg.report.auroc_intervals import paired_auroc, resampled_auroc
from bayesavg.report.intervals import (
    Interval,
    _resampled,
    bootstrap,
    carried_by,
    paired_bootstrap,
    resample_counts,
)
from bayesavg.runtime.errors import UserError


def _predictive(n: int, classes: int, seed: int, scale: float = 2.0) -> tuple[torch.Tensor, ...]:
    """Random float64 log-probabilities and labels; ``scale`` > 1 makes them overconfident."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, classes, generator=gen, dtype=torch.float64) * scale
    y = torch.multinomial(torch.softmax(logits / 2, 1), 1, generator=gen)[:, 0]
    return torch.log_softmax(logits, 1), y


def _on_edges(n: int = 60, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three-class predictions whose probabilities are all multiples of 1/8, so many sit
    on edges of 4 equal-width bins (or at 0 or 1), where (lower, upper] and
    [lower, upper) bins disagree; random probabilities never do."""
    gen = torch.Generator().manual_seed(seed)
    cuts = torch.randint(0, 9, (n, 2), generator=gen).sort(1).values
    eighths = torch.cat([cuts[:, :1], cuts[:, 1:] - cuts[:, :1], 8 - cuts[:, 1:]], 1)
    probs = eighths.double() / 8
    return probs.log(), torch.randint(0, 3, (n,), generator=gen)


def _brute_classwise(lp: torch.Tensor, y: torch.Tensor, bins: int, upper_closed: bool) -> float:
    """§11 by loops: per class, equal-width bins of p(class) ((lower, upper] when
    ``upper_closed``, else [lower, upper)), sum of |hits - mass| over N, mean over classes."""
    probs = lp.exp().tolist()
    labels = y.tolist()
    per_class = []
    for c in range(len(probs[0])):
        sums: dict[int, list[float]] = {}
        for p_row, label in zip(probs, labels, strict=True):
            p = p_row[c]
            b = math.ceil(p * bins) - 1 if upper_closed else math.floor(p * bins)
            acc = sums.setdefault(min(bins - 1, max(0, b)), [0.0, 0.0])
            acc[0] += p
            acc[1] += float(label == c)
        per_class.append(sum(abs(h - m) for m, h in sums.values()) / len(labels))
    return sum(per_class) / len(per_class)


# --- ALGORITHMS §7 and §11: the bin count reaches every ECE ---------------------------


def test_every_ece_defaults_to_the_papers_twenty_bins() -> None:
    """§7: 20 equal-width bins unless told otherwise (a default of 15, torchmetrics',
    would silently change every reported ECE)."""
    lp, y = _predictive(400, 5, 0)
    assert float(ece(lp, y)) == float(ece(lp, y, 20))
    assert float(ece(lp, y)) != pytest.approx(float(ece(lp, y, 15)), abs=1e-9)
    assert float(adaptive_ece(lp, y)) == float(adaptive_ece(lp, y, 20))
    assert float(classwise_ece(lp, y)) == float(classwise_ece(lp, y, 20))


def test_protocol_metrics_bin_with_the_bins_they_are_given() -> None:
    """§11: adaptive ECE has B = the ECE's bins, so ``ece_bins`` must reach both protocol
    ECEs, not only the default of 20."""
    lp, y = _predictive(300, 4, 1)
    found = protocol_metrics(lp, y, ece_bins=7)
    assert float(found["ece_adaptive"]) == float(adaptive_ece(lp, y, 7))
    assert float(found["ece_classwise"]) == float(classwise_ece(lp, y, 7))
    assert float(found["ece_adaptive"]) != pytest.approx(float(adaptive_ece(lp, y, 20)))
    assert float(found["ece_classwise"]) != pytest.approx(float(classwise_ece(lp, y, 20)))
    for key, value in selective_metrics(lp, y).items():
        assert float(found[key]) == float(value)


def test_classwise_ece_puts_edge_probabilities_in_the_lower_bin() -> None:
    """Equal-width bins are (lower, upper] as for the top-class ECE (§7, §11); on these
    inputs the other convention gives another value, so the edge rule is what is tested."""
    lp, y = _on_edges()
    expected = _brute_classwise(lp, y, 4, upper_closed=True)
    assert expected != pytest.approx(_brute_classwise(lp, y, 4, upper_closed=False), abs=1e-6)
    assert float(classwise_ece(lp, y, 4)) == pytest.approx(expected, abs=1e-12)


def test_calibrated_metrics_bin_with_the_bins_they_are_given() -> None:
    """§11: the tempered predictive's three ECEs at ``ece_bins``, not at a default."""
    val_lp, val_y = _predictive(400, 5, 2, scale=3.0)
    lp, y = _predictive(300, 5, 3, scale=3.0)
    found = calibrated_metrics(val_lp, val_y, lp, y, ece_bins=7)
    tempered = torch.log_softmax(lp / fit_temperature(val_lp, val_y), 1)
    assert found["ece"] == pytest.approx(float(ece(tempered, y, 7)), abs=1e-12)
    assert found["ece_adaptive"] == pytest.approx(float(adaptive_ece(tempered, y, 7)), abs=1e-12)
    assert found["ece_classwise"] == pytest.approx(float(classwise_ece(tempered, y, 7)), abs=1e-12)
    assert found["ece"] != pytest.approx(float(ece(tempered, y, 20)), abs=1e-9)
    assert found["nll"] == pytest.approx(float(nll(tempered, y)), abs=1e-12)
    assert found["brier"] == pytest.approx(float(brier(tempered, y)), abs=1e-12)


def test_many_tied_confidences_are_ranked_by_index() -> None:
    """§11: ties broken by index. Only three distinct confidences over 200 points, errors
    scattered: an unstable sort (stable on a handful of points, not on hundreds) would
    shuffle the tied blocks and change the risk curve inside them."""
    gen = torch.Generator().manual_seed(0)
    n = 200
    conf = torch.tensor([0.9, 0.7, 0.55], dtype=torch.float64)[
        torch.randint(0, 3, (n,), generator=gen)
    ]
    wrong = torch.rand(n, generator=gen) < 0.3
    lp = torch.stack([conf, 1 - conf], 1).log()
    y = wrong.long()  # class 0 is always predicted
    ranked = sorted(range(n), key=lambda i: (-float(conf[i]), i))
    errs, risks = 0.0, []
    for k, i in enumerate(ranked, start=1):
        errs += float(wrong[i])
        risks.append(errs / k)
    _, risk = risk_coverage(lp, y)
    assert risk.tolist() == pytest.approx(risks, abs=1e-12)
    assert float(selective_metrics(lp, y)["aurc"]) == pytest.approx(sum(risks) / n, abs=1e-12)


def test_dee_of_the_one_member_nll_is_one_member() -> None:
    """§11: DEE = k where the ensemble's calibrated NLL at k members equals the value; at
    exactly the one-member NLL that is 1, also when the curve first rises before falling
    below it, and for a one-member curve."""
    assert deep_ensemble_equivalent(1.0, [1.0, 1.2, 0.9]) == 1.0
    assert deep_ensemble_equivalent(0.5, [0.5]) == 1.0
    assert deep_ensemble_equivalent(0.4, [0.5]) == math.inf
    assert deep_ensemble_equivalent(0.6, [0.5]) == -math.inf


# --- ALGORITHMS §10: bootstrap intervals ---------------------------------------------


def test_bootstrap_ece_uses_the_bins_it_is_given() -> None:
    """A paired difference's point and a single metric's point are the metric at
    ``ece_bins``, the same binning the resamples use."""
    a, y = _predictive(300, 4, 4)
    b, _ = _predictive(300, 4, 5)
    got = paired_bootstrap("ece", a, b, y, resamples=20, seed=0, ece_bins=7)
    assert got.diff == pytest.approx(float(ece(b, y, 7) - ece(a, y, 7)), abs=1e-15)
    own = bootstrap("ece", a, y, resamples=20, seed=0, ece_bins=7)
    assert own.value == pytest.approx(float(ece(a, y, 7)), abs=1e-15)
    assert own.low <= own.value <= own.high


def test_resampled_ece_puts_edge_confidences_in_the_lower_bin() -> None:
    """Every resample's ECE is ``ece`` of its repeated points, also when confidences sit
    exactly on bin edges ((lower, upper] bins, 1.0 in the last): random confidences never
    do, so only this case tells the two edge conventions apart."""
    lp, y = _on_edges()
    counts = resample_counts(len(y), 30, 1)
    found = _resampled("ece", lp, y, counts, 4)
    for r, row in enumerate(counts):
        idx = torch.repeat_interleave(torch.arange(len(y)), row.long())
        assert float(found[r]) == pytest.approx(float(ece(lp[idx], y[idx], 4)), abs=1e-12), r


def test_resamples_draw_every_point_equally_often() -> None:
    """Sampling with replacement from all n points: each point's expected count is 1
    (the last point included), the total of each row n."""
    counts = resample_counts(5, 8000, 0)
    assert torch.equal(counts.sum(1), torch.full((8000,), 5.0, dtype=torch.float64))
    # mean count per point over 8,000 rows: sd sqrt(0.8 / 8000) = 0.01; allow 5 sd
    assert float((counts.mean(0) - 1).abs().max()) < 0.05


def test_more_confident_counts_as_better_confidence() -> None:
    """The 'confidence' comparison (DSWAG's 'more confident' claim): a positive difference
    (B more confident) is 'better', a negative one 'worse'."""
    up = Interval("confidence", 0.02, 0.01, 0.03, 0.95, 100)
    down = Interval("confidence", -0.02, -0.03, -0.01, 0.95, 100)
    assert (up.verdict(), down.verdict()) == ("better", "worse")


# --- ALGORITHMS §9: OOD scores and detection ----------------------------------------


def test_msp_score_keeps_relative_precision_for_confident_predictions() -> None:
    """1 - max p for max p = exp(-1e-14): 1e-14 to relative 1e-6 (as -expm1), where
    1 - exp(x) in float64 is off by about 0.1%."""
    x = -1e-14
    lp = torch.tensor([[[x, math.log(-math.expm1(x))]]], dtype=torch.float64)
    msp = float(ood_scores_from_log(lp)["msp"][0])
    assert msp == pytest.approx(-math.expm1(x), rel=1e-6, abs=0)


def test_detection_metrics_refuse_a_single_class() -> None:
    """AUROC and FPR need both classes: all-OOD labels are refused, not a NaN."""
    scores = torch.rand(6, generator=torch.Generator().manual_seed(0))
    for metric in (auroc, fpr_at_tpr):
        with pytest.raises(UserError, match="both in-distribution and OOD"):
            metric(scores, torch.ones(6, dtype=torch.bool))
        with pytest.raises(UserError, match="both in-distribution and OOD"):
            metric(scores, torch.zeros(6, dtype=torch.bool))


def test_ood_metrics_skip_a_score_one_side_lacks() -> None:
    """Only the scores both dicts have are compared (a single network has no MI)."""
    g = torch.Generator().manual_seed(0)
    s_in = {"msp": torch.rand(8, generator=g), "mutual_info": torch.rand(8, generator=g)}
    s_out = {"msp": torch.rand(5, generator=g) + 0.5}
    assert set(ood_metrics(s_in, s_out)) == {"msp"}


def test_resampled_auroc_refuses_non_finite_scores() -> None:
    """A NaN score would make every comparison false and the AUROC a silent number."""
    counts_in, counts_out = resample_counts(3, 4, 0), resample_counts(2, 4, 1)
    with pytest.raises(ValueError, match="finite"):
        resampled_auroc([0.1, math.nan, 0.3], [0.5, 0.6], counts_in, counts_out)


def test_ood_and_test_strata_draw_different_resamples(monkeypatch: pytest.MonkeyPatch) -> None:
    """With as many OOD as test points, the two strata must not repeat the same positions
    (that would tie two unrelated sets of draws): their count matrices differ."""
    drawn: list[torch.Tensor] = []

    def spy(n: int, resamples: int, seed: int) -> torch.Tensor:
        counts = resample_counts(n, resamples, seed)
        drawn.append(counts)
        return counts

    monkeypatch.setattr(auroc_intervals, "resample_counts", spy)
    rng = np.random.default_rng(0)
    reference = (rng.normal(0, 1, 30), rng.normal(1, 1, 30))
    candidate = (rng.normal(0, 1, 30), rng.normal(1, 1, 30))
    paired_auroc(reference, candidate, resamples=50, seed=3)
    assert len(drawn) == 2 and drawn[0].shape == drawn[1].shape
    assert not torch.equal(drawn[0], drawn[1])


# --- report statistics ---------------------------------------------------------------


def test_carried_by_counts_a_removal_that_reaches_exactly_zero() -> None:
    """'to 0 or past it': dropping the +2 leaves 1 - 1 = 0, so one image carries it."""
    assert carried_by(torch.tensor([2.0, 1.0, -1.0])) == 1
    assert carried_by(torch.tensor([-2.0, -1.0, 1.0])) == 1


def test_permutation_p_is_exact_at_the_largest_exact_size() -> None:
    """Up to EXACT_PERMUTATIONS_MAX distinct x values the p-value enumerates every
    permutation: at exactly that many it is the exact share of orderings, a multiple of
    1 / k!, not a seeded Monte Carlo estimate."""
    k = stats.EXACT_PERMUTATIONS_MAX
    rng = np.random.default_rng(0)
    x = rng.normal(size=k).tolist()
    y = (np.asarray(x) + rng.normal(size=k)).tolist()
    rank_y = stats.ranks(np.asarray(y))
    perms = np.asarray(list(itertools.permutations(range(1, k + 1))), dtype=float)
    rank_y_c = rank_y - rank_y.mean()
    perms_c = perms - perms.mean(1, keepdims=True)
    rhos = (perms_c @ rank_y_c) / np.sqrt((perms_c**2).sum(1) * (rank_y_c**2).sum())
    observed = stats.spearman(x, y)
    expected = float(np.mean(rhos >= observed - 1e-12))
    assert stats.clustered_permutation_p(x, y) == expected
    assert 0 < expected < 1


def test_permutation_p_beyond_the_exact_size_follows_its_seed() -> None:
    """More units than the exact limit: a seeded draw, reproducible for one seed, and a
    different draw (so a slightly different estimate) for another."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=12).tolist()
    y = (np.asarray(x) * 0.3 + rng.normal(size=12)).tolist()
    first = stats.clustered_permutation_p(x, y, seed=0)
    assert stats.clustered_permutation_p(x, y, seed=0) == first
    assert 0.01 < first < 0.99
    assert stats.clustered_permutation_p(x, y, seed=1) != first
