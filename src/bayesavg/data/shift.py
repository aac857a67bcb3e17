"""Dataset shift: rotated test images and MNIST-C-style corruptions, in torch.

Shifts act on the stored images (uint8, or float in [0, 1]) before
``prepared.to_input`` normalises them, so a shifted set is just another split:
same dtype, same range, same shape. Each shift is a pure function of the
images, the seed and the severity: randomness comes from a CPU
``torch.Generator`` seeded per corruption (never torch's global stream) and
is moved to the images' device, so CPU and CUDA draw the same noise.

Corruptions follow MNIST-C (Mu & Gilmer, 2019, google-research/mnist-c):
severity is a level 1..5 indexing the parameter tables below, and each
default level is the one MNIST-C used to build its benchmark (stripe has no
levels there; its default is MNIST-C's 7-of-28-column stripes). Geometric
parameters are in pixels or fractions of the image, so they mean the same
on 28x28 MNIST and 32x32 CIFAR. Rotation is counter-clockwise as displayed
(row 0 at the top): 90 degrees equals ``torch.rot90(x, 1, dims=(-2, -1))``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..seeding import derive_seed

# The rotation sweep: 0 (the clean set) to 180 degrees in steps of 15.
ANGLES: tuple[int, ...] = tuple(range(0, 181, 15))
LEVELS = (1, 2, 3, 4, 5)


def _check_images(x: torch.Tensor) -> None:
    if x.dim() != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {tuple(x.shape)}")
    if x.dtype != torch.uint8 and not x.dtype.is_floating_point:
        raise ValueError(f"images must be uint8 or float in [0, 1], got {x.dtype}")


def _to_unit(x: torch.Tensor) -> torch.Tensor:
    """Stored images -> a float32 copy in [0, 1], where the arithmetic happens."""
    if x.dtype == torch.uint8:
        return x.float().div_(255)
    return x.to(torch.float32, copy=True)


def _from_unit(y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Back to the stored dtype and range (in place on ``y``, which is scratch)."""
    y = y.clamp_(0, 1)
    if like.dtype == torch.uint8:
        return y.mul_(255).round_().to(torch.uint8)
    return y.to(like.dtype)


