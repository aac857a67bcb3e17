"""Speed of bayesavg's two hot paths, as ratios to a baseline measured in the same run.

Absolute seconds depend on the machine and on whatever else it runs, so
every number that matters here is a ratio between variants timed side by
side: each round runs every variant once, in a rotated order, after a
warm-up, and the median and range over rounds are reported. Nothing is
asserted; the targets are printed next to the measurements.

(a) Fine-tuning throughput of LeNet-5 on the in-memory mnist5k train split:
    ``bayesavg.training.train.train`` with SWAG collection (the ``after_step`` hook of
    ``trajectories.finetune``), without it, and a bare PyTorch loop.
(b) 30-sample SWAG evaluation on the test split: ``bayesavg.evaluate.evaluate``
    against the lower bound of S forward passes (plus S BatchNorm passes over
    the training data for a BN model) and against a straightforward
    per-sample loop with state dicts, ``torch.optim.swa_utils.update_bn`` and
    DataLoaders.
(d) The same evaluation with the pipeline's default shifts (13 rotations, 7
    corruptions of a 200-image test subset) and 1,000 OOD images predicted in
    the same pass, against S forward passes over all the images evaluated:
    the extra sets must cost forwards only.

Run ``python benchmarks/run.py [--quick] [--device auto|cpu|cuda]``; the
results go to ``benchmarks/results.json``. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.optim.swa_utils import update_bn as torch_update_bn
from torch.utils.data import DataLoader, TensorDataset

from bayesavg import models
from bayesavg.data import prepare, to_input
from bayesavg.evaluate import evaluate
from bayesavg.posteriors import HWA, SWAG, MeanFieldVI, svi_step
from bayesavg.posteriors.file import PosteriorFile
from bayesavg.runtime.io import write_text
from bayesavg.seeding import derive_seed, generator, resolve_device, seed_everything
from bayesavg.sgld import SGLD
from bayesavg.training.sam import sam_step
from bayesavg.training.train import Tensors, lr_at, sgd, sgd_step, train

RESULTS = Path(__file__).resolve().parent / "results.json"
SEED = 0
INPUT_SHAPE = (1, 28, 28)
NUM_CLASSES = 10
BN_MODEL = "bench_lenet5_bn"
MOMENTUM, WEIGHT_DECAY = 0.9, 0.0005
FINETUNE_LR = 0.01
POSTERIOR_LR = 0.05
POSTERIOR_EPOCHS = 2
MAX_RANK = 20
SNAPSHOTS = 10
TARGET_OVERHEAD = 0.05
TARGET_RATIO = 1.10


@dataclass(frozen=True)
class Settings:
    """Work per measurement; ``--quick`` shrinks it for a smoke run."""

    epochs: int
    finetune_rounds: int
    n_samples: int
    eval_rounds: int
    bn_images: int | None = None
    batch_size: int = 64
    eval_batch_size: int = 1000
    collect_every: int = 10


FULL = Settings(epochs=1, finetune_rounds=9, n_samples=30, eval_rounds=3)
QUICK = Settings(epochs=1, finetune_rounds=2, n_samples=5, eval_rounds=2, bn_images=1000)


class Outcome(NamedTuple):
    """Seconds one variant took, and what it computed (for the agreement checks)."""

    seconds: float
    result: torch.Tensor


Variant = Callable[[], Outcome]


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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="smoke run (~20 s)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results JSON path")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: untouched)"
    )
    return parser.parse_args()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine_info(device: torch.device, threads_from_flag: bool) -> dict[str, Any]:
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "threads_from_flag": threads_from_flag,
        "device": str(device),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_start": [round(v, 2) for v in os.getloadavg()],
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def load_data(device: torch.device) -> tuple[Tensors, Tensors]:
    """mnist5k train and test splits, normalised, on the device (as the pipeline does)."""
    with tempfile.TemporaryDirectory() as tmp:
        prep = prepare("mnist5k", tmp, Path(tmp) / "prepared", SEED, 0.2, 0.1)
    mean, std = prep.manifest["mean"], prep.manifest["std"]
    return (
        Tensors(to_input(prep.train.x, mean, std, device), prep.train.y.to(device)),
        Tensors(to_input(prep.test.x, mean, std, device), prep.test.y.to(device)),
    )


def init_model(name: str, device: torch.device) -> nn.Module:
    """A registry model from a seeded random initialisation."""
    torch.manual_seed(derive_seed(SEED, "bench", name))
    return models.build_model(name, INPUT_SHAPE, NUM_CLASSES).to(device)


def theta(model: nn.Module) -> torch.Tensor:
    return nn.utils.parameters_to_vector(model.parameters()).detach().cpu()


def interleave(variants: dict[str, Variant], rounds: int) -> dict[str, list[float]]:
    """Seconds per round for every variant; round r starts at variant r (rotated order)."""
    names = list(variants)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            seconds[name].append(variants[name]().seconds)
    return seconds


def median_range(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def per_round_ratios(num: list[float], den: list[float]) -> list[float]:
    return [a / b for a, b in zip(num, den, strict=True)]


# (a) fine-tuning ------------------------------------------------------------


def run_train(
    model0: nn.Module,
    data: Tensors,
    epochs: int,
    batch_size: int,
    collect_every: int | None,
) -> Outcome:
    """``bayesavg.training.train.train`` with SWAG collection as in ``trajectories.finetune``.

    ``collect_every``: None = no collection, 0 = each epoch, k = every k iterations.
    """
    model = copy.deepcopy(model0).train()
    optimizer = sgd(model, MOMENTUM, WEIGHT_DECAY)
    iters_per_epoch = math.ceil(len(data) / batch_size)
    total = epochs * iters_per_epoch
    after_step = None
    if collect_every is not None:
        collector = SWAG(theta(model).numel(), MAX_RANK, device=data.x.device)
        first = 0
        every = collect_every or iters_per_epoch

        def after_step(i: int) -> None:
            if i >= first and (i - first + 1) % every == 0:
                collector.collect(model)

    device = data.x.device
    sync(device)
    start = time.perf_counter()
    train(
        model,
        optimizer,
        data,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr_at("constant", FINETUNE_LR, FINETUNE_LR, 1, total),
        generator=generator(SEED),
        after_step=after_step,
        desc="bench",
    )
    sync(device)
    return Outcome(time.perf_counter() - start, theta(model))


def run_bare(model0: nn.Module, data: Tensors, epochs: int, batch_size: int) -> Outcome:
    """The same SGD in plain PyTorch: no schedule, no metrics, no hooks."""
    model = copy.deepcopy(model0).train()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=FINETUNE_LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY
    )
    gen = generator(SEED)
    n, device = len(data), data.x.device
    sync(device)
    start = time.perf_counter()
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen).to(device)
        for b in range(0, n, batch_size):
            idx = order[b : b + batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(data.x[idx]), data.y[idx])
            loss.backward()
            optimizer.step()
    sync(device)
    return Outcome(time.perf_counter() - start, theta(model))


def finetune_variants(
    model0: nn.Module, data: Tensors, epochs: int, s: Settings
) -> dict[str, Variant]:
    def with_collection(collect_every: int | None) -> Variant:
        return partial(run_train, model0, data, epochs, s.batch_size, collect_every)

    return {
        "bare_torch_loop": partial(run_bare, model0, data, epochs, s.batch_size),
        "train_no_collection": with_collection(None),
        "train_swag_every_epoch": with_collection(0),
        f"train_swag_every_{s.collect_every}_iters": with_collection(s.collect_every),
    }


def bench_finetune(train_data: Tensors, s: Settings) -> dict[str, Any]:
    model0 = init_model("lenet5", train_data.x.device)
    warm_data = Tensors(train_data.x[:640], train_data.y[:640])
    warm = {name: v() for name, v in finetune_variants(model0, warm_data, 1, s).items()}
    same = torch.equal(warm["bare_torch_loop"].result, warm["train_no_collection"].result)
    seconds = interleave(finetune_variants(model0, train_data, s.epochs, s), s.finetune_rounds)
    images = s.epochs * len(train_data)
    bare = seconds["bare_torch_loop"]
    # Throughput is each variant's best round (its least disturbed run), so that the
    # images/s column and the best-of overhead are one measurement seen two ways; a
    # per-variant median can pick a busy round for one variant and a quiet one for
    # another, and then contradict the per-round ratios beside it.
    rates = {k: (images / min(v), images / max(v), images / min(v)) for k, v in seconds.items()}
    overhead = {
        k: median_range([r - 1 for r in per_round_ratios(v, bare)])
        for k, v in seconds.items()
        if k != "bare_torch_loop"
    }
    return {
        "model": "lenet5",
        "train_images": len(train_data),
        "epochs": s.epochs,
        "batch_size": s.batch_size,
        "rounds": s.finetune_rounds,
        "images_per_s": {k: round(v[0], 1) for k, v in rates.items()},
        "images_per_s_range": {k: [round(v[1], 1), round(v[2], 1)] for k, v in rates.items()},
        "overhead_vs_bare": {k: round(v[0], 4) for k, v in overhead.items()},
        "overhead_vs_bare_range": {
            k: [round(v[1], 4), round(v[2], 4)] for k, v in overhead.items()
        },
        "overhead_vs_bare_best": {k: round(min(seconds[k]) / min(bare) - 1, 4) for k in overhead},
        "seconds_per_round": {k: [round(t, 4) for t in v] for k, v in seconds.items()},
        "target_overhead": TARGET_OVERHEAD,
        "target_variant": "train_swag_every_epoch",
        "target_met": overhead["train_swag_every_epoch"][0] <= TARGET_OVERHEAD,
        "train_equals_bare_weights": same,
    }


# (b) SWAG evaluation ----------------------------------------------------------


def swag_posterior(name: str, train_data: Tensors, s: Settings) -> PosteriorFile:
    """Train ``name`` from a seeded random init, collecting SNAPSHOTS SWAG snapshots.

    The inputs are already normalised, so the file records identity normalisation.
    """
    model = init_model(name, train_data.x.device).train()
    total = POSTERIOR_EPOCHS * math.ceil(len(train_data) / s.batch_size)
    every = total // SNAPSHOTS
    collector = SWAG(theta(model).numel(), MAX_RANK, device=train_data.x.device)

    def after_step(i: int) -> None:
        if (i + 1) % every == 0 and collector.n_collected < SNAPSHOTS:
            collector.collect(model)

    train(
        model,
        sgd(model, MOMENTUM, WEIGHT_DECAY),
        train_data,
        epochs=POSTERIOR_EPOCHS,
        batch_size=s.batch_size,
        lr=lr_at("constant", POSTERIOR_LR, POSTERIOR_LR, 1, total),
        generator=generator(SEED),
        after_step=after_step,
        desc=f"posterior {name}",
    )
    posterior = PosteriorFile.from_model(
        model,
        trajectory="bench",
        model_name=name,
        model_kwargs={},
        input_shape=INPUT_SHAPE,
        mean=[0.0],
        std=[1.0],
        num_classes=NUM_CLASSES,
        data={"dataset": "mnist5k", "seed": SEED, "test_fraction": 0.2, "val_fraction": 0.1},
    )
    posterior.collector = collector.state_dict()
    return posterior


def run_ours(
    posterior: PosteriorFile, test: Tensors, bn_x: torch.Tensor | None, n: int, batch: int
) -> Outcome:
    device = test.x.device
    sync(device)
    start = time.perf_counter()
    result = evaluate(
        posterior,
        "swag",
        {"test": (test.x, test.y)},
        n_samples=n,
        bn_x=bn_x,
        batch_size=batch,
        seed=SEED,
        device=device,
    )
    sync(device)
    return Outcome(time.perf_counter() - start, result["test"].log_probs.exp())


def run_bound(
    posterior: PosteriorFile, test: Tensors, bn_x: torch.Tensor | None, n: int, batch: int
) -> Outcome:
    """S forward passes over the test split (and S train-mode passes over ``bn_x``), with the
    same channels-last model ``evaluate`` predicts with."""
    device = test.x.device
    model = models.for_inference(posterior.build_model(device))
    sync(device)
    start = time.perf_counter()
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
    sync(device)
    return Outcome(time.perf_counter() - start, torch.empty(0))


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
    sync(device)
    start = time.perf_counter()
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
    sync(device)
    return Outcome(time.perf_counter() - start, probs.cpu())


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
    warm = {k: v() for k, v in eval_variants(posterior, test, bn_x, 2, s.eval_batch_size).items()}
    prob_diff = (warm["ours"].result - warm["naive"].result.double()).abs().max().item()
    check = eval_variants(posterior, test, bn_x, s.n_samples, s.eval_batch_size)
    seconds = interleave(check, s.eval_rounds)
    to_bound = median_range(per_round_ratios(seconds["ours"], seconds["bound"]))
    speedup = median_range(per_round_ratios(seconds["naive"], seconds["ours"]))
    return {
        "parameters": posterior.theta.numel(),
        "batchnorm": posterior.has_batchnorm,
        "snapshots": posterior.collector["n_collected"],
        "seconds": round(statistics.median(seconds["ours"]), 4),
        "lower_bound_seconds": round(statistics.median(seconds["bound"]), 4),
        "ratio_to_bound": round(to_bound[0], 4),
        "ratio_to_bound_range": [round(to_bound[1], 4), round(to_bound[2], 4)],
        "ratio_to_bound_best": round(min(seconds["ours"]) / min(seconds["bound"]), 4),
        "naive_seconds": round(statistics.median(seconds["naive"]), 4),
        "speedup_vs_naive": round(speedup[0], 3),
        "speedup_vs_naive_range": [round(speedup[1], 3), round(speedup[2], 3)],
        "target_met": to_bound[0] <= TARGET_RATIO,
        "max_prob_diff_vs_naive_2_samples": prob_diff,
        "seconds_per_round": {k: [round(t, 4) for t in v] for k, v in seconds.items()},
    }


def shuffled(x: torch.Tensor) -> torch.Tensor:
    """``x`` in a seeded random order.

    mnist5k's splits are stored sorted by class; a BN pass over class-sorted
    batches normalises each batch with class-specific statistics.
    """
    return x[torch.randperm(x.shape[0], generator=generator(SEED)).to(x.device)]


def bench_evaluate(train_data: Tensors, test: Tensors, s: Settings) -> dict[str, Any]:
    models.MODELS[BN_MODEL] = lenet5_bn
    bn_images = shuffled(train_data.x)[: s.bn_images]
    out: dict[str, Any] = {
        "n_samples": s.n_samples,
        "test_images": len(test),
        "bn_images": bn_images.shape[0],
        "bn_images_order": "train split in a fixed shuffled order (it is stored sorted by class)",
        "batch_size": s.eval_batch_size,
        "rounds": s.eval_rounds,
        "bn_model_note": f"{BN_MODEL} is defined in benchmarks/run.py and registered at run time",
    }
    for name in ("lenet5", BN_MODEL):
        out[name] = bench_evaluate_one(name, train_data, test, bn_images, s)
    out["target_ratio"] = TARGET_RATIO
    return out


def extra_inputs(device: torch.device) -> tuple[dict[str, Tensors], torch.Tensor]:
    """The default params' shifted test subsets (by name) and OOD images, normalised."""
    from bayesavg.config import load_params
    from bayesavg.extra_sets import ood_images, shift_subset, shifted
    from bayesavg.shift import shifts

    e = load_params(Path(__file__).resolve().parents[1] / "params.yaml").evaluate
    with tempfile.TemporaryDirectory() as tmp:
        prep = prepare("mnist5k", tmp, Path(tmp) / "prepared", SEED, 0.2, 0.1)
    mean, std = prep.manifest["mean"], prep.manifest["std"]
    subset = shift_subset(prep.test, e.shift.n_points, SEED)
    listed = shifts(e.shift.angles, e.shift.corruptions, e.shift.severity)
    splits = {
        f"shift.{name}": Tensors(to_input(x, mean, std, device), subset.y.to(device))
        for name, x in shifted(subset.x, listed, SEED).items()
    }
    ood = ood_images(e.ood.sets[0], INPUT_SHAPE, tmp, (SEED, 0.2, 0.1), e.ood.n_points, SEED)
    return splits, to_input(ood, mean, std, device)


