"""``corrupt`` against the benchmark's own code: CIFAR-10-C's deterministic corruptions.

Where the reference comes from. ``DIGESTS`` holds the sha256 of what make_cifar_c.py
(hendrycks/robustness, ImageNet-C/create_c/, as of
commit ca360085) makes of the two 32x32 RGB test images ``images()`` builds (smooth colour
gradients with seeded fine noise; seeded colour blocks with a sine ripple, a grey ramp and pure
black, white and red patches): its ``disk``, ``clipped_zoom`` and corruption functions, copied
verbatim, run against the real libraries -- scikit-image 0.26.0, OpenCV 4.10.0
(opencv-python-headless 4.10.0.84), Pillow 13.0.0 (libjpeg-turbo 3.2.0), scipy 1.17.1,
numpy 2.4.6, torchvision 0.29.1 -- on 2026-11-27. The only change to the benchmark's code: a
shim ``gaussian(x, sigma, multichannel=True)`` -> ``skimage.filters.gaussian(x, sigma=sigma,
channel_axis=-1)``, since scikit-image dropped ``multichannel``. As in make_cifar_c.py, each
image went through ``Compose([ToTensor(), ToPILImage()])`` first (lossless for uint8) and each
result was stored as ``np.uint8(...)`` of the returned array (truncation). OpenCV 5.0.0 gave
the same bytes. Digests, not arrays: the repo holds no data, and an exact match is all the
test asks.

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
make_cifar_c.py with the ``gaussian`` shim; for each corruption ``fn`` and severity ``s`` take
the sha256 of ``np.stack([np.uint8(fn(convert_img(img), s)) for img in images()])``, where
``convert_img`` is make_cifar_c.py's. Then update the versions above.

Every case matches exactly: no tolerance is needed. pixelate and jpeg_compression run Pillow
on both sides, so for them this pins the wiring (layout, conversion) and the Pillow build: a
Pillow whose libjpeg-turbo encodes differently fails jpeg_compression alone, and then the
fixture wants regenerating, not the port fixing.
"""

from __future__ import annotations

import hashlib

import numpy as np
import PIL
import pytest
import torch

from bayesavg.data.cifar_c import corrupt