def _warp(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Sample ``x`` (float, N C H W) at ``a @ p`` for each output pixel ``p``.

    ``a`` is a 2x2 inverse map in pixel units about the image centre (x right,
    y down), shared by all images: one grid, expanded, is much cheaper than a
    grid per image. Bilinear, zero fill; align_corners=False puts the centre
    at (W-1)/2, the convention of MNIST-C's skimage warps, and maps multiples
    of 90 degrees onto the pixel grid exactly.
    """
    n, _, h, w = x.shape
    # Normalised coordinates are pixels scaled by 2/W and 2/H: conjugate by that
    # scaling so non-square images rotate without shearing.
    aspect = torch.tensor([[1.0, h / w], [w / h, 1.0]])
    theta = torch.cat([a.float() * aspect, torch.zeros(2, 1)], dim=1)
    grid = F.affine_grid(theta[None].to(x.device), [1, 1, h, w], align_corners=False)
    return F.grid_sample(
        x, grid.expand(n, h, w, 2), mode="bilinear", padding_mode="zeros", align_corners=False
    )


def _cos_sin(degrees: float) -> tuple[float, float]:
    """Exact for multiples of 90 degrees, so those rotations move pixels without blur."""
    exact = {0: (1.0, 0.0), 90: (0.0, 1.0), 180: (-1.0, 0.0), 270: (0.0, -1.0)}
    if degrees % 90 == 0:
        return exact[int(degrees % 360)]
    rad = math.radians(degrees)
    return math.cos(rad), math.sin(rad)


def _angle(degrees: object) -> float:
    if (
        isinstance(degrees, bool)
        or not isinstance(degrees, numbers.Real)
        or not math.isfinite(degrees)
    ):
        raise ValueError(f"rotation angle must be a finite number of degrees, got {degrees!r}")
    return float(degrees)


def rotate(x: torch.Tensor, degrees: float) -> torch.Tensor:
    """Rotate images counter-clockwise by ``degrees`` about the centre (bilinear, zero fill)."""
    _check_images(x)
    degrees = _angle(degrees)
    if degrees % 360 == 0:
        return x.clone()
    c, s = _cos_sin(degrees)
    # The forward map turns (x, y) to (c x + s y, -s x + c y) with y down;
    # grid_sample needs its inverse.
    a = torch.tensor([[c, -s], [s, c]])
    return _from_unit(_warp(_to_unit(x), a), x)


def translate(x: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """Move content ``dy`` pixels down and ``dx`` right; what leaves the frame is lost."""
    _check_images(x)
    h, w = x.shape[-2:]
    out = torch.zeros_like(x)
    if abs(dy) >= h or abs(dx) >= w:
        return out
    src_y, dst_y = slice(max(-dy, 0), h - max(dy, 0)), slice(max(dy, 0), h - max(-dy, 0))
    src_x, dst_x = slice(max(-dx, 0), w - max(dx, 0)), slice(max(dx, 0), w - max(-dx, 0))
    out[..., dst_y, dst_x] = x[..., src_y, src_x]
    return out


# Corruptions work on float images in [0, 1] on x's device and draw from a CPU
# generator; ``_from_unit`` clamps and converts back.


def _random_signs(n: int, k: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """MNIST-C flips the direction of each geometric corruption per image at random."""
    return (torch.randint(0, 2, (n, k), generator=gen) * 2 - 1).to(device)


def _shot_noise(x: torch.Tensor, photons: float, gen: torch.Generator) -> torch.Tensor:
    """Poisson counts of ``photons`` per unit intensity; black stays black."""
    counts = torch.poisson(x.cpu() * photons, generator=gen)
    return counts.to(x.device) / photons


def _impulse_noise(x: torch.Tensor, amount: float, gen: torch.Generator) -> torch.Tensor:
    """Salt and pepper: each value is set to 1 or 0 (even odds) with probability ``amount``."""
    u = torch.rand(x.shape, generator=gen).to(x.device)
    out = torch.where(u < amount / 2, 1.0, x)
    return torch.where((u >= amount / 2) & (u < amount), 0.0, out)


def _translate(x: torch.Tensor, pixels: float, gen: torch.Generator) -> torch.Tensor:
    """Shift by ``pixels`` along both axes, each direction random per image."""
    k = int(pixels)
    signs = _random_signs(x.shape[0], 2, gen, x.device)
    out = torch.empty_like(x)
    for sy in (-1, 1):
        for sx in (-1, 1):
            mask = (signs[:, 0] == sy) & (signs[:, 1] == sx)
            out[mask] = translate(x[mask], sy * k, sx * k)
    return out


def _shear(x: torch.Tensor, angle: float, gen: torch.Generator) -> torch.Tensor:
    """skimage's ``AffineTransform(shear=±angle)`` about the centre, as MNIST-C warps it."""
    signs = _random_signs(x.shape[0], 1, gen, x.device)[:, 0]
    out = torch.empty_like(x)
    for sign in (-1, 1):
        a = torch.tensor([[1.0, -math.sin(sign * angle)], [0.0, math.cos(angle)]])
        out[signs == sign] = _warp(x[signs == sign], a)
    return out


def _scale(x: torch.Tensor, factor: float, gen: torch.Generator) -> torch.Tensor:
    """Shrink content to ``factor`` of its size about the centre (zero fill around it)."""
    return _warp(x, torch.eye(2) / factor)


def _brightness(x: torch.Tensor, delta: float, gen: torch.Generator) -> torch.Tensor:
    """Add ``delta`` to HSV value, hue and saturation kept (plain addition for grey)."""
    value = x.amax(dim=1, keepdim=True)
    new_value = (value + delta).clamp(max=1.0)
    # RGB is proportional to V at fixed hue and saturation; black has no hue and becomes grey.
    return torch.where(value > 0, x * (new_value / value.clamp(min=1e-12)), new_value)


def _stripe(x: torch.Tensor, fraction: float, gen: torch.Generator) -> torch.Tensor:
    """Invert a band of ``fraction`` of the width at the left and the right edge."""
    w = x.shape[-1]
    k = round(fraction * w)
    out = x.clone()
    out[..., :k] = 1 - x[..., :k]
    out[..., w - k :] = 1 - x[..., w - k :]
    return out


@dataclass(frozen=True)
class Corruption:
    """One corruption: its function, the parameter at each level 1..5, its default level."""

    fn: Callable[[torch.Tensor, float, torch.Generator], torch.Tensor]
    levels: tuple[float, float, float, float, float]
    default: int
    random: bool


# Parameter tables and default levels are MNIST-C's (corruptions.py there).
CORRUPTIONS: dict[str, Corruption] = {
    # photons per unit intensity; 3 is harsh, but only the strokes are affected
    "shot_noise": Corruption(_shot_noise, (60, 25, 12, 5, 3), 5, True),
    # fraction of values replaced by 0 or 1
    "impulse_noise": Corruption(_impulse_noise, (0.03, 0.06, 0.09, 0.17, 0.27), 4, True),
    # pixels along each axis
    "translate": Corruption(_translate, (1, 2, 3, 4, 5), 3, True),
    # skimage shear angle in radians
    "shear": Corruption(_shear, (0.2, 0.4, 0.6, 0.8, 1.0), 2, True),
    # size of the content after scaling
    "scale": Corruption(_scale, (0.9, 0.8, 0.7, 0.6, 0.5), 3, False),
    # added to HSV value
    "brightness": Corruption(_brightness, (0.1, 0.2, 0.3, 0.4, 0.5), 5, False),
    # fraction of the width inverted at each side; MNIST-C: 7 of 28 columns
    "stripe": Corruption(_stripe, (0.1, 0.15, 0.2, 0.25, 0.3), 4, False),
}


def _corruption(name: str) -> Corruption:
    if name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; choose from {', '.join(CORRUPTIONS)}")
    return CORRUPTIONS[name]


def _level(name: str, severity: int | None) -> int:
    default = _corruption(name).default
    level = default if severity is None else severity
    if isinstance(level, bool) or level not in LEVELS:
        raise ValueError(f"severity of {name} must be an integer 1..5, got {severity!r}")
    return int(level)


def corrupt(x: torch.Tensor, name: str, seed: int, severity: int | None = None) -> torch.Tensor:
    """Corrupt images with ``name`` at level ``severity`` (MNIST-C's level if None).

    The noise stream is derived from ``seed``, the name and the level, so two
    corruptions of the same images never share noise. It is drawn for the
    whole batch: corrupt a split once (10,000 MNIST images take ~0.1 s), not
    batch by batch, or every batch would get the same noise.
    """
    _check_images(x)
    corruption = _corruption(name)
    level = _level(name, severity)
    gen = torch.Generator().manual_seed(derive_seed(seed, "shift", name, level))
    return _from_unit(corruption.fn(_to_unit(x), corruption.levels[level - 1], gen), x)


# CIFAR-10-C's corruptions (``cifar_c``) are kinds ``c_<name>``: the prefix keeps them
# apart from MNIST-C's (both have a shot_noise and a brightness), and a report from
# aggregating them with the others. Their module (and scipy) loads only when used.
C_PREFIX = "c_"
CIFAR_C_GROUPS = ("all", "standard")


@dataclass(frozen=True)
class Shift:
    """One shifted version of a test set: a rotation by ``parameter`` degrees or a corruption.

    ``kind`` is ``"rotate"``, an MNIST-C-style corruption name, or ``c_<name>`` for a
    CIFAR-10-C corruption; for corruptions ``parameter`` is the severity level. ``name``
    is the key used in metrics (``rotate_15``, ``shot_noise``; a non-default level is
    appended, ``shot_noise_3``; CIFAR-10-C's always, ``c_fog_3``).
    """

    kind: str
    parameter: float

    def __post_init__(self) -> None:
        if self.kind == "rotate":
            _angle(self.parameter)
        elif self.kind.startswith(C_PREFIX):
            from . import cifar_c

            cifar_c.check(self.kind.removeprefix(C_PREFIX), self.parameter)  # type: ignore[arg-type]
        else:
            _level(self.kind, self.parameter)  # type: ignore[arg-type]

    @property
    def name(self) -> str:
        if self.kind == "rotate":
            return f"rotate_{self.parameter:g}"
        if self.kind.startswith(C_PREFIX) or self.parameter != CORRUPTIONS[self.kind].default:
            return f"{self.kind}_{int(self.parameter)}"
        return self.kind

    @property
    def cifar_c(self) -> str | None:
        """The CIFAR-10-C corruption's name, or None for the other shifts."""
        return self.kind.removeprefix(C_PREFIX) if self.kind.startswith(C_PREFIX) else None

    def apply(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        """The shifted images (same dtype, range and shape); rotations ignore ``seed``."""
        if self.kind == "rotate":
            return rotate(x, self.parameter)
        if self.cifar_c is not None:
            from . import cifar_c

            level = int(self.parameter)
            return cifar_c.corrupt(x, self.cifar_c, level, derive_seed(seed, self.kind, level))
        return corrupt(x, self.kind, seed, int(self.parameter))


def cifar_c_shifts(names: Iterable[str], severities: Iterable[int]) -> list[Shift]:
    """CIFAR-10-C's corruptions (names, or the groups ``all``: 19, ``standard``: 15) at each
    severity, corruption by corruption."""
    names = list(names)
    if not names:
        return []  # the module (and scipy, ~0.3 s) loads only for CIFAR-10-C
    from . import cifar_c

    groups = {"all": cifar_c.ALL, "standard": cifar_c.STANDARD}
    listed = [c for name in names for c in groups.get(name, (name,))]
    return [Shift(f"{C_PREFIX}{c}", level) for c in dict.fromkeys(listed) for level in severities]


def shifts(
    angles: Iterable[float] = ANGLES,
    corruptions: Iterable[str] = tuple(CORRUPTIONS),
    severity: int | None = None,
    cifar_c: Iterable[str] = (),
    cifar_c_severities: Iterable[int] = (1, 2, 3, 4, 5),
) -> list[Shift]:
    """The rotations, then the corruptions (each at ``severity``, or its default level),
    then CIFAR-10-C's (``cifar_c_shifts``)."""
    out = [Shift("rotate", angle) for angle in angles]
    out += [Shift(name, _level(name, severity)) for name in corruptions]
    out += cifar_c_shifts(cifar_c, cifar_c_severities)
    names = [s.name for s in out]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"shifts listed twice: {', '.join(duplicates)}")
    return out


def parse(name: str) -> Shift:
    """The shift a metrics key names: ``rotate_<degrees>``, ``<corruption>`` (its default
    level) or ``<corruption>_<level>``; the inverse of ``Shift.name``."""
    if name.startswith("rotate_"):
        try:
            degrees = float(name.removeprefix("rotate_"))
        except ValueError:
            raise ValueError(f"shift {name!r}: rotate_<degrees>, e.g. rotate_15") from None
        return Shift("rotate", degrees)
    base, _, level = name.rpartition("_")
    if base.startswith(C_PREFIX) and level.isascii() and level.isdigit():
        return Shift(base, int(level))
    if base in CORRUPTIONS and level.isascii() and level.isdigit():
        return Shift(base, int(level))
    if name in CORRUPTIONS:
        return Shift(name, CORRUPTIONS[name].default)
    raise ValueError(
        f"unknown shift {name!r}; rotate_<degrees> or one of {', '.join(CORRUPTIONS)} "
        "(optionally _<level 1-5>)"
    )


def parse_many(names: Iterable[str]) -> list[Shift]:
    """Shifts by name (``parse``) for ``bayesavg evaluate --shift``, with ``rotations`` (the
    13 angles of ``ANGLES``) and ``corruptions`` (all of ``CORRUPTIONS`` at their default
    level) and ``cifar-c`` (CIFAR-10-C's 19 corruptions at severities 1-5) expanded; a
    shift named twice, directly or through a group, counts once, in the
    order first named."""
    found: dict[str, Shift] = {}
    for name in names:
        if name == "rotations":
            group = shifts(corruptions=())
        elif name == "corruptions":
            group = shifts(angles=())
        elif name == "cifar-c":
            group = cifar_c_shifts(["all"], (1, 2, 3, 4, 5))
        else:
            group = [parse(name)]
        for shift in group:
            found.setdefault(shift.name, shift)
    return list(found.values())
