"""(b) 30-sample SWAG evaluation on the test split.

``bayesavg.evaluation.evaluate.evaluate`` against the lower bound of S forward passes
(plus S BatchNorm passes over the training data for a BN model) and against
a straightforward per-sample loop with state dicts,
``torch.optim.swa_utils.update_bn`` and DataLoaders.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from common import NUM_CLASSES, SEED, TARGET_RATIO, Settings, swag_posterior
from timing import (
    Outcome,
    Stopwatch,
    Variant,
    fmt_range,
    interleave,
    ratio,
    ratio_fields,
    rounded,
    warm_up,
)
from torch import nn
from torch.optim.swa_utils import update_bn as torch_update_bn
from torch.utils.data import DataLoader, TensorDataset

from bayesavg import models
from bayesavg.evaluation.evaluate import evaluate
from bayesavg.models.small import mlp
from bayesavg.posteriors import SWAG
from bayesavg.posteriors.file import PosteriorFile
from bayesavg.seeding import generator
from bayesavg.training.train import Tensors

BN_MODEL = "bench_lenet5_bn"
MODELS = ("lenet5", BN_MODEL)
BOOKKEEPING_MODEL = "bench_mlp_lenet_size"


def lenet5_bn(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """LeNet-5 with BatchNorm after each conv and hidden linear layer; benchmark-only."""
    channels, height, width = in_shape
    pad = 2 if (height, width) == (28, 28) else 0
    feat = ((height + 2 * pad - 4) // 2 - 4) // 2
    return nn.Sequential(
        nn.Conv2d(channels, 6, 5, padding=pad, bias=False),
        nn.BatchNorm2d(6),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * feat * feat, 120, bias=False),
        nn.BatchNorm1d(120),
        nn.ReLU(inplace=True),
        nn.Linear(120, 84, bias=False),
        nn.BatchNorm1d(84),
        nn.ReLU(inplace=True),
        nn.Linear(84, num_classes),
    )


def mlp_lenet_size(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """One hidden layer of 77: LeNet-5's parameter count (61k) and logits, a forward ~free."""
    return mlp(in_shape, num_classes, hidden=(77,))


def run_ours(
    posterior: PosteriorFile,
    test: Tensors,
    bn_x: torch.Tensor | None,
    n: int,
    batch: int,
    extra: Mapping[str, Tensors] | None = None,
    ood: torch.Tensor | None = None,
) -> Outcome:
    """``evaluate`` on the test split, and on ``extra`` splits and ``ood`` in the same pass;
    as the evaluate stage, with the per-sample table (``curves``) of the test split alone."""
    device = test.x.device
    splits = {"test": (test.x, test.y), **{k: (v.x, v.y) for k, v in (extra or {}).items()}}
    with Stopwatch(device) as watch:
        result = evaluate(
            posterior,
            "swag",
            splits,
            n_samples=n,
            bn_x=bn_x,
            batch_size=batch,
            seed=SEED,
            device=device,
            ood=None if ood is None else {"ood": ood},
            curves=("test",),
        )
    return Outcome(watch.seconds, result["test"].log_probs.exp())


def run_bound(
    posterior: PosteriorFile, test: Tensors, bn_x: torch.Tensor | None, n: int, batch: int
) -> Outcome:
    """S forward passes over the test split (and S train-mode passes over ``bn_x``), with the
    same channels-last model ``evaluate`` predicts with."""
    device = test.x.device
    model = models.for_inference(posterior.build_model(device))
    with Stopwatch(device) as watch:
        for _ in range(n):
            if bn_x is not None:
                model.train()
                with torch.no_grad():
                    for i in range(0, bn_x.shape[0], batch):
                        model(bn_x[i : i + batch])
                model.eval()
            with torch.inference_mode():
                for i in range(0, test.x.shape[0], batch):
                    model(test.x[i : i + batch])
    return Outcome(watch.seconds)


