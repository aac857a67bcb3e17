"""Data: mnist5k splits, manifest checksums, offline downloads, image folders, normalisation."""

from __future__ import annotations

import hashlib
import json
import shutil
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch
from PIL import Image

from bayesavg.data.datasets import Split, load_imagefolder, load_source
from bayesavg.data.prepared import (
    channel_stats,
    load_eval_split,
    load_prepared,
    prepare,
    stratified_split,
    to_input,
)
from bayesavg.runtime.errors import UserError
from bayesavg.runtime.io import sha256_file

if TYPE_CHECKING:
    from conftest import ImageFolderFactory, PreparedDir

SPLIT_SIZES = {"train": 3600, "val": 400, "test": 1000}


def _row_hashes(split: Split) -> list[str]:
    """One digest per image, so images can be compared across splits as set members."""
    return [hashlib.sha256(row.numpy().tobytes()).hexdigest() for row in split.x]


def _splits(prep: PreparedDir) -> dict[str, Split]:
    p = prep.prepared
    return {"train": p.train, "val": p.val, "test": p.test}


def _single_line(err: pytest.ExceptionInfo[UserError]) -> str:
    """The message of a UserError, checked to be one line as the CLI prints it."""
    message = str(err.value)
    assert "\n" not in message and message.strip() == message
    return message


@pytest.fixture(scope="module")
def mnist5k_source() -> Any:
    """The 5000 mnist5k digits as shipped, for comparing splits against the whole."""
    return load_source("mnist5k", "unused-raw-dir")


def test_prepare_mnist5k_split_sizes(mnist5k_prepared: PreparedDir) -> None:
    manifest = mnist5k_prepared.prepared.manifest
    for name, split in _splits(mnist5k_prepared).items():
        assert len(split) == SPLIT_SIZES[name]
        assert manifest["splits"][name]["n"] == SPLIT_SIZES[name]
        assert tuple(split.x.shape[1:]) == (1, 28, 28)
        assert split.x.dtype == torch.uint8 and split.y.dtype == torch.int64
    assert manifest["num_classes"] == 10
    assert manifest["input_shape"] == [1, 28, 28]


