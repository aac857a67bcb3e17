"""Edges of the evaluation the other tests left unchecked, found by hand-made mutation
testing of evaluate, selective, calibrated, temperature scaling and the analyses: each
test fails for a plausible slip (named in its docstring) and holds for the definitions
in ALGORITHMS §2, §7, §9 and §11 and the README's temperature bracket [0.05, 20]."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from torch import nn

from bayesavg.analyses.plane import grid_axes
from bayesavg.analyses.sweep import rounds_to_target
from bayesavg.evaluation.calibrated import calibrated_metrics, dee_text, deep_ensemble_equivalent
from bayesavg.evaluation.centre import center_model, centre_sharpness
from bayesavg.evaluation.evaluate import (
    _in_order,
    bn_rows,
    evaluate,
    log_softmax_predictions,
    method_of,
)
from bayesavg.evaluation.metrics import adaptive_ece, brier, classwise_ece, ece, nll
from bayesavg.evaluation.selective import perfect_aurc
from bayesavg.evaluation.sharpness import hessian_trace, sam_sharpness
from bayesavg.posteriors.file import PosteriorFile, load_posterior
from bayesavg.predictors.calibration import fit_temperature
from bayesavg.predictors.sampling import Draws, centres

if TYPE_CHECKING:
    from conftest import PreparedDir, TinyPosteriors


def _planted(temperature: float, n: int = 4000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of logits z and labels drawn from softmax(z / T): the best T is T."""
    gen = torch.Generator().manual_seed(seed)
    z = 3.0 * torch.randn(n, 10, generator=gen, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z / temperature, dim=-1), 1, generator=gen)[:, 0]
    return torch.log_softmax(z, dim=-1), y


def test_the_bn_share_rounds_to_the_nearest_count() -> None:
    """``round(f * n)`` images (at least one), distinct and in range: 3.5 of 7 is 4, not
    the 3 a truncating ``int`` gives."""
    for n, fraction in [(7, 0.5), (10, 0.36), (3, 0.01), (5, 1.0)]:
        rows = bn_rows(n, fraction, 0)
        assert len(rows) == max(1, round(fraction * n)), (n, fraction)
        assert len(set(rows.tolist())) == len(rows) and 0 <= int(rows.min()) <= int(rows.max()) < n


def test_swag_at_scale_zero_is_swa(
    tiny_posteriors: TinyPosteriors, mnist5k_prepared: PreparedDir
) -> None:
    """ALGORITHMS §2: SWA is SWAG at scale 0. An explicit ``scale=0.0`` must not be read
    as 'no scale given' (``scale or default``), which samples at the default 0.5."""
    post = load_posterior(tiny_posteriors.swag)
    test = mnist5k_prepared.prepared.test
    split = {"test": (post.model_input(test.x[:200]), test.y[:200])}
    zero = evaluate(post, "swag", split, n_samples=2, scale=0.0)["test"]
    swa = evaluate(post, "swa", split)["test"]
    assert torch.allclose(zero.log_probs, swa.log_probs, rtol=0, atol=1e-12)
    for key in ("accuracy", "nll", "ece", "brier"):
        assert zero.metrics[key] == pytest.approx(swa.metrics[key], rel=1e-12, abs=1e-15)


def test_perfect_aurc_at_the_extremes() -> None:
    """Every point wrong: the risk is 1 at every coverage, so the least AURC is 1 (a range
    starting at k = 0 would divide by zero); no points: NaN, never a made-up 0."""
    for n in (1, 2, 7):
        assert perfect_aurc(n, n) == pytest.approx(1.0)
        assert perfect_aurc(n, 0) == 0.0
    assert math.isnan(perfect_aurc(0, 0))


def test_a_temperature_beyond_the_bracket_is_refused() -> None:
    """README: a degenerate fit is one whose T would lie on the edge of [0.05, 20]. A
    predictive sharpened to T = 0.03 is refused with that bracket in the message; one at
    T = 12 is fitted (a narrower bracket would refuse it)."""
    with pytest.raises(ValueError, match=r"is at the edge of \[0\.05, 20\]"):
        fit_temperature(*_planted(0.03))
    assert fit_temperature(*_planted(12.0, n=20000)) == pytest.approx(12.0, rel=0.15)


def test_an_always_wrong_predictive_is_refused_at_the_upper_edge() -> None:
    """Confidently wrong everywhere: the NLL falls as T grows, to T_MAX; that edge is
    degenerate as much as the lower one."""
    z = torch.zeros(50, 3, dtype=torch.float64)
    z[:, 0] = 5.0
    with pytest.raises(ValueError, match=r"fitted temperature 20 is at the edge"):
        fit_temperature(torch.log_softmax(z, 1), torch.ones(50, dtype=torch.long))


