"""ECE bin edges and the reliability table the pipeline writes (plots/reliability/<p>.csv).

The stage writes ``Evaluation.reliability.rows()`` with ``write_csv`` and reports
``metrics["ece"]``; both must describe the same bins, so ECE recomputed from the
CSV rows as sum_b (count_b / N) |acc_b - conf_b| equals the reported value.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from bayesavg.data.prepared import to_input
from bayesavg.evaluation.evaluate import evaluate
from bayesavg.evaluation.metrics import classification_metrics, ece, reliability
from bayesavg.posteriors.file import load_posterior
from bayesavg.runtime.io import write_csv

if TYPE_CHECKING:
    from conftest import PreparedDir, TinyPosteriors


def _certain(n: int, k: int = 4) -> torch.Tensor:
    """Log-probabilities of one-hot predictions: exp gives confidence exactly 1.0."""
    return torch.eye(k, dtype=torch.float64)[torch.arange(n) % k].log()


@pytest.mark.parametrize("n_bins", [1, 2, 3, 7, 10, 15, 20])
def test_confidence_one_lands_in_the_last_bin(n_bins: int) -> None:
    lp = _certain(12)
    assert bool((lp.exp().max(dim=1).values == 1.0).all())
    y = torch.arange(12) % 4
    y[:3] = (y[:3] + 1) % 4  # 3 of 12 wrong: accuracy 0.75 at confidence 1
    rel = reliability(lp, y, n_bins)
    assert rel.count.shape == (n_bins,)  # no extra bin
    assert rel.count[-1].item() == 12  # not dropped
    assert rel.count[:-1].sum().item() == 0
    assert rel.upper[-1].item() == 1.0
    assert rel.confidence[-1].item() == 1.0
    assert rel.accuracy[-1].item() == 0.75
    assert ece(lp, y, n_bins).item() == pytest.approx(0.25, abs=1e-15)


def test_bma_confidence_rounding_above_one_stays_in_the_last_bin() -> None:
    """evaluate's BMA of 20 agreeing certain samples: logaddexp 19 times, minus log 20,
    rounds to 4.4e-16 > 0, so the confidence is 1 + 4.4e-16 (bucketize puts it past the
    last edge; the clamp must bring it back)."""
    sample = _certain(5, 3)
    log_sum = sample
    for _ in range(19):
        log_sum = torch.logaddexp(log_sum, sample)
    lp = log_sum - math.log(20)
    assert bool((lp.exp().max(dim=1).values > 1.0).all())
    rel = reliability(lp, torch.arange(5) % 3, 20)
    assert rel.count.shape == (20,) and rel.count[-1].item() == 5


def _ece_from_csv(path: Path) -> tuple[float, int]:
    """ECE recomputed from the CSV as the report reads it (every cell a float)."""
    with path.open(newline="") as f:
        rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    n = sum(r["count"] for r in rows)
    return sum(r["count"] / n * abs(r["accuracy"] - r["confidence"]) for r in rows), int(n)


@pytest.mark.parametrize("seed", range(3))
def test_ece_from_written_rows_matches_reported_on_random_predictions(
    seed: int, tmp_path: Path
) -> None:
    """Random logits plus confidences on bin edges and at exactly 1."""
    g = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(400, 10, generator=g, dtype=torch.float64)
    lp = torch.log_softmax(logits, dim=1)
    lp = torch.cat([lp, _certain(30, 10)])
    edges = torch.tensor([k / 20 for k in range(3, 20)], dtype=torch.float64)  # >= 1/K
    on_edge = torch.full((edges.numel(), 10), 0.0, dtype=torch.float64)
    on_edge[:, 0] = edges
    on_edge[:, 1:] = ((1 - edges) / 9)[:, None]
    lp = torch.cat([lp, on_edge.log()])
    y = torch.randint(0, 10, (lp.shape[0],), generator=g)
    path = tmp_path / "rel.csv"
    write_csv(path, reliability(lp, y, 20).rows())
    recomputed, n = _ece_from_csv(path)
    assert n == lp.shape[0]
    reported = classification_metrics(lp, y, ece_bins=20)["ece"].item()
    assert recomputed == pytest.approx(reported, rel=1e-12, abs=1e-15)


def test_ece_from_pipeline_csv_matches_reported(
    tiny_posteriors: TinyPosteriors, mnist5k_prepared: PreparedDir, tmp_path: Path
) -> None:
    """As stages/evaluate.py does it: evaluate, write rows(), compare with metrics['ece']."""
    posterior = load_posterior(tiny_posteriors.swag)
    test = mnist5k_prepared.prepared.test
    m = mnist5k_prepared.prepared.manifest
    results = evaluate(
        posterior,
        "swag",
        {"test": (to_input(test.x, m["mean"], m["std"]), test.y)},
        n_samples=3,
        ece_bins=20,
        seed=0,
    )
    result = results["test"]
    out = tmp_path / "plots" / "reliability" / "swag.csv"
    write_csv(out, result.reliability.rows())
    recomputed, n = _ece_from_csv(out)
    assert n == result.metrics["n"] == len(test)
    assert len(result.reliability.rows()) == 20
    assert recomputed == pytest.approx(result.metrics["ece"], rel=1e-12, abs=1e-15)