def run_ours_extra(
    posterior: PosteriorFile,
    test: Tensors,
    extra: dict[str, Tensors],
    ood: torch.Tensor,
    n: int,
    batch: int,
) -> Outcome:
    device = test.x.device
    splits = {"test": (test.x, test.y), **{k: (v.x, v.y) for k, v in extra.items()}}
    sync(device)
    start = time.perf_counter()
    result = evaluate(
        posterior,
        "swag",
        splits,
        n_samples=n,
        batch_size=batch,
        seed=SEED,
        device=device,
        ood={"ood": ood},
    )
    sync(device)
    return Outcome(time.perf_counter() - start, result["test"].log_probs.exp())


def bench_evaluate_extra(train_data: Tensors, test: Tensors, s: Settings) -> dict[str, Any]:
    """Clean test split, every shift and the OOD set in one pass, against the bound of S
    forwards over all those images, and against the clean split alone."""
    extra, ood = extra_inputs(test.x.device)
    everything = torch.cat([test.x, *(t.x for t in extra.values()), ood])
    posterior = swag_posterior("lenet5", train_data, s)
    batch = s.eval_batch_size
    variants: dict[str, Variant] = {
        "ours_all": partial(run_ours_extra, posterior, test, extra, ood, s.n_samples, batch),
        "bound_all": partial(
            run_bound, posterior, Tensors(everything, test.y), None, s.n_samples, batch
        ),
        "ours_test": partial(run_ours, posterior, test, None, s.n_samples, batch),
    }
    for variant in variants.values():
        variant()
    seconds = interleave(variants, s.eval_rounds)
    to_bound = median_range(per_round_ratios(seconds["ours_all"], seconds["bound_all"]))
    return {
        "images": {
            "test": len(test),
            "shifted": sum(len(t) for t in extra.values()),
            "ood": ood.shape[0],
        },
        "n_samples": s.n_samples,
        "ratio_to_bound": round(to_bound[0], 4),
        "ratio_to_bound_range": [round(to_bound[1], 4), round(to_bound[2], 4)],
        "ratio_to_bound_best": round(min(seconds["ours_all"]) / min(seconds["bound_all"]), 4),
        "cost_vs_test_only": round(
            statistics.median(per_round_ratios(seconds["ours_all"], seconds["ours_test"])), 3
        ),
        "image_ratio_vs_test_only": round(everything.shape[0] / len(test), 3),
        "target_ratio": TARGET_RATIO,
        "seconds_per_round": {k: [round(t, 4) for t in v] for k, v in seconds.items()},
    }


