"""Real image sizes: resize + centre crop at load, and the random resized crop on the
device (issue "Bring your own network and data" §3)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import RandomResizedCrop
from torchvision.transforms.v2 import functional as F

from bayesavg.data.datasets import load_imagefolder
from bayesavg.data.prepared import prepare
from bayesavg.data.resize import resize_crop, resize_size_for
from bayesavg.training.augment import ATTEMPTS, Augment, EpochDraws, _boxes, apply, draw_epoch


def _images(n: int = 6, h: int = 24, w: int = 24, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, h, w), generator=g, dtype=torch.uint8)


def _full_box(n: int) -> torch.Tensor:
    """Every try: scale 1, ratio 1 (the middle of log 3/4 .. log 4/3), at (0, 0)."""
    box = torch.zeros(n, ATTEMPTS, 4)
    box[..., 0], box[..., 1] = 1.0 - 1e-7, 0.5
    return box


def test_a_whole_image_box_is_the_image_and_its_flip() -> None:
    x = _images()
    flip = torch.tensor([False, True] * 3)
    zeros = torch.zeros(6, dtype=torch.int64)
    draws = EpochDraws(zeros, zeros, flip, _full_box(6))
    out = apply(x, draws, Augment(flip=True, resized_crop=True))
    assert torch.equal(out[~flip], x[~flip])
    assert torch.equal(out[flip], x[flip].flip(-1))


def test_a_box_matches_torchvision_resized_crop_inside_the_image() -> None:
    """A 12x12 box at (4, 6) upsampled to 24x24: torchvision's ``resized_crop`` (bilinear,
    no antialias) gives the same pixels, up to rounding, away from the box's edges
    (there torchvision clamps at the box, this crop reads the neighbouring pixels)."""
    x = _images(2)
    torch.manual_seed(0)
    h = w = 12
    scale = h * w / (24 * 24)
    box = torch.zeros(2, ATTEMPTS, 4)
    box[..., 0] = (scale - 0.08) / 0.92
    box[..., 1] = 0.5
    box[..., 2] = 4 / (24 - h + 1) + 1e-6
    box[..., 3] = 6 / (24 - w + 1) + 1e-6
    assert _boxes(box.double(), 24, 24).tolist() == [[4.0, 6.0, 12.0, 12.0]] * 2
    zeros = torch.zeros(2, dtype=torch.int64)
    ours = apply(x, EpochDraws(zeros, zeros, zeros.bool(), box), Augment(resized_crop=True))
    theirs = F.resized_crop(x, 4, 6, h, w, [24, 24], antialias=False)
    inner = (slice(None), slice(None), slice(2, -2), slice(2, -2))
    assert (ours[inner].int() - theirs[inner].int()).abs().max() <= 1


def test_boxes_follow_the_scale_and_ratio_ranges() -> None:
    draws = draw_epoch(4000, Augment(resized_crop=True), torch.Generator().manual_seed(3))
    assert draws.box is not None
    top, left, h, w = _boxes(draws.box.double(), 32, 48).unbind(1)
    assert (h >= 1).all() and (w >= 1).all() and (top + h <= 32).all() and (left + w <= 48).all()
    area = h * w / (32 * 48)
    assert area.min() >= 0.07 and area.max() <= 1.0
    ratio = w / h
    fits = (ratio >= 3 / 4 * 0.9) & (ratio <= 4 / 3 * 1.1)
    assert fits.float().mean() > 0.99  # rounding to whole pixels bends the smallest boxes
    # the same distribution as torchvision's own draws (tries that do not fit are
    # rejected, so large boxes of extreme ratios are rarer than a uniform scale says)
    torch.manual_seed(0)
    image = torch.zeros(3, 32, 48)
    theirs = [RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(4000)]
    their_area = torch.tensor([b[2] * b[3] / (32 * 48) for b in theirs], dtype=torch.float64)
    for q in (0.1, 0.5, 0.9):
        assert math.isclose(area.quantile(q), their_area.quantile(q), abs_tol=0.03), q


def test_resized_crop_is_seeded_and_leaves_other_settings_bitwise() -> None:
    x = _images()
    aug = Augment(flip=True, resized_crop=True)
    a = apply(x, draw_epoch(6, aug, torch.Generator().manual_seed(5)), aug)
    b = apply(x, draw_epoch(6, aug, torch.Generator().manual_seed(5)), aug)
    c = apply(x, draw_epoch(6, aug, torch.Generator().manual_seed(6)), aug)
    assert torch.equal(a, b) and not torch.equal(a, c)
    plain = Augment(flip=True)  # the draws before the boxes are unchanged
    d1 = draw_epoch(6, plain, torch.Generator().manual_seed(5))
    d2 = draw_epoch(6, aug, torch.Generator().manual_seed(5))
    assert torch.equal(d1.flip, d2.flip) and d1.box is None
    with pytest.raises(ValueError, match="one crop or the other"):
        Augment(crop_padding=2, resized_crop=True)


def test_resize_crop_keeps_the_aspect_and_takes_the_centre() -> None:
    x = torch.zeros(1, 3, 40, 80, dtype=torch.uint8)
    x[..., 20:60] = 200  # the middle square of a 2:1 image
    out = resize_crop(x, 20, 20)  # shorter side 40 -> 20, then the central 20 x 20
    assert out.shape == (1, 3, 20, 20)
    assert out[..., 2:-2].float().mean() == 200
    assert resize_size_for(224) == 256 and resize_size_for(224, 232 / 224) == 232


def test_an_imagefolder_of_mixed_sizes_is_fitted(tmp_path: Path) -> None:
    for label, size in enumerate([(50, 70), (64, 64), (90, 40)]):
        (tmp_path / str(label)).mkdir()
        for i in range(2):
            pixels = np.full((*size, 3), 40 * label + i, dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / str(label) / f"{i}.png")
    split, classes = load_imagefolder(tmp_path, fit=(36, 32))
    assert classes == 3 and split.x.shape == (6, 3, 32, 32)
    assert split.x[split.y == 2].unique().tolist() == [80, 81]


def test_prepare_fits_and_normalises_as_asked(tmp_path: Path) -> None:
    for label in range(3):
        (tmp_path / "img" / str(label)).mkdir(parents=True)
        for i in range(10):
            pixels = np.full((30, 40, 3), 20 * label + i, dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "img" / str(label) / f"{i}.png")
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    data = prepare(
        f"imagefolder:{tmp_path / 'img'}",
        tmp_path,
        tmp_path / "out",
        0,
        0.2,
        0.2,
        (18, 16),
        (mean, std),
    )
    assert data.input_shape == (3, 16, 16)
    assert data.manifest["mean"] == mean and data.manifest["std"] == std
    assert (data.manifest["resize_size"], data.manifest["image_size"]) == (18, 16)