def state_dict_of(template: nn.Module, vector: torch.Tensor) -> dict[str, torch.Tensor]:
    """A full state dict: ``vector`` cut into the template's parameters, plus its buffers."""
    params = dict(template.named_parameters())
    chunks = vector.split([p.numel() for p in params.values()])
    state = {k: c.view_as(p) for (k, p), c in zip(params.items(), chunks, strict=True)}
    state.update(dict(template.named_buffers()))
    return state


def run_naive(
    posterior: PosteriorFile, test: Tensors, bn_x: torch.Tensor | None, n: int, batch: int
) -> Outcome:
    """The straightforward loop: sample, load a state dict into a copy, torch update_bn, predict."""
    device = test.x.device
    with Stopwatch(device) as watch:
        swag = SWAG.from_state_dict(posterior.collector, device=device)
        template = posterior.build_model(device)
        gen = torch.Generator(device=device).manual_seed(SEED)
        test_loader = DataLoader(TensorDataset(test.x), batch_size=batch)
        bn_loader = None if bn_x is None else DataLoader(TensorDataset(bn_x), batch_size=batch)
        probs = torch.zeros(test.x.shape[0], NUM_CLASSES, device=device)
        for _ in range(n):
            model = copy.deepcopy(template)
            model.load_state_dict(state_dict_of(template, swag.sample(scale=0.5, generator=gen)))
            if bn_loader is not None:
                torch_update_bn(bn_loader, model, device)
            model.eval()
            with torch.no_grad():
                probs += torch.cat([torch.softmax(model(xb), dim=1) for (xb,) in test_loader])
        probs /= n
    return Outcome(watch.seconds, probs.cpu())


def eval_variants(
    posterior: PosteriorFile, test: Tensors, bn_x: torch.Tensor | None, n: int, batch: int
) -> dict[str, Variant]:
    args = (posterior, test, bn_x, n, batch)
    return {
        "bound": partial(run_bound, *args),
        "ours": partial(run_ours, *args),
        "naive": partial(run_naive, *args),
    }


def bench_evaluate_one(
    name: str, train_data: Tensors, test: Tensors, bn_images: torch.Tensor, s: Settings
) -> dict[str, Any]:
    posterior = swag_posterior(name, train_data, s)
    bn_x = bn_images if posterior.has_batchnorm else None
    warm = warm_up(eval_variants(posterior, test, bn_x, 2, s.eval_batch_size))
    prob_diff = (warm["ours"].result - warm["naive"].result.double()).abs().max().item()
    check = eval_variants(posterior, test, bn_x, s.n_samples, s.eval_batch_size)
    seconds = interleave(check, s.eval_rounds)
    to_bound = ratio(seconds["ours"], seconds["bound"])
    speedup = ratio(seconds["naive"], seconds["ours"])
    return {
        "parameters": posterior.theta.numel(),
        "batchnorm": posterior.has_batchnorm,
        "snapshots": posterior.collector["n_collected"],
        "seconds": round(statistics.median(seconds["ours"]), 4),
        "lower_bound_seconds": round(statistics.median(seconds["bound"]), 4),
        **ratio_fields("ratio_to_bound", to_bound, 4),
        "naive_seconds": round(statistics.median(seconds["naive"]), 4),
        **ratio_fields("speedup_vs_naive", speedup, 3, best=False),
        "target_met": to_bound.median <= TARGET_RATIO,
        "max_prob_diff_vs_naive_2_samples": prob_diff,
        "seconds_per_round": rounded(seconds),
    }