# report -------------------------------------------------------------------------


# (c) step costs (issue 3) ----------------------------------------------------


def run_steps(kind: str, data: Tensors, iters: int, batch_size: int) -> Outcome:
    """``iters`` training steps of LeNet-5 of one kind: sgd, sam, sgld, svi or svi+hwa."""
    model = init_model("lenet5", data.x.device)
    hwa: HWA | None = None
    if kind.startswith("svi"):
        target: nn.Module = MeanFieldVI(model, sigma_init=0.01)
        step = svi_step(len(data))
        params = [target.mu, target.rho]
        if kind == "svi+hwa":
            hwa = HWA(target.mu.numel(), 20, device=data.x.device)
    else:
        target, params = model, list(model.parameters())
        step = sam_step(0.05) if kind == "sam" else sgd_step
    opt = SGLD(params, len(data)) if kind == "sgld" else sgd(params, 0.9, 0.0)
    for group in opt.param_groups:
        group["lr"] = 0.01
    gen = torch.Generator().manual_seed(SEED)
    order = torch.randint(0, len(data), (iters, batch_size), generator=gen).to(data.x.device)
    target.train()
    sync(data.x.device)
    started = time.perf_counter()
    for i in range(iters):
        opt.zero_grad(set_to_none=True)
        step(target, data.x[order[i]], data.y[order[i]])
        opt.step()
        if hwa is not None and (i + 1) % 10 == 0:
            hwa.collect(target.mu, target.rho)
    sync(data.x.device)
    return Outcome(time.perf_counter() - started, theta(model))


