"""On-device augmentation against torchvision's own crop and flip."""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as F

from bayesavg.training.augment import Augment, EpochDraws, apply, draw_epoch

CUDA = pytest.param(
    "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
)


def _images(n: int, shape: tuple[int, int, int], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8)


def _torchvision(img: torch.Tensor, top: int, left: int, flip: bool, padding: int) -> torch.Tensor:
    """What RandomCrop(H, padding=p) (constant zero fill) then RandomHorizontalFlip do to
    one image, for the given offsets and flip."""
    _, height, width = img.shape
    out = F.crop(F.pad(img, padding, fill=0), top, left, height, width) if padding else img
    return F.hflip(out) if flip else out


def _assert_torchvision(x: torch.Tensor, out: torch.Tensor, draws: EpochDraws, p: int) -> None:
    assert out.dtype == torch.uint8 and out.shape == x.shape and out.device == x.device
    x, out = x.cpu(), out.cpu()
    for i in range(x.shape[0]):
        top, left, flip = int(draws.top[i]), int(draws.left[i]), bool(draws.flip[i])
        assert torch.equal(out[i], _torchvision(x[i], top, left, flip, p)), i


def _layouts(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same images contiguous, channels-last and as a strided (non-contiguous) view."""
    n, c, h, w = x.shape
    wide = torch.zeros(n, c, h, 2 * w, dtype=x.dtype)
    wide[..., ::2] = x
    return {
        "contiguous": x,
        "channels_last": x.contiguous(memory_format=torch.channels_last),
        "strided": wide[..., ::2],
    }


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided"])
@pytest.mark.parametrize(
    ("shape", "augment"),
    [
        ((3, 32, 32), Augment(4, True)),
        ((1, 28, 28), Augment(4, True)),
        ((3, 32, 32), Augment(0, True)),
        ((3, 32, 32), Augment(2, False)),
        ((3, 5, 7), Augment(6, True)),  # padding wider than the image, non-square
    ],
)
def test_each_image_is_torchvisions_crop_and_flip(shape, augment: Augment, layout: str) -> None:
    x = _layouts(_images(64, shape))[layout]
    draws = draw_epoch(64, augment, torch.Generator().manual_seed(1))
    _assert_torchvision(x, apply(x, draws, augment), draws, augment.crop_padding)


def test_the_transform_objects_with_our_offsets_give_the_same_images(monkeypatch) -> None:
    """torchvision's RandomCrop(32, padding=4) and RandomHorizontalFlip themselves (their
    default fill and padding mode), with get_params answering our draws."""
    augment = Augment(4, True)
    x = _images(32, (3, 32, 32), seed=7)
    draws = draw_epoch(32, augment, torch.Generator().manual_seed(8))
    out = apply(x, draws, augment)
    crop = T.RandomCrop(32, padding=4)
    for i in range(32):
        offsets = (int(draws.top[i]), int(draws.left[i]), 32, 32)
        monkeypatch.setattr(T.RandomCrop, "get_params", staticmethod(lambda *_, o=offsets: o))
        ref = T.RandomHorizontalFlip(p=float(draws.flip[i]))(crop(x[i]))
        assert torch.equal(out[i], ref), i


def test_flip_only_mirrors_exactly_the_drawn_images() -> None:
    augment = Augment(0, True)
    x = _images(50, (3, 8, 8))
    draws = draw_epoch(50, augment, torch.Generator().manual_seed(6))
    expected = torch.where(draws.flip.view(-1, 1, 1, 1), x.flip(-1), x)
    assert torch.equal(apply(x, draws, augment), expected)
    assert draws.flip.any() and not draws.flip.all()
    assert not draws.top.any() and not draws.left.any()


def test_offsets_cover_all_81_positions_and_both_flips() -> None:
    draws = draw_epoch(5000, Augment(4, True), torch.Generator().manual_seed(0))
    assert draws.top.dtype == draws.left.dtype == torch.int64 and draws.flip.dtype == torch.bool
    assert len(draws) == draws.left.shape[0] == draws.flip.shape[0] == 5000
    positions = set(zip(draws.top.tolist(), draws.left.tolist(), strict=True))
    assert positions == {(t, left) for t in range(9) for left in range(9)}
    assert set(draws.flip.tolist()) == {False, True}
    assert 0.45 < draws.flip.double().mean().item() < 0.55


def test_the_same_seed_draws_the_same_offsets() -> None:
    def draws(seed: int) -> EpochDraws:
        return draw_epoch(100, Augment(4, True), torch.Generator().manual_seed(seed))

    a, b, c = draws(3), draws(3), draws(4)
    assert all(
        torch.equal(u, v) if u is not None else v is None
        for u, v in zip(vars(a).values(), vars(b).values(), strict=True)
    )
    assert not torch.equal(a.top, c.top)


def test_the_stream_does_not_depend_on_the_flags() -> None:
    """Every active setting draws top, left and flip alike: the generator ends in the same
    state, the offsets of one padding agree, and the flips of every padding agree."""
    settings = [Augment(4, True), Augment(4, False), Augment(0, True), Augment(2, True)]
    gens = [torch.Generator().manual_seed(5) for _ in settings]
    draws = [draw_epoch(50, a, g) for a, g in zip(settings, gens, strict=True)]
    assert all(torch.equal(g.get_state(), gens[0].get_state()) for g in gens)
    assert torch.equal(draws[0].top, draws[1].top) and torch.equal(draws[0].left, draws[1].left)
    assert not draws[1].flip.any()
    assert torch.equal(draws[0].flip, draws[2].flip) and torch.equal(draws[0].flip, draws[3].flip)


def test_inactive_augmentation_returns_the_input_and_draws_nothing() -> None:
    assert not Augment().active and Augment(1).active and Augment(flip=True).active
    gen = torch.Generator().manual_seed(9)
    state = gen.get_state()
    draws = draw_epoch(10, Augment(), gen)
    assert torch.equal(gen.get_state(), state)
    assert len(draws) == 10 and not draws.top.any() and not draws.left.any()
    assert not draws.flip.any()
    x = _images(10, (3, 8, 8))
    assert apply(x, draws, Augment()) is x


def test_minibatch_draws_are_the_epochs_rows() -> None:
    augment = Augment(4, True)
    x = _images(40, (3, 32, 32))
    draws = draw_epoch(40, augment, torch.Generator().manual_seed(2))
    idx = torch.tensor([5, 0, 39, 17])
    assert torch.equal(apply(x[idx], draws.take(idx), augment), apply(x, draws, augment)[idx])


def test_the_output_keeps_the_inputs_layout() -> None:
    augment = Augment(4, True)
    x = _images(16, (3, 32, 32))
    draws = draw_epoch(16, augment, torch.Generator().manual_seed(4))
    layouts = _layouts(x)
    cl = apply(layouts["channels_last"], draws, augment)
    assert cl.is_contiguous(memory_format=torch.channels_last) and not cl.is_contiguous()
    assert apply(layouts["contiguous"], draws, augment).is_contiguous()
    assert apply(layouts["strided"], draws, augment).is_contiguous()
    assert torch.equal(cl, apply(x, draws, augment))


def test_an_empty_batch_is_empty() -> None:
    augment = Augment(4, True)
    draws = draw_epoch(0, augment, torch.Generator().manual_seed(0))
    assert apply(_images(0, (3, 8, 8)), draws, augment).shape == (0, 3, 8, 8)


@pytest.mark.parametrize("device", [CUDA])
def test_on_the_device_with_draws_left_on_the_host(device: str) -> None:
    augment = Augment(4, True)
    x = _images(64, (3, 32, 32))
    draws = draw_epoch(64, augment, torch.Generator().manual_seed(1))
    on_device = apply(x.to(device), draws, augment)
    assert torch.equal(on_device, apply(x.to(device), draws.to(device), augment))
    _assert_torchvision(x.to(device), on_device, draws, 4)


def _draws(n: int) -> EpochDraws:
    return EpochDraws(
        torch.zeros(n, dtype=torch.int64),
        torch.zeros(n, dtype=torch.int64),
        torch.zeros(n, dtype=torch.bool),
    )


@pytest.mark.parametrize(
    "x",
    [torch.zeros(2, 3, 8, 8), torch.zeros(2, 3, 8, 8, dtype=torch.int64)],
    ids=["float32", "int64"],
)
def test_non_uint8_images_are_refused(x: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="uint8"):
        apply(x, _draws(2), Augment(4, True))


def test_images_without_a_batch_dimension_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\(B, C, H, W\).*\(3, 8, 8\)"):
        apply(torch.zeros(3, 8, 8, dtype=torch.uint8), _draws(3), Augment(4, True))


def test_draws_for_another_batch_size_are_refused() -> None:
    with pytest.raises(ValueError, match="4 images"):
        apply(_images(4, (3, 8, 8)), _draws(10), Augment(4, True))


@pytest.mark.parametrize("padding", [-1, 1.5, True])
def test_a_bad_padding_is_refused(padding) -> None:
    with pytest.raises(ValueError, match="crop_padding"):
        Augment(padding)
