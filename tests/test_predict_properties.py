"""Seeded predictions: the seeds every stream derives from, the served predictor
(``bayesavg.predict``) and each further seed's predictions (``bayesavg.seeds.replicate``).

Other tests compute their expected values with ``derive_seed`` itself, so a change to it
goes unseen there: here its values are pinned (every stored result was drawn with them).
The served predictor and a replicated seed must predict what ``evaluate`` gives with the
evaluate stage's own seed, scale and sample count; ``seeds.replicate`` has no other fast
test (the pipeline's ``test_seeds`` is ``slow``).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch

from bayesavg.evaluation.evaluate import bn_inputs, evaluate
from bayesavg.posteriors.file import load_posterior
from bayesavg.predict import Predictor, PredictorConfig
from bayesavg.predictors.calibration import fit_temperature
from bayesavg.runtime.errors import UserError
from bayesavg.seeding import (
    derive_seed,
    generator,
    isolated_rng,
    resolve_device,
    rng_state,
    seed_everything,
    set_rng_state,
)

if TYPE_CHECKING:
    from pathlib import Path

    from conftest import PreparedDir, TinyPosteriors

    from bayesavg.config import Params

CPU = torch.device("cpu")


def test_derived_seeds_are_the_ones_every_stored_result_used() -> None:
    assert derive_seed(0, "evaluate", "swag") == 6616426915831439774
    assert derive_seed(7, "augment", 3) == 4309875677938409490
    assert derive_seed(0) == 2033344993903900207


def test_derived_seeds_are_63_bit_and_keep_the_names_apart() -> None:
    """Names are separated (1/23 is not 12/3) and the seed fits a signed 64-bit int."""
    seeds = [derive_seed(s, *names) for s in range(50) for names in ((), ("a",), (1, 2))]
    assert all(0 <= s < 2**63 for s in seeds) and len(set(seeds)) == len(seeds)
    assert max(seeds) >= 2**62, "63 bits are used"
    assert derive_seed(0, 1, 23) != derive_seed(0, 12, 3)
    assert derive_seed(1, 23) != derive_seed(12, 3)


def test_numpy_is_seeded_modulo_2_to_the_32() -> None:
    seed = 2**31 + 5
    np.random.seed(seed % 2**32)
    expected = np.random.rand(3)
    seed_everything(seed)
    assert np.array_equal(np.random.rand(3), expected)


def test_a_generator_is_seeded_with_its_seed() -> None:
    for seed in (1, 2):
        want = torch.rand(4, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(torch.rand(4, generator=generator(seed)), want)
    assert not torch.equal(
        torch.rand(4, generator=generator(1)), torch.rand(4, generator=generator(2))
    )


def test_isolated_rng_draws_from_the_seed_and_restores_the_outside_stream() -> None:
    torch.manual_seed(11)
    torch.rand(2)
    outside = torch.rand(3)
    torch.manual_seed(11)
    torch.rand(2)
    with isolated_rng(5):
        inside = torch.rand(3)
    assert torch.equal(inside, torch.rand(3, generator=torch.Generator().manual_seed(5)))
    assert torch.equal(torch.rand(3), outside)


def test_isolated_rng_on_the_cpu_seeds_no_gpu_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the streams it restores: ``torch.manual_seed`` would reseed every GPU for good
    (and, CUDA not initialised, queue a lazy seed with a stack trace each call)."""

    def refused(*args: object) -> None:
        raise AssertionError("a GPU stream was seeded")

    monkeypatch.setattr(torch.cuda, "manual_seed_all", refused)
    monkeypatch.setattr(torch.cuda, "manual_seed", refused)
    with isolated_rng(5):
        inside = torch.rand(3)
    assert torch.equal(inside, torch.rand(3, generator=torch.Generator().manual_seed(5)))


def test_an_rng_state_round_trips() -> None:
    state = rng_state(CPU)
    first = torch.rand(3)
    set_rng_state(state, CPU)
    assert torch.equal(torch.rand(3), first)


@pytest.mark.parametrize("name", ["meta", "mps"])
def test_devices_other_than_cpu_and_cuda_are_refused(name: str) -> None:
    with pytest.raises(
        UserError, match=rf"^device: '{name}' is not one of auto, cpu, cuda, cuda:N$"
    ):
        resolve_device(name)


def test_a_config_mapping_without_keys_takes_the_dataclass_defaults() -> None:
    assert PredictorConfig.from_mapping({"method": "swag"}) == PredictorConfig("swag")
    config = PredictorConfig("swag", scale=0.25, n_samples=7, seed=5, batch_size=64)
    assert PredictorConfig.from_mapping(config.as_mapping()) == config


def test_the_served_predictor_predicts_what_evaluate_gives_with_its_settings(
    tiny_posteriors: TinyPosteriors, mnist5k_prepared: PreparedDir
) -> None:
    config = PredictorConfig("swag", scale=0.25, n_samples=3, seed=5, batch_size=64)
    images = mnist5k_prepared.prepared.test.x[:10]
    got = Predictor(tiny_posteriors.swag, config)(images.numpy())["probabilities"]
    post = load_posterior(tiny_posteriors.swag)
    want = evaluate(
        post,
        "swag",
        {"t": (post.model_input(images), torch.zeros(10).long())},
        n_samples=3,
        scale=0.25,
        seed=5,
        batch_size=64,
    )["t"].log_probs.exp()
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-7)