def bench_steps(train_data: Tensors, s: Settings) -> dict[str, Any]:
    """Seconds per step of SAM, SGLD, SVI and SVI with HWA collection, as ratios to SGD."""
    iters = 20 if s.finetune_rounds < 5 else 100
    kinds = ("sgd", "sam", "sgld", "svi", "svi+hwa")
    variants = {k: partial(run_steps, k, train_data, iters, s.batch_size) for k in kinds}
    for variant in variants.values():
        variant()
    seconds = interleave(variants, s.finetune_rounds)
    ratios = {
        f"{num}_over_{den}": round(
            statistics.median(per_round_ratios(seconds[num], seconds[den])), 3
        )
        for num, den in (("sam", "sgd"), ("sgld", "sgd"), ("svi", "sgd"), ("svi+hwa", "svi"))
    }
    return {
        "iterations": iters,
        "batch_size": s.batch_size,
        "ms_per_step": {
            k: round(1000 * statistics.median(v) / iters, 3) for k, v in seconds.items()
        },
        "ratios": ratios,
        "targets": {"sam_over_sgd": "about 2", "svi+hwa_over_svi": "<= 1.05"},
    }


def fmt_range(lo: float, hi: float, pattern: str) -> str:
    return f"[{pattern.format(lo)} .. {pattern.format(hi)}]"


