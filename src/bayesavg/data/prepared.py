"""The pipeline's prepared data: deterministic stratified train/val/test splits,
normalisation, the split files with a sha256 each in the manifest, read back checked.

The datasets themselves (registry, downloads, image folders) live in ``datasets``; a
posterior evaluated outside the pipeline gets its split here too (``load_eval_split``),
recomputed exactly as the data stage made it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..runtime.errors import UserError
from ..runtime.io import atomic_path, save_torch, sha256_file, write_json
from ..seeding import derive_seed, generator
from .datasets import (
    Source,
    Split,
    check_spec,
    list_imagefolder,
    load_imagefolder,
    load_source,
)
from .storage import SHARE, channel_stats_streamed, choose, host_memory, read_array, write_array

SPLITS = ("train", "val", "test")
HASHED = 2**30  # bytes: streamed splits up to this size are hashed when read


@dataclass(frozen=True)
class Prepared:
    train: Split
    val: Split
    test: Split
    manifest: dict[str, Any]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.manifest["input_shape"])  # type: ignore[return-value]

    @property
    def num_classes(self) -> int:
        return int(self.manifest["num_classes"])


def stratified_split(
    y: torch.Tensor, fraction: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (kept, taken): ``fraction`` of each class taken, chosen by ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    kept, taken = [], []
    for c in torch.unique(y).tolist():
        idx = torch.nonzero(y == c).flatten()
        idx = idx[torch.randperm(idx.numel(), generator=gen)]
        n_take = round(fraction * idx.numel())
        taken.append(idx[:n_take])
        kept.append(idx[n_take:])
    return torch.sort(torch.cat(kept)).values, torch.sort(torch.cat(taken)).values


def split_indices(
    y_pool: torch.Tensor,
    y_test: torch.Tensor | None,
    seed: int,
    test_fraction: float,
    val_fraction: float,
) -> dict[str, tuple[str, torch.Tensor]]:
    """Deterministic, stratified train/val/test as indices: for each split, which array
    of the source (``train`` pool or official ``test``) and the indices into it, in the
    stored order.

    Datasets with an official test split keep it; the others (mnist5k,
    imagefolder) hold out ``test_fraction``. ``val_fraction`` of the rest is
    the validation split used for tuning.
    """
    pool = torch.arange(y_pool.shape[0])
    if y_test is None:
        keep, take = stratified_split(y_pool, test_fraction, derive_seed(seed, "split", "test"))
        test, pool = ("train", take), pool[keep]
    else:
        test = ("test", torch.arange(y_test.shape[0]))
    keep, take = stratified_split(y_pool[pool], val_fraction, derive_seed(seed, "split", "val"))
    parts = {"train": ("train", pool[keep]), "val": ("train", pool[take]), "test": test}
    # Stored in a seeded random order: sources such as mnist5k are sorted by
    # class, and class-sorted batches would skew every sequential pass over
    # a split (the BatchNorm update normalises each batch by its own stats).
    return {
        name: (
            which,
            idx[torch.randperm(idx.numel(), generator=generator(derive_seed(seed, "order", name)))],
        )
        for name, (which, idx) in parts.items()
    }


def split_source(
    source: Source, seed: int, test_fraction: float, val_fraction: float
) -> tuple[Split, Split, Split]:
    """The train/val/test splits of a source in memory (``split_indices``)."""
    y_test = None if source.test is None else source.test.y
    parts = split_indices(source.train.y, y_test, seed, test_fraction, val_fraction)
    arrays = {"train": source.train, "test": source.test}
    return tuple(  # type: ignore[return-value]
        arrays[which].subset(idx)  # type: ignore[union-attr]
        for which, idx in parts.values()
    )


# Published per-dataset constants, used as the papers' code uses them; a dataset not
# listed (mnist5k, imagefolder) is normalised by its own training split's statistics.
# CIFAR's are the SWAG reference code's (PreResNet, WideResNet), for CIFAR-10 and -100
# alike: the std there is the spread of per-image means, smaller than the pixel std,
# kept so that a network trained here sees the reference's inputs.
NORMALISATION: dict[str, tuple[list[float], list[float]]] = {
    "mnist": ([0.1307], [0.3081]),
    "fashion_mnist": ([0.2860], [0.3530]),
    "cifar10": ([0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010]),
    "cifar100": ([0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010]),
}


def normalisation(dataset: str, train_x: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per-channel (mean, std) of a dataset's inputs: published constants where listed."""
    if dataset in NORMALISATION:
        mean, std = NORMALISATION[dataset]
        return list(mean), list(std)
    return channel_stats(train_x)


