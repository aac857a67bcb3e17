"""CIFAR-10-C: the 19 corruptions of Hendrycks & Dietterich (ICLR 2019) for 32x32 RGB images.

Why two routes. ``official`` loads the published arrays (CIFAR-10-C / CIFAR-100-C on
Zenodo): that is the benchmark, and results should be reported on it. ``corrupt`` rebuilds
the corruptions with the benchmark's CIFAR parameters (``make_cifar_c.py`` in
hendrycks/robustness, not ImageNet-C's), in its order of operations, with its clipping and
its uint8 truncation, so that other images, other seeds and offline tests get the same
shift. Its output matches the official arrays in distribution, not bit for bit: the noise
comes from a numpy ``Generator`` seeded with ``seed`` (drawn image by image, in order)
instead of numpy's global state. The skimage, OpenCV and ImageMagick calls are
re-implemented with scipy, numpy and PIL (``cifar_c_ops`` names each one); given the same
draws, they reproduced the benchmark's functions pixel for pixel against skimage 0.26,
OpenCV 4.10 and ImageMagick 6.9.11. Frost needs the benchmark's frost photographs; without
them (``frost_dir``) a synthetic texture stands in, so prefer the official arrays for frost.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from scipy import ndimage

from . import cifar_c_ops as ops

STANDARD: tuple[str, ...] = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur",
    "motion_blur", "zoom_blur", "snow", "frost", "fog", "brightness", "contrast",
    "elastic_transform", "pixelate", "jpeg_compression",
)  # fmt: skip
EXTRA: tuple[str, ...] = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
ALL: tuple[str, ...] = STANDARD + EXTRA
SEVERITIES = (1, 2, 3, 4, 5)


@dataclass(frozen=True)
class OfficialArchive:
    """Where a published set lives: the Zenodo record, its tar and the tar's MD5 as Zenodo
    lists it. The tar unpacks to ``folder``/<corruption>.npy and ``folder``/labels.npy."""

    folder: str
    record: str
    url: str
    md5: str


OFFICIAL: dict[str, OfficialArchive] = {
    "cifar10": OfficialArchive(
        "CIFAR-10-C",
        "https://zenodo.org/records/2535967",
        "https://zenodo.org/records/2535967/files/CIFAR-10-C.tar?download=1",
        "56bf5dcef84df0e2308c6dcbcbbd8499",
    ),
    "cifar100": OfficialArchive(
        "CIFAR-100-C",
        "https://zenodo.org/records/3555552",
        "https://zenodo.org/records/3555552/files/CIFAR-100-C.tar?download=1",
        "11f0ed0f1191edbf9fa23466ae6021d3",
    ),
}

# make_cifar_c.py's constants, one tuple per severity 1..5 (zoom factors built there too)
PARAMS: dict[str, tuple[Any, ...]] = {
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),
    "shot_noise": (500, 250, 100, 75, 50),
    "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),
    "speckle_noise": (0.06, 0.1, 0.12, 0.16, 0.2),
    "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1.0),
    "glass_blur": ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)),
    "defocus_blur": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)),
    "motion_blur": ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)),
    "zoom_blur": tuple(np.arange(1, stop, 0.01) for stop in (1.06, 1.11, 1.16, 1.21, 1.26)),
    "snow": (
        (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
        (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
        (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
        (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
        (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
    ),
    "frost": ((1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)),
    "fog": ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)),
    "spatter": (
        (0.62, 0.1, 0.7, 0.7, 0.5, 0),
        (0.65, 0.1, 0.8, 0.7, 0.5, 0),
        (0.65, 0.3, 1, 0.69, 0.5, 0),
        (0.65, 0.1, 0.7, 0.69, 0.6, 1),
        (0.65, 0.1, 0.5, 0.68, 0.6, 1),
    ),
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),
    "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),
    "saturate": ((0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)),
    "jpeg_compression": (80, 65, 58, 50, 40),
    "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),
    # fractions of the image side (IMSIZE = 32 there): displacement, smoothing, affine jitter
    "elastic_transform": (
        (0, 0, 0.08),
        (0.05, 0.2, 0.07),
        (0.08, 0.06, 0.06),
        (0.1, 0.04, 0.05),
        (0.1, 0.03, 0.03),
    ),
}
# The benchmark picks among its first five photographs (np.random.randint(5)): frost6 unused
FROST_FILES = ("frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg")

Op = Callable[[np.ndarray, Any, np.random.Generator], np.ndarray]


def _unit(img: np.ndarray) -> np.ndarray:
    return img / 255.0


def _gaussian_noise(img: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
    x = _unit(img)
    return np.clip(x + rng.normal(size=x.shape, scale=c), 0, 1) * 255


def _shot_noise(img: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
    return np.clip(rng.poisson(_unit(img) * c) / c, 0, 1) * 255


def _impulse_noise(img: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
    # skimage random_noise(mode='s&p', amount=c): each value flipped with probability c,
    # to 1 or 0 with even odds (salt_vs_pepper 0.5)
    x = _unit(img)
    flipped, salted = rng.random(x.shape) < c, rng.random(x.shape) < 0.5
    return np.where(flipped, np.where(salted, 1.0, 0.0), x) * 255


def _speckle_noise(img: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
    x = _unit(img)
    return np.clip(x + x * rng.normal(size=x.shape, scale=c), 0, 1) * 255


def _gaussian_blur(img: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
    return np.clip(ops.gaussian(img, c, channels=True), 0, 1) * 255


def _glass_blur(img: np.ndarray, c: tuple, rng: np.random.Generator) -> np.ndarray:
    sigma, delta, iterations = c
    x = (ops.gaussian(img, sigma, channels=True) * 255).astype(np.uint8)
    steps = range(img.shape[0] - delta, delta, -1)
    for _ in range(iterations):
        # drawn at once: the same stream as the benchmark's one (dx, dy) pair per pixel
        offsets = rng.integers(-delta, delta, size=(len(steps), len(steps), 2)).tolist()
        for h, row in zip(steps, offsets, strict=True):
            for w, (dx, dy) in zip(steps, row, strict=True):
                # The benchmark's "swap" (a, b = b, a on numpy views) copies the neighbour
                # into (h, w) and leaves the neighbour as it was; the official arrays were
                # made so, and so is this.
                x[h, w] = x[h + dy, w + dx]
    return np.clip(ops.gaussian(x, sigma, channels=True), 0, 1) * 255


def _defocus_blur(img: np.ndarray, c: tuple, rng: np.random.Generator) -> np.ndarray:
    # cv2.filter2D per channel (correlation, border reflect-101 = scipy 'mirror')
    kernel, x = ops.disk(*c), _unit(img)
    out = [ndimage.correlate(x[..., d], kernel, mode="mirror") for d in range(3)]
    return np.clip(np.stack(out, axis=-1), 0, 1) * 255


def _motion_blur(img: np.ndarray, c: tuple, rng: np.random.Generator) -> np.ndarray:
    return ops.motion_blur(img, c[0], c[1], rng.uniform(-45, 45))


def _zoom_blur(img: np.ndarray, c: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    x = _unit(img).astype(np.float32)
    out = np.zeros_like(x)
    for zoom in c:
        out += ops.clipped_zoom(x, zoom)
    return np.clip((x + out) / (len(c) + 1), 0, 1) * 255


def _snow(img: np.ndarray, c: tuple, rng: np.random.Generator) -> np.ndarray:
    x = img.astype(np.float32) / 255
    layer = rng.normal(size=x.shape[:2], loc=c[0], scale=c[1])
    layer = ops.clipped_zoom(layer[..., None], c[2])[..., 0]
    layer[layer < c[3]] = 0
    layer8 = (np.clip(layer, 0, 1) * 255).astype(np.uint8)  # the PIL 'L' image Wand gets
    blurred = ops.motion_blur(layer8, c[4], c[5], rng.uniform(-135, -45))
    flakes = (blurred / 255.0)[..., None]
    # cv2 RGB2GRAY in float32 (OpenCV builds differ in the last bit: FMA or not)
    grey = x[..., 0] * np.float32(0.299) + x[..., 1] * np.float32(0.587)
    grey = grey + x[..., 2] * np.float32(0.114)
    x = c[6] * x + (1 - c[6]) * np.maximum(x, grey[..., None] * 1.5 + 0.5)
    return np.clip(x + flakes + np.rot90(flakes, k=2), 0, 1) * 255


def _fog(img: np.ndarray, c: tuple, rng: np.random.Generator) -> np.ndarray:
    x = _unit(img)
    top = x.max()
    mapsize = max(32, 1 << (img.shape[0] - 1).bit_length())
    x = x + c[0] * ops.plasma_fractal(rng, mapsize, c[1])[: x.shape[0], : x.shape[1], None]
    return np.clip(x * top / (top + c[0]), 0, 1) * 255


def _brightness(img: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
    hsv = ops.rgb2hsv(_unit(img))
    hsv[..., 2] = np.clip(hsv[..., 2] + c, 0, 1)
    return np.clip(ops.hsv2rgb(hsv), 0, 1) * 255


def _saturate(img: np.ndarray, c: tuple, rng: np.random.Generator) -> np.ndarray:
    hsv = ops.rgb2hsv(_unit(img))
    hsv[..., 1] = np.clip(hsv[..., 1] * c[0] + c[1], 0, 1)
    return np.clip(ops.hsv2rgb(hsv), 0, 1) * 255


def _contrast(img: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
    x = _unit(img)
    means = x.mean(axis=(0, 1), keepdims=True)
    return np.clip((x - means) * c + means, 0, 1) * 255


def _jpeg_compression(img: np.ndarray, c: int, rng: np.random.Generator) -> np.ndarray:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=c)
    return np.asarray(Image.open(buf).convert("RGB"))


def _pixelate(img: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
    n = img.shape[0]
    small = Image.fromarray(img).resize((int(n * c), int(n * c)), Image.Resampling.BOX)
    return np.asarray(small.resize((n, n), Image.Resampling.BOX))


def _elastic_transform(img: np.ndarray, c: tuple, rng: np.random.Generator) -> np.ndarray:
    n = img.shape[0]
    alpha, sigma, jitter = (v * n for v in c)
    x = img.astype(np.float32) / 255
    centre, half = np.float32([n, n]) // 2, n // 3
    src = np.float32([centre + half, [centre[0] + half, centre[1] - half], centre - half])
    dst = src + rng.uniform(-jitter, jitter, size=src.shape).astype(np.float32)
    x = ops.warp_affine(x, ops.affine_from_points(src, dst))
    # skimage gaussian(mode='reflect', truncate=3) = scipy's; then scipy map_coordinates

    def field() -> np.ndarray:
        u = rng.uniform(-1, 1, size=(n, n))
        smooth = ops.gaussian(u, sigma, channels=False, mode="reflect", truncate=3)
        return (smooth * alpha).astype(np.float32)

    dx = field()
    dy = field()
    rows, cols = np.indices((n, n))
    coords = [rows + dy, cols + dx]
    out = [ndimage.map_coordinates(x[..., k], coords, order=1, mode="reflect") for k in range(3)]
    return np.clip(np.stack(out, axis=-1), 0, 1) * 255


def _spatter(img: np.ndarray, c: tuple, rng: np.random.Generator) -> np.ndarray:
    x = img.astype(np.float32) / 255
    liquid = rng.normal(size=x.shape[:2], loc=c[0], scale=c[1])
    liquid = ops.gaussian(liquid, c[2], channels=False)
    liquid[liquid < c[3]] = 0
    if c[5] == 0:  # water: pale turquoise, shaded along the drops' edges
        # clipped before the cast: the benchmark's astype wraps values over 1 (rare)
        liquid8 = (np.clip(liquid, 0, 1) * 255).astype(np.uint8)
        m = liquid8 * ops.water_shading(liquid8)
        # m /= max; an all-zero layer (no drop: 0/0 there) is left without spatter here
        m = m / m.max() * c[4] if m.max() > 0 else m
        color = np.array([175, 238, 238], dtype=np.float32) / 255
        return np.clip(x + m[..., None] * color, 0, 1) * 255
    mask = ops.gaussian((liquid > c[3]).astype(np.float32), c[4], channels=False)  # mud
    mask[mask < 0.8] = 0
    mud = np.array([63, 42, 20], dtype=np.float32) / 255 * mask[..., None]
    return np.clip(x * (1 - mask[..., None]) + mud, 0, 1) * 255


def _frost_op(frost_dir: Path | None) -> Op:
    textures = None
    if frost_dir is not None:
        missing = [f for f in FROST_FILES if not (Path(frost_dir) / f).is_file()]
        if missing:
            warnings.warn(
                f"{frost_dir} lacks {missing}: frost uses a synthetic texture", stacklevel=3
            )
        else:
            textures = ops.frost_photographs(str(Path(frost_dir).resolve()), FROST_FILES)

    def frost(img: np.ndarray, c: tuple, rng: np.random.Generator) -> np.ndarray:
        n = img.shape[0]
        if textures is None:
            layer = np.rint(ops.frost_texture(rng, n))  # stands in for an 8-bit photograph
        else:
            texture = textures[rng.integers(5)]
            if min(texture.shape[:2]) <= n:
                raise ValueError(f"frost photographs (~63 px after resize) too small for {n} px")
            top, left = rng.integers(0, texture.shape[0] - n), rng.integers(0, texture.shape[1] - n)
            layer = texture[top : top + n, left : left + n]
        return np.clip(c[0] * img + c[1] * layer, 0, 255)

    return frost


OPS: dict[str, Op] = {name: globals()[f"_{name}"] for name in ALL if name != "frost"}


def check(name: str, severity: int) -> None:
    """ValueError, in one line, unless ``name`` is a corruption and ``severity`` in 1..5."""
    if name not in ALL:
        raise ValueError(f"unknown corruption {name!r}; allowed: {', '.join(ALL)}")
    if isinstance(severity, bool) or severity not in SEVERITIES:
        raise ValueError(f"severity must be one of 1, 2, 3, 4, 5; got {severity!r}")


def corrupt(
    x: torch.Tensor, name: str, severity: int, seed: int, *, frost_dir: Path | None = None
) -> torch.Tensor:
    """Corrupt uint8 images (N, 3, H, W) as CIFAR-10-C's ``name`` at ``severity`` (1..5).

    Deterministic in (x, name, severity, seed): one numpy Generator seeded with ``seed``
    serves the images in order, so another seed draws other noise. Square images of any
    side >= 8 work; the pixel-sized parameters are CIFAR's (32 px), not rescaled (elastic,
    given as fractions of the side, is). ``frost_dir``: a folder with the benchmark's
    frost1.png, frost2.png, frost3.png, frost4.jpg and frost5.jpg; without them frost blends
    a synthetic texture (``cifar_c_ops.frost_texture``), NOT the benchmark's, so frost then
    only resembles CIFAR-10-C: prefer ``official`` arrays for frost.
    """
    check(name, severity)
    if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.ndim != 4 or x.shape[1] != 3:
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"corrupt needs uint8 images of shape (N, 3, H, W); got {got}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ValueError(f"corrupt needs an integer seed; got {seed!r}")
    if x.shape[2] != x.shape[3] or x.shape[2] < 8:
        raise ValueError(f"corrupt needs square images of side >= 8; got {x.shape[2]}x{x.shape[3]}")
    op = _frost_op(frost_dir) if name == "frost" else OPS[name]
    c = PARAMS[name][severity - 1]
    rng = np.random.default_rng(seed)
    images = x.detach().cpu().permute(0, 2, 3, 1).numpy()
    out = np.empty_like(images)
    for i, img in enumerate(images):
        # np.uint8(...) of the clipped float result, as the benchmark saved it: truncation
        out[i] = np.clip(op(np.ascontiguousarray(img), c, rng), 0, 255).astype(np.uint8)
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous().to(x.device)


def _archive(dataset: str) -> OfficialArchive:
    if dataset not in OFFICIAL:
        raise ValueError(f"no official corrupted set for {dataset!r}; allowed: cifar10, cifar100")
    return OFFICIAL[dataset]


def official_hint(raw_dir: Path, dataset: str) -> str:
    """One line telling where the official arrays go and where to get them."""
    a = _archive(dataset)
    return (
        f"{a.folder} not found: download {a.url} (MD5 {a.md5}) and unpack it so that "
        f"{Path(raw_dir) / a.folder}/<corruption>.npy and labels.npy exist"
    )


def official(
    raw_dir: Path, dataset: str, name: str, severity: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The published images of ``name`` at ``severity`` as uint8 (N, 3, 32, 32) and their
    int64 labels, or None when ``raw_dir``/CIFAR-10-C (cifar10) or CIFAR-100-C (cifar100)
    lacks ``name``.npy or labels.npy. Each array stacks severities 1..5 in order (10,000
    test images each), so severity s is the s-th fifth."""
    a = _archive(dataset)
    check(name, severity)
    folder = Path(raw_dir) / a.folder
    images_file, labels_file = folder / f"{name}.npy", folder / "labels.npy"
    if not (images_file.is_file() and labels_file.is_file()):
        return None
    images = np.load(images_file, mmap_mode="r")
    labels = np.load(labels_file, mmap_mode="r")
    if (
        images.dtype != np.uint8
        or images.ndim != 4
        or images.shape[-1] != 3
        or len(images) % 5
        or labels.shape != images.shape[:1]
    ):
        raise ValueError(
            f"{images_file}: expected uint8 (5*N, H, W, 3) and as many labels; got "
            f"{images.dtype} {images.shape} and labels {labels.shape}"
        )
    n = len(images) // 5
    block = slice((severity - 1) * n, severity * n)
    x = torch.from_numpy(np.array(images[block])).permute(0, 3, 1, 2).contiguous()
    return x, torch.from_numpy(np.array(labels[block], dtype=np.int64))
