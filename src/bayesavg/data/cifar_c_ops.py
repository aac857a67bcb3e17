"""Primitives of the CIFAR-10-C corruptions (``cifar_c``) in numpy, scipy and PIL only.

The benchmark (``make_cifar_c.py`` in hendrycks/robustness) builds its corruptions from
scikit-image, OpenCV and ImageMagick (through Wand). None of them is a dependency here, so
each primitive re-implements the call the benchmark made; its docstring names that call so
the two can be checked against each other. Images are (H, W, C) numpy arrays, as there.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image
from scipy import ndimage


def gaussian(img: np.ndarray, sigma: float, *, channels: bool, **kw: object) -> np.ndarray:
    """``skimage.filters.gaussian(img, sigma, multichannel=channels)``.

    skimage calls ``scipy.ndimage.gaussian_filter`` with mode 'nearest' unless told; a
    channel axis gets sigma 0. Integer input is scaled to [0, 1] first, as skimage does.
    """
    x = img / 255.0 if img.dtype == np.uint8 else img
    kw.setdefault("mode", "nearest")
    return ndimage.gaussian_filter(x, (sigma, sigma, 0.0) if channels else sigma, **kw)


def disk(radius: float, alias_blur: float) -> np.ndarray:
    """The benchmark's ``disk`` for CIFAR's radii (<= 8): an aliased disk on a 17x17 float32
    grid, normalised, then ``cv2.GaussianBlur`` 3x3 (border reflect-101) in OpenCV's float32
    arithmetic, since the truncation to uint8 that follows makes the last bit matter."""
    if radius > 8:
        raise ValueError(f"disk radius {radius} > 8 is ImageNet-C's, not CIFAR-10-C's")
    grid = np.arange(-8, 9)
    xx, yy = np.meshgrid(grid, grid)
    k = np.asarray(xx**2 + yy**2 <= radius**2, dtype=np.float32)
    k /= k.sum()
    t = np.array([-1.0, 0.0, 1.0])  # cv2.getGaussianKernel(3, alias_blur, CV_32F)
    g = np.exp(-0.5 / alias_blur**2 * t * t).astype(np.float32)
    g = (g * (1.0 / g.astype(np.float64).sum())).astype(np.float32)
    for _ in range(2):  # rows, then columns: OpenCV's centre*k0 + (left + right)*k1
        p = np.pad(k, [(0, 0), (1, 1)], mode="reflect")
        k = (p[:, 1:-1] * g[1] + (p[:, :-2] + p[:, 2:]) * g[0]).T
    return k


def motion_blur(img: np.ndarray, radius: float, sigma: float, angle: float) -> np.ndarray:
    """ImageMagick's ``MotionBlurImage`` (what Wand's motion blur calls) on 8-bit ``img``,
    as the 8-bit values ImageMagick 6 (Q16) writes to PNG: rounded to 16 bits, then
    truncated to 8 (checked pixel for pixel against ImageMagick 6.9.11's -motion-blur)."""
    return np.floor(np.rint(smear(img, radius, sigma, angle) * 257) / 257)


def smear(img: np.ndarray, radius: float, sigma: float, angle: float) -> np.ndarray:
    """The motion blur in float, as the ``imagecorruptions`` package re-derived it from
    ImageMagick: a one-sided Gaussian of 2*ceil(radius)+1 taps along ``angle`` degrees,
    edge pixels repeated past the border."""
    width = 2 * math.ceil(radius) + 1
    taps = np.arange(width)
    kernel = np.exp(-(taps**2) / (2.0 * sigma**2))
    kernel /= kernel.sum()
    px, py = width * math.sin(math.radians(angle)), width * math.cos(math.radians(angle))
    hyp = math.hypot(px, py)
    rows, cols = np.arange(img.shape[0]), np.arange(img.shape[1])
    out = np.zeros(img.shape, dtype=np.float64)
    for i in range(width):
        dx, dy = math.ceil(i * py / hyp - 0.5), math.ceil(i * px / hyp - 0.5)
        r = np.clip(rows + dy, 0, len(rows) - 1)
        c = np.clip(cols + dx, 0, len(cols) - 1)
        out += kernel[i] * img[r][:, c]
    return out


def clipped_zoom(img: np.ndarray, zoom: float) -> np.ndarray:
    """The benchmark's ``clipped_zoom``: zoom the centre crop (scipy ``zoom``, order 1, as
    there) and trim back to the input's size."""
    h = img.shape[0]
    ch = math.ceil(h / zoom)
    top = (h - ch) // 2
    out = ndimage.zoom(img[top : top + ch, top : top + ch], (zoom, zoom, 1), order=1)
    trim = (out.shape[0] - h) // 2
    return out[trim : trim + h, trim : trim + h]


def plasma_fractal(rng: np.random.Generator, mapsize: int, wibbledecay: float) -> np.ndarray:
    """The benchmark's diamond-square height map (``plasma_fractal``), in [0, 1]; mapsize a
    power of two. Same steps and draws, from ``rng`` instead of numpy's global state."""
    m = np.zeros((mapsize, mapsize))
    step, wibble = mapsize, 100.0

    def wibbled(a: np.ndarray) -> np.ndarray:
        return a / 4 + wibble * rng.uniform(-wibble, wibble, a.shape)

    while step >= 2:
        half = step // 2
        corners = m[0:mapsize:step, 0:mapsize:step]
        sq = corners + np.roll(corners, -1, axis=0)
        sq += np.roll(sq, -1, axis=1)
        m[half:mapsize:step, half:mapsize:step] = wibbled(sq)
        dr = m[half:mapsize:step, half:mapsize:step]
        ul = m[0:mapsize:step, 0:mapsize:step]
        lt = dr + np.roll(dr, 1, axis=0) + ul + np.roll(ul, -1, axis=1)
        m[0:mapsize:step, half:mapsize:step] = wibbled(lt)
        tt = dr + np.roll(dr, 1, axis=1) + ul + np.roll(ul, -1, axis=0)
        m[half:mapsize:step, 0:mapsize:step] = wibbled(tt)
        step //= 2
        wibble /= wibbledecay
    m -= m.min()
    return m / m.max()


def rgb2hsv(rgb: np.ndarray) -> np.ndarray:
    """``skimage.color.rgb2hsv`` for float RGB in [0, 1] (hue in [0, 1), grey -> hue 0)."""
    v = rgb.max(-1)
    delta = np.ptp(rgb, axis=-1)
    safe = np.where(delta == 0, 1.0, delta)
    s = np.where(delta == 0, 0.0, delta / np.where(v == 0, 1.0, v))
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    # skimage assigns red, then green, then blue where each is the max: the last one wins
    h = np.where(r == v, (g - b) / safe, 0.0)
    h = np.where(g == v, 2.0 + (b - r) / safe, h)
    h = np.where(b == v, 4.0 + (r - g) / safe, h)
    h = np.where(delta == 0, 0.0, (h / 6.0) % 1.0)
    return np.stack([h, s, v], axis=-1)


def hsv2rgb(hsv: np.ndarray) -> np.ndarray:
    """``skimage.color.hsv2rgb``: the six-sector formula."""
    h, s, v = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    hi = np.floor(h * 6)
    f = h * 6 - hi
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    sectors = np.stack(
        [
            np.stack(rgb, axis=-1)
            for rgb in ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))
        ]
    )
    idx = (hi.astype(np.int64) % 6)[None, ..., None]
    return np.take_along_axis(sectors, idx, axis=0)[0]


