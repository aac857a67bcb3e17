"""The inputs predicted beside the clean test split: shifted test images and OOD images.

The pipeline's evaluate stages and ``bayesavg evaluate`` build them here, so
both shift the same test subset with the same seeds and read OOD sets the
same way; every posterior sample then predicts the clean split, every shift
and every OOD set in one forward pass (``bayesavg.evaluation.evaluate.evaluate``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ..runtime.errors import UserError
from ..seeding import derive_seed, generator
from .datasets import Split
from .ood_data import OOD_SETS, load_ood, ood_set_error
from .prepared import load_eval_split
from .shift import Shift


def shift_subset(test: Split, n_points: int, seed: int) -> Split:
    """The fixed seeded test images every shift transforms (all of them if ``n_points``
    is at least the split's size); the same subset for every predictor."""
    return test.random_subset(n_points, shift_seed(seed))


Official = Callable[[Shift], torch.Tensor | None]


def shifted(
    images: torch.Tensor, shifts: Sequence[Shift], seed: int, official: Official | None = None
) -> dict[str, torch.Tensor]:
    """Each shift's version of ``images`` by its metrics name; corruptions seeded by ``seed``.
    ``official(shift)``: the published images of a shift where there are some
    (``official_cifar_c``), used instead of generating it."""
    out = {}
    for s in shifts:
        found = official(s) if official is not None else None
        try:
            out[s.name] = (
                found if found is not None else s.apply(images, derive_seed(seed, "shift"))
            )
        except ValueError as err:
            raise UserError(f"shift {s.name}: {err}") from None
    return out


def official_cifar_c(
    raw_dir: str | Path, dataset: str, seed: int, test: Split, positions: torch.Tensor
) -> tuple[Official, list[str]]:
    """The official CIFAR-10-C / CIFAR-100-C images of the test images at ``positions`` of
    the stored test split, for ``shifted``, and the names of the shifts it served (filled
    as it serves them).

    The data stage keeps the official test split whole, in a seeded order
    (``prepared.split_indices``): that order is recomputed here, so the official images of
    exactly these test images are taken, and their labels are checked against the split's."""
    from . import cifar_c

    served: list[str] = []
    if dataset not in cifar_c.OFFICIAL:
        return (lambda s: None), served
    n = len(test)
    order = torch.randperm(n, generator=generator(derive_seed(seed, "order", "test")))
    source = order[positions]

    def images(s: Shift) -> torch.Tensor | None:
        if s.cifar_c is None:
            return None
        try:
            found = cifar_c.official(Path(raw_dir), dataset, s.cifar_c, int(s.parameter))
        except (OSError, ValueError) as err:  # a truncated unpack, another array
            a = cifar_c.OFFICIAL[dataset]
            raise UserError(
                f"{Path(raw_dir) / a.folder}/{s.cifar_c}.npy or labels.npy is unreadable "
                f"({err}); unpack {a.url} (MD5 {a.md5}) there again"
            ) from None
        if found is None:
            return None
        x, y = found
        if x.shape[1:] != test.x.shape[1:]:
            return None  # the data stage resized the images (data.image_size): generate
        if x.shape[0] != n or not torch.equal(y[source], test.y[positions]):
            hint = cifar_c.official_hint(Path(raw_dir), dataset)
            raise UserError(
                f"{cifar_c.OFFICIAL[dataset].folder}/{s.cifar_c}.npy does not hold the "
                f"{dataset} test split in its published order; {hint}"
            )
        served.append(s.name)
        return x[source]

    return images, served


def subset_positions(n: int, n_points: int, seed: int) -> torch.Tensor:
    """Where ``shift_subset``'s images sit in the test split."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(shift_seed(seed)))[:n_points]


def shift_seed(seed: int) -> int:
    """The seed of the shifted subset (``shift_subset``)."""
    return derive_seed(seed, "shift_subset")


def ood_images(
    spec: str,
    input_shape: Sequence[int],
    raw_dir: str | Path,
    fractions: tuple[int, float, float],
    n_points: int | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """uint8 images of OOD set ``spec``: a packaged set (``OOD_SETS``) or a dataset spec's
    test split (``fashion_mnist``, ``imagefolder:<DIR>``); ``fractions`` are the (seed,
    test_fraction, val_fraction) that split a dataset spec. ``n_points``: a fixed seeded
    subset of that many (None: all)."""
    if spec in OOD_SETS:
        images = load_ood(spec)
    else:
        try:
            images = load_eval_split(spec, raw_dir, tuple(input_shape), "test", *fractions)  # type: ignore[arg-type]
        except UserError as err:
            raise ood_set_error(spec, err) from None
    if tuple(images.x.shape[1:]) != tuple(input_shape):
        raise UserError(
            f"OOD set {spec}: images of shape {tuple(images.x.shape[1:])}, the network takes "
            f"{tuple(input_shape)}"
        )
    if n_points is not None:
        images = images.random_subset(n_points, derive_seed(seed, "ood_subset", spec))
    return images.x
