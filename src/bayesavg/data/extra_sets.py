"""The inputs predicted beside the clean test split: shifted test images and OOD images.

The pipeline's evaluate stages and ``bayesavg evaluate`` build them here, so
both shift the same test subset with the same seeds and read OOD sets the
same way; every posterior sample then predicts the clean split, every shift
and every OOD set in one forward pass (``bayesavg.evaluation.evaluate.evaluate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from ..runtime.errors import UserError
from ..seeding import derive_seed
from .datasets import Split
from .ood_data import OOD_SETS, load_ood
from .prepared import load_eval_split
from .shift import Shift


def shift_subset(test: Split, n_points: int, seed: int) -> Split:
    """The fixed seeded test images every shift transforms (all of them if ``n_points``
    is at least the split's size); the same subset for every predictor."""
    return test.random_subset(n_points, derive_seed(seed, "shift_subset"))


def shifted(images: torch.Tensor, shifts: Sequence[Shift], seed: int) -> dict[str, torch.Tensor]:
    """Each shift's version of ``images`` by its metrics name; corruptions seeded by ``seed``."""
    out = {}
    for s in shifts:
        try:
            out[s.name] = s.apply(images, derive_seed(seed, "shift"))
        except ValueError as err:
            raise UserError(f"shift {s.name}: {err}") from None
    return out


def ood_images(
    spec: str,
    input_shape: Sequence[int],
    raw_dir: str | Path,
    fractions: tuple[int, float, float],
    n_points: int | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """uint8 images of OOD set ``spec``: a packaged set (``OOD_SETS``) or a dataset spec's
    test split (``fashion_mnist``, ``imagefolder:<DIR>``); ``fractions`` are the (seed,
    test_fraction, val_fraction) that split a dataset spec. ``n_points``: a fixed seeded
    subset of that many (None: all)."""
    if spec in OOD_SETS:
        images = load_ood(spec)
    else:
        images = load_eval_split(spec, raw_dir, tuple(input_shape), "test", *fractions)  # type: ignore[arg-type]
    if tuple(images.x.shape[1:]) != tuple(input_shape):
        raise UserError(
            f"OOD set {spec}: images of shape {tuple(images.x.shape[1:])}, the network takes "
            f"{tuple(input_shape)}"
        )
    if n_points is not None:
        images = images.random_subset(n_points, derive_seed(seed, "ood_subset", spec))
    return images.x
