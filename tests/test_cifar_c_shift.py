"""CIFAR-10-C as the evaluation's shift (issue 29 §3): the shifts' names and seeds, the
official arrays taken for exactly the shifted test images, and the report's aggregates."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from test_report import _inputs

from bayesavg.data import cifar_c
from bayesavg.data.datasets import Split
from bayesavg.data.extra_sets import official_cifar_c, shift_subset, shifted, subset_positions
from bayesavg.data.shift import Shift, parse, parse_many, shifts
from bayesavg.report.inputs import PredictorResult
from bayesavg.report.render import to_markdown
from bayesavg.report.sections import corrupted
from bayesavg.report.sections.shift.measures import corruptions
from bayesavg.report.uncertainty import compute
from bayesavg.runtime.errors import UserError
from bayesavg.seeding import derive_seed, generator


def _images(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=gen)


def test_every_corruption_at_every_severity_is_a_named_shift() -> None:
    found = shifts(angles=(), corruptions=(), cifar_c=["all"])
    assert len(found) == 19 * 5
    assert [s.name for s in found[:5]] == [f"c_gaussian_noise_{k}" for k in range(1, 6)]
    assert all(parse(s.name) == s for s in found)  # names read back
    assert [s.name for s in parse_many(["cifar-c"])] == [s.name for s in found]
    standard = shifts(angles=(), corruptions=(), cifar_c=["standard"], cifar_c_severities=[2])
    assert [s.cifar_c for s in standard] == list(cifar_c.STANDARD)
    both = shifts(angles=(), corruptions=["shot_noise"], cifar_c=["shot_noise"])
    assert [s.name for s in both] == ["shot_noise", *(f"c_shot_noise_{k}" for k in range(1, 6))]
    with pytest.raises(ValueError, match="unknown corruption 'smog'"):
        shifts(angles=(), corruptions=(), cifar_c=["smog"])


def test_a_cifar_c_shift_is_seeded_per_corruption_and_severity() -> None:
    x = _images(4)
    fog = Shift("c_fog", 3)
    out = fog.apply(x, 7)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    assert torch.equal(out, cifar_c.corrupt(x, "fog", 3, derive_seed(7, "c_fog", 3)))
    assert torch.equal(out, fog.apply(x, 7)) and not torch.equal(out, fog.apply(x, 8))
    noise = [Shift("c_gaussian_noise", k).apply(x, 7) for k in (1, 5)]
    assert (noise[1].float() - x.float()).abs().mean() > (noise[0].float() - x.float()).abs().mean()


def test_grey_images_get_one_line_not_a_traceback() -> None:
    grey = torch.zeros(2, 1, 28, 28, dtype=torch.uint8)
    with pytest.raises(UserError, match=r"^shift c_fog_1: ") as err:
        shifted(grey, [Shift("c_fog", 1)], 0)
    assert "\n" not in str(err.value)


def _official(tmp_path: Path, n: int) -> tuple[Path, np.ndarray, np.ndarray]:
    """A fake CIFAR-10-C: fog at 5 severities of ``n`` images, and their labels."""
    folder = tmp_path / "CIFAR-10-C"
    folder.mkdir()
    rng = np.random.default_rng(0)
    fog = rng.integers(0, 256, (5 * n, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 5 * n).astype(np.int64)
    labels[n:] = np.tile(labels[:n], 4)
    np.save(folder / "fog.npy", fog)
    np.save(folder / "labels.npy", labels)
    return tmp_path, fog, labels


def test_the_official_arrays_serve_exactly_the_shifted_test_images(tmp_path: Path) -> None:
    """The data stage stores the official test split in a seeded order and the shift
    takes a seeded subset of it: the official images of those very test images are used."""
    n, seed, k = 12, 3, 5
    raw, fog, labels = _official(tmp_path, n)
    order = torch.randperm(n, generator=generator(derive_seed(seed, "order", "test")))
    test = Split(_images(n), torch.from_numpy(labels[:n])[order])  # as prepared stores it
    subset = shift_subset(test, k, seed)
    positions = subset_positions(n, k, seed)
    assert torch.equal(test.y[positions], subset.y)
    images, served = official_cifar_c(raw, "cifar10", seed, test, positions)
    got = shifted(subset.x, [Shift("c_fog", 2), Shift("c_snow", 2)], seed, images)
    expected = torch.from_numpy(fog[n : 2 * n]).permute(0, 3, 1, 2)[order[positions]]
    assert torch.equal(got["c_fog_2"], expected)
    assert served == ["c_fog_2"]  # snow has no array: generated
    assert torch.equal(
        got["c_snow_2"], Shift("c_snow", 2).apply(subset.x, derive_seed(seed, "shift"))
    )
    wrong = Split(test.x, (test.y + 1) % 10)
    images, _ = official_cifar_c(raw, "cifar10", seed, wrong, positions)
    with pytest.raises(UserError, match="published order"):
        images(Shift("c_fog", 2))
    none, served = official_cifar_c(raw, "mnist5k", seed, test, positions)
    assert none(Shift("c_fog", 2)) is None and served == []


@pytest.mark.parametrize("damage", ["truncated", "pickled", "float"])
def test_a_damaged_official_array_is_one_line_naming_it(tmp_path: Path, damage: str) -> None:
    """An interrupted unpack or another array in CIFAR-10-C/ is a UserError naming the file
    and the archive to unpack again, not numpy's traceback."""
    n, seed = 12, 3
    raw, fog, labels = _official(tmp_path, n)
    path = raw / "CIFAR-10-C" / "fog.npy"
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:5000])
    elif damage == "pickled":
        np.save(path, np.array([{"not": "images"}], dtype=object), allow_pickle=True)
    else:
        np.save(path, fog.astype(np.float32))
    test = Split(_images(n), torch.from_numpy(labels[:n]))
    images, _ = official_cifar_c(raw, "cifar10", seed, test, torch.arange(4))
    with pytest.raises(UserError) as err:
        images(Shift("c_fog", 2))
    line = str(err.value)
    assert "\n" not in line and "fog.npy or labels.npy is unreadable" in line
    assert "zenodo" in line and "there again" in line


