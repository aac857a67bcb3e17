"""Rotations and MNIST-C-style corruptions keep the stored format and do what they say."""

from __future__ import annotations

import math

import pytest
import torch

from bayesavg.data.shift import (
    ANGLES,
    CORRUPTIONS,
    Shift,
    corrupt,
    parse,
    parse_many,
    rotate,
    shifts,
    translate,
)

RANDOM = [name for name, c in CORRUPTIONS.items() if c.random]


def _digits(n: int = 16, c: int = 1, size: int = 28, seed: int = 0) -> torch.Tensor:
    """MNIST-like uint8 images: black background, bright strokes in the central region."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.zeros(n, c, size, size, dtype=torch.uint8)
    m = size // 5
    x[..., m:-m, m:-m] = torch.randint(0, 256, (n, c, size - 2 * m, size - 2 * m), generator=gen)
    x[x < 128] = 0
    return x


def _images(kind: str) -> torch.Tensor:
    """A 1-channel 28x28 uint8 set (mnist5k) or a 3-channel 32x32 float set in [0, 1]."""
    if kind == "mnist":
        return _digits()
    return torch.rand(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x.float() / 255 if x.dtype == torch.uint8 else x.float()


# Rotation ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mnist", "cifar"])
def test_rotate_90_is_rot90_counter_clockwise(kind):
    x = _images(kind)
    # align_corners=False centres the grid on (W-1)/2, so quarter turns land on pixels
    torch.testing.assert_close(rotate(x, 90), torch.rot90(x, 1, dims=(-2, -1)), atol=1e-6, rtol=0)
    torch.testing.assert_close(rotate(x, -90), torch.rot90(x, -1, dims=(-2, -1)), atol=1e-6, rtol=0)
    torch.testing.assert_close(rotate(x, 270), rotate(x, -90), atol=1e-6, rtol=0)


def test_positive_angle_turns_counter_clockwise_on_screen():
    # A point right of the centre moves up (row 0 is the top), also on a non-square image.
    x = torch.zeros(1, 1, 21, 31, dtype=torch.uint8)
    x[0, 0, 10, 18] = 255  # centre is (10, 15); this is 3 pixels to its right
    assert torch.nonzero(rotate(x, 90)[0, 0]).tolist() == [[7, 15]]
    assert torch.nonzero(rotate(x, -90)[0, 0]).tolist() == [[13, 15]]


@pytest.mark.parametrize("kind", ["mnist", "cifar"])
def test_full_turns_are_identity_and_half_turn_twice_returns(kind):
    x = _images(kind)
    for degrees in (0, 360, -360, 720.0):
        assert torch.equal(rotate(x, degrees), x)
    torch.testing.assert_close(rotate(rotate(x, 180), 180), x, atol=1e-6, rtol=0)


def test_rotation_zero_fills_and_nothing_wraps_around():
    size = 28
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    r = ((yy - 13.5) ** 2 + (xx - 13.5) ** 2).sqrt()
    # Content inside the inscribed disk stays in the frame and inside that disk.
    disk = torch.exp(-(r**2) / 30).mul(255).round().to(torch.uint8)[None, None]
    for degrees in (15, 45, 100):
        out = rotate(disk, degrees)
        assert abs(_unit(out).sum() / _unit(disk).sum() - 1) < 0.02
        assert disk[..., r > 14].max() == 0 and out[..., r > 14].max() == 0
    # Content in a corner leaves the frame at 45 degrees: lost, not wrapped to another edge.
    corner = torch.zeros(1, 1, size, size, dtype=torch.uint8)
    corner[..., :3, :3] = 255
    out = rotate(corner, 45)
    assert out.sum() == 0
    assert out.dtype == torch.uint8


def test_rotation_of_a_non_square_image_is_rigid():
    x = torch.zeros(1, 1, 21, 31)
    x[0, 0, 10, 19] = 1.0  # 4 pixels right of the centre (10, 15)
    out = rotate(x, 45)[0, 0]
    idx = torch.nonzero(out).float()
    centroid = (idx * out[out > 0][:, None]).sum(0) / out.sum()
    expected = torch.tensor([10 - 4 * math.sqrt(0.5), 15 + 4 * math.sqrt(0.5)])
    torch.testing.assert_close(centroid, expected, atol=0.1, rtol=0)


# Corruptions --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mnist", "cifar"])
@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corruption_keeps_the_stored_format_and_changes_the_images(name, kind):
    x = _images(kind)
    before = x.clone()
    out = corrupt(x, name, seed=0)
    assert torch.equal(x, before), "the input must not be modified"
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert _unit(out).min() >= 0 and _unit(out).max() <= 1
    assert torch.equal(corrupt(x, name, seed=0), out), "same seed, same images"
    other = corrupt(x, name, seed=1)
    if CORRUPTIONS[name].random:
        assert not torch.equal(other, out)
    else:
        assert torch.equal(other, out)
    assert (_unit(out) - _unit(x)).abs().mean() > 0.01


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_severity_levels_are_ordered_and_validated(name):
    x = _images("mnist")
    change = [(_unit(corrupt(x, name, 0, level)) - _unit(x)).abs().mean() for level in (1, 5)]
    assert change[0] < change[1]
    for bad in (0, 6, 2.5, True):
        with pytest.raises(ValueError, match=f"severity of {name} must be an integer 1..5"):
            corrupt(x, name, 0, bad)


def test_translate_is_a_roll_with_the_border_zeroed():
    x = _images("cifar")
    out = translate(x, 2, -3)
    expected = torch.roll(x, shifts=(2, -3), dims=(-2, -1))
    expected[..., :2, :] = 0
    expected[..., :, -3:] = 0
    assert torch.equal(out, expected)
    assert torch.equal(translate(x, 0, 0), x)
    assert translate(x, 32, 0).abs().sum() == 0


def test_translate_corruption_moves_each_image_three_pixels_in_a_random_direction():
    x = _digits(n=64)
    out = corrupt(x, "translate", seed=0)
    directions = set()
    for i in range(len(x)):
        hits = [
            (dy, dx)
            for dy in (-3, 3)
            for dx in (-3, 3)
            if torch.equal(out[i], translate(x[i : i + 1], dy, dx)[0])
        ]
        assert len(hits) == 1
        directions.add(hits[0])
    assert len(directions) == 4


def test_brightness_raises_value_and_keeps_hue():
    grey = _images("mnist")
    out = corrupt(grey, "brightness", seed=0)  # default level: +0.5, as MNIST-C
    assert _unit(out).mean() > _unit(grey).mean() + 0.3
    expected = (grey.float() + 127.5).clamp(max=255).round().to(torch.uint8)
    assert (out.int() - expected.int()).abs().max() <= 1
    colour = _images("cifar") * 0.4  # dim enough that nothing saturates at +0.1
    out = corrupt(colour, "brightness", seed=0, severity=1)
    torch.testing.assert_close(out.amax(dim=1), colour.amax(dim=1) + 0.1)
    torch.testing.assert_close(
        out / out.amax(dim=1, keepdim=True), colour / colour.amax(dim=1, keepdim=True)
    )


@pytest.mark.parametrize(("size", "width"), [(28, 7), (32, 8)])
def test_stripe_inverts_a_quarter_at_each_side(size, width):
    x = _digits(size=size)
    out = corrupt(x, "stripe", seed=0)
    changed = out != x
    assert changed.float().mean() == pytest.approx(2 * width / size)
    assert changed[..., :width].all() and changed[..., -width:].all()
    assert torch.equal(out[..., :width], 255 - x[..., :width])
    assert torch.equal(out[..., width:-width], x[..., width:-width])


def test_impulse_noise_sets_the_expected_fraction_to_black_or_white():
    x = torch.full((64, 1, 28, 28), 128, dtype=torch.uint8)
    out = corrupt(x, "impulse_noise", seed=0)  # default level: 17% of values, as MNIST-C
    changed = out != x
    assert changed.float().mean() == pytest.approx(0.17, abs=0.01)
    assert set(out[changed].unique().tolist()) == {0, 255}
    assert (out == 255).float().mean() == pytest.approx(0.085, abs=0.01)


def test_shot_noise_counts_photons_and_keeps_black_black():
    x = _digits(n=64)
    out = corrupt(x, "shot_noise", seed=0)  # default level: 3 photons per unit intensity
    assert torch.all(out[x == 0] == 0)
    assert set(out.unique().tolist()) <= {0, 85, 170, 255}
    grey = torch.full((64, 1, 28, 28), 51, dtype=torch.uint8)  # 0.2: clamping at 1 is rare
    assert _unit(corrupt(grey, "shot_noise", seed=0)).mean() == pytest.approx(0.2, abs=0.01)


def test_scale_shrinks_content_about_the_centre():
    size = 28
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    blob = torch.exp(-((yy - 13.5) ** 2 + (xx - 13.5) ** 2) / 40)[None, None]
    out = corrupt(blob, "scale", seed=0)  # default level: content at 70% of its size
    assert (out.sum() / blob.sum()).item() == pytest.approx(0.7**2, rel=0.03)
    torch.testing.assert_close(out, out.flip(-1).flip(-2))  # still centred


def test_shear_keeps_the_centre_row_and_moves_the_others():
    x = torch.rand(32, 1, 29, 29, generator=torch.Generator().manual_seed(0))
    out = corrupt(x, "shear", seed=0)
    torch.testing.assert_close(out[..., 14, :], x[..., 14, :])
    assert (out[..., :10, :] - x[..., :10, :]).abs().mean() > 0.1


def test_corruptions_neither_use_nor_move_the_global_rng():
    x = _digits()
    torch.manual_seed(0)
    first = [corrupt(x, name, seed=5) for name in RANDOM]
    state = torch.get_rng_state()
    torch.manual_seed(1)
    second = [corrupt(x, name, seed=5) for name in RANDOM]
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    torch.manual_seed(0)
    assert torch.equal(torch.get_rng_state(), state)


# The shift list and bad input ---------------------------------------------------------


def test_shifts_lists_the_rotation_sweep_then_the_corruptions():
    listed = shifts()
    names = [s.name for s in listed]
    assert names[: len(ANGLES)] == [f"rotate_{a}" for a in range(0, 181, 15)]
    assert names[len(ANGLES) :] == list(CORRUPTIONS)
    assert Shift("shot_noise", 5.0).name == "shot_noise"
    assert [s.name for s in shifts((7.5,), ("shot_noise",), severity=2)] == [
        "rotate_7.5",
        "shot_noise_2",
    ]
    x = _images("mnist")
    for s in (Shift("rotate", 30), Shift("impulse_noise", 4)):
        expected = rotate(x, 30) if s.kind == "rotate" else corrupt(x, "impulse_noise", 3)
        assert torch.equal(s.apply(x, seed=3), expected)
    with pytest.raises(ValueError, match="shifts listed twice: rotate_15"):
        shifts((15, 15.0), ())


@pytest.mark.parametrize("angle", [math.nan, math.inf, -math.inf, "15", None])
def test_bad_angle_is_refused(angle):
    x = _images("mnist")
    message = "rotation angle must be a finite number of degrees"
    with pytest.raises(ValueError, match=message):
        rotate(x, angle)
    with pytest.raises(ValueError, match=message):
        Shift("rotate", angle)
    with pytest.raises(ValueError, match=message):
        shifts((angle,), ())


def test_unknown_corruption_and_bad_images_are_refused():
    x = _images("mnist")
    message = "unknown corruption 'fog'; choose from shot_noise, impulse_noise"
    with pytest.raises(ValueError, match=message):
        corrupt(x, "fog", seed=0)
    with pytest.raises(ValueError, match=message):
        Shift("fog", 1)
    with pytest.raises(ValueError, match=message):
        shifts((), ("fog",))
    with pytest.raises(ValueError, match=r"images must be \(N, C, H, W\)"):
        rotate(x[0], 15)
    with pytest.raises(ValueError, match="images must be uint8 or float"):
        corrupt(x.long(), "stripe", seed=0)


if torch.cuda.is_available():  # defined where a GPU is, so nothing is skipped elsewhere

    @pytest.mark.parametrize("shift", shifts((0, 45, 90)), ids=lambda s: s.name)
    def test_cuda_gives_the_cpu_result(shift):
        x = _digits(n=64)
        cpu = shift.apply(x, seed=0)
        cuda = shift.apply(x.cuda(), seed=0)
        assert cuda.device.type == "cuda" and cuda.dtype == torch.uint8
        # Noise is drawn on the CPU; interpolation may round differently by one level.
        assert (cuda.cpu().int() - cpu.int()).abs().max() <= 1


def test_parse_is_the_inverse_of_name() -> None:

    for shift in [*shifts(), *shifts((), severity=2)]:
        assert parse(shift.name) == shift
    assert parse("rotate_22.5") == Shift("rotate", 22.5)
    for bad in ("fog", "rotate_x", "stripe_9"):
        with pytest.raises(ValueError):
            parse(bad)


def test_groups_expand_to_the_pipelines_shifts_once_each() -> None:
    """``rotations`` is the 13 angles 0..180 by 15, ``corruptions`` all seven at their default
    level, as the pipeline's shift analysis names them; repeats count once, in order."""
    rotations = parse_many(["rotations"])
    assert [s.name for s in rotations] == [f"rotate_{a}" for a in range(0, 181, 15)]
    corruptions = parse_many(["corruptions"])
    assert [s.name for s in corruptions] == list(CORRUPTIONS)
    assert len(corruptions) == 7
    both = parse_many(["stripe", "rotate_30", "corruptions", "rotations", "rotate_30.0"])
    names = [s.name for s in both]
    assert names[:2] == ["stripe", "rotate_30"] and len(names) == len(set(names)) == 20
    assert parse_many(["shot_noise_3"])[0] == parse("shot_noise_3")
    with pytest.raises(ValueError, match="unknown shift 'rotation'"):
        parse_many(["rotation"])