def canny(img: np.ndarray, low: int, high: int) -> np.ndarray:
    """``cv2.Canny(img, low, high)`` on uint8: 3x3 Sobel (border replicate), L1 magnitude,
    OpenCV's non-maximum suppression (tan 22.5 deg sectors, its > / >= ties, zero outside the
    image) and hysteresis (8-connected). Returns a bool edge map."""
    a = np.pad(img.astype(np.int32), 1, mode="edge")
    dx = (a[:-2, 2:] + 2 * a[1:-1, 2:] + a[2:, 2:]) - (a[:-2, :-2] + 2 * a[1:-1, :-2] + a[2:, :-2])
    dy = (a[2:, :-2] + 2 * a[2:, 1:-1] + a[2:, 2:]) - (a[:-2, :-2] + 2 * a[:-2, 1:-1] + a[:-2, 2:])
    mag = np.abs(dx) + np.abs(dy)
    mp = np.pad(mag, 1)
    h, w = mag.shape

    def at(di: int, dj: np.ndarray | int) -> np.ndarray:
        rows = np.arange(h)[:, None] + 1 + di
        return mp[rows, np.arange(w)[None, :] + 1 + dj]

    x, y = np.abs(dx).astype(np.int64), np.abs(dy).astype(np.int64) << 15
    tg22 = x * 13573  # round(tan(22.5 deg) * 2**15), OpenCV's TG22
    horizontal, vertical = y < tg22, y > tg22 + (x << 16)
    s = np.where((dx ^ dy) < 0, -1, 1)
    keep = np.where(
        horizontal,
        (mag > at(0, -1)) & (mag >= at(0, 1)),
        np.where(
            vertical,
            (mag > at(-1, 0)) & (mag >= at(1, 0)),
            (mag > at(-1, -s)) & (mag > at(1, s)),
        ),
    )
    candidate = keep & (mag > low)
    labels, n = ndimage.label(candidate, structure=np.ones((3, 3)))
    strong = np.unique(labels[candidate & (mag > high)])
    return np.isin(labels, strong[strong > 0]) if n else candidate