def bench_bookkeeping(train_data: Tensors, test: Tensors, s: Settings) -> dict[str, Any]:
    """What each sample adds beyond its forward pass (the draw, loading it, the BMA and
    the test split's per-sample metrics), on a model whose forward is almost free, so the
    figure is not lost in LeNet-5's 17 ms forward (what its ratio to the bound reads)."""
    posterior = swag_posterior(BOOKKEEPING_MODEL, train_data, s)
    variants = eval_variants(posterior, test, None, s.n_samples, s.eval_batch_size)
    variants.pop("naive")
    warm_up(variants)
    seconds = interleave(variants, 2 * s.eval_rounds + 1)
    beyond = [
        1000 * (ours - bound) / s.n_samples
        for ours, bound in zip(seconds["ours"], seconds["bound"], strict=True)
    ]
    return {
        "model": BOOKKEEPING_MODEL,
        "parameters": posterior.theta.numel(),
        "ms_per_sample_beyond_bound": round(statistics.median(beyond), 3),
        "ms_per_sample_beyond_bound_range": [round(min(beyond), 3), round(max(beyond), 3)],
        "seconds_per_round": rounded(seconds),
    }


def shuffled(x: torch.Tensor) -> torch.Tensor:
    """``x`` in a seeded random order.

    mnist5k's splits are stored sorted by class; a BN pass over class-sorted
    batches normalises each batch with class-specific statistics.
    """
    return x[torch.randperm(x.shape[0], generator=generator(SEED)).to(x.device)]


def bench_evaluate(train_data: Tensors, test: Tensors, s: Settings) -> dict[str, Any]:
    models.MODELS[BN_MODEL] = lenet5_bn
    models.MODELS[BOOKKEEPING_MODEL] = mlp_lenet_size
    bn_images = shuffled(train_data.x)[: s.bn_images]
    out: dict[str, Any] = {
        "n_samples": s.n_samples,
        "test_images": len(test),
        "bn_images": bn_images.shape[0],
        "bn_images_order": "train split in a fixed shuffled order (it is stored sorted by class)",
        "batch_size": s.eval_batch_size,
        "rounds": s.eval_rounds,
        "bn_model_note": f"{BN_MODEL} and {BOOKKEEPING_MODEL} are defined in "
        "benchmarks/evaluate.py and registered at run time",
    }
    for name in MODELS:
        out[name] = bench_evaluate_one(name, train_data, test, bn_images, s)
    out["bookkeeping"] = bench_bookkeeping(train_data, test, s)
    out["target_ratio"] = TARGET_RATIO
    return out


def show(e: dict[str, Any]) -> None:
    """(b)'s table: per model, ours against the bound and against the naive loop."""
    print(
        f"\n(b) SWAG evaluation, {e['n_samples']} samples, {e['test_images']} test images "
        f"(+ BN pass over {e['bn_images']} train images), batch {e['batch_size']}, "
        f"median [range] of {e['rounds']} rounds"
    )
    print(
        f"  {'model':<16} {'ours s':>7} {'bound s':>8} {'ours/bound':>11} {'range':>16} "
        f"{'best-of':>8} {'naive s':>8} {'naive/ours':>11} {'range':>14}"
    )
    for name in MODELS:
        r = e[name]
        speedup_range = fmt_range(*r["speedup_vs_naive_range"], "{:.2f}")
        print(
            f"  {name:<16} {r['seconds']:>7.2f} {r['lower_bound_seconds']:>8.2f} "
            f"{r['ratio_to_bound']:>11.3f} {fmt_range(*r['ratio_to_bound_range'], '{:.3f}'):>16} "
            f"{r['ratio_to_bound_best']:>8.3f} {r['naive_seconds']:>8.2f} "
            f"{r['speedup_vs_naive']:>10.2f}x {speedup_range:>14}"
        )
    met = ", ".join(f"{n}: {'met' if e[n]['target_met'] else 'NOT met'}" for n in MODELS)
    print(f"  target: ours/bound <= {e['target_ratio']:.2f}: {met}")
    print(f"  {e['bn_model_note']}")
    b = e["bookkeeping"]
    low, high = b["ms_per_sample_beyond_bound_range"]
    print(
        f"  per sample beyond its forward ({b['model']}, {b['parameters']} parameters, a "
        f"forward ~free): {b['ms_per_sample_beyond_bound']:.2f} ms {fmt_range(low, high, '{:.2f}')}"
    )
