"""The ``evaluation`` part of ``scripts/gpu_check.py``: what a 30-sample SWAG evaluation
costs against the forward passes no implementation can avoid."""

from __future__ import annotations

import statistics
from typing import Any

import torch
from gpu_check_parts import Size, cifar_setup, paced, peak_mib, reset_peak, rotation, sync, timed
from gpu_check_runner import Context
from torch import nn

from bayesavg.evaluation.evaluate import evaluate
from bayesavg.models import for_inference
from bayesavg.trajectories import finetune, initial_network

BATCH = 1000
GOAL = 1.10


def _bn_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _summary(size: Size, seconds: dict[str, list[float]]) -> dict[str, Any]:
    """The medians and ratios of the rounds timed so far."""
    out: dict[str, Any] = {"rounds_done": len(seconds["bound"])}
    if not seconds["bound"] or len(seconds["ours"]) != len(seconds["bound"]):
        return out
    ratios = sorted(a / b for a, b in zip(seconds["ours"], seconds["bound"], strict=True))
    out.update(
        ours_seconds=round(statistics.median(seconds["ours"]), 3),
        bound_seconds=round(statistics.median(seconds["bound"]), 3),
        ours_over_bound=round(statistics.median(ratios), 3),
        ours_over_bound_range=[round(ratios[0], 3), round(ratios[-1], 3)],
        goal_met=statistics.median(ratios) <= GOAL,
    )
    return out


def evaluation(ctx: Context) -> dict[str, Any]:
    """``evaluate`` of a PreResNet-20 SWAG posterior (S samples, BN recomputed on the
    training images for each) against S x (a train-mode BN pass over the training images
    + an eval-mode forward over the test images) written out by hand: the forward passes
    no implementation can avoid. Same model layout (channels-last), fp32, batch 1000.
    Rounds stop early where another would not fit the part's time box."""
    size, device = Size.of(ctx), torch.device(ctx.device)
    n_bn, n_test = size.bn_images, size.test_images
    p, data = cifar_setup(n_bn, n_test, size.eval_epochs, 128)
    result = finetune(p, "swag", data, initial_network(p, data), device)
    assert result is not None
    post = result.posterior
    bn_x = post.model_input(data.train.x, device).contiguous(memory_format=torch.channels_last)
    test_x = post.model_input(data.test.x, device).contiguous(memory_format=torch.channels_last)
    test = {"test": (test_x, data.test.y)}

    def ours(samples: int) -> None:
        evaluate(post, "swag", test, n_samples=samples, scale=0.5, bn_x=bn_x, seed=0, device=device)

    model = for_inference(post.build_model(device))
    layers = _bn_layers(model)

    def bound(samples: int) -> None:
        with torch.no_grad():
            for _ in range(samples):
                for m in layers:
                    m.reset_running_stats()
                    m.momentum = None  # cumulative average over the pass
                model.train()
                for i in range(0, n_bn, BATCH):
                    model(bn_x[i : i + BATCH])
                model.eval()
                for i in range(0, n_test, BATCH):
                    model(test_x[i : i + BATCH])

    variants = {"ours": ours, "bound": bound}
    out: dict[str, Any] = {
        "model": "preresnet20",
        "samples": size.eval_samples,
        "bn_images": n_bn,
        "test_images": n_test,
        "batch_size": BATCH,
        "rounds": size.eval_rounds,
        "goal_ours_over_bound": GOAL,
        "peak_mib": {},
    }
    for name, fn in variants.items():  # warm-up, 2 samples
        reset_peak(device)
        fn(2)
        sync(device)
        out["peak_mib"][name] = peak_mib(device)
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for r in paced(size.eval_rounds, ctx.left):
        for name in rotation(list(variants), r):
            seconds[name].append(timed(lambda fn=variants[name]: fn(size.eval_samples), device))
        ctx.report({**out, **_summary(size, seconds)})
    return {**out, **_summary(size, seconds)}
