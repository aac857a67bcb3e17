"""CIFAR-10-C corruptions: each runs at every severity, is seeded, grows with severity as the
benchmark's parameters say, and the official arrays load by severity block."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bayesavg.data.cifar_c import (
    ALL,
    EXTRA,
    FROST_FILES,
    OFFICIAL,
    PARAMS,
    STANDARD,
    corrupt,
    official,
    official_hint,
)

SEVERITIES = (1, 2, 3, 4, 5)
# Corruptions that draw random numbers (motion blur: its angle; fog: its fractal)
RANDOM = (
    "gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "glass_blur",
    "motion_blur", "snow", "frost", "fog", "spatter", "elastic_transform",
)  # fmt: skip
# Where make_cifar_c.py's parameters do not grow monotonically, so neither does the change:
NOT_MONOTONE = {
    "glass_blur": "severity 4 is sigma 0.25 with two shuffles after 3's sigma 0.4 with one",
    "snow": "zoom 1, 1, 1.75, 2.25, 1.25 and threshold 0.6, 0.5, 0.55, 0.6, 0.65",
    "frost": "the image's weight falls (1 .. 0.75) as the frost's rises (0.2 .. 0.45)",
    "spatter": "severities 1-3 are water, 4-5 mud",
    "saturate": "saturation x0.3, x0.1 (greyer), then x1.5, x2+0.1, x2.5+0.2",
    "elastic_transform": "affine jitter falls from 8% to 3% of the side as the field grows",
}
# elastic_transform is the one where severity 5 changes the image LESS than severity 1: its
# severity 1 is a pure affine jitter of up to 2.56 px, severity 5 a 0.96 px jitter plus a
# local displacement of ~0.5 px rms (alpha 3.2 px on noise smoothed with sigma 0.96 px).
FIVE_BELOW_ONE = {"elastic_transform"}


def _images(n: int = 6, size: int = 32, seed: int = 0) -> torch.Tensor:
    """Smooth luminance ramps in random directions, a mild colour cast, pixel noise (std 8)."""
    g = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / (size - 1)
    out = []
    for _ in range(n):
        a = g.uniform(0, 2 * np.pi)
        ramp = np.cos(a) * xx + np.sin(a) * yy
        lum = 50 + 150 * (ramp - ramp.min()) / np.ptp(ramp)
        out.append(lum[..., None] + g.uniform(-30, 30, size=3) + g.normal(0, 8, (size, size, 3)))
    return torch.from_numpy(np.clip(np.stack(out), 0, 255).astype(np.uint8)).permute(0, 3, 1, 2)


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return _images()


@pytest.fixture(scope="module")
def outputs(images: torch.Tensor) -> dict[tuple[str, int], torch.Tensor]:
    """Every corruption at every severity with seed 0, computed once."""
    return {(n, s): corrupt(images, n, s, seed=0) for n in ALL for s in SEVERITIES}


def _change(x: torch.Tensor, y: torch.Tensor) -> float:
    return (y.float() - x.float()).abs().mean().item()


def test_names_and_parameters_are_the_benchmarks() -> None:
    assert STANDARD[:4] == ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur")
    assert STANDARD[-3:] == ("elastic_transform", "pixelate", "jpeg_compression")
    assert len(STANDARD) == 15 and EXTRA == (
        "speckle_noise",
        "gaussian_blur",
        "spatter",
        "saturate",
    )
    assert ALL == STANDARD + EXTRA and set(PARAMS) == set(ALL)
    assert all(len(PARAMS[n]) == 5 for n in ALL)
    # spot checks of CIFAR's constants (ImageNet-C's differ): noise, blur, jpeg
    assert PARAMS["gaussian_noise"] == (0.04, 0.06, 0.08, 0.09, 0.10)
    assert PARAMS["motion_blur"][4] == (9, 2.5) and PARAMS["jpeg_compression"][0] == 80
    assert len(PARAMS["zoom_blur"][0]) == 7  # np.arange(1, 1.06, 0.01) ends at 1.06


def test_every_corruption_keeps_shape_and_dtype(images, outputs) -> None:
    for (name, severity), y in outputs.items():
        assert y.shape == images.shape == (6, 3, 32, 32), (name, severity)
        assert y.dtype == torch.uint8, (name, severity)
        assert not torch.equal(y, images), (name, severity)


@pytest.mark.parametrize("name", RANDOM)
def test_same_seed_same_output_other_seed_other_output(images, outputs, name) -> None:
    assert torch.equal(corrupt(images, name, 3, seed=0), outputs[name, 3])
    assert not torch.equal(corrupt(images, name, 3, seed=1), outputs[name, 3])


@pytest.mark.parametrize("name", sorted(set(ALL) - set(RANDOM)))
def test_deterministic_corruptions_ignore_the_seed(images, outputs, name) -> None:
    assert torch.equal(corrupt(images, name, 3, seed=7), outputs[name, 3])


@pytest.mark.parametrize("name", ALL)
def test_change_grows_with_severity(images, outputs, name) -> None:
    change = [_change(images, outputs[name, s]) for s in SEVERITIES]
    if name in FIVE_BELOW_ONE:
        assert change[4] < change[0], change
    else:
        assert change[4] > change[0], change
    if name not in NOT_MONOTONE:
        # non-strict: motion blur's severities 3 and 4, (6, 2) and (8, 2), differ only in
        # taps of weight ~1e-9, so they tie
        assert all(b >= a for a, b in itertools.pairwise(change)), change


def test_noise_is_the_benchmarks_formula_with_truncation() -> None:
    """Same draws as numpy's Generator(seed), clipped to [0, 1], times 255, truncated."""
    x = _images(n=1)
    img = x[0].permute(1, 2, 0).numpy() / 255.0
    noise = np.random.default_rng(5).normal(size=img.shape, scale=0.10)
    want = (np.clip(img + noise, 0, 1) * 255).astype(np.uint8)
    got = corrupt(x, "gaussian_noise", 5, seed=5)[0].permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(got, want)
    shot = np.random.default_rng(5).poisson(img * 500) / 500
    want = (np.clip(shot, 0, 1) * 255).astype(np.uint8)
    got = corrupt(x, "shot_noise", 1, seed=5)[0].permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("size", [16, 64])