def print_table(results: dict[str, Any], wall: float) -> None:
    m, f, e = results["machine"], results["finetune"], results["evaluate"]
    print(
        f"\nbayesavg benchmark ({results['mode']}): torch {m['torch']}, device {m['device']}, "
        f"{m['threads']} threads, load {m['load_average_start'][0]} -> "
        f"{m['load_average_end'][0]}, {wall:.0f} s"
    )
    if max(m["load_average_start"][0], m["load_average_end"][0]) >= (m["cpu_count"] or 1):
        print(
            "  note: load average >= CPU count: other processes compete for the cores; "
            "absolute numbers (and the cost of small ops) are inflated, compare ratios only"
        )
    print(
        f"\n(a) fine-tuning {f['model']}: {f['epochs']} epoch(s) x {f['train_images']} images, "
        f"batch {f['batch_size']}, images/s best of {f['rounds']} rounds [slowest-fastest]"
    )
    print(
        f"  {'variant':<27} {'images/s':>8} {'range':>16} {'best-of':>8} "
        f"{'overhead, per-round median':>27} {'range':>18}"
    )
    for k, rate in f["images_per_s"].items():
        lo, hi = f["images_per_s_range"][k]
        row = f"  {k:<27} {rate:>8.0f} {fmt_range(lo, hi, '{:.0f}'):>16}"
        if k in f["overhead_vs_bare"]:
            olo, ohi = f["overhead_vs_bare_range"][k]
            row += (
                f" {f['overhead_vs_bare_best'][k]:>+8.1%}"
                f" {f['overhead_vs_bare'][k]:>+27.1%} {fmt_range(olo, ohi, '{:+.1%}'):>18}"
            )
        print(row)
    verdict = "met" if f["target_met"] else "NOT met"
    print(
        f"  target: {f['target_variant']} <= {f['target_overhead']:.0%} over bare: {verdict}; "
        f"train == bare weights: {f['train_equals_bare_weights']}"
    )
    print(
        f"\n(b) SWAG evaluation, {e['n_samples']} samples, {e['test_images']} test images "
        f"(+ BN pass over {e['bn_images']} train images), batch {e['batch_size']}, "
        f"median [range] of {e['rounds']} rounds"
    )
    print(
        f"  {'model':<16} {'ours s':>7} {'bound s':>8} {'ours/bound':>11} {'range':>16} "
        f"{'best-of':>8} {'naive s':>8} {'naive/ours':>11} {'range':>14}"
    )
    for name in ("lenet5", BN_MODEL):
        r = e[name]
        speedup_range = fmt_range(*r["speedup_vs_naive_range"], "{:.2f}")
        print(
            f"  {name:<16} {r['seconds']:>7.2f} {r['lower_bound_seconds']:>8.2f} "
            f"{r['ratio_to_bound']:>11.3f} {fmt_range(*r['ratio_to_bound_range'], '{:.3f}'):>16} "
            f"{r['ratio_to_bound_best']:>8.3f} {r['naive_seconds']:>8.2f} "
            f"{r['speedup_vs_naive']:>10.2f}x {speedup_range:>14}"
        )
    met = ", ".join(
        f"{n}: {'met' if e[n]['target_met'] else 'NOT met'}" for n in ("lenet5", BN_MODEL)
    )
    print(f"  target: ours/bound <= {e['target_ratio']:.2f}: {met}")
    print(f"  {e['bn_model_note']}")