def distance_to_zero(zero: np.ndarray) -> np.ndarray:
    """``cv2.distanceTransform(src, DIST_L2, 5)`` where ``zero`` marks the zero pixels: the
    5x5 chamfer distance (float32 steps 1, 1.4, 2.1969), the shortest path of straight,
    diagonal and knight moves, which OpenCV's two raster passes compute. inf where there is
    no zero pixel (the caller truncates)."""
    a, b, c = np.float32(1), np.float32(1.4), np.float32(2.1969)
    zr, zc = np.nonzero(zero)
    if len(zr) == 0:
        return np.full(zero.shape, np.inf, dtype=np.float32)
    rr, cc = np.indices(zero.shape).reshape(2, -1, 1)
    du, dv = np.abs(rr - zr), np.abs(cc - zc)
    u, v = np.maximum(du, dv).astype(np.float32), np.minimum(du, dv).astype(np.float32)
    d = np.where(u >= 2 * v, v * c + (u - 2 * v) * a, (u - v) * c + (2 * v - u) * b)
    return d.min(1).reshape(zero.shape)


def equalize_hist(img: np.ndarray) -> np.ndarray:
    """``cv2.equalizeHist`` on uint8: the cumulative histogram from the first occupied level,
    scaled to 255 and rounded."""
    hist = np.bincount(img.ravel(), minlength=256)
    first = int(np.flatnonzero(hist)[0])
    if hist[first] == img.size:
        return np.full_like(img, first)
    scale = np.float32(255.0 / (img.size - hist[first]))
    lut = np.zeros(256, dtype=np.uint8)
    cum = np.cumsum(hist[first + 1 :])
    lut[first + 1 :] = np.clip(np.rint(cum.astype(np.float32) * scale), 0, 255)  # float32, as C++
    return lut[img]


def box3(img: np.ndarray) -> np.ndarray:
    """``cv2.blur(img, (3, 3))`` (border reflect-101): rounded for uint8, as OpenCV does."""
    out = ndimage.uniform_filter(img.astype(np.float64), size=3, mode="mirror")
    return np.rint(out).astype(np.uint8) if img.dtype == np.uint8 else out.astype(img.dtype)