def channel_stats(x: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of uint8 images scaled to [0, 1]."""
    xf = x.double() / 255
    dims = [0, 2, 3]
    return xf.mean(dim=dims).tolist(), xf.std(dim=dims).clamp(min=1e-6).tolist()


def to_input(
    x: torch.Tensor, mean: list[float], std: list[float], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """uint8 images -> normalised float32 model input on ``device``."""
    xf = x.to(device=device, dtype=torch.float32).div_(255)
    m = torch.tensor(mean, dtype=torch.float32, device=xf.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=xf.device).view(1, -1, 1, 1)
    return xf.sub_(m).div_(s)


def prepare(
    dataset: str,
    raw_dir: str | Path,
    out_dir: str | Path,
    seed: int,
    test_fraction: float,
    val_fraction: float,
    fit: tuple[int, int] | None = None,
    normalise: tuple[list[float], list[float]] | None = None,
    storage: str = "memory",
    device: torch.device | None = None,
) -> Prepared:
    """Load, split and write the splits and ``manifest.json`` to ``out_dir``.

    ``fit`` (resize_size, image_size): images resized and centre-cropped at load;
    ``normalise`` (mean, std): the constants of the network's pretrained weights
    instead of the dataset's own. ``storage`` (``storage.choose``, for training on
    ``device``): ``memory`` writes ``{split}.pt``; ``stream`` writes uint8
    ``{split}.x.npy`` and ``{split}.y.npy``, a chunk at a time (an image folder is
    decoded chunk by chunk, never whole), and the manifest says ``storage: stream``.
    """
    source = _indexed(dataset, raw_dir, fit)
    parts = split_indices(source.y_pool, source.y_test, seed, test_fraction, val_fraction)
    sizes = {name: idx.numel() for name, (_, idx) in parts.items()}
    if min(sizes.values()) == 0:
        raise UserError(
            f"{dataset}: too few images for train/val/test splits of sizes "
            f"{sizes['train']}/{sizes['val']}/{sizes['test']}"
        )
    kind = choose(storage, sizes["train"] * math.prod(source.shape), device or torch.device("cpu"))
    out = Path(out_dir)
    write = _write_streamed if kind == "stream" else _write_in_memory
    splits, files = {}, {}
    for name, (which, idx) in parts.items():
        splits[name], files[name] = write(out, name, source, which, idx)
        files[name]["per_class"] = torch.bincount(
            splits[name].y, minlength=source.num_classes
        ).tolist()
    mean, std = _normalisation(dataset, splits["train"].x) if normalise is None else normalise
    manifest = {
        "dataset": dataset,
        "seed": seed,
        "test_fraction": test_fraction,
        "val_fraction": val_fraction,
        "num_classes": source.num_classes,
        "input_shape": list(source.shape),
        **({} if fit is None else {"resize_size": fit[0], "image_size": fit[1]}),
        **({"storage": "stream"} if kind == "stream" else {}),
        "mean": mean,
        "std": std,
        "splits": files,
    }
    write_json(out / "manifest.json", manifest)
    return Prepared(splits["train"], splits["val"], splits["test"], manifest)


@dataclass(frozen=True)
class _Indexed:
    """A source whose images are read by index: from memory, or decoded from an image
    folder on demand (so that streaming never holds the folder whole)."""

    y_pool: torch.Tensor
    y_test: torch.Tensor | None
    num_classes: int
    shape: tuple[int, int, int]
    rows: Callable[[str, torch.Tensor], torch.Tensor]


def _indexed(dataset: str, raw_dir: str | Path, fit: tuple[int, int] | None) -> _Indexed:
    if dataset.startswith("imagefolder:"):
        folder = list_imagefolder(dataset.removeprefix("imagefolder:"), fit=fit)
        return _Indexed(
            folder.y,
            None,
            folder.num_classes,
            folder.shape,
            lambda _, idx: torch.from_numpy(folder.read(idx.tolist())),
        )
    source = load_source(dataset, raw_dir, fit)
    arrays = {"train": source.train, "test": source.test}
    return _Indexed(
        source.train.y,
        None if source.test is None else source.test.y,
        source.num_classes,
        tuple(source.train.x.shape[1:]),  # type: ignore[arg-type]
        lambda which, idx: arrays[which].x[idx],  # type: ignore[union-attr]
    )


def _labels(source: _Indexed, which: str, idx: torch.Tensor) -> torch.Tensor:
    y = source.y_pool if which == "train" else source.y_test
    assert y is not None
    return y[idx]


def _write_in_memory(
    out: Path, name: str, source: _Indexed, which: str, idx: torch.Tensor
) -> tuple[Split, dict[str, Any]]:
    split = Split(source.rows(which, idx), _labels(source, which, idx))
    path = out / f"{name}.pt"
    save_torch(path, {"x": split.x, "y": split.y})
    return split, {"file": path.name, "sha256": sha256_file(path), "n": len(split)}


def _write_streamed(
    out: Path, name: str, source: _Indexed, which: str, idx: torch.Tensor
) -> tuple[Split, dict[str, Any]]:
    x_path, y_path = out / f"{name}.x.npy", out / f"{name}.y.npy"
    write_array(
        x_path, (idx.numel(), *source.shape), lambda i, j: source.rows(which, idx[i:j]).numpy()
    )
    y = _labels(source, which, idx)
    with atomic_path(y_path) as tmp, tmp.open("wb") as f:
        np.save(f, y.numpy())
    entry = {
        "file": x_path.name,
        "labels": y_path.name,
        "sha256": sha256_file(x_path),
        "labels_sha256": sha256_file(y_path),
        "n": idx.numel(),
    }
    return Split(read_array(x_path), y), entry


def _normalisation(dataset: str, train_x: torch.Tensor) -> tuple[list[float], list[float]]:
    """``normalisation``, from histograms when the split in float64 would not fit in a
    quarter of RAM: a split that fits gets the in-memory bits, streamed or not."""
    if dataset in NORMALISATION or 8 * train_x.numel() <= SHARE * host_memory():
        return normalisation(dataset, train_x)
    return channel_stats_streamed(train_x)


def _load_split_file(path: Path, expected_sha256: str | None) -> Split:
    _check(path, expected_sha256)
    try:
        obj = torch.load(path, weights_only=True)
        return Split(obj["x"], obj["y"])
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as err:
        raise UserError(f"cannot read {path} ({err}); rerun the data stage") from None


def _load_streamed(out: Path, entry: dict[str, Any], verify: bool) -> Split:
    x_path, y_path = out / entry["file"], out / entry["labels"]
    # Hashing a split larger than HASHED at every stage start would cost minutes: there
    # DVC's own hash of the output guards the bytes, and the array's shape is checked.
    hashed = verify and (not x_path.exists() or x_path.stat().st_size <= HASHED)
    _check(x_path, entry["sha256"] if hashed else None)
    _check(y_path, entry["labels_sha256"] if verify else None)
    x = read_array(x_path)
    if x.shape[0] != entry["n"]:
        raise UserError(f"{x_path} holds {x.shape[0]} images, its manifest {entry['n']}")
    try:
        return Split(x, torch.from_numpy(np.load(y_path)))
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {y_path} ({err}); rerun the data stage") from None


def _check(path: Path, expected_sha256: str | None) -> None:
    if not path.is_file():
        raise UserError(f"{path} is missing; rerun the data stage (dvc repro data)")
    if expected_sha256 is not None and sha256_file(path) != expected_sha256:
        raise UserError(
            f"{path} does not match its manifest checksum; rerun the data stage (dvc repro data)"
        )


_ENTRY_KEYS = {"file": str, "sha256": str, "n": int}


def read_manifest(path: Path) -> dict[str, Any]:
    """The data stage's manifest, checked for what readers take from it (the dataset's
    name, and per split its file, sha256 and size): a damaged one is one line."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {path} ({err}); run the data stage first") from None
    splits = manifest.get("splits") if isinstance(manifest, dict) else None
    problem = None
    if not isinstance(splits, dict) or not isinstance(manifest.get("dataset"), str):
        problem = "no dataset name or splits"
    else:
        for split in SPLITS:
            entry = splits.get(split)
            bad = [
                k for k, kind in _ENTRY_KEYS.items() if not isinstance((entry or {}).get(k), kind)
            ]
            if bad:
                problem = f"split {split!r} lacks {', '.join(bad)}"
                break
    if problem is not None:
        raise UserError(f"{path} is not a data stage manifest ({problem}); rerun the data stage")
    return manifest


