"""Out-of-distribution image sets available offline once installed.

``animal_mnist``: 10,000 28x28 grayscale animal silhouettes (10 classes of
1,000; MIT licence), white on black like MNIST, shipped inside the
``animal-mnist`` wheel on PyPI. Its own loader imports TensorFlow and calls
``pickle.load``; here only its data files are read, with an unpickler that
can build numpy arrays and nothing else, after a sha256 check.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..runtime.errors import UserError
from ..runtime.io import sha256_file
from .datasets import Split, check_spec

ANIMAL_MNIST_VERSION = "0.4"
# sha256 of the gzipped pickles in animal-mnist==0.4 (they match the wheel's RECORD).
ANIMAL_MNIST_FILES = {
    "animal_data_version_3.gz": "68a30346781a0984f839463a4615d2decb899d1ce65091bb92586311754a34ce",
    "animal_label_version_3.gz": "dec8dba7c469830989fbab46825021a08a38470753a512f27ada847eced97b57",
}
# Label order as in the package description; checked by viewing eight images per label.
ANIMAL_MNIST_CLASSES = (
    "bear",
    "bird",
    "cat",
    "cow",
    "dog",
    "elephant",
    "giraffe",
    "horse",
    "sheep",
    "zebra",
)
_INSTALL_HINT = (
    "install it with: python -m pip install --no-deps animal-mnist=="
    f"{ANIMAL_MNIST_VERSION} (make install does this)"
)

# Exactly the globals a pickled numpy array references (found by unpickling the
# files): the array rebuilder, the array type and the dtype type. The files were
# written by numpy 1.x, hence ``numpy.core``; the objects are taken from
# ``numpy._core`` directly, so numpy 2's deprecated alias is never imported.
_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): np._core.multiarray._reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays only: any other global is refused, so a tampered
    file cannot run code (plain ``pickle.load`` would call whatever it names)."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to unpickle {module}.{name}: only numpy arrays are allowed"
            ) from None


def restricted_loads(data: bytes) -> np.ndarray:
    """A numpy array from pickle bytes, refusing anything but array reconstruction."""
    obj = RestrictedUnpickler(io.BytesIO(data)).load()
    if not isinstance(obj, np.ndarray):
        raise pickle.UnpicklingError(f"expected a numpy array, got {type(obj).__name__}")
    return obj


def animal_mnist_dir() -> Path:
    """Where the installed ``animal_mnist`` package keeps its data files.

    Found without importing the package (its modules import TensorFlow).
    """
    spec = importlib.util.find_spec("animal_mnist")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the animal_mnist OOD set needs the animal-mnist package; {_INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "Animal_MNIST"


def _read_checked(path: Path, expected: str) -> np.ndarray:
    if not path.is_file():
        raise UserError(f"{path} is missing; reinstall animal-mnist: {_INSTALL_HINT}")
    digest = sha256_file(path)
    if digest != expected:
        raise UserError(
            f"{path} has sha256 {digest[:12]}..., expected {expected[:12]}...; "
            f"reinstall animal-mnist=={ANIMAL_MNIST_VERSION}: {_INSTALL_HINT}"
        )
    try:
        with gzip.open(path, "rb") as f:
            return restricted_loads(f.read())
    except (OSError, EOFError, pickle.UnpicklingError) as err:
        raise UserError(f"cannot read {path} ({err}); reinstall animal-mnist") from None


def load_animal_mnist() -> Split:
    """All 10,000 images as uint8 (N, 1, 28, 28) in 0..255, labels 0..9 (ANIMAL_MNIST_CLASSES).

    Stored like the in-distribution splits, so the pipeline normalises them
    with the in-distribution mean and std. The order is the file's (by class).
    """
    root = animal_mnist_dir()
    x = _read_checked(
        root / "animal_data_version_3.gz", ANIMAL_MNIST_FILES["animal_data_version_3.gz"]
    )
    y = _read_checked(
        root / "animal_label_version_3.gz", ANIMAL_MNIST_FILES["animal_label_version_3.gz"]
    )
    if x.shape != (10000, 28, 28) or x.dtype != np.uint8 or y.shape != (10000,):
        raise UserError(
            f"animal_mnist files hold {x.dtype} {x.shape} and {y.dtype} {y.shape}, expected "
            f"uint8 (10000, 28, 28) and (10000,); reinstall animal-mnist=={ANIMAL_MNIST_VERSION}"
        )
    images = torch.from_numpy(np.ascontiguousarray(x)).unsqueeze(1)
    return Split(images, torch.from_numpy(y.astype(np.int64)))


OOD_SETS: dict[str, Callable[[], Split]] = {"animal_mnist": load_animal_mnist}


def load_ood(name: str) -> Split:
    """An OOD set by name; the labels are that set's own classes, unrelated to the task's."""
    if name not in OOD_SETS:
        raise UserError(f"unknown OOD set {name!r}; choose one of {', '.join(OOD_SETS)}")
    return OOD_SETS[name]()


def check_ood_spec(spec: str) -> None:
    """An OOD set's one-line error (``extra_sets.ood_images`` gives the same), without
    reading any image: a name neither packaged nor a dataset spec, a folder not there."""
    if spec in OOD_SETS:
        return
    try:
        check_spec(spec)
    except UserError as err:
        raise ood_set_error(spec, err) from None


def ood_set_error(spec: str, err: UserError) -> UserError:
    """A dataset spec's error as an OOD set's: which set, and the packaged ones besides."""
    return UserError(f"OOD set {spec}: {err} (or a packaged OOD set: {', '.join(OOD_SETS)})")