def main() -> None:
    args = parse_args()
    settings = QUICK if args.quick else FULL
    device = resolve_device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    seed_everything(SEED)
    started = time.perf_counter()
    machine = machine_info(device, args.threads is not None)
    train_data, test = load_data(device)
    results: dict[str, Any] = {
        "machine": machine,
        "mode": "quick" if args.quick else "full",
        "finetune": bench_finetune(train_data, settings),
        "evaluate": bench_evaluate(train_data, test, settings),
        "steps": bench_steps(train_data, settings),
        "evaluate_extra": bench_evaluate_extra(train_data, test, settings),
    }
    machine["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    wall = time.perf_counter() - started
    results["wall_seconds"] = round(wall, 1)
    write_text(args.out, json.dumps(results, indent=2) + "\n")
    print_table(results, wall)
    st = results["steps"]
    print(f"\n(c) step costs, lenet5, {st['iterations']} steps of batch {st['batch_size']}")
    print(f"  ms/step: {st['ms_per_step']}")
    print(f"  ratios (median per round): {st['ratios']}; expected {st['targets']}")
    ex = results["evaluate_extra"]
    print(
        f"\n(d) evaluation with shifts and OOD in the same pass, lenet5, {ex['images']}: "
        f"ours / bound {ex['ratio_to_bound']} (range {ex['ratio_to_bound_range']}, target <= "
        f"{ex['target_ratio']}); cost vs test only {ex['cost_vs_test_only']} for "
        f"{ex['image_ratio_vs_test_only']}x the images"
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
