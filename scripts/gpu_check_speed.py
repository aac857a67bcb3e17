"""The training step's speed-ups for ``scripts/gpu_check.py --speed``: SWAG fine-tuning in
bf16, eager against compiled (``compile: true``), graph-captured (``cuda_graphs: true``)
and both, and the projected wall time of the CIFAR-10 preset's SWAG protocol.

Every variant is ``gpu_check_throughput._ours`` (the library's loop, a SWAG trajectory's
plan) on the same CIFAR-shaped images, timed side by side as the throughput part times
its loops (``measure``): a warm-up epoch each (where compilation and capture happen,
reported as ``warm_up_s``), then rounds of one epoch of each, the order rotated. Goals
(issue 27): the best variant at least 2x eager on PreResNet-20, 1.2x on WideResNet-28x10.

PreResNet-164 (the preset's network) also runs the SWAG reference code's loop, for the
projection: the preset's ``swag`` trajectory (300 epochs of 45,000 images), its
monitoring (every 5 epochs on 40% of 70,000 forward images) and its 30-sample
evaluation (each sample a BatchNorm pass over the 45,000 training images and a forward
pass over the 10,000 test images), with a forward image costing a third of a training
image (a step is a forward and a backward of twice its cost). The reference's
projection trains and evaluates the same images at its own images/s, without
monitoring (in its favour). Goal: ours at least 5x faster.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch
from gpu_check_parts import Size, cifar_shaped
from gpu_check_runner import Context
from gpu_check_throughput import Epoch, Summary, _ours, _reference, measure, paired, timed_only

from bayesavg.training.precision import Precision

VARIANTS = {
    "eager": (False, False),
    "compiled": (True, False),
    "graphs": (False, True),
    "compiled_graphs": (True, True),
}
GOALS = {"preresnet20": 2.0, "wideresnet28x10": 1.2}
PROTOCOL_GOAL = 5.0
# The preset's swag trajectory and evaluation (presets/cifar10.yaml), in images.
EPOCHS, TRAIN, TEST, SAMPLES = 300, 45_000, 10_000, 30
MONITORED = (5_000 + 10_000 + 45_000 + 10_000) * 0.4 / 5  # forward images an epoch
FORWARD_COST = 1 / 3  # of a training image


def protocol_hours(train_images_per_s: float, monitoring: bool = True) -> float:
    """The preset's SWAG protocol at ``train_images_per_s``: training, monitoring and the
    30-sample evaluation (forward images at a third of a training image's cost)."""
    forward = SAMPLES * (TRAIN + TEST) + (EPOCHS * MONITORED if monitoring else 0)
    images = EPOCHS * TRAIN + FORWARD_COST * forward
    return images / train_images_per_s / 3600


def _summary(model_name: str) -> Summary:
    def summary(
        head: dict[str, Any], n: int, seconds: dict[str, list[float | None]]
    ) -> dict[str, Any]:
        out = dict(head)
        timed = timed_only(seconds)
        out["rounds_done"] = {k: len(timed.get(k, [])) for k in seconds}
        out["images_per_s"] = {k: round(n / statistics.median(v), 1) for k, v in timed.items()}
        eager = seconds.get("eager", [])
        speedups = {}
        for name in VARIANTS:
            pairs = paired(eager, seconds.get(name, []))
            if name != "eager" and pairs:
                speedups[name] = round(statistics.median(a / b for a, b in pairs), 3)
        out["over_eager"] = speedups
        if speedups:
            best = max(speedups, key=speedups.__getitem__)
            out["best"], out["best_over_eager"] = best, speedups[best]
            if model_name in GOALS:
                out["goal_best_over_eager"] = GOALS[model_name]
                out["goal_met"] = speedups[best] >= GOALS[model_name]
        ips = out["images_per_s"]
        ours = max((ips[k] for k in VARIANTS if k in ips), default=None)
        if "reference_swag_code" in ips and ours is not None:
            hours = {
                "ours": round(protocol_hours(ours), 2),
                "reference_swag_code": round(protocol_hours(ips["reference_swag_code"], False), 2),
            }
            ratio = hours["reference_swag_code"] / hours["ours"]
            out["protocol_hours"] = hours
            out["protocol_reference_over_ours"] = round(ratio, 2)
            out["goal_protocol"] = PROTOCOL_GOAL
            out["protocol_goal_met"] = ratio >= PROTOCOL_GOAL
        return out

    return summary


def speed(model_name: str, ctx: Context) -> dict[str, Any]:
    """Images/s of the four step variants of ``model_name`` (and, for PreResNet-164, the
    reference code's loop and the protocol's projection)."""
    size, device = Size.of(ctx), torch.device(ctx.device)
    prec = Precision("bf16" if device.type == "cuda" else "fp32", device.type)
    x, y = cifar_shaped(size.batch_size * dict(size.batches)[model_name])
    builders: dict[str, Callable[[], Epoch | str]] = {}
    for name, (compile, graphs) in VARIANTS.items():
        if compile and device.type != "cuda" and ctx.quick:
            builders[name] = lambda: "compiling on the CPU takes minutes: not in --quick"
            continue
        builders[name] = lambda c=compile, g=graphs: _ours(
            model_name, device, prec, x, y, size, compile=c, graphs=g
        )
    deterministic = dict.fromkeys(VARIANTS, True)
    if model_name == "preresnet164":
        builders["reference_swag_code"] = lambda: _reference(model_name, device, x, y, size)
        deterministic["reference_swag_code"] = False
    head = {
        "images_per_epoch": len(y),
        "batch_size": size.batch_size,
        "precision": prec.name,
        "protocol": {
            "epochs": EPOCHS,
            "train_images": TRAIN,
            "test_images": TEST,
            "samples": SAMPLES,
            "monitored_forward_images_per_epoch": MONITORED,
            "forward_cost": round(FORWARD_COST, 3),
        },
    }
    compiled = frozenset(name for name, (compile, _) in VARIANTS.items() if compile)
    return measure(builders, deterministic, head, len(y), ctx, _summary(model_name), compiled)