def test_prepare_mnist5k_is_stratified(mnist5k_prepared: PreparedDir) -> None:
    """mnist5k has 500 digits per class, so every split holds an equal share of each class."""
    manifest = mnist5k_prepared.prepared.manifest
    for name, split in _splits(mnist5k_prepared).items():
        counts = torch.bincount(split.y, minlength=10).tolist()
        assert manifest["splits"][name]["per_class"] == counts
        assert counts == [SPLIT_SIZES[name] // 10] * 10


def test_prepare_mnist5k_splits_are_disjoint_and_complete(
    mnist5k_prepared: PreparedDir, mnist5k_source: Any
) -> None:
    """No digit is in two splits, and together the splits are exactly the 5000 digits."""
    hashes = {name: _row_hashes(split) for name, split in _splits(mnist5k_prepared).items()}
    for name, rows in hashes.items():
        assert len(set(rows)) == len(rows), f"{name} repeats an image"
    assert not set(hashes["train"]) & set(hashes["val"])
    assert not set(hashes["train"]) & set(hashes["test"])
    assert not set(hashes["val"]) & set(hashes["test"])

    def pairs(split: Split) -> Counter[tuple[str, int]]:
        return Counter(zip(_row_hashes(split), split.y.tolist(), strict=True))

    combined = sum((pairs(s) for s in _splits(mnist5k_prepared).values()), Counter())
    assert combined == pairs(mnist5k_source.train)


def test_prepare_manifest_checksums_match_files(mnist5k_prepared: PreparedDir) -> None:
    out = mnist5k_prepared.out_dir
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == mnist5k_prepared.prepared.manifest
    assert on_disk["dataset"] == "mnist5k" and on_disk["seed"] == 0
    for name in SPLIT_SIZES:
        entry = on_disk["splits"][name]
        assert entry["file"] == f"{name}.pt"
        assert entry["sha256"] == sha256_file(out / entry["file"])


def test_prepare_mean_std_are_those_of_the_train_split(
    mnist5k_prepared: PreparedDir, mnist5k_source: Any
) -> None:
    train = mnist5k_prepared.prepared.train.x.numpy().astype(np.float64) / 255
    manifest = mnist5k_prepared.prepared.manifest
    assert manifest["mean"] == pytest.approx([train.mean()], rel=1e-9)
    assert manifest["std"] == pytest.approx([train.std(ddof=1)], rel=1e-9)
    everything = mnist5k_source.train.x.numpy().astype(np.float64) / 255
    assert abs(manifest["mean"][0] - everything.mean()) > 1e-6, "stats must use train images only"


def test_prepare_same_seed_gives_same_splits(mnist5k_prepared: PreparedDir, tmp_path: Path) -> None:
    again = prepare("mnist5k", tmp_path / "raw", tmp_path / "out", 0, 0.2, 0.1)
    for name, split in _splits(mnist5k_prepared).items():
        other = getattr(again, name)
        assert torch.equal(split.x, other.x) and torch.equal(split.y, other.y)
    assert again.manifest["mean"] == mnist5k_prepared.prepared.manifest["mean"]


def test_prepare_same_seed_gives_identical_files(
    mnist5k_prepared: PreparedDir, tmp_path: Path
) -> None:
    """A rerun must be bitwise identical, or DVC sees changed outputs and reruns everything."""
    again = prepare("mnist5k", tmp_path / "raw", tmp_path / "out", 0, 0.2, 0.1)
    first = mnist5k_prepared.prepared.manifest["splits"]
    for name in SPLIT_SIZES:
        assert again.manifest["splits"][name]["sha256"] == first[name]["sha256"], name
        assert (tmp_path / "out" / f"{name}.pt").read_bytes() == (
            mnist5k_prepared.out_dir / f"{name}.pt"
        ).read_bytes()


def test_prepare_different_seed_gives_different_split(
    mnist5k_prepared: PreparedDir, tmp_path: Path
) -> None:
    other = prepare("mnist5k", tmp_path / "raw", tmp_path / "out", 1, 0.2, 0.1)
    assert len(other.test) == SPLIT_SIZES["test"]
    ours = set(_row_hashes(mnist5k_prepared.prepared.test))
    theirs = set(_row_hashes(other.test))
    assert ours != theirs
    assert len(ours & theirs) < 500, "a new seed should reshuffle most of the test split"
    first = mnist5k_prepared.prepared.manifest["splits"]["test"]["sha256"]
    assert other.manifest["splits"]["test"]["sha256"] != first


def test_load_prepared_round_trips(mnist5k_prepared: PreparedDir) -> None:
    loaded = load_prepared(mnist5k_prepared.out_dir)
    assert loaded.manifest == mnist5k_prepared.prepared.manifest
    assert loaded.input_shape == (1, 28, 28) and loaded.num_classes == 10
    for name, split in _splits(mnist5k_prepared).items():
        other = getattr(loaded, name)
        assert torch.equal(split.x, other.x) and torch.equal(split.y, other.y)


def test_load_prepared_detects_a_tampered_file(
    mnist5k_prepared: PreparedDir, tmp_path: Path
) -> None:
    copy = tmp_path / "prepared"
    shutil.copytree(mnist5k_prepared.out_dir, copy)
    data = bytearray((copy / "val.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "val.pt").write_bytes(bytes(data))
    with pytest.raises(UserError) as err:
        load_prepared(copy)
    message = _single_line(err)
    assert "checksum" in message and "val.pt" in message


def test_load_prepared_without_manifest_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"manifest\.json") as err:
        load_prepared(tmp_path)
    _single_line(err)


def test_load_eval_split_matches_the_data_stage(mnist5k_prepared: PreparedDir) -> None:
    """``bayesavg evaluate --data mnist5k`` must test on the very images the pipeline held out."""
    test = load_eval_split("mnist5k", "unused-raw-dir", (1, 28, 28), "test", 0, 0.2, 0.1)
    assert torch.equal(test.x, mnist5k_prepared.prepared.test.x)
    assert torch.equal(test.y, mnist5k_prepared.prepared.test.y)


def test_load_eval_split_rejects_unknown_spec() -> None:
    with pytest.raises(UserError, match="imagefolder:<DIR>") as err:
        load_eval_split("stl10", "raw", (3, 32, 32), "test", 0, 0.2, 0.1)
    _single_line(err)


@pytest.mark.parametrize("dataset", ["mnist", "fashion_mnist", "cifar10"])
def test_load_source_offline_says_what_was_tried_and_where_to_put_it(
    dataset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tried: list[str] = []

    def offline(request: Any, *args: Any, **kwargs: Any) -> Any:
        tried.append(request if isinstance(request, str) else request.full_url)
        raise urllib.error.URLError("offline")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    raw = tmp_path / "raw"
    with pytest.raises(UserError) as err:
        load_source(dataset, raw)
    message = _single_line(err)
    assert tried, "the downloader should have tried the network"
    assert any(url in message for url in tried), (tried, message)
    assert str(raw) in message and "by hand" in message
    assert "dataset: mnist5k" in message and "--data mnist5k" in message
    assert not tmp_path.joinpath("raw").exists(), "the folders the download made are removed"


def test_a_failed_download_keeps_the_folders_that_were_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only what the download made goes: a folder the user made (to place files in)
    stays, and so does one holding a file."""
    monkeypatch.setattr(urllib.request, "urlopen", _offline)
    raw = tmp_path / "raw"
    (raw / "MNIST").mkdir(parents=True)
    (raw / "notes.txt").write_text("mine\n")
    with pytest.raises(UserError):
        load_source("mnist", raw)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "raw",
        "raw/MNIST",
        "raw/notes.txt",
    ]


def _offline(*args: Any, **kwargs: Any) -> Any:
    raise urllib.error.URLError("offline")


def _idx(array: np.ndarray) -> bytes:
    """``array`` (uint8) in MNIST's idx format."""
    dims = np.array(array.shape, dtype=">u4").tobytes()
    return bytes([0, 0, 0x08, array.ndim]) + dims + array.tobytes()


def test_an_unpacked_file_cut_short_is_unpacked_again_from_its_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchvision checks MNIST's .gz archives, not the idx files it unpacked from them:
    an unpack cut short would fail on every run. It is unpacked again from the archive."""
    import gzip

    import torchvision.datasets

    rng = np.random.default_rng(0)
    folder = tmp_path / "raw" / "MNIST" / "raw"
    folder.mkdir(parents=True)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (6, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, 6, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (4, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, 4, dtype=np.uint8),
    }
    resources = []
    for name, array in arrays.items():
        packed = gzip.compress(_idx(array), mtime=0)
        (folder / f"{name}.gz").write_bytes(packed)
        (folder / name).write_bytes(_idx(array))
        resources.append((f"{name}.gz", hashlib.md5(packed).hexdigest()))
    monkeypatch.setattr(torchvision.datasets.MNIST, "resources", resources)
    monkeypatch.setattr(urllib.request, "urlopen", None)  # no download may be tried
    cut = folder / "train-images-idx3-ubyte"
    cut.write_bytes(cut.read_bytes()[:2000])
    source = load_source("mnist", tmp_path / "raw")
    assert torch.equal(source.train.x[:, 0], torch.from_numpy(arrays["train-images-idx3-ubyte"]))
    assert torch.equal(source.test.y, torch.from_numpy(arrays["t10k-labels-idx1-ubyte"]).long())
    assert cut.stat().st_size == len(_idx(arrays["train-images-idx3-ubyte"]))


def test_load_source_unknown_dataset() -> None:
    with pytest.raises(UserError, match="unknown dataset"):
        load_source("not-a-dataset", "raw")


def test_imagefolder_labels_come_from_folder_numbers(
    imagefolder_factory: ImageFolderFactory,
) -> None:
    """With 12 classes, folder "10" must be label 10, not the 3rd in string order."""
    root = imagefolder_factory(num_classes=12, per_class=2, mode="L")
    split, num_classes = load_imagefolder(root)
    assert num_classes == 12
    assert len(split) == 24
    assert torch.bincount(split.y).tolist() == [2] * 12
    for image, label in zip(split.x, split.y.tolist(), strict=True):
        value = int(image[0, 0, 0])
        assert (image == value).all()
        assert value // 10 == label, f"image of folder {value // 10} labelled {label}"


@pytest.mark.parametrize("channels", [None, 1, 3])
def test_a_16_bit_greyscale_image_is_scaled_not_clipped(
    tmp_path: Path, channels: int | None
) -> None:
    """A 16-bit PNG (PIL's "I;16") keeps its picture: round(v / 257) in 0..255, grey
    in every channel asked for (PIL's own convert("L") clips it, nearly all white)."""
    values = np.arange(0, 65536, 257 * 5, dtype=np.uint16)[:49].reshape(7, 7)
    values[0, 0], values[0, 1] = 65535, 128  # round(128 / 257) = 0
    (tmp_path / "0").mkdir()
    Image.fromarray(values).save(tmp_path / "0" / "a.png")
    with Image.open(tmp_path / "0" / "a.png") as img:
        assert img.mode in ("I;16", "I")
    split, _ = load_imagefolder(tmp_path, channels=channels)
    expected = torch.from_numpy(np.rint(values / 257.0).astype(np.uint8))
    assert split.x.shape[1] == (channels or 1)
    for channel in split.x[0]:
        assert torch.equal(channel, expected)
    assert expected[0, 0] == 255 and expected[0, 1] == 0


def test_hidden_folders_of_an_imagefolder_are_no_classes(
    imagefolder_factory: ImageFolderFactory,
) -> None:
    """A notebook's .ipynb_checkpoints beside the class folders is left alone."""
    root = imagefolder_factory(num_classes=2, per_class=2, mode="L")
    hidden = root / ".ipynb_checkpoints"
    hidden.mkdir()
    Image.new("L", (4, 4)).save(hidden / "x.png")
    split, num_classes = load_imagefolder(root)
    assert (num_classes, len(split)) == (2, 4)


def test_imagefolder_defaults_to_the_first_image(imagefolder: Path) -> None:
    split, num_classes = load_imagefolder(imagefolder)
    assert num_classes == 3
    assert tuple(split.x.shape) == (6, 3, 12, 10)
    assert split.x.dtype == torch.uint8


@pytest.mark.parametrize(
    ("mode", "channels", "size"),
    [("RGB", 1, (28, 28)), ("L", 3, (32, 32)), ("RGB", 3, (7, 5)), ("L", 1, (12, 10))],
)
def test_imagefolder_converts_channels_and_size(
    imagefolder_factory: ImageFolderFactory,
    mode: str,
    channels: int,
    size: tuple[int, int],
) -> None:
    """Channels and (height, width) as asked; a flat image keeps its value when resized."""
    root = imagefolder_factory(num_classes=2, per_class=2, mode=mode, size=(12, 10))
    split, _ = load_imagefolder(root, channels=channels, size=size)
    assert tuple(split.x.shape) == (4, channels, *size)
    for image, label in zip(split.x, split.y.tolist(), strict=True):
        assert int(image.min()) == int(image.max())
        assert int(image[0, 0, 0]) // 10 == label


def test_imagefolder_resizes_mixed_sizes_to_the_first(tmp_path: Path) -> None:
    for label, (h, w) in enumerate([(8, 6), (16, 20)]):
        (tmp_path / str(label)).mkdir()
        Image.new("L", (w, h), 50).save(tmp_path / str(label) / "a.png")
    split, _ = load_imagefolder(tmp_path)
    assert tuple(split.x.shape) == (2, 1, 8, 6)
    assert split.y.tolist() == [0, 1]


def _write_png(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("L", (4, 4), 7).save(path)


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        (["0/a.png", "cat/b.png"], "'cat'"),
        (["0/a.png", "2/b.png"], "must be 0..1"),
        (["1/a.png", "2/b.png"], "must be 0..1"),
        (["a.png"], "no class sub-folders"),
        (["0/notes.txt", "1/readme.md"], "no images"),
    ],
)
def test_imagefolder_layout_errors(tmp_path: Path, layout: list[str], expected: str) -> None:
    for name in layout:
        if name.endswith(".png"):
            _write_png(tmp_path / name)
        else:
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text("text")
    with pytest.raises(UserError) as err:
        load_imagefolder(tmp_path)
    message = _single_line(err)
    assert message.startswith("imagefolder:")
    assert expected in message


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_imagefolder_not_a_directory(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "images"
    if kind == "file":
        path.write_text("not a folder")
    with pytest.raises(UserError, match="is not a directory") as err:
        load_imagefolder(path)
    assert str(path) in _single_line(err)


def test_imagefolder_unreadable_image(tmp_path: Path) -> None:
    _write_png(tmp_path / "0" / "good.png")
    broken = tmp_path / "1" / "broken.png"
    broken.parent.mkdir()
    broken.write_bytes(b"\x89PNG\r\n\x1a\n but then garbage")
    with pytest.raises(UserError, match="cannot read image") as err:
        load_imagefolder(tmp_path)
    assert str(broken) in _single_line(err)


@pytest.mark.parametrize("fraction", [0.0, 0.2, 0.35, 1.0])
@pytest.mark.parametrize("seed", [0, 7])
def test_stratified_split_properties(fraction: float, seed: int) -> None:
    """Kept and taken partition the indices; each class gives ``fraction`` of its members."""
    order = torch.randperm(73, generator=torch.Generator().manual_seed(3))
    y = torch.tensor([0] * 40 + [1] * 20 + [2] * 10 + [3] * 3)[order]
    kept, taken = stratified_split(y, fraction, seed)
    assert torch.equal(torch.sort(torch.cat([kept, taken])).values, torch.arange(73))
    assert torch.equal(kept, torch.sort(kept).values)
    assert torch.equal(taken, torch.sort(taken).values)
    counts = torch.bincount(y).tolist()
    taken_counts = torch.bincount(y[taken], minlength=4).tolist()
    assert taken_counts == [round(fraction * n) for n in counts]
    again = stratified_split(y, fraction, seed)
    assert torch.equal(again[0], kept) and torch.equal(again[1], taken)


def test_stratified_split_depends_on_seed() -> None:
    y = torch.arange(200) % 4
    assert not torch.equal(stratified_split(y, 0.5, 0)[1], stratified_split(y, 0.5, 1)[1])


def test_to_input_normalises_per_channel() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (5, 3, 4, 6), dtype=torch.uint8, generator=gen)
    original = x.clone()
    mean, std = [0.1, 0.5, 0.9], [0.2, 0.3, 0.4]
    out = to_input(x, mean, std)
    assert out.dtype == torch.float32 and out.shape == x.shape
    for c in range(3):
        expected = (x[:, c].double() / 255 - mean[c]) / std[c]
        assert torch.allclose(out[:, c].double(), expected, atol=1e-6)
    assert torch.equal(x, original), "the uint8 input must not be modified"


def test_to_input_with_channel_stats_standardises() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (50, 2, 8, 8), dtype=torch.uint8, generator=gen)
    x[:, 1] //= 4
    mean, std = channel_stats(x)
    out = to_input(x, mean, std).double()
    assert torch.allclose(out.mean(dim=(0, 2, 3)), torch.zeros(2, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(out.std(dim=(0, 2, 3)), torch.ones(2, dtype=torch.float64), atol=1e-5)
