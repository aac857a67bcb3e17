"""``corrupt`` against the benchmark's own code: CIFAR-10-C's deterministic corruptions.

Where the reference comes from. ``tests/data/cifar_c_reference.npz`` holds two 32x32 RGB test
images (``images``, uint8, (2, 32, 32, 3): smooth colour gradients with seeded fine noise; seeded
colour blocks with a sine ripple, a grey ramp and pure black, white and red patches) and, under
``<name>_<severity>``, what make_cifar_c.py (hendrycks/robustness, ImageNet-C/create_c/, as of
commit ca360085) makes of them: its ``disk``, ``clipped_zoom`` and corruption functions, copied
verbatim, run against the real libraries -- scikit-image 0.26.0, OpenCV 4.10.0
(opencv-python-headless 4.10.0.84), Pillow 13.0.0 (libjpeg-turbo 3.2.0), scipy 1.17.1,
numpy 2.4.6, torchvision 0.29.1 -- on 2026-11-27. The only change to the benchmark's code: a
shim ``gaussian(x, sigma, multichannel=True)`` -> ``skimage.filters.gaussian(x, sigma=sigma,
channel_axis=-1)``, since scikit-image dropped ``multichannel``. As in make_cifar_c.py, each
image went through ``Compose([ToTensor(), ToPILImage()])`` first (lossless for uint8) and each
result was stored as ``np.uint8(...)`` of the returned array (truncation). OpenCV 5.0.0 gave
the same bytes. ``meta`` (a JSON string) records those versions and the date.

Which corruptions. Those whose output depends on no random draw in make_cifar_c.py, at all
five severities: defocus_blur, zoom_blur, gaussian_blur, contrast, brightness, saturate,
pixelate, jpeg_compression. The others draw from numpy's global state, so no fixed reference
exists for them: gaussian/shot/speckle noise (the noise), impulse_noise (skimage's
random_noise), glass_blur (the pixel swaps), motion_blur (the angle,
``np.random.uniform(-45, 45)``, passed to ImageMagick), snow (the flakes and their blur
angle), frost (the photograph and the crop), fog (the plasma fractal), spatter (the liquid
layer), elastic_transform (the affine jitter and the displacement fields).

How to regenerate (the generator script is not part of the repo). Install scikit-image and
opencv-python-headless into a scratch folder, never into the project's environment
(``pip install --target /tmp/ref scikit-image opencv-python-headless``); in a script run with
``PYTHONPATH=/tmp/ref`` and this project's Python, copy the functions named above from
make_cifar_c.py with the ``gaussian`` shim; take ``images`` from the current fixture; for each
corruption ``fn`` and severity ``s`` store ``np.stack([np.uint8(fn(convert_img(img), s)) for
img in images])`` under ``f"{fn.__name__}_{s}"``, where ``convert_img`` is make_cifar_c.py's;
add ``meta``; write all with ``np.savez_compressed``. Then update the versions above.

Every case matches exactly: no tolerance is needed. pixelate and jpeg_compression run Pillow
on both sides, so for them this pins the wiring (layout, conversion) and the Pillow build: a
Pillow whose libjpeg-turbo encodes differently fails jpeg_compression alone, and then the
fixture wants regenerating, not the port fixing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import PIL
import pytest
import torch

from bayesavg.data.cifar_c import corrupt

FIXTURE = Path(__file__).parent / "data" / "cifar_c_reference.npz"
DETERMINISTIC = (
    "defocus_blur", "zoom_blur", "gaussian_blur", "contrast", "brightness", "saturate",
    "pixelate", "jpeg_compression",
)  # fmt: skip
SEVERITIES = (1, 2, 3, 4, 5)


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    with np.load(FIXTURE, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def test_fixture_covers_every_deterministic_case(reference: dict[str, np.ndarray]) -> None:
    expected = {f"{n}_{s}" for n in DETERMINISTIC for s in SEVERITIES} | {"images", "meta"}
    assert set(reference) == expected
    assert reference["images"].dtype == np.uint8
    assert reference["images"].shape == (2, 32, 32, 3)
    meta = json.loads(str(reference["meta"]))
    assert meta["scikit-image"] == "0.26.0" and meta["opencv"] == "4.10.0"


@pytest.mark.parametrize("severity", SEVERITIES)
@pytest.mark.parametrize("name", DETERMINISTIC)
def test_corrupt_matches_benchmark(
    reference: dict[str, np.ndarray], name: str, severity: int
) -> None:
    x = torch.from_numpy(reference["images"]).permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW
    got = corrupt(x, name, severity, seed=0).permute(0, 2, 3, 1).numpy()
    want = reference[f"{name}_{severity}"]
    assert got.dtype == np.uint8 and got.shape == want.shape
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    hint = ""
    if name == "jpeg_compression":
        meta = json.loads(str(reference["meta"]))
        hint = f" (fixture: Pillow {meta['pillow']}, here: Pillow {PIL.__version__})"
    assert not diff.any(), (
        f"{name} severity {severity}: {int((diff > 0).sum())} of {diff.size} values differ "
        f"from the benchmark's, by up to {int(diff.max())} grey levels{hint}"
    )
