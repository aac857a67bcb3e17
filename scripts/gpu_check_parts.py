"""The in-process measurements of ``scripts/gpu_check.py``, one function each, each
returning a dict: CPU vs CUDA, bf16 vs fp32, evaluation cost; and shared helpers."""

from __future__ import annotations

import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from bayesavg.config import parse_params
from bayesavg.data import NORMALISATION, Prepared, prepare
from bayesavg.datasets import Split
from bayesavg.evaluate import evaluate
from bayesavg.models import for_inference
from bayesavg.trajectories import compute_for, finetune, initial_network, pretrain_members

ROOT = Path(__file__).resolve().parents[1]
MEAN, STD = NORMALISATION["cifar10"]
# Two runs on other kernels (CPU vs CUDA) or precisions (bf16 vs fp32) start alike and
# drift apart over thousands of steps as runs of two seeds do: their weights differ (the
# relative difference says by how much), their test metrics must agree. On mnist5k's
# 1,000 test images one image is 0.1 pp. NLL: the params' tuning notes show two runs of
# one setting 0.007 apart at ~0.055 (~13%, mc_dropout), so 10% is as tight as is fair.
TOLERANCE = {"accuracy_pp": 1.0, "nll_relative": 0.10}
PREDICTORS = {"map": None, "swag": 0.5}  # method: SWAG scale (the params' defaults)


@dataclass(frozen=True)
class Size:
    """How much each measurement does: ``full`` on a GPU (the whole check in ~9 min on an
    H100 with the pipeline), ``quick`` for a smoke run on the CPU in seconds."""

    pretrain_epochs: int  # short pretrain + SWAG runs on mnist5k (cpu_vs_cuda, bf16_vs_fp32)
    swag_epochs: int
    train_images: int | None  # mnist5k training and test images kept (None: all 3,200
    short_test_images: int | None  # and 1,000)
    swag_samples: int
    batch_size: int  # throughput: CIFAR-shaped batches per epoch, rounds, loader workers
    batches: int
    rounds: int
    workers: int
    throughput_models: tuple[str, ...]
    bn_images: int  # evaluation: BN-pass images, test images, SWAG epochs, samples, rounds
    test_images: int
    eval_epochs: int
    eval_samples: int
    eval_rounds: int

    @classmethod
    def full(cls) -> Size:
        return cls(
            pretrain_epochs=10,
            swag_epochs=5,
            train_images=None,
            short_test_images=None,
            swag_samples=30,
            batch_size=128,
            batches=50,
            rounds=5,
            workers=4,  # the reference's run_swag.py default
            throughput_models=("preresnet20", "wideresnet28x10"),
            bn_images=5000,
            test_images=1000,
            eval_epochs=3,
            eval_samples=30,
            eval_rounds=3,
        )

    @classmethod
    def quick(cls) -> Size:
        return cls(
            pretrain_epochs=1,
            swag_epochs=2,  # SWAG needs two snapshots
            train_images=128,
            short_test_images=200,
            swag_samples=2,
            batch_size=8,
            batches=2,
            rounds=1,
            workers=0,
            throughput_models=("preresnet20",),
            bn_images=32,
            test_images=32,
            eval_epochs=2,
            eval_samples=2,
            eval_rounds=1,
        )


# --- helpers -----------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device: torch.device) -> float | None:
    """``torch.cuda.max_memory_allocated`` since the last ``reset_peak`` (None on the CPU)."""
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of ``fn()``, the device synchronised before and after (kernels are async)."""
    sync(device)
    started = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - started


def rotated(names: list[str], rounds: int) -> Iterator[str]:
    """Every name once per round, the order rotated by one each round (load drift hits all)."""
    for r in range(rounds):
        yield from names[r % len(names) :] + names[: r % len(names)]


def cifar_shaped(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random uint8 images (n, 3, 32, 32) and labels of 10 classes: timing needs no CIFAR."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
    return x, torch.randint(0, 10, (n,), generator=g)


def peak_memory(out: dict[str, Any], prefix: str = "") -> dict[str, float | None]:
    """Every ``peak_mib`` in ``out``, keyed by where it is (``throughput.preresnet20.ours``)."""
    found: dict[str, float | None] = {}
    for key, value in out.items():
        if key == "peak_mib" and not isinstance(value, dict):
            found[prefix.rstrip(".")] = value
        elif key == "peak_mib":
            found.update({f"{prefix}{k}": v for k, v in value.items()})
        elif isinstance(value, dict):
            found.update(peak_memory(value, f"{prefix}{key}."))
    return found


def swag_only(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with the swag trajectory alone (no ensemble, dswag, planes, landscapes,
    sweeps naming the others) and its map and swag predictors, as the params validate."""
    raw["finetune"] = {"swag": raw["finetune"]["swag"]}
    raw["evaluate"]["predictors"] = {
        "swag": {
            "map": {"method": "map"},
            "swag": {"method": "swag", "scale": PREDICTORS["swag"]},
        }
    }
    for section in ("plane", "landscape"):
        raw["evaluate"].pop(section, None)
    raw["evaluate"]["dswag_sweep"] = {"workers": []}
    return raw


