"""Selective prediction and the calibration protocol's ECEs (ALGORITHMS §11), each against
a brute-force computation on small arrays."""

from __future__ import annotations

import math

import pytest
import torch

from bayesavg.evaluation.metrics import adaptive_ece, classwise_ece, ece
from bayesavg.evaluation.selective import (
    perfect_aurc,
    resampled,
    risk_coverage,
    selective_metrics,
)


def _predictive(n: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, classes, generator=gen, dtype=torch.float64) * 2
    y = torch.randint(0, classes, (n,), generator=gen)
    return torch.log_softmax(logits, 1), y


def _brute(log_probs: torch.Tensor, y: torch.Tensor, copies: list[int]) -> dict[str, float]:
    """The definitions, literally: the resample's points listed (each repeated as often as
    it was drawn), ranked by confidence with ties by position, the risk at every k."""
    probs = log_probs.exp()
    points = [i for i, c in enumerate(copies) for _ in range(c)]
    conf = [float(probs[i].max()) for i in points]
    wrong = [float(probs[i].argmax() != y[i]) for i in points]
    ranked = sorted(range(len(points)), key=lambda j: (-conf[j], points[j], j))
    n = len(points)
    errs, risks, generalized = 0.0, [], []
    for k, j in enumerate(ranked, start=1):
        errs += wrong[j]
        risks.append(errs / k)
        generalized.append(errs / n)
    out = {"aurc": sum(risks) / n, "augrc": sum(generalized) / n}
    for coverage in (0.9, 0.95):
        k = math.ceil(coverage * n - 1e-9)
        out[f"risk_at_{round(100 * coverage)}"] = risks[k - 1]
    return out


def test_selective_metrics_match_the_definition() -> None:
    lp, y = _predictive(57, 4, 0)
    found = selective_metrics(lp, y)
    for key, value in _brute(lp, y, [1] * 57).items():
        assert float(found[key]) == pytest.approx(value, abs=1e-12), key


def test_every_bootstrap_resample_matches_the_definition() -> None:
    lp, y = _predictive(23, 3, 1)
    gen = torch.Generator().manual_seed(2)
    rows = []
    for _ in range(6):
        idx = torch.randint(0, 23, (23,), generator=gen)
        rows.append(torch.bincount(idx, minlength=23).double())
    counts = torch.stack(rows)
    found = resampled(lp, y, counts)
    for r, row in enumerate(counts):
        for key, value in _brute(lp, y, [int(c) for c in row]).items():
            assert float(found[key][r]) == pytest.approx(value, abs=1e-12), (r, key)


def test_a_perfect_ranking_reaches_the_analytic_minimum() -> None:
    """Every error less confident than every right answer: AURC is its least value."""
    n, errors = 40, 7
    y = torch.zeros(n, dtype=torch.long)
    conf = torch.linspace(0.99, 0.6, n)  # descending: the last 7 are the errors
    probs = torch.stack([conf, 1 - conf], 1).double()
    probs[n - errors :] = probs[n - errors :].flip(1)  # wrong, and least confident
    lp = probs.log()
    found = selective_metrics(lp, y)
    assert float(found["aurc"]) == pytest.approx(perfect_aurc(n, errors), abs=1e-12)
    assert perfect_aurc(n, errors) == pytest.approx(
        sum(max(0, k - (n - errors)) / k for k in range(1, n + 1)) / n
    )
    assert float(found["risk_at_90"]) == pytest.approx(
        (36 - 33) / 36
    )  # ceil(0.9 * 40) = 36, 33 right first


def test_a_random_ranking_approaches_the_error_rate() -> None:
    """Confidence unrelated to correctness: the risk is the error rate at every coverage
    on average, so AURC tends to it (here within 0.01 over 20,000 points)."""
    gen = torch.Generator().manual_seed(3)
    n = 20000
    conf = torch.rand(n, generator=gen, dtype=torch.float64) * 0.4 + 0.55
    wrong = torch.rand(n, generator=gen) < 0.3
    probs = torch.stack([conf, 1 - conf], 1)
    y = wrong.long()  # class 0 is always predicted: wrong where y = 1
    found = selective_metrics(probs.log(), y)
    rate = wrong.double().mean().item()
    assert float(found["aurc"]) == pytest.approx(rate, abs=0.01)
    assert float(found["augrc"]) == pytest.approx(rate / 2, abs=0.01)


def test_ties_are_broken_by_index() -> None:
    """Two equally confident points: the earlier one is retained first (stated rule)."""
    probs = torch.tensor([[0.8, 0.2], [0.8, 0.2], [0.6, 0.4]], dtype=torch.float64)
    y_first_wrong = torch.tensor([1, 0, 0])
    coverage, risk = risk_coverage(probs.log(), y_first_wrong)
    assert coverage.tolist() == pytest.approx([1 / 3, 2 / 3, 1])
    assert risk.tolist() == pytest.approx([1.0, 0.5, 1 / 3])
    y_second_wrong = torch.tensor([0, 1, 0])
    assert risk_coverage(probs.log(), y_second_wrong)[1].tolist() == pytest.approx(
        [0.0, 0.5, 1 / 3]
    )


def _brute_adaptive(lp: torch.Tensor, y: torch.Tensor, bins: int) -> float:
    probs = lp.exp()
    conf = probs.max(1).values.tolist()
    right = (probs.argmax(1) == y).double().tolist()
    order = sorted(range(len(conf)), key=lambda i: (conf[i], i))
    n, total, start = len(conf), 0.0, 0
    for b in range(bins):
        size = n // bins + (1 if b < n % bins else 0)
        part = order[start : start + size]
        start += size
        total += abs(sum(right[i] for i in part) - sum(conf[i] for i in part))
    return total / n


def _brute_classwise(lp: torch.Tensor, y: torch.Tensor, bins: int) -> float:
    probs = lp.exp()
    n, classes = probs.shape
    per_class = []
    for c in range(classes):
        sums: dict[int, list[float]] = {}
        for i in range(n):
            p = float(probs[i, c])
            b = min(bins - 1, max(0, math.ceil(p * bins) - 1))
            acc = sums.setdefault(b, [0.0, 0.0])
            acc[0] += p
            acc[1] += float(y[i] == c)
        per_class.append(sum(abs(h - p) for p, h in sums.values()) / n)
    return sum(per_class) / classes


@pytest.mark.parametrize("bins", [1, 5, 20])
def test_adaptive_and_classwise_ece_match_the_definitions(bins: int) -> None:
    lp, y = _predictive(53, 4, 4)
    assert float(adaptive_ece(lp, y, bins)) == pytest.approx(_brute_adaptive(lp, y, bins))
    assert float(classwise_ece(lp, y, bins)) == pytest.approx(_brute_classwise(lp, y, bins))


def test_one_adaptive_bin_is_the_equal_width_ece_of_one_bin() -> None:
    lp, y = _predictive(31, 3, 5)
    assert float(adaptive_ece(lp, y, 1)) == pytest.approx(float(ece(lp, y, 1)))