def test_other_square_sizes_work(size) -> None:
    x = _images(n=1, size=size)
    for name in ALL:
        y = corrupt(x, name, 5, seed=0)
        assert y.shape == x.shape and y.dtype == torch.uint8, name


@pytest.mark.parametrize(
    ("name", "severity", "match"),
    [
        ("gaussian", 1, "unknown corruption 'gaussian'; allowed: gaussian_noise, shot_noise"),
        ("fog", 0, "severity must be one of 1, 2, 3, 4, 5; got 0"),
        ("fog", 6, "severity must be one of 1, 2, 3, 4, 5; got 6"),
        ("fog", 2.5, "severity"),
        ("fog", True, "severity"),
    ],
)
def test_bad_name_or_severity_is_one_clear_line(images, tmp_path, name, severity, match) -> None:
    for call in (
        lambda: corrupt(images, name, severity, seed=0),
        lambda: official(tmp_path, "cifar10", name, severity),
    ):
        with pytest.raises(ValueError, match=match) as err:
            call()
        assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "x",
    [
        torch.zeros(2, 3, 32, 32),  # float
        torch.zeros(2, 1, 32, 32, dtype=torch.uint8),  # one channel
        torch.zeros(3, 32, 32, dtype=torch.uint8),  # no batch
        torch.zeros(2, 3, 32, 24, dtype=torch.uint8),  # not square
        torch.zeros(2, 3, 4, 4, dtype=torch.uint8),  # too small
    ],
)
def test_bad_images_are_refused(x) -> None:
    with pytest.raises(ValueError, match="corrupt needs"):
        corrupt(x, "contrast", 1, seed=0)


@pytest.mark.parametrize("seed", [None, 1.5, "0"])
def test_seed_must_be_an_integer(images, seed) -> None:
    with pytest.raises(ValueError, match="integer seed"):
        corrupt(images, "gaussian_noise", 1, seed=seed)


