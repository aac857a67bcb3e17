"""One SWAG sample's evaluation, ours and the reference code's, timed for the protocol
projection of ``gpu_check --speed`` (forward images/s, measured, not assumed).

A sample is a weight draw at scale 0.5, a BatchNorm pass over training images and a
pass over test images:

- ours: ``bayesavg.evaluation.evaluate`` of a SWAG posterior for one sample, as the
  evaluate stage calls it under the preset (its ``evaluate.batch_size``, its precision,
  inputs normalised a batch at a time from uint8: ``PosteriorFile.inputs``);
- the reference: the loop of its ``experiments/uncertainty/uncertainty.py``, written
  out here with its own library: ``SWAG.sample(scale, cov=True)``,
  ``swag.utils.bn_update`` over its training loader (the model's ``transform_train``,
  unshuffled), then the model over its test loader (``transform_test``) as that script
  runs it (autograd on, softmax copied to the host per batch), batch 128, 4 loader
  workers, fp32, ``cudnn.benchmark``.
"""

from __future__ import annotations

import statistics
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from gpu_check_measure import _modes
from gpu_check_parts import MODELS, Size, cifar_setup, cifar_shaped, timed
from gpu_check_reference import reference_package

from bayesavg.evaluation.evaluate import evaluate
from bayesavg.trajectories import compute_for, finetune, initial_network

SCALE = 0.5
FULL, QUICK = (10_000, 2_000), (16, 8)  # BN-pass and test images of one timed sample
ROUNDS = 3
Sample = Callable[[], None]


def ours(
    model_name: str,
    device: torch.device,
    precision: str,
    batch: int,
    size: Size,
    n: tuple[int, int],
) -> Sample:
    """One sample of ``evaluate`` for a SWAG posterior of ``model_name`` (two snapshots
    of a short run on a few images: the weights' values do not change the time)."""
    name, kwargs = MODELS[model_name]
    n_bn, n_test = n
    p, data = cifar_setup(2 * size.batch_size, 8, 2, size.batch_size, precision, augment=True)
    p = p.model_copy(update={"model": p.model.model_copy(update={"name": name, **kwargs})})
    result = finetune(
        p, "swag", data, initial_network(p, data), device, compute=compute_for(p, device)
    )
    assert result is not None
    post = result.posterior
    x, y = cifar_shaped(n_bn + n_test, seed=2)
    bn_x = post.inputs(x[:n_bn], device)
    test = {"test": (post.inputs(x[n_bn:], device), y[n_bn:])}
    prec = compute_for(p, device).precision

    def sample() -> None:
        evaluate(
            post,
            "swag",
            test,
            n_samples=1,
            scale=SCALE,
            bn_x=bn_x,
            batch_size=batch,
            seed=0,
            device=device,
            precision=prec,
        )

    return sample


def reference(
    model_name: str, device: torch.device, size: Size, n: tuple[int, int]
) -> Sample | str:
    """One sample of the reference's evaluation loop (the module docstring), or why not."""
    swag = reference_package()
    if isinstance(swag, str):
        return swag
    from PIL import Image

    _, kwargs = MODELS[model_name]
    base = swag.models.preresnet.PreResNet
    cfg = swag.models.PreResNet56  # the same transforms for every depth
    collector = swag.posteriors.SWAG(
        base, no_cov_mat=False, max_num_models=size.max_rank, num_classes=10, **kwargs
    ).to(device)
    for _ in range(2):  # two snapshots: a low-rank part to sample from
        collector.collect_model(base(num_classes=10, **kwargs).to(device))
    n_bn, n_test = n
    x, y = cifar_shaped(n_bn + n_test, seed=2)
    pictures, labels = x.permute(0, 2, 3, 1).numpy(), y.tolist()

    class Images(torch.utils.data.Dataset):
        def __init__(self, rows: range, transform) -> None:
            self.rows, self.transform = rows, transform

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            row = self.rows[i]
            picture = Image.fromarray(np.ascontiguousarray(pictures[row]))
            return self.transform(picture), labels[row]

    def loader(rows: range, transform) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(
            Images(rows, transform),
            batch_size=size.batch_size,
            shuffle=False,
            num_workers=size.workers,
            pin_memory=device.type == "cuda",
            multiprocessing_context="fork" if size.workers else None,
        )

    train = loader(range(n_bn), cfg.transform_train)
    test = loader(range(n_bn, n_bn + n_test), cfg.transform_test)

    def sample() -> None:
        collector.sample(scale=SCALE, cov=True)
        swag.utils.bn_update(train, collector, device)
        collector.eval()
        for inputs, _ in test:
            output = collector(inputs.to(device, non_blocking=True))
            with torch.no_grad():
                F.softmax(output, dim=1).cpu().numpy()

    return sample


def forward_rates(
    model_name: str, device: torch.device, precision: str, batch: int, size: Size, quick: bool
) -> dict[str, Any]:
    """Forward images/s of one evaluation sample, ours and the reference's: each built
    and warmed up by one sample, then the median of ``ROUNDS`` alternating samples. A
    side that cannot run (the reference not installed) or fails says why."""
    n = QUICK if quick else FULL
    out: dict[str, Any] = {"bn_images": n[0], "test_images": n[1], "images_per_s": {}}
    builders: dict[str, tuple[Callable[[], Sample | str], bool]] = {
        "ours": (lambda: ours(model_name, device, precision, batch, size, n), True),
        "reference_swag_code": (lambda: reference(model_name, device, size, n), False),
    }
    samples: dict[str, Sample] = {}
    for name, (build, deterministic) in builders.items():
        try:
            with _modes(name, deterministic):
                found = build()
                if isinstance(found, str):
                    out.setdefault("skipped", {})[name] = found
                    continue
                found()
            samples[name] = found
        except Exception as err:  # this side's error; the projection then assumes
            out.setdefault("failed", {})[name] = f"{type(err).__name__}: {err}"[:500]
            out.setdefault("tracebacks", {})[name] = traceback.format_exc()[-2000:]
    seconds: dict[str, list[float]] = {name: [] for name in samples}
    for _ in range(ROUNDS):
        for name, sample in samples.items():
            with _modes(name, builders[name][1]):
                seconds[name].append(timed(sample, device))
    for name, found in seconds.items():
        out["images_per_s"][name] = round(sum(n) / statistics.median(found), 1)
    return out
