"""(3) of ``scale.py``: batched on-CPU augmentation against torchvision per image.

``augment.draw_epoch`` + ``apply`` (crop 4 + flip) over CIFAR-shaped images,
one thread, in rounds interleaved with torchvision's per-image transforms;
its cost per 50,000-image epoch is set against PreResNet-20's epoch time
measured by (1), so that the fraction says whether augmentation matters.
"""

from __future__ import annotations

from typing import Any

import torch
from common import SEED
from timing import Outcome, Stopwatch, fmt_range, interleave, median_range, per_round_ratios

from bayesavg.training.augment import Augment, apply, draw_epoch

EPOCH_IMAGES = 50_000  # a CIFAR training epoch
AUG_BATCH = 128


def augmentation(n: int, rounds: int, train_rate: float) -> dict[str, Any]:
    """``n`` images timed per variant and round; ``train_rate``: PreResNet-20's images/s."""
    from torchvision import transforms  # here: scale.py's workers need not pay for its import

    x = torch.randint(0, 256, (n, 3, 32, 32), generator=torch.Generator().manual_seed(SEED))
    x, aug = x.to(torch.uint8), Augment(4, True)
    tv = transforms.Compose(
        [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip()]
    )

    def ours(m: int = n) -> Outcome:
        with Stopwatch() as watch:
            draws = draw_epoch(m, aug, torch.Generator().manual_seed(SEED))
            for i in range(0, m, AUG_BATCH):
                take = draws.take(torch.arange(i, min(i + AUG_BATCH, m)))
                apply(x[i : i + AUG_BATCH], take, aug)
        return Outcome(watch.seconds)

    def torchvision(m: int = n) -> Outcome:
        with Stopwatch() as watch:
            for i in range(0, m, AUG_BATCH):
                torch.stack([tv(img) for img in x[i : min(i + AUG_BATCH, m)]])
        return Outcome(watch.seconds)

    ours(1280), torchvision(1280)
    sec = interleave({"ours": ours, "torchvision": torchvision}, rounds)
    per_image = {k: median_range([1e6 * t / n for t in v]) for k, v in sec.items()}
    epoch_train = EPOCH_IMAGES / train_rate
    return {
        "images_timed": n,
        "batch_size": AUG_BATCH,
        "us_per_image": per_image,
        "seconds_per_epoch": {k: v[0] * EPOCH_IMAGES / 1e6 for k, v in per_image.items()},
        "torchvision_over_ours": median_range(per_round_ratios(sec["torchvision"], sec["ours"])),
        "preresnet20_epoch_seconds_1x1": epoch_train,
        "fraction_of_epoch": per_image["ours"][0] * EPOCH_IMAGES / 1e6 / epoch_train,
        "seconds_per_round": sec,
    }


def show(a: dict[str, Any]) -> None:
    """(3) in three lines: ours per image and per epoch, and torchvision against it."""
    (ours, tv), ratio = a["us_per_image"].values(), a["torchvision_over_ours"]
    print(
        f"\naugmentation, crop 4 + flip, 1 thread, {a['images_timed']} images timed in batches "
        f"of {a['batch_size']}, median [range] of {len(a['seconds_per_round']['ours'])} rounds\n"
        f"  ours: {ours[0]:.2f} us/image {fmt_range(ours[1], ours[2], '{:.2f}')}, "
        f"{a['seconds_per_epoch']['ours']:.2f} s per 50,000-image epoch = "
        f"{a['fraction_of_epoch']:.2%} of a PreResNet-20 epoch on 1 process x 1 thread "
        f"({a['preresnet20_epoch_seconds_1x1']:.0f} s)\n"
        f"  torchvision per image: {tv[0]:.1f} us/image, "
        f"{a['seconds_per_epoch']['torchvision']:.1f} s per epoch: {ratio[0]:.1f}x ours "
        f"{fmt_range(ratio[1], ratio[2], '{:.1f}')}"
    )