def load_prepared(out_dir: str | Path, verify: bool = True) -> Prepared:
    """Read what ``prepare`` wrote, checking each file's sha256 against the manifest.
    Streamed splits come back memory-mapped: their images are read when indexed."""
    out = Path(out_dir)
    manifest = read_manifest(out / "manifest.json")
    splits = []
    for s in SPLITS:
        entry = manifest["splits"][s]
        if "labels" in entry:
            splits.append(_load_streamed(out, entry, verify))
        else:
            expected = entry["sha256"] if verify else None
            splits.append(_load_split_file(out / entry["file"], expected))
    return Prepared(*splits, manifest)


def load_eval_split(
    spec: str,
    raw_dir: str | Path,
    input_shape: tuple[int, int, int],
    split: str,
    seed: int,
    test_fraction: float,
    val_fraction: float,
    resize_size: int | None = None,
) -> Split:
    """The ``split`` ('train', 'val' or 'test') of a dataset spec, shaped like
    ``input_shape``.

    Used by ``bayesavg evaluate`` outside the pipeline: the split is
    recomputed from the seed and fractions the posterior recorded, so it
    matches the data stage exactly. ``imagefolder:<DIR>`` is used whole.
    ``resize_size``: the images are resized and centre-cropped to
    ``input_shape`` as the data stage did (``data.image_size``).
    """
    fit = None if resize_size is None else (resize_size, input_shape[-1])
    check_spec(spec)
    if spec.startswith("imagefolder:"):
        data, _ = load_imagefolder(
            spec.removeprefix("imagefolder:"), input_shape[0], tuple(input_shape[1:]), fit
        )
        return data
    source = load_source(spec, raw_dir, fit)
    train, val, test = split_source(source, seed, test_fraction, val_fraction)
    data = {"train": train, "val": val}.get(split, test)
    if tuple(data.x.shape[1:]) != tuple(input_shape):
        raise UserError(
            f"{spec} images are {tuple(data.x.shape[1:])}, "
            f"the posterior expects {tuple(input_shape)}"
        )
    return data