def test_frost_uses_photographs_from_frost_dir(images, tmp_path) -> None:
    """Five flat "photographs" (value 20 + 40k): each output is c0 * x + c1 * one of them."""
    values = [20 + 40 * k for k in range(5)]
    for name, v in zip(FROST_FILES, values, strict=True):
        # PIL reads by content, so PNG data under a .jpg name keeps the values exact
        Image.fromarray(np.full((200, 210, 3), v, dtype=np.uint8)).save(tmp_path / name, "PNG")
    c0, c1 = PARAMS["frost"][4]
    y = corrupt(images, "frost", 5, seed=0, frost_dir=tmp_path)
    for xi, yi in zip(images.numpy(), y.numpy(), strict=True):
        candidates = [np.clip(c0 * xi + c1 * v, 0, 255).astype(np.uint8) for v in values]
        assert any(np.array_equal(yi, c) for c in candidates)
    assert torch.equal(y, corrupt(images, "frost", 5, seed=0, frost_dir=tmp_path))


def test_frost_without_photographs_warns_and_synthesises(images, outputs, tmp_path) -> None:
    with pytest.warns(UserWarning, match="synthetic texture"):
        y = corrupt(images, "frost", 2, seed=0, frost_dir=tmp_path)
    assert torch.equal(y, outputs["frost", 2])


def _fake_official(root: Path, folder: str, name: str, n: int = 10) -> np.ndarray:
    """n images (5 severities x n/5), image i filled with 10 i + channel; labels i % 3."""
    d = root / folder
    d.mkdir(parents=True, exist_ok=True)
    imgs = (10 * np.arange(n)[:, None, None, None] + np.arange(3)).astype(np.uint8)
    np.save(d / f"{name}.npy", np.broadcast_to(imgs, (n, 32, 32, 3)).copy())
    np.save(d / "labels.npy", (np.arange(n) % 3).astype(np.uint8))
    return imgs


def test_official_is_none_without_the_arrays(tmp_path) -> None:
    assert official(tmp_path, "cifar10", "fog", 1) is None
    _fake_official(tmp_path, "CIFAR-10-C", "fog")
    assert official(tmp_path, "cifar10", "snow", 1) is None  # another corruption's file
    assert official(tmp_path, "cifar100", "fog", 1) is None  # another data set's folder


@pytest.mark.parametrize(
    ("dataset", "folder"), [("cifar10", "CIFAR-10-C"), ("cifar100", "CIFAR-100-C")]
)
def test_official_picks_the_severity_block(tmp_path, dataset, folder) -> None:
    _fake_official(tmp_path, folder, "glass_blur")
    for s in SEVERITIES:
        got = official(tmp_path, dataset, "glass_blur", s)
        assert got is not None
        x, y = got
        assert x.shape == (2, 3, 32, 32) and x.dtype == torch.uint8 and x.is_contiguous()
        index = torch.tensor([2 * (s - 1), 2 * (s - 1) + 1])
        want = (10 * index[:, None, None, None] + torch.arange(3)[:, None, None]).expand(
            2, 3, 32, 32
        )
        assert torch.equal(x, want.to(torch.uint8))
        assert y.dtype == torch.int64 and torch.equal(y, index % 3)


def test_official_refuses_malformed_arrays(tmp_path) -> None:
    d = tmp_path / "CIFAR-10-C"
    d.mkdir()
    np.save(d / "fog.npy", np.zeros((9, 32, 32, 3), dtype=np.uint8))  # not 5 blocks
    np.save(d / "labels.npy", np.zeros(9, dtype=np.uint8))
    with pytest.raises(ValueError, match="expected uint8"):
        official(tmp_path, "cifar10", "fog", 1)
    with pytest.raises(ValueError, match="allowed: cifar10, cifar100"):
        official(tmp_path, "svhn", "fog", 1)


def test_official_hint_and_archives(tmp_path) -> None:
    hint = official_hint(tmp_path, "cifar100")
    assert "\n" not in hint and "zenodo.org/records/3555552" in hint
    assert OFFICIAL["cifar100"].md5 in hint and str(tmp_path / "CIFAR-100-C") in hint
    assert OFFICIAL["cifar10"].url.startswith("https://zenodo.org/records/2535967/")
    assert all(len(a.md5) == 32 for a in OFFICIAL.values())
