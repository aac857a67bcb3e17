"""Classification metrics: hand-computed examples, brute force, torchmetrics (ALGORITHMS §7)."""

from __future__ import annotations

import math

import pytest
import torch
from torchmetrics.functional.classification import multiclass_calibration_error

from bayesavg.evaluation.metrics import (
    accuracy,
    brier,
    classification_metrics,
    ece,
    entropy,
    nll,
    reliability,
)


def _log(probs: list[list[float]]) -> torch.Tensor:
    """Log-probabilities in float64, the input every metric takes."""
    return torch.tensor(probs, dtype=torch.float64).log()


def _random_case(seed: int, n: int = 500, c: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 log-softmax of random logits, and labels agreeing with argmax ~60% of the time."""
    g = torch.Generator().manual_seed(seed)
    logits = 2.5 * torch.randn(n, c, generator=g)
    y = torch.where(
        torch.rand(n, generator=g) < 0.6,
        logits.argmax(1),
        torch.randint(0, c, (n,), generator=g),
    )
    return torch.log_softmax(logits, dim=1), y


def _brute_ece(log_probs: torch.Tensor, y: torch.Tensor, n_bins: int) -> float:
    """Python loop over points and bins (lower, upper]; confidence 0 goes to bin 0."""
    probs = log_probs.double().exp().tolist()
    labels = y.tolist()
    bins: list[list[tuple[float, float]]] = [[] for _ in range(n_bins)]
    for p, label in zip(probs, labels, strict=True):
        conf = max(p)
        correct = float(p.index(conf) == label)
        b = max(math.ceil(conf * n_bins) - 1, 0)
        bins[b].append((conf, correct))
    total = 0.0
    for members in bins:
        if members:
            conf_mean = sum(m[0] for m in members) / len(members)
            acc_mean = sum(m[1] for m in members) / len(members)
            total += len(members) / len(probs) * abs(acc_mean - conf_mean)
    return total


HAND_PROBS = [[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.25, 0.25, 0.5]]
HAND_Y = [0, 2, 2]


def test_accuracy_nll_brier_by_hand() -> None:
    """Points: correct (p_y .7), wrong (pred 1, p_y .3), correct (p_y .5).

    accuracy = 2/3
    nll = -(ln .7 + ln .3 + ln .5) / 3 = (0.3566749439 + 1.2039728043 + 0.6931471806) / 3
        = 0.7512649763 (a mean: the sum would be 2.2537949288)
    brier = ((.3^2 + .2^2 + .1^2) + (.1^2 + .6^2 + .7^2) + (.25^2 + .25^2 + .5^2)) / 3
          = (0.14 + 0.86 + 0.375) / 3 = 0.4583333333
    """
    log_probs, y = _log(HAND_PROBS), torch.tensor(HAND_Y)
    assert accuracy(log_probs, y).item() == pytest.approx(2 / 3, abs=1e-12)
    assert nll(log_probs, y).item() == pytest.approx(0.7512649763, abs=1e-9)
    assert brier(log_probs, y).item() == pytest.approx(0.4583333333, abs=1e-9)


def test_reliability_and_ece_by_hand_with_edges_in_lower_bin() -> None:
    """4 bins (0,.25], (.25,.5], (.5,.75], (.75,1]; confidences .5 and .75 sit on edges.

    point  conf    correct  bin
    A      .5      yes      1  (edge: lower bin)
    B      .75     no       2  (edge: lower bin)
    C      .625    yes      2
    D      .875    yes      3
    E      .9375   no       3
    F      1.0     yes      3  (top edge: last bin)
    bin 1: conf .5, acc 1; bin 2: conf (.75 + .625)/2 = .6875, acc .5;
    bin 3: conf (.875 + .9375 + 1)/3 = .9375, acc 2/3.
    ECE = 1/6 * .5 + 2/6 * .1875 + 3/6 * (.9375 - 2/3) = 8/96 + 6/96 + 13/96 = 27/96 = 0.28125.
    With [lower, upper) bins (torchmetrics) A and B move up and ECE would be 0.40625.
    """
    probs = [
        [0.5, 0.25, 0.25],
        [0.75, 0.125, 0.125],
        [0.125, 0.625, 0.25],
        [0.875, 0.0625, 0.0625],
        [0.9375, 0.03125, 0.03125],
        [1.0, 0.0, 0.0],
    ]
    y = torch.tensor([0, 1, 1, 0, 2, 0])
    log_probs = _log(probs)
    conf = log_probs.exp().max(1).values
    assert conf.tolist() == [0.5, 0.75, 0.625, 0.875, 0.9375, 1.0]

    rel = reliability(log_probs, y, n_bins=4)
    assert rel.lower.tolist() == [0.0, 0.25, 0.5, 0.75]
    assert rel.upper.tolist() == [0.25, 0.5, 0.75, 1.0]
    assert rel.count.tolist() == [0, 1, 2, 3]
    torch.testing.assert_close(
        rel.confidence[1:], torch.tensor([0.5, 0.6875, 0.9375], dtype=torch.float64)
    )
    torch.testing.assert_close(
        rel.accuracy[1:], torch.tensor([1.0, 0.5, 2 / 3], dtype=torch.float64)
    )
    assert rel.ece().item() == pytest.approx(0.28125, abs=1e-12)
    assert ece(log_probs, y, n_bins=4).item() == pytest.approx(0.28125, abs=1e-12)

    rows = rel.rows()
    assert [r["count"] for r in rows] == [0, 1, 2, 3]
    assert rows[2]["gap"] == pytest.approx(0.5 - 0.6875, abs=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_ece15_matches_torchmetrics(seed: int) -> None:
    """Random confidences never sit on a bin edge, where the two conventions differ."""
    log_probs, y = _random_case(seed)
    ours = ece(log_probs, y, n_bins=15).item()
    ref = multiclass_calibration_error(
        log_probs.exp(), y, num_classes=log_probs.shape[1], n_bins=15, norm="l1"
    ).item()
    assert ours > 0.01
    assert ours == pytest.approx(ref, abs=1e-6)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("n_bins", [1, 7, 20])
def test_ece_matches_python_loop(seed: int, n_bins: int) -> None:
    log_probs, y = _random_case(seed, n=300, c=4)
    assert ece(log_probs, y, n_bins).item() == pytest.approx(
        _brute_ece(log_probs, y, n_bins), abs=1e-9
    )


def test_classification_metrics_keys_and_values() -> None:
    log_probs, y = _random_case(7)
    out = classification_metrics(log_probs, y)
    assert set(out) == {"accuracy", "nll", "ece", "ece15", "brier", "entropy"}
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in out.values())
    assert out["ece"].item() == pytest.approx(_brute_ece(log_probs, y, 20), abs=1e-9)
    assert out["ece15"].item() == pytest.approx(_brute_ece(log_probs, y, 15), abs=1e-9)
    assert out["ece"].item() != pytest.approx(out["ece15"].item(), abs=1e-6)
    assert out["accuracy"].item() == pytest.approx(
        (log_probs.argmax(1) == y).double().mean().item(), abs=1e-12
    )
    probs = log_probs.double().exp()
    assert out["nll"].item() == pytest.approx(
        -probs[torch.arange(len(y)), y].log().mean().item(), rel=1e-6
    )
    onehot = torch.nn.functional.one_hot(y, probs.shape[1]).double()
    expected_brier = ((probs - onehot) ** 2).sum(1).mean().item()
    assert out["brier"].item() == pytest.approx(expected_brier, abs=1e-7)
    assert classification_metrics(log_probs, y, ece_bins=15)["ece"] == out["ece15"]
    expected_entropy = -(probs * probs.log()).sum(1).mean().item()
    assert out["entropy"].item() == pytest.approx(expected_entropy, rel=1e-9)
    certain = torch.log(torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64))
    assert classification_metrics(certain, torch.tensor([0]))["entropy"].item() == 0.0


@pytest.mark.parametrize("seed", [0, 1])
def test_classification_metrics_are_the_bytes_of_each_metric_alone(seed: int) -> None:
    """The per-sample table shares the probabilities between ECE, ECE-15 and Brier; each
    value is still the one its own function gives, bit for bit."""
    log_probs, y = _random_case(seed)
    out = classification_metrics(log_probs, y, ece_bins=20)
    assert torch.equal(out["ece"], ece(log_probs, y, 20))
    assert torch.equal(out["ece15"], ece(log_probs, y, 15))
    assert torch.equal(out["brier"], brier(log_probs, y))
    assert torch.equal(out["entropy"], entropy(log_probs))


def test_nll_stays_finite_when_probabilities_underflow_float32() -> None:
    """log p(y) = -200 (p ~ 1e-87, 0 in float32): NLL is 200 for that point, not inf."""
    log_probs = torch.tensor([[-200.0, 0.0], [math.log(0.25), math.log(0.75)]])
    y = torch.tensor([0, 1])
    assert torch.isinf(-log_probs[0, 0].exp().log())
    out = classification_metrics(log_probs, y)
    expected = (200.0 - math.log(0.75)) / 2
    assert torch.isfinite(out["nll"])
    assert out["nll"].item() == pytest.approx(expected, rel=1e-6)
    assert out["brier"].item() == pytest.approx((2.0 + 2 * 0.25**2) / 2, abs=1e-6)
    assert out["accuracy"].item() == pytest.approx(0.5)