SEVERITIES = (1, 2, 3, 4, 5)
PILLOW = "13.0.0"  # the build the digests were made with (jpeg_compression)
IMAGES = "e45e5484bbd8332a25edaa1d6b6e8364548237e5f99cc5bdb16c2a2667fac498"
DIGESTS = {  # sha256 of the benchmark's uint8 (2, 32, 32, 3) output, severities 1..5
    "defocus_blur": (
        "351d2ab11fe2eb10b12fff4c55cf00b4e310141b90757e96fa5351cab4ceca61",
        "7ee33c99c239fab3fb6b276e088e99292606876135cdd3c97656a4266a02af98",
        "f562ccd0a937000caffa3a2e55a056f6c472b65ed2bedaad03d48ceea5de76ef",
        "f695307353255b5bb3d9d12f049aad19604d8816f7149fe3f690d6c3b90e73a2",
        "fd79b1e406bdb689728b1a83c4d980a7ee4d6f54449b7f8a861133f6022057b8",
    ),
    "zoom_blur": (
        "11ebcdbc3cc9095968255c8378e0f9677225b20906ca8fb4aede849acd918fff",
        "5ae47eff3bd78011053a7606df5cf14794c46748346d83230927adfaefb44bd2",
        "096b735d5720eb115ea25a97f4923448a50e16953c50d43e2ab2b1c61daa5f2b",
        "7b38b8e8de275e16bba451729c3cf7a56ddc21f376b8e49c7990cdcf5d3487dd",
        "ec5bd399315ae9d6ce4805d5ed73d2c7e05fe10b920f1894a6a705193dc29a09",
    ),
    "gaussian_blur": (
        "a98baebb85bf7159ecfef41b541a3992cc1d63c0b36643f7d5b4b30796bbb2ed",
        "0ab803b2dc4def2ca8b3e349238132a7cfd09a6441b94ba1af787872a71dbd0b",
        "3cf91aeaff27ff8d178609a7eb8029372cd68630b30313dbef97759d827b0792",
        "b583709d2ff6da5e11d25648c737268d916bd432c7b62cef0b7145349cf4b407",
        "b5c47d98fd54a54ab3e3c59f47ccb858dc2240120ab2d2c299e766791b9a6fa9",
    ),
    "contrast": (
        "997d0a722e886b9029112a7c209550d9a0ac0bde3afeb12bef826c1d555276e9",
        "37d2564cb08861bd80e1191e795074e288cb3857e4b0ebf4cfc705985509941c",
        "4c9731ed6380141eb644af4cffe21f5188cf2a4432882befdc375360de408883",
        "82ceb6d314fc3de6304d3d6408132499ddb2bd12195dfd39256980cb963d994b",
        "d232095d8b205c2b7a5ffd75c74abe1965920f24f580501ce8495bed7d653019",
    ),
    "brightness": (
        "d58b2a8f41478aa449f6b0b12fa3b543d7ccf9753c3760235fb2d988f07bd5a0",
        "0a979129e3c4e5fe16b53a5b8fd99e8651fa0fdfd361c0fb4f0e318dccf4a152",
        "a34e80349bcc7619bdf295cbb9e5cefca0ea181629bbddee3b4aba256ab75b0f",
        "77f80a720afbed4d6ce566d89e1f0304d2321225c4477880e341ae748e427462",
        "600b975f311f9e8d7b19cec7de3038fe709c9d9e534d755ee4a82489ec005d88",
    ),
    "saturate": (
        "54013473c351ed88c9fc79bb911910b95538d38224292687cc3bc7f633d34347",
        "e214595498f0603c231c4aa3ea2480f93a0f8140dcc051e535bf0138c8604f49",
        "e41935a2a3d196d60c260a3d409c31b6cfb7215a35c2cf5e8a0d394491b51c52",
        "a8f3697af6f2708127c6454b0874df12e29f697739e131482af1a1a4bc2b8396",
        "f6003880c940fcf720b8a8f98107866a899fc4ee456b479cd749c85520f989b0",
    ),
    "pixelate": (
        "34dbc520878c498a327140dbb9bde90c823f02a9f37d6f83e551ff5a97eff89c",
        "9bad7cc9112956dec18f52ace998b0f893127076ee96c8c76f807e89a555551f",
        "2f1c2919fc64a1d74c059cab0876df64987bc4420d19edf7a23ee3ebf4e24c40",
        "8f03f1c2b57082527d3ea6c45a2806b8113ed0b2b6ba9b333f53059fc574c9b5",
        "7b9e99fa1d93161d2fe9967878213cb1a0d3bb99dfdd427bf63f7f8d98cd054a",
    ),
    "jpeg_compression": (
        "c603e18264ca98540d0540283d888c77c853454b5bfe5d4d3d7bef7f3f13d133",
        "c81f8b09ce5ee89f57fb195a1101b0c9fb8dbd327a31e7b1964f35cb281ccb4d",
        "043658a9b2d4324762ce1cf0f902c9f445fec99295654cdd434cc0c0451bc3cb",
        "20b9fd1b3baf343f9dba459893c040b4cfb79b6218136fb2d63513f59c4665f5",
        "199aa5bf6101b38397097781b8e813f1fa56224dabad79b2ca104e8113ac4fcc",
    ),
}


def images() -> np.ndarray:
    """The two deterministic 32x32 RGB uint8 test images, (2, 32, 32, 3)."""
    yy, xx = np.mgrid[0:32, 0:32] / 31.0
    rng = np.random.default_rng(20240611)
    # 0: smooth colour gradients plus seeded fine noise (texture for the blurs)
    a = np.stack([40 + 180 * xx, 30 + 200 * yy, 230 - 190 * (xx + yy) / 2], axis=-1)
    a = a + rng.normal(scale=12, size=(32, 32, 3))
    # 1: seeded 4x4-pixel colour blocks, a sine ripple, a grey band, pure black/white patches
    b = np.kron(rng.integers(0, 256, (8, 8, 3)), np.ones((4, 4, 1))).astype(np.float64)
    b = b + 40 * np.sin(2 * np.pi * (xx * 3 + yy * 2))[..., None]
    b[12:16] = np.linspace(0, 255, 32)[:, None]  # achromatic (saturation 0) ramp
    b[0:4, 0:4] = 0
    b[0:4, 28:32] = 255
    b[28:32, 0:4] = [255, 0, 0]
    return np.stack([np.clip(np.rint(a), 0, 255), np.clip(np.rint(b), 0, 255)]).astype(np.uint8)


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def test_the_images_are_the_ones_the_digests_were_made_from() -> None:
    assert _sha(images()) == IMAGES


@pytest.mark.parametrize("severity", SEVERITIES)
@pytest.mark.parametrize("name", DIGESTS)
def test_corrupt_matches_benchmark(name: str, severity: int) -> None:
    x = torch.from_numpy(images()).permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW
    got = corrupt(x, name, severity, seed=0).permute(0, 2, 3, 1).numpy()
    assert got.dtype == np.uint8 and got.shape == (2, 32, 32, 3)
    hint = (
        f" (digests: Pillow {PILLOW}, here: Pillow {PIL.__version__})"
        if name == "jpeg_compression"
        else ""
    )
    assert _sha(got) == DIGESTS[name][severity - 1], (
        f"{name} severity {severity}: not the benchmark's bytes{hint}"
    )
