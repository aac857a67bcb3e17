"""Temperature scaling: the fit recovers a planted temperature and minimises the NLL."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import PreparedDir, TinyPosteriors

from bayesavg.evaluation.evaluate import evaluate
from bayesavg.posteriors.file import load_posterior
from bayesavg.predict import Predictor, PredictorConfig
from bayesavg.predictors.calibration import apply_temperature, fit_temperature, tempered_nll


def _planted(
    temperature: float, n: int = 20000, classes: int = 10, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits z and labels drawn from softmax(z / T): the true temperature is T."""
    gen = torch.Generator().manual_seed(seed)
    z = 3.0 * torch.randn(n, classes, generator=gen, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z / temperature, dim=-1), 1, generator=gen)[:, 0]
    return torch.log_softmax(z, dim=-1), y


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.5])
def test_the_fit_recovers_a_planted_temperature(temperature: float) -> None:
    log_probs, y = _planted(temperature)
    assert fit_temperature(log_probs, y) == pytest.approx(temperature, rel=0.05)


def test_the_fit_is_the_minimum_of_the_nll_on_a_grid() -> None:
    log_probs, y = _planted(1.7, n=3000, seed=1)
    fitted = fit_temperature(log_probs, y)
    best = tempered_nll(log_probs, y, fitted)
    grid = [math.exp(v / 100) for v in range(-300, 301)]
    assert best <= min(tempered_nll(log_probs, y, t) for t in grid) + 1e-9


def test_tempering_log_probs_is_tempering_logits() -> None:
    z = torch.randn(50, 7, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    tempered = apply_temperature(torch.log_softmax(z, dim=-1), 1.9)
    assert torch.allclose(tempered, torch.log_softmax(z / 1.9, dim=-1), atol=1e-12)
    assert torch.allclose(tempered.exp().sum(-1), torch.ones(50, dtype=torch.float64))


def test_a_degenerate_predictive_is_refused() -> None:
    """Always right with margin: the NLL keeps falling as T shrinks, to the bracket's edge."""
    z = torch.zeros(100, 3, dtype=torch.float64)
    z[:, 0] = 5.0
    with pytest.raises(ValueError, match="at the edge"):
        fit_temperature(torch.log_softmax(z, dim=-1), torch.zeros(100, dtype=torch.long))
    with pytest.raises(ValueError, match="not all finite"):
        fit_temperature(torch.full((4, 3), math.nan), torch.zeros(4, dtype=torch.long))


def test_a_tempered_map_and_its_served_model_agree(
    tiny_posteriors: TinyPosteriors, mnist5k_prepared: PreparedDir
) -> None:
    """``evaluate(temperature=T)`` of one network is ``apply_temperature`` of its predictive,
    the fit lowers the validation NLL, and the served model predicts with the same T."""
    data = mnist5k_prepared.prepared
    post = load_posterior(tiny_posteriors.plain)
    splits = {
        name: (post.model_input(part.x), part.y)
        for name, part in (("val", data.val), ("test", data.test))
    }
    plain = evaluate(post, "map", splits)
    temperature = fit_temperature(plain["val"].log_probs, data.val.y)
    assert (
        tempered_nll(plain["val"].log_probs, data.val.y, temperature) < plain["val"].metrics["nll"]
    )
    scaled = evaluate(post, "map", splits, temperature=temperature)
    expected = apply_temperature(plain["test"].log_probs, temperature)
    assert torch.allclose(scaled["test"].log_probs, expected, atol=1e-5)
    assert scaled["test"].metrics["nll"] == pytest.approx(
        tempered_nll(plain["test"].log_probs, data.test.y, temperature), abs=1e-5
    )
    served = Predictor(tiny_posteriors.plain, PredictorConfig("map", temperature=temperature))
    probs = served(data.test.x[:20].numpy())["probabilities"]
    assert np.allclose(probs, scaled["test"].log_probs[:20].exp().numpy(), atol=1e-6)
    config = PredictorConfig("map", temperature=temperature)
    assert PredictorConfig.from_mapping(config.as_mapping()) == config
