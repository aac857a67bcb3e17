"""Shifted and OOD inputs: the same subset and seeds everywhere, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bayesavg.data.datasets import Split
from bayesavg.data.extra_sets import ood_images, shift_subset, shifted
from bayesavg.data.shift import parse, rotate, shifts
from bayesavg.runtime.errors import UserError
from bayesavg.runtime.io import write_npz


def _split(n: int = 30) -> Split:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
    return Split(x, torch.arange(n) % 10)


def test_shift_subset_is_fixed_by_the_seed_and_keeps_labels() -> None:
    test = _split()
    a, b = shift_subset(test, 10, 0), shift_subset(test, 10, 0)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(a.x, shift_subset(test, 10, 1).x)
    assert len(shift_subset(test, 100, 0)) == len(test)
    rows = [int(torch.nonzero((test.x == img).all(dim=(1, 2, 3)))[0]) for img in a.x]
    assert torch.equal(test.y[rows], a.y)


def test_shifted_applies_each_shift_under_its_name() -> None:
    images = _split(5).x
    out = shifted(images, shifts([0.0, 90.0], ["shot_noise"]), seed=3)
    assert list(out) == ["rotate_0", "rotate_90", "shot_noise"]
    assert torch.equal(out["rotate_0"], images)
    assert torch.equal(out["rotate_90"], rotate(images, 90.0))
    again = shifted(images, [parse("shot_noise")], seed=3)["shot_noise"]
    assert torch.equal(out["shot_noise"], again)
    assert not torch.equal(shifted(images, [parse("shot_noise")], seed=4)["shot_noise"], again)


def test_ood_images_subset_and_shape_check() -> None:
    full = ood_images("animal_mnist", (1, 28, 28), "unused", (0, 0.2, 0.2))
    assert full.shape == (10000, 1, 28, 28) and full.dtype == torch.uint8
    part = ood_images("animal_mnist", (1, 28, 28), "unused", (0, 0.2, 0.2), 50, seed=1)
    assert torch.equal(part, ood_images("animal_mnist", (1, 28, 28), "", (0, 0.2, 0.2), 50, 1))
    assert part.shape[0] == 50
    with pytest.raises(UserError, match="OOD set animal_mnist: images of shape"):
        ood_images("animal_mnist", (3, 32, 32), "unused", (0, 0.2, 0.2))


def test_write_npz_is_byte_identical_and_loads_without_pickle(tmp_path) -> None:
    arrays = {"b": np.eye(3), "a.x": np.arange(4, dtype=np.float32)}
    write_npz(tmp_path / "one.npz", arrays)
    write_npz(tmp_path / "two.npz", dict(reversed(arrays.items())))
    assert (tmp_path / "one.npz").read_bytes() == (tmp_path / "two.npz").read_bytes()
    with np.load(tmp_path / "one.npz", allow_pickle=False) as found:
        assert sorted(found.files) == ["a.x", "b"]
        assert np.array_equal(found["a.x"], arrays["a.x"]) and found["a.x"].dtype == np.float32
