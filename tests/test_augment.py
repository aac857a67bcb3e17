"""On-device augmentation against torchvision's own crop and flip."""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms.functional as F

from bayesavg.augment import Augment, EpochDraws, apply, draw_epoch


def _images(n: int, shape: tuple[int, int, int], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8)


def _torchvision(img: torch.Tensor, top: int, left: int, flip: bool, padding: int) -> torch.Tensor:
    """RandomCrop(H, padding=p) (constant zero fill) then RandomHorizontalFlip, for given
    offsets and flip."""
    _, height, width = img.shape
    out = F.crop(F.pad(img, padding, fill=0), top, left, height, width) if padding else img
    return F.hflip(out) if flip else out


@pytest.mark.parametrize(
    ("shape", "augment"),
    [
        ((3, 32, 32), Augment(4, True)),
        ((1, 28, 28), Augment(4, True)),
        ((3, 32, 32), Augment(0, True)),
        ((3, 32, 32), Augment(2, False)),
    ],
)
def test_each_image_is_torchvisions_crop_and_flip(shape, augment: Augment) -> None:
    x = _images(64, shape)
    draws = draw_epoch(64, augment, torch.Generator().manual_seed(1))
    out = apply(x, draws, augment)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    for i in range(64):
        ref = _torchvision(
            x[i], int(draws.top[i]), int(draws.left[i]), bool(draws.flip[i]), augment.crop_padding
        )
        assert torch.equal(out[i], ref), i


def test_offsets_cover_all_81_positions_and_both_flips() -> None:
    draws = draw_epoch(5000, Augment(4, True), torch.Generator().manual_seed(0))
    positions = set(zip(draws.top.tolist(), draws.left.tolist(), strict=True))
    assert positions == {(t, left) for t in range(9) for left in range(9)}
    assert 0.45 < draws.flip.double().mean().item() < 0.55


def test_the_same_seed_draws_the_same_offsets() -> None:
    a = draw_epoch(100, Augment(4, True), torch.Generator().manual_seed(3))
    b = draw_epoch(100, Augment(4, True), torch.Generator().manual_seed(3))
    assert all(torch.equal(u, v) for u, v in zip(vars(a).values(), vars(b).values(), strict=True))


def test_the_stream_does_not_depend_on_the_flags() -> None:
    """Active augmentations draw top, left and flip alike: the offsets of crop-only and
    crop+flip runs with one seed are the same."""
    a = draw_epoch(50, Augment(4, False), torch.Generator().manual_seed(5))
    b = draw_epoch(50, Augment(4, True), torch.Generator().manual_seed(5))
    assert torch.equal(a.top, b.top) and torch.equal(a.left, b.left)
    assert not a.flip.any()


def test_inactive_augmentation_returns_the_input_and_draws_nothing() -> None:
    gen = torch.Generator().manual_seed(9)
    state = gen.get_state()
    draws = draw_epoch(10, Augment(), gen)
    assert torch.equal(gen.get_state(), state)
    x = _images(10, (3, 8, 8))
    assert apply(x, draws, Augment()) is x


def test_minibatch_draws_are_the_epochs_rows() -> None:
    augment = Augment(4, True)
    x = _images(40, (3, 32, 32))
    draws = draw_epoch(40, augment, torch.Generator().manual_seed(2))
    idx = torch.tensor([5, 0, 39, 17])
    assert torch.equal(apply(x[idx], draws.take(idx), augment), apply(x, draws, augment)[idx])


def test_channels_last_input_gives_the_same_images() -> None:
    augment = Augment(4, True)
    x = _images(16, (3, 32, 32))
    draws = draw_epoch(16, augment, torch.Generator().manual_seed(4))
    cl = x.contiguous(memory_format=torch.channels_last)
    assert torch.equal(apply(cl, draws, augment), apply(x, draws, augment))


def test_float_images_are_refused() -> None:
    with pytest.raises(ValueError, match="uint8"):
        apply(
            torch.zeros(2, 3, 8, 8),
            EpochDraws(*(torch.zeros(2, dtype=torch.int64),) * 2, torch.zeros(2, dtype=torch.bool)),
            Augment(4, True),
        )