def _default_params() -> dict[str, Any]:
    return swag_only(yaml.safe_load((ROOT / "params.yaml").read_text()))


def toy_pipeline(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` shrunk to a smoke run of every stage (``--quick`` with the pipeline): the
    end-to-end tests' small BatchNorm MLP, one or two epochs, few samples and points."""
    sys.path.insert(0, str(ROOT / "tests"))
    from pipeline_repo import small_params  # the tests' own shrinking, not a copy of it

    small = small_params(epochs=2, pretrain_epochs=1, members=2)
    small["device"] = raw["device"]
    e = small["evaluate"]
    e.update(n_samples=3)
    e["shift"]["n_points"] = 50
    e["ood"]["n_points"] = 100
    e["plane"].update(grid=3, n_points=100)
    e["dswag_sweep"].update(workers=[1, 2], rounds=2, sigma_draws=2)
    e["sharpness"].update(n_points=100, probes=1)
    e["landscape"].update(n_points=100, t={"start": -1.0, "stop": 2.0, "points": 3})
    e["landscape"]["rays"]["distances"]["points"] = 3
    e["landscape"]["swag"]["offsets"]["points"] = 3
    return small


# --- short SWAG runs on mnist5k: CPU vs CUDA, bf16 vs fp32 -------------------------------


@functools.cache
def _mnist5k(train_images: int | None, test_images: int | None) -> Prepared:
    """The default params' split; the first images of train and test where asked (the
    splits are stratified and shuffled, so a prefix holds every class)."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-data-") as tmp:
        data = prepare("mnist5k", tmp, tmp, 0, 0.2, 0.2)
    train, test = data.train, data.test
    if train_images is not None:
        train = train.subset(torch.arange(train_images))
    if test_images is not None:
        test = test.subset(torch.arange(test_images))
    return Prepared(train, data.val, test, data.manifest)


@functools.cache
def _short_run(device_name: str, precision: str, size: Size) -> dict[str, Any]:
    """The default params' LeNet-5 pretrained and fine-tuned along their swag trajectory
    (fewer epochs, one pretrained member) on ``device_name`` in ``precision`` through the
    library, as the stages call it; test metrics of the map (end point) and swag
    predictors (``size.swag_samples`` samples, scale 0.5)."""
    device = torch.device(device_name)
    data = _mnist5k(size.train_images, size.short_test_images)
    raw = _default_params()
    raw.update(device=device_name, precision=precision)
    raw["pretrain"].update(epochs=size.pretrain_epochs, members=1)
    swag = raw["finetune"]["swag"]
    swag["epochs"] = size.swag_epochs
    per_epoch = -(-len(data.train) // swag["batch_size"])
    swag["schedule"]["cycle_length"] = per_epoch  # one cycle, one snapshot per epoch
    p = parse_params(raw)
    compute = compute_for(p, device)
    reset_peak(device)
    started = time.perf_counter()
    pre = pretrain_members(p, data, device, compute=compute)
    assert pre is not None
    result = finetune(p, "swag", data, pre.posterior, device, compute=compute)
    assert result is not None
    post = result.posterior
    test = {"test": (post.model_input(data.test.x, device), data.test.y)}
    out: dict[str, Any] = {"device": device_name, "precision": precision}
    for method, scale in PREDICTORS.items():
        found = evaluate(
            post,
            method,
            test,
            n_samples=size.swag_samples,
            scale=scale,
            seed=0,
            device=device,
            precision=compute.precision,
        )["test"].metrics
        out[method] = {"accuracy": found["accuracy"], "nll": found["nll"]}
    sync(device)
    out["seconds"] = round(time.perf_counter() - started, 2)
    out["peak_mib"] = peak_mib(device)
    out["theta"] = post.theta.detach().cpu().double()
    return out


def _compare(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> dict[str, Any]:
    """Metric differences of two short runs against ``TOLERANCE``; weights' distance."""
    diffs = {}
    for method in PREDICTORS:
        acc = 100 * abs(a[method]["accuracy"] - b[method]["accuracy"])
        nll = abs(a[method]["nll"] - b[method]["nll"]) / a[method]["nll"]
        diffs[method] = {"accuracy_pp": round(acc, 3), "nll_relative": round(nll, 4)}
    ok = all(
        d["accuracy_pp"] <= TOLERANCE["accuracy_pp"]
        and d["nll_relative"] <= TOLERANCE["nll_relative"]
        for d in diffs.values()
    )
    weights = float((a["theta"] - b["theta"]).norm() / a["theta"].norm())
    runs = {
        n: {k: v for k, v in r.items() if k != "theta"} for n, r in zip(names, (a, b), strict=True)
    }
    return {
        "runs": runs,
        "differences": diffs,
        "weights_relative_difference": weights,
        "tolerance": dict(TOLERANCE, relative_to=names[0]),
        "within_tolerance": ok,
    }


def _what(size: Size) -> str:
    images = f"{size.train_images or 3200} train, {size.short_test_images or 1000} test images"
    return (
        f"mnist5k ({images}), LeNet-5: pretrain {size.pretrain_epochs} epochs, "
        f"the swag trajectory {size.swag_epochs} epochs (a snapshot each epoch); test "
        f"metrics of map (its end point) and swag ({size.swag_samples} samples, scale 0.5)"
    )


def cpu_vs_cuda(device: torch.device, size: Size) -> dict[str, Any]:
    """Does the GPU train and predict like the CPU (same params, seeds, fp32)?"""
    cpu = _short_run("cpu", "fp32", size)
    dev = _short_run(str(device), "fp32", size)
    if device.type == "cpu":  # --device cpu: the same (cached) run twice, for the JSON's shape
        return {"what": _what(size), **_compare(cpu, dev, ("cpu", "cpu_same_run"))}
    return {"what": _what(size), **_compare(cpu, dev, ("cpu", "cuda"))}


def bf16_vs_fp32(device: torch.device, size: Size) -> dict[str, Any]:
    """Does bf16 autocast (fp32 master weights) give fp32's test metrics?"""
    fp32 = _short_run(str(device), "fp32", size)
    bf16 = _short_run(str(device), "bf16", size)
    return {"what": _what(size), **_compare(fp32, bf16, ("fp32", "bf16"))}


# --- evaluation cost ---------------------------------------------------------------------


def _bn_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def evaluation(device: torch.device, size: Size) -> dict[str, Any]:
    """``evaluate`` of a PreResNet-20 SWAG posterior (S samples, BN recomputed on the
    training images for each) against S x (a train-mode BN pass over the training images
    + an eval-mode forward over the test images) written out by hand: the forward passes
    no implementation can avoid. Same model layout (channels-last), fp32, batch 1000."""
    n_bn, n_test = size.bn_images, size.test_images
    x, y = cifar_shaped(n_bn + 2 * n_test, seed=1)
    manifest = {
        "dataset": "cifar_shaped_random",
        "seed": 0,
        "test_fraction": 0.2,
        "val_fraction": 0.2,
        "num_classes": 10,
        "input_shape": [3, 32, 32],
        "mean": MEAN,
        "std": STD,
    }
    data = Prepared(
        Split(x[:n_bn], y[:n_bn]),
        Split(x[n_bn : n_bn + n_test], y[n_bn : n_bn + n_test]),
        Split(x[n_bn + n_test :], y[n_bn + n_test :]),
        manifest,
    )
    raw = _default_params()
    raw["model"] = {"name": "preresnet", "depth": 20}
    swag = raw["finetune"]["swag"]
    swag.update(epochs=size.eval_epochs, batch_size=min(128, n_bn))
    swag["schedule"] = {"kind": "constant", "lr": 0.05}
    swag["collect"] = {"start_epoch": 0, "every": 0, "max_rank": 20}  # one per epoch
    p = parse_params(raw)
    post = finetune(p, "swag", data, initial_network(p, data), device)
    assert post is not None
    post = post.posterior
    bn_x = post.model_input(data.train.x, device).contiguous(memory_format=torch.channels_last)
    test_x = post.model_input(data.test.x, device).contiguous(memory_format=torch.channels_last)
    test = {"test": (test_x, data.test.y)}
    batch = 1000

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
                for i in range(0, n_bn, batch):
                    model(bn_x[i : i + batch])
                model.eval()
                for i in range(0, n_test, batch):
                    model(test_x[i : i + batch])

    variants = {"ours": ours, "bound": bound}
    peaks: dict[str, float | None] = {}
    for name, fn in variants.items():  # warm-up, 2 samples
        reset_peak(device)
        fn(2)
        sync(device)
        peaks[name] = peak_mib(device)
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for name in rotated(list(variants), size.eval_rounds):
        seconds[name].append(timed(lambda fn=variants[name]: fn(size.eval_samples), device))
    ratios = sorted(a / b for a, b in zip(seconds["ours"], seconds["bound"], strict=True))
    return {
        "model": "preresnet20",
        "samples": size.eval_samples,
        "bn_images": n_bn,
        "test_images": n_test,
        "batch_size": batch,
        "rounds": size.eval_rounds,
        "ours_seconds": round(statistics.median(seconds["ours"]), 3),
        "bound_seconds": round(statistics.median(seconds["bound"]), 3),
        "ours_over_bound": round(statistics.median(ratios), 3),
        "ours_over_bound_range": [round(ratios[0], 3), round(ratios[-1], 3)],
        "goal_ours_over_bound": 1.10,
        "goal_met": statistics.median(ratios) <= 1.10,
        "peak_mib": peaks,
    }