def _with_cifar_c(p: PredictorResult, offset: float) -> None:
    shift = {"rotate_90": {"accuracy": 0.5, "nll": 2.0, "ece": 0.1, "brier": 0.6, "entropy": 1}}
    for name in ("fog", "snow"):
        for level in range(1, 6):
            shift[f"c_{name}_{level}"] = {
                "accuracy": 0.9 - 0.1 * level,
                "nll": offset + 0.2 * level + (0.1 if name == "snow" else 0.0),
                "ece": 0.01 * level,
                "brier": 0.1,
                "entropy": 0.5,
            }
    p.metrics["shift"] = shift
    p.metrics["cifar_c_official"] = ["c_fog_1"]


def test_the_report_aggregates_cifar_c_by_severity_and_overall() -> None:
    inputs = _inputs()
    for i, p in enumerate(inputs.predictors):
        _with_cifar_c(p, 0.1 * i)
    base = inputs.predictors[0]
    levels = corrupted.by_severity(base)
    assert sorted(levels) == [1, 2, 3, 4, 5]
    assert levels[3]["nll"] == pytest.approx([0.6, 0.7])
    assert corrupted.corrupted(base, "nll") == pytest.approx(
        np.mean([0.2 * k for k in range(1, 6)]) + 0.05
    )
    assert corruptions(base) == []  # CIFAR-10-C is not in the MNIST-C shift table
    section = corrupted.build(inputs, compute(inputs))
    text = to_markdown(section.blocks)
    assert "2 corruptions at severities 1, 2, 3, 4, 5" in text
    assert "the published arrays for 1 of 10" in text
    assert not math.isnan(corrupted.corrupted(base, "accuracy"))
    assert corrupted.build(_inputs(), compute(_inputs())).blocks == []