def filter_u8(img: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """``cv2.filter2D(img, cv2.CV_8U, kernel)`` for an integer kernel: correlation with
    border reflect-101, saturated to 0..255."""
    out = ndimage.correlate(img.astype(np.int64), kernel.astype(np.int64), mode="mirror")
    return np.clip(out, 0, 255).astype(np.uint8)


def water_shading(liquid8: np.ndarray) -> np.ndarray:
    """Spatter's water shading (float32), as the benchmark computes it with OpenCV: distance
    to the drops' Canny edges, truncated at 20, blurred, equalised, embossed, blurred."""
    dist = distance_to_zero(canny(liquid8, 50, 150))
    dist = box3(np.minimum(dist, 20)).astype(np.uint8)  # THRESH_TRUNC at 20
    dist = filter_u8(equalize_hist(dist), np.array([[-2, -1, 0], [-1, 1, 1], [0, 1, 2]]))
    return box3(dist).astype(np.float32)


def affine_from_points(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``cv2.getAffineTransform``: the 2x3 map of three (x, y) points onto three others."""
    a = np.hstack([src.astype(np.float64), np.ones((3, 1))])
    return np.linalg.solve(a, dst.astype(np.float64)).T


def warp_affine(img: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``cv2.warpAffine(img, m, size, borderMode=BORDER_REFLECT_101)`` on float32, bilinear:
    each output pixel samples the input at the inverse map, quantised to 1/32 pixel and
    weighted in float32 as OpenCV's fixed-point remap does."""
    det = m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0]
    inv = np.array([[m[1, 1], -m[0, 1]], [-m[1, 0], m[0, 0]]]) / det
    inv = np.hstack([inv, -inv @ m[:, 2:]])
    yy, xx = np.indices(img.shape[:2])

    def fixed(row: np.ndarray) -> np.ndarray:  # OpenCV: AB_BITS 10, INTER_BITS 5
        base = np.rint((row[1] * yy + row[2]) * 1024).astype(np.int64) + 16
        return (base + np.rint(row[0] * xx * 1024).astype(np.int64)) >> 5

    fx, fy = fixed(inv[0]), fixed(inv[1])
    x0, y0 = fx >> 5, fy >> 5
    tx, ty = (fx & 31).astype(np.float32) / 32, (fy & 31).astype(np.float32) / 32
    one = np.float32(1)

    def at(r: np.ndarray, c: np.ndarray) -> np.ndarray:  # reflect-101 indices
        h, w = img.shape[:2]
        r = (h - 1) - np.abs((h - 1) - np.abs(r))
        return img[r, (w - 1) - np.abs((w - 1) - np.abs(c))]

    weights = ((one - ty) * (one - tx), (one - ty) * tx, ty * (one - tx), ty * tx)
    corners = (at(y0, x0), at(y0, x0 + 1), at(y0 + 1, x0), at(y0 + 1, x0 + 1))
    out = corners[0] * weights[0][..., None]
    for v, wt in zip(corners[1:], weights[1:], strict=True):
        out = out + v * wt[..., None]  # left to right in float32, as OpenCV sums
    return out.astype(np.float32)


def frost_texture(rng: np.random.Generator, size: int) -> np.ndarray:
    """A frost-like RGB layer (float, 0..255) for when the benchmark's frost photographs are
    not at hand. Not the benchmark's textures: ice grain and short needles (sparse seeds
    smeared at random angles) over fractal haze, tinted white to turquoise, at the level
    (~110-210) and 32-pixel-crop contrast (std ~15-35) of the photographs after the
    benchmark's 0.2x resize."""

    def unit(a: np.ndarray) -> np.ndarray:
        return (a - a.mean()) / max(float(a.std()), 1e-12)

    mapsize = 1 << max(size - 1, 1).bit_length()
    haze = plasma_fractal(rng, mapsize, 1.8)[:size, :size]
    grain = ndimage.gaussian_filter(rng.random((size, size)), 0.6)
    needles = np.zeros((size, size))
    for _ in range(2):
        seeds = (rng.random((size, size)) < 0.06).astype(np.float64)
        needles += smear(seeds, rng.uniform(1, 3), 1.5, rng.uniform(0, 360))
    ice = unit(0.4 * unit(haze) + 0.35 * unit(grain) + 0.25 * unit(needles))
    grey = rng.uniform(110, 210) + rng.uniform(15, 35) * ice
    tint = np.array([-rng.uniform(0, 70), -rng.uniform(0, 15), rng.uniform(0, 15)])
    return np.clip(grey[..., None] + tint, 0, 255)


@lru_cache(maxsize=4)
def frost_photographs(folder: str, files: tuple[str, ...]) -> tuple[np.ndarray, ...]:
    """The benchmark's frost photographs as it uses them: ``cv2.resize(fx=fy=0.2)`` with its
    default bilinear, which at exactly 1/5 samples source pixel 5*i + 2 (no averaging)."""
    out = []
    for name in files:
        with Image.open(Path(folder) / name) as im:
            full = np.asarray(im.convert("RGB"))
        h, w = round(full.shape[0] * 0.2), round(full.shape[1] * 0.2)
        out.append(full[2::5, 2::5][:h, :w].astype(np.float64))
    return tuple(out)
