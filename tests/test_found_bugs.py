"""Source bugs a mutation audit found, each a test that fails until the source is fixed.

``PosteriorFile.validate`` promises to "check every block completely, so a bad file fails
at load, not half-way through use" (``posteriors/checks.py``: a malformed block "would
otherwise fail with a traceback deep inside sampling"). Two malformed files load:

- ``covers`` naming one parameter twice: ``validate`` counts it twice (the collector
  must hold 2 x 15 values) while ``covered_positions`` finds it once (15 positions), so
  SWAG sampling fails in ``index_copy_`` with an IndexError.
- ``samples.collectors`` beside ``samples.buffers: None``: ``check_samples`` returns at
  ``buffers is None`` before it looks at the collectors, so garbage collectors load, the
  file provides ``member_snapshots``, and MultiSWAG fails with a KeyError.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from bayesavg.models import build_model
from bayesavg.posteriors import SWAG
from bayesavg.posteriors.file import PosteriorFile, load_posterior, save_posterior
from bayesavg.runtime.errors import UserError

SHAPE = (1, 4, 4)


def _mlp_posterior() -> PosteriorFile:
    """An MLP on 1x4x4 inputs: parameters 1.weight, 1.bias, 4.weight (3 x 5), 4.bias."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build_model("mlp", SHAPE, 3, {"hidden": [5]})
    return PosteriorFile.from_model(
        model,
        trajectory="swag",
        model_name="mlp",
        model_kwargs={"hidden": [5]},
        input_shape=SHAPE,
        mean=[0.5],
        std=[0.25],
        num_classes=3,
        data={"dataset": "mnist5k", "seed": 0, "test_fraction": 0.2, "val_fraction": 0.1},
    )


def test_covers_naming_a_parameter_twice_is_refused_at_load(tmp_path: Path) -> None:
    post = _mlp_posterior()
    swag = SWAG(30, max_rank=2)  # what validate expects for the name counted twice
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        swag.collect(torch.randn(30, generator=gen))
    bad = dataclasses.replace(post, covers=["4.weight", "4.weight"], collector=swag.state_dict())
    save_posterior(tmp_path / "posterior.pt", bad)
    with pytest.raises(UserError, match=r": covers "):
        load_posterior(tmp_path / "posterior.pt")


def test_member_collectors_are_checked_when_the_samples_have_no_buffers(tmp_path: Path) -> None:
    post = _mlp_posterior()
    samples = {
        "theta": torch.stack([post.theta, post.theta]),
        "buffers": None,
        "collectors": [{"junk": 1}, "not a dict"],
    }
    bad = dataclasses.replace(post, trajectory="multiswag", samples=samples)
    save_posterior(tmp_path / "posterior.pt", bad)
    with pytest.raises(UserError, match=r": samples\.collectors"):
        load_posterior(tmp_path / "posterior.pt")
