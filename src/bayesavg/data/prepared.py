"""The pipeline's prepared data: deterministic stratified train/val/test splits,
normalisation, the split files with a sha256 each in the manifest, read back checked.

The datasets themselves (registry, downloads, image folders) live in ``datasets``; a
posterior evaluated outside the pipeline gets its split here too (``load_eval_split``),
recomputed exactly as the data stage made it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..runtime.errors import UserError
from ..runtime.io import save_torch, sha256_file, write_json
from ..seeding import derive_seed, generator
from .datasets import TORCHVISION, Source, Split, load_imagefolder, load_source

SPLITS = ("train", "val", "test")


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


def split_source(
    source: Source, seed: int, test_fraction: float, val_fraction: float
) -> tuple[Split, Split, Split]:
    """Deterministic, stratified train/val/test.

    Datasets with an official test split keep it; the others (mnist5k,
    imagefolder) hold out ``test_fraction``. ``val_fraction`` of the rest is
    the validation split used for tuning.
    """
    pool = source.train
    if source.test is None:
        keep, take = stratified_split(pool.y, test_fraction, derive_seed(seed, "split", "test"))
        test, pool = pool.subset(take), pool.subset(keep)
    else:
        test = source.test
    keep, take = stratified_split(pool.y, val_fraction, derive_seed(seed, "split", "val"))
    splits = {"train": pool.subset(keep), "val": pool.subset(take), "test": test}
    # Stored in a seeded random order: sources such as mnist5k are sorted by
    # class, and class-sorted batches would skew every sequential pass over
    # a split (the BatchNorm update normalises each batch by its own stats).
    return tuple(  # type: ignore[return-value]
        split.subset(
            torch.randperm(len(split), generator=generator(derive_seed(seed, "order", name)))
        )
        for name, split in splits.items()
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
) -> Prepared:
    """Load, split and write ``{train,val,test}.pt`` and ``manifest.json`` to ``out_dir``.

    ``fit`` (resize_size, image_size): images resized and centre-cropped at load;
    ``normalise`` (mean, std): the constants of the network's pretrained weights
    instead of the dataset's own."""
    source = load_source(dataset, raw_dir, fit)
    train, val, test = split_source(source, seed, test_fraction, val_fraction)
    if len(train) == 0 or len(val) == 0 or len(test) == 0:
        raise UserError(
            f"{dataset}: too few images for train/val/test splits of sizes "
            f"{len(train)}/{len(val)}/{len(test)}"
        )
    mean, std = normalisation(dataset, train.x) if normalise is None else normalise
    out = Path(out_dir)
    splits = {"train": train, "val": val, "test": test}
    files = {}
    for name, split in splits.items():
        path = out / f"{name}.pt"
        save_torch(path, {"x": split.x, "y": split.y})
        counts = torch.bincount(split.y, minlength=source.num_classes).tolist()
        files[name] = {
            "file": path.name,
            "sha256": sha256_file(path),
            "n": len(split),
            "per_class": counts,
        }
    manifest = {
        "dataset": dataset,
        "seed": seed,
        "test_fraction": test_fraction,
        "val_fraction": val_fraction,
        "num_classes": source.num_classes,
        "input_shape": list(train.x.shape[1:]),
        **({} if fit is None else {"resize_size": fit[0], "image_size": fit[1]}),
        "mean": mean,
        "std": std,
        "splits": files,
    }
    write_json(out / "manifest.json", manifest)
    return Prepared(train, val, test, manifest)


def _load_split_file(path: Path, expected_sha256: str | None) -> Split:
    if expected_sha256 is not None and sha256_file(path) != expected_sha256:
        raise UserError(
            f"{path} does not match its manifest checksum; rerun the data stage (dvc repro data)"
        )
    try:
        obj = torch.load(path, weights_only=True)
        return Split(obj["x"], obj["y"])
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as err:
        raise UserError(f"cannot read {path} ({err}); rerun the data stage") from None


def load_prepared(out_dir: str | Path, verify: bool = True) -> Prepared:
    """Read what ``prepare`` wrote, checking each file's sha256 against the manifest."""
    out = Path(out_dir)
    manifest_path = out / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {manifest_path} ({err}); run the data stage first") from None
    splits = [
        _load_split_file(
            out / manifest["splits"][s]["file"], manifest["splits"][s]["sha256"] if verify else None
        )
        for s in SPLITS
    ]
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
    """The ``split`` ('train' or 'test') of a dataset spec, shaped like ``input_shape``.

    Used by ``bayesavg evaluate`` outside the pipeline: the split is
    recomputed from the seed and fractions the posterior recorded, so it
    matches the data stage exactly. ``imagefolder:<DIR>`` is used whole.
    ``resize_size``: the images are resized and centre-cropped to
    ``input_shape`` as the data stage did (``data.image_size``).
    """
    fit = None if resize_size is None else (resize_size, input_shape[-1])
    if spec.startswith("imagefolder:"):
        data, _ = load_imagefolder(
            spec.removeprefix("imagefolder:"), input_shape[0], tuple(input_shape[1:]), fit
        )
        return data
    if spec not in ("mnist5k", *TORCHVISION):
        raise UserError(
            f"unknown data spec {spec!r}; use mnist5k, mnist, fashion_mnist, "
            "cifar10, cifar100 or imagefolder:<DIR>"
        )
    source = load_source(spec, raw_dir, fit)
    train, _, test = split_source(source, seed, test_fraction, val_fraction)
    data = train if split == "train" else test
    if tuple(data.x.shape[1:]) != tuple(input_shape):
        raise UserError(
            f"{spec} images are {tuple(data.x.shape[1:])}, "
            f"the posterior expects {tuple(input_shape)}"
        )
    return data