@pytest.mark.parametrize(
    ("images", "expected"),
    [
        (np.zeros((2, 1, 28, 27), dtype=np.uint8), r"the network takes \(N, \*\(1, 28, 28\)\)"),
        (np.full((2, 1, 28, 28), 256.0), "integer pixel values 0-255"),
        (np.full((2, 1, 28, 28), 0.5), "integer pixel values 0-255"),
        (np.full((2, 1, 28, 28), -1.0), "integer pixel values 0-255"),
    ],
)
def test_the_served_predictor_refuses_other_images(
    tiny_posteriors: TinyPosteriors, images: np.ndarray, expected: str
) -> None:
    predictor = Predictor(tiny_posteriors.plain, PredictorConfig("map"))
    with pytest.raises(UserError, match=expected):
        predictor(images)


def test_batchnorm_images_are_needed_only_where_batchnorm_is_recomputed(
    bn_swag_posterior: Path,
) -> None:
    with pytest.raises(UserError, match=r"^predictor swag on a BatchNorm network needs training"):
        Predictor(bn_swag_posterior, PredictorConfig("swag"))
    served = Predictor(bn_swag_posterior, PredictorConfig("map"))
    out = served(np.zeros((2, 1, 28, 28), dtype=np.uint8))
    assert out["probabilities"].shape == (2, 10)


def _params(**evaluate: Any) -> Params:
    """The short runs' params with the swag trajectory's predictors: swag_diag (named
    apart from its trajectory), swa_ts (a fitted temperature), swag with its own S."""
    from pipeline_repo import small_params

    from bayesavg.config import parse_params

    raw = small_params(epochs=1, pretrain_epochs=1, members=2)
    raw["evaluate"].update(evaluate)
    raw["evaluate"]["predictors"] = {}
    raw["evaluate"]["predictors"]["swag"] = {
        "swag_diag": {"method": "swag_diag", "scale": 1.0},
        "swa_ts": {"method": "swa", "temperature": "fit"},
        "swag": {"method": "swag", "scale": 0.5, "n_samples": 3},
    }
    return parse_params(raw)


def _expected(post: Any, prepared: Any, name: str, split: str = "test", **kw: Any) -> Any:
    """What the evaluate stage computes for predictor ``name`` at seed 0 (stages/evaluate)."""
    part = prepared.test if split == "test" else prepared.val
    return evaluate(
        post,
        kw.pop("method"),
        {split: (post.model_input(part.x), part.y)},
        seed=derive_seed(0, "evaluate", name),
        **kw,
    )[split]


def test_a_replicated_seed_predicts_as_its_evaluate_stages(
    tiny_posteriors: TinyPosteriors, mnist5k_prepared: PreparedDir
) -> None:
    from bayesavg.seeds.replicate import predictions

    prepared = mnist5k_prepared.prepared
    post = load_posterior(tiny_posteriors.swag)
    params = _params(n_samples=4)
    got = predictions(params, prepared, {"swag": post}, CPU)
    assert set(got) == {"swag_diag", "swa_ts", "swag"}
    diag = _expected(post, prepared, "swag_diag", method="swag_diag", scale=1.0, n_samples=4)
    swag = _expected(post, prepared, "swag", method="swag", scale=0.5, n_samples=3)
    for name, want in (("swag_diag", diag), ("swag", swag)):
        assert got[name].log_probs.dtype == np.float32
        np.testing.assert_allclose(got[name].log_probs, want.log_probs.numpy(), atol=1e-6)
        assert got[name].metrics["nll"] == pytest.approx(float(want.metrics["nll"]), abs=1e-9)
    val = _expected(post, prepared, "swa_ts", "val", method="swa", n_samples=4)
    temperature = fit_temperature(val.log_probs, prepared.val.y)
    assert got["swa_ts"].metrics["temperature"] == temperature
    test = _expected(post, prepared, "swa_ts", method="swa", n_samples=4, temperature=temperature)
    np.testing.assert_allclose(got["swa_ts"].log_probs, test.log_probs.numpy(), atol=1e-6)


def test_a_replicated_seed_updates_batchnorm_on_the_stages_share(
    bn_swag_posterior: Path, mnist5k_prepared: PreparedDir
) -> None:
    from bayesavg.seeds.replicate import predict

    prepared = mnist5k_prepared.prepared
    post = load_posterior(bn_swag_posterior)
    params = _params(n_samples=2, bn_update_fraction=0.5)
    got = predict(params, "swag_diag", prepared, post, CPU)
    bn_x = bn_inputs(post, prepared.train, 0.5, 0, CPU)
    want = _expected(
        post, prepared, "swag_diag", method="swag_diag", scale=1.0, n_samples=2, bn_x=bn_x
    )
    np.testing.assert_allclose(got.log_probs, want.log_probs.numpy(), atol=1e-6)


def test_trajectories_run_after_the_one_they_start_from() -> None:
    from bayesavg.seeds.replicate import order

    params = _params()
    ran = order(params)
    assert sorted(ran) == sorted(params.finetune)
    for i, name in enumerate(ran):
        start = params.finetune[name].start
        assert start not in params.finetune or ran.index(start) < i, (name, start)
    assert any(params.finetune[n].start in params.finetune for n in ran), "a continuation"


def test_seed_everything_seeds_python_too() -> None:
    seed_everything(3)
    first = random.random()
    seed_everything(3)
    assert random.random() == first