def test_the_fit_refuses_mismatched_or_empty_inputs() -> None:
    """Labels for fewer points than predictions would silently fit on a prefix; no
    points at all has no NLL."""
    log_probs = torch.log_softmax(torch.randn(4, 3, dtype=torch.float64), 1)
    with pytest.raises(ValueError, match=r"^log_probs \(4, 3\) and labels \(3,\)$"):
        fit_temperature(log_probs, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^log_probs \(0, 3\) and labels \(0,\)$"):
        fit_temperature(log_probs[:0], torch.zeros(0, dtype=torch.long))


def test_points_all_at_the_origin_get_a_unit_span() -> None:
    """``grid_axes``: with no range on either axis the span is 1, widened by the margin
    on both sides, the origin a node."""
    a, b = grid_axes(torch.zeros(3, 2, dtype=torch.float64), 5, 0.25)
    expected = torch.tensor([-0.25, -0.125, 0.0, 0.125, 0.25], dtype=torch.float64)
    assert torch.allclose(a, expected) and torch.allclose(b, expected)


def test_the_samples_table_is_the_bma_of_the_first_s_networks(
    tiny_posteriors: TinyPosteriors, mnist5k_prepared: PreparedDir
) -> None:
    """ALGORITHMS §7 'metrics as a function of the number of samples': row s (numbered from
    1) is the average of the first s networks alone, i.e. an evaluation with S = s and the
    same seed; dividing by the final S in every row, or numbering from 0, breaks it."""
    post = load_posterior(tiny_posteriors.swag)
    test = mnist5k_prepared.prepared.test
    split = {"test": (post.model_input(test.x[:200]), test.y[:200])}
    full = evaluate(post, "swag", split, n_samples=3, seed=5)["test"]
    assert [row["samples"] for row in full.by_samples] == [1, 2, 3]
    for s in (1, 2, 3):
        prefix = evaluate(post, "swag", split, n_samples=s, seed=5)["test"].metrics
        for key in ("accuracy", "nll", "ece", "brier"):
            assert full.by_samples[s - 1][key] == pytest.approx(prefix[key], rel=1e-12), (s, key)


def test_dee_at_the_bottom_of_a_curve_that_turns_back() -> None:
    """The calibrated NLL of k members hit exactly where the curve turns back up is k
    members: both segments meeting there include their ends."""
    assert deep_ensemble_equivalent(0.7, [1.0, 0.7, 0.8]) == 2.0
    assert deep_ensemble_equivalent(1.0, [1.0, 1.0, 0.9]) == 1.0


def test_dee_of_a_one_member_curve() -> None:
    """With M = 1 there is no segment: equal to it is one member, better is '> 1'."""
    assert deep_ensemble_equivalent(0.9, [0.9]) == 1.0
    assert deep_ensemble_equivalent(0.8, [0.9]) == math.inf
    assert deep_ensemble_equivalent(1.0, [0.9]) == -math.inf
    assert (dee_text(math.nan, 3), dee_text(1.0, 1)) == ("n/a", "1.00")


def test_a_degenerate_calibration_says_what_the_fit_said() -> None:
    """``calibrated_metrics``'s ``error`` is the fit's own message (which T, which
    bracket), so the report can say why a predictor has no calibrated metrics."""
    constant = torch.full((10, 3), -math.log(3), dtype=torch.float64)
    y = torch.arange(10) % 3
    with pytest.raises(ValueError) as raised:
        fit_temperature(constant, y)
    assert calibrated_metrics(constant, y, constant, y) == {"error": str(raised.value)}


def test_rounds_to_target_reports_the_rows_round() -> None:
    """The round is the history row's own ``epoch``, not its position: a history that
    starts later (or skips rounds) still names the round that reached the target."""
    history = [
        {"epoch": 3, "train_accuracy": 0.5},
        {"epoch": 5, "train_accuracy": 0.9},
        {"epoch": 6, "train_accuracy": 0.95},
    ]
    assert rounds_to_target(history, 0.9) == 5


def test_a_grid_needs_three_nodes() -> None:
    """Below 3 nodes an axis cannot hold the origin and both ends: refused, not drawn."""
    with pytest.raises(ValueError, match=r"^grid must be >= 3, got 2$"):
        grid_axes(torch.tensor([[-1.0, 1.0], [1.0, -1.0]], dtype=torch.float64), 2, 0.25)


def test_every_metric_is_of_the_returned_predictive_at_the_bins_given(
    tiny_posteriors: TinyPosteriors, mnist5k_prepared: PreparedDir
) -> None:
    """``ece_bins`` reaches every binned metric (ece, adaptive and classwise ECE, the
    reliability bins, the samples table); ece15 stays at 15 bins. Catches a call that
    falls back to the default 20 bins, which the default itself cannot show."""
    post = load_posterior(tiny_posteriors.swag)
    test = mnist5k_prepared.prepared.test
    x, y = post.model_input(test.x[:300]), test.y[:300]
    found = evaluate(post, "swag", {"test": (x, y)}, n_samples=2, ece_bins=7)["test"]
    lp, m = found.log_probs, found.metrics
    expected = {
        "ece": ece(lp, y, 7),
        "ece15": ece(lp, y, 15),
        "ece_adaptive": adaptive_ece(lp, y, 7),
        "ece_classwise": classwise_ece(lp, y, 7),
        "nll": nll(lp, y),
        "brier": brier(lp, y),
    }
    for key, value in expected.items():
        assert m[key] == pytest.approx(float(value), rel=1e-12, abs=1e-15), key
        if key in found.by_samples[-1]:
            assert found.by_samples[-1][key] == m[key], key
    assert len(found.reliability.rows()) == 7


def test_ood_scores_need_their_reference_split(
    tiny_posteriors: TinyPosteriors, mnist5k_prepared: PreparedDir
) -> None:
    """An ``ood_reference`` that is not one of the splits is a clear ValueError before any
    network runs, not a KeyError from deep inside the accumulation."""
    post = load_posterior(tiny_posteriors.plain)
    test = mnist5k_prepared.prepared.test
    split = {"test": (post.model_input(test.x[:10]), test.y[:10])}
    for kwargs in ({"ood": {"other": post.model_input(test.x[:5])}}, {"point_scores": True}):
        with pytest.raises(ValueError, match=r"^ood_reference 'val' is not one of the splits$"):
            evaluate(post, "map", split, ood_reference="val", **kwargs)


def test_predictions_are_in_eval_mode_whatever_mode_the_model_is_in() -> None:
    """``log_softmax_predictions`` switches the model to eval mode (a model handed over
    straight from training is in train mode) and keeps dropout off unless asked: the
    same inputs give the same, deterministic log-probabilities of the eval-mode network."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.5), nn.Linear(16, 3))
        x = torch.randn(40, 6)
        with torch.no_grad():
            expected = torch.log_softmax(model.eval()(x).double(), 1)
        model.train()
        found = log_softmax_predictions(model, x, batch_size=16)
        assert torch.allclose(found, expected, rtol=0, atol=1e-6)
        sampled = log_softmax_predictions(model, x, 16, dropout=True)
    assert not torch.allclose(sampled, expected, rtol=0, atol=1e-3)


def test_a_network_is_never_drawn_twice() -> None:
    """Networks come from one sequential stream: asking again for network s (or an earlier
    one) would silently draw a new, different network, so it is refused."""
    drawn: list[int] = []

    def draw(s: int) -> tuple[torch.Tensor, None]:
        drawn.append(s)
        return torch.zeros(1), None

    network = _in_order(Draws(draw, None))
    network(1)
    network(3)
    assert drawn == [0, 1, 2]
    for again in (3, 2):
        with pytest.raises(ValueError, match=f"network {again} asked for after network 3"):
            network(again)
    assert drawn == [0, 1, 2]


def test_a_centre_with_its_own_buffers_keeps_them(
    bn_swag_posterior: Path, mnist5k_prepared: PreparedDir
) -> None:
    """``center_model``: BatchNorm is recomputed only for weights that come without
    buffers (§6); the last iterate's own running statistics are used as stored even
    when training inputs are at hand."""
    post = load_posterior(bn_swag_posterior)
    bn_x = post.model_input(mnist5k_prepared.prepared.train.x[:256])
    model = center_model(post, post.theta, post.buffers, bn_x, "cpu")
    own = dict(model.named_buffers())
    stats = [name for name in post.buffers if name.endswith(("running_mean", "running_var"))]
    assert stats
    for name in stats:
        assert torch.equal(own[name], post.buffers[name]), name
    recomputed = dict(center_model(post, post.theta, None, bn_x, "cpu").named_buffers())
    assert not torch.equal(recomputed[stats[0]], post.buffers[stats[0]])


def test_the_sharpness_of_an_ensemble_is_the_mean_over_its_members(
    short_starts: dict[str, PosteriorFile], mnist5k_prepared: PreparedDir
) -> None:
    """``centre_sharpness`` of several centres (an ensemble's members) averages both the
    SAM sharpness and tr(H) over them, each member's trace from the shared probe stream."""
    start, train = short_starts["pretrain"], mnist5k_prepared.prepared.train
    x, y = start.model_input(train.x[:64]), train.y[:64]
    found = centre_sharpness(
        start, "ensemble", x, y, bn_x=None, rho=0.05, probes=1, seed=3, device="cpu"
    )
    gen = torch.Generator().manual_seed(3)
    sam, traces = [], []
    for theta, buffers in centres(start, method_of("ensemble")):
        model = center_model(start, theta, buffers, None, "cpu")
        sam.append(sam_sharpness(model, x, y, 0.05, 1000))
        traces.append(hessian_trace(model, x, y, 1, gen, 1000).mean().item())
    assert len(traces) == 2 and traces[0] != traces[1]
    assert found["sharpness"] == pytest.approx(sum(sam) / 2, rel=1e-9)
    assert found["hessian_trace"] == pytest.approx(sum(traces) / 2, rel=1e-9)
