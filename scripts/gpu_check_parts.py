"""The measurements of ``scripts/gpu_check.py``, one function each, each returning a dict."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from bayesavg.batchnorm import update_bn
from bayesavg.config import parse_params
from bayesavg.data import NORMALISATION, Prepared, Split, prepare
from bayesavg.evaluate import evaluate, log_softmax_predictions
from bayesavg.models import build_model, for_inference
from bayesavg.posterior_file import PosteriorFile
from bayesavg.precision import Precision
from bayesavg.train import Compute
from bayesavg.trajectories import finetune, pretrain_members

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODELS = {"preresnet20": ("preresnet", {"depth": 20}), "wideresnet28x10": ("wideresnet28x10", {})}
MEAN, STD = NORMALISATION["cifar10"]
# Two training runs on other kernels or precisions drift apart as two seeds do (the weights'
# relative difference says how far): their test metrics, not their weights, must agree.
TOLERANCE = {"accuracy_pp": 1.0, "nll_relative": 0.10}
POSTERIORS = ("models/pretrain/posterior.pt", "models/swag/posterior.pt")
TESTED = ("map", "swa", "swag")


@dataclass(frozen=True)
class Size:
    short_epochs: int
    cifar_images: int
    rounds: int
    eval_samples: int
    workers: int
    throughput_models: tuple[str, ...]

    @classmethod
    def full(cls) -> Size:
        return cls(5, 128 * 50, 5, 30, 8, ("preresnet20", "wideresnet28x10"))

    @classmethod
    def quick(cls) -> Size:
        return cls(2, 128 * 2, 2, 3, 0, ("preresnet20",))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_mib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the pipeline end to end -------------------------------------------------------------


def pipeline(device: torch.device) -> dict[str, Any]:
    """``dvc repro`` of a clone of HEAD with ``device`` in params.yaml, then pretrain and
    finetune@swag forced again: their posteriors must be the same bytes."""
    repo = Path(tempfile.mkdtemp(prefix="gpu-check-")) / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["device"] = str(device)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "DVC_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", MLFLOW_DISABLE_TELEMETRY="true")

    def dvc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["dvc", *args], cwd=repo, env=env, capture_output=True, text=True)

    started = time.perf_counter()
    proc = dvc("repro")
    out: dict[str, Any] = {
        "ok": proc.returncode == 0,
        "seconds": round(time.perf_counter() - started, 1),
        "stages": proc.stdout.count("Running stage"),
    }
    if proc.returncode != 0:
        out["error"] = (proc.stderr or proc.stdout)[-2000:]
        return out
    metrics = {n: json.loads((repo / "metrics" / f"{n}.json").read_text()) for n in TESTED}
    out["test"] = {n: {k: m[k] for k in ("accuracy", "nll")} for n, m in metrics.items()}
    first = {p: _sha256(repo / p) for p in POSTERIORS}
    again = dvc("repro", "--force", "--single-item", "pretrain", "finetune@swag")
    second = {p: _sha256(repo / p) for p in POSTERIORS}
    out["determinism"] = {"rerun_ok": again.returncode == 0, "bitwise_equal": first == second}
    return out


# --- short SWAG runs: CPU vs device, bf16 vs fp32 ----------------------------------------


@functools.cache
def _mnist5k() -> Prepared:
    return prepare("mnist5k", "data/raw", tempfile.mkdtemp(prefix="gpu-check-data-"), 0, 0.2, 0.2)


@functools.cache
def _swag_run(device_name: str, precision: str, epochs: int, samples: int) -> dict[str, Any]:
    """LeNet-5 on mnist5k: pretraining, a SWAG trajectory, a 30-sample SWAG evaluation."""
    device = torch.device(device_name)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw.update(device=device_name, precision=precision)
    raw["pretrain"].update(epochs=epochs, members=1)
    raw["finetune"] = {"swag": dict(raw["finetune"]["swag"], epochs=epochs)}
    raw["evaluate"]["predictors"] = {"swag": {"trajectory": "swag", "method": "swag"}}
    for key in ("plane", "landscape"):
        raw["evaluate"].pop(key)
    raw["evaluate"]["dswag_sweep"] = {"workers": []}
    p = parse_params(raw)
    data = _mnist5k()
    compute = Compute(device, Precision(precision, device.type), device.type == "cuda")
    _reset_peak(device)
    pre = pretrain_members(p, data, device, compute=compute)
    result = finetune(p, "swag", data, pre.posterior, device, compute=compute)
    post = result.posterior
    test = {"test": (post.model_input(data.test.x, device), data.test.y)}
    found = evaluate(
        post,
        "swag",
        test,
        n_samples=samples,
        scale=0.5,
        seed=0,
        device=device,
        precision=compute.precision,
    )["test"].metrics
    return {
        "accuracy": found["accuracy"],
        "nll": found["nll"],
        "theta": post.theta,
        "peak_mib": _peak_mib(device),
    }


def _compare(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> dict[str, Any]:
    acc = 100 * abs(a["accuracy"] - b["accuracy"])
    nll = abs(a["nll"] - b["nll"]) / a["nll"]
    weights = float((a["theta"] - b["theta"]).norm() / a["theta"].norm())
    return {
        **{
            n: {k: r[k] for k in ("accuracy", "nll", "peak_mib")}
            for n, r in zip(names, (a, b), strict=True)
        },
        "accuracy_difference_pp": round(acc, 3),
        "nll_relative_difference": round(nll, 4),
        "weights_relative_difference": weights,
        "tolerance": TOLERANCE,
        "within_tolerance": acc <= TOLERANCE["accuracy_pp"] and nll <= TOLERANCE["nll_relative"],
    }


def cpu_vs_device(device: torch.device, size: Size) -> dict[str, Any]:
    cpu = _swag_run("cpu", "fp32", size.short_epochs, size.eval_samples)
    dev = _swag_run(str(device), "fp32", size.short_epochs, size.eval_samples)
    return _compare(cpu, dev, ("cpu", "device"))


def bf16_vs_fp32(device: torch.device, size: Size) -> dict[str, Any]:
    fp32 = _swag_run(str(device), "fp32", size.short_epochs, size.eval_samples)
    bf16 = _swag_run(str(device), "bf16", size.short_epochs, size.eval_samples)
    return _compare(fp32, bf16, ("fp32", "bf16"))


def cifar_shaped(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
    return x, torch.randint(0, 10, (n,), generator=g)


# --- evaluation cost ---------------------------------------------------------------------


def evaluation(device: torch.device, size: Size) -> dict[str, Any]:
    """``evaluate`` of a PreResNet-20 SWAG posterior (S samples, BN recomputed) against S x
    (a BN pass over the training images + a forward over the test images) by hand."""
    x, y = cifar_shaped(size.cifar_images + 1000, seed=1)
    prepared = Prepared(
        Split(x[:-1000], y[:-1000]),
        Split(x[-1000:-500], y[-1000:-500]),
        Split(x[-500:], y[-500:]),
        _manifest(),
    )
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["model"] = {"name": "preresnet", "depth": 20}
    swag = raw["finetune"]["swag"]
    swag.update(epochs=3, batch_size=128, schedule={"kind": "constant", "lr": 0.05})
    swag["collect"] = {"start_epoch": 0, "every": 0, "max_rank": 20}  # one per epoch
    raw["finetune"] = {"swag": swag}
    raw["evaluate"]["predictors"] = {"swag": {"trajectory": "swag", "method": "swag"}}
    for key in ("plane", "landscape"):
        raw["evaluate"].pop(key)
    raw["evaluate"]["dswag_sweep"] = {"workers": []}
    p = parse_params(raw)
    start_net = build_model("preresnet", (3, 32, 32), 10, {"depth": 20})
    from bayesavg.trajectories.common import posterior_fields

    start = PosteriorFile.from_model(
        start_net, **posterior_fields(p, prepared, "init", {"depth": 20})
    )
    post = finetune(p, "swag", prepared, start, device).posterior
    bn_x = post.model_input(prepared.train.x, device)
    test = {"test": (post.model_input(prepared.test.x, device), prepared.test.y)}
    samples = size.eval_samples

    def ours() -> None:
        evaluate(
            post,
            "swag",
            test,
            n_samples=samples,
            scale=0.5,
            bn_x=bn_x,
            seed=0,
            device=device,
            batch_size=500,
        )

    model = for_inference(post.build_model(device))

    def bound() -> None:
        for _ in range(samples):
            update_bn(model, bn_x, 500)
            log_softmax_predictions(model, test["test"][0], 500)

    times: dict[str, list[float]] = {"ours": [], "bound": []}
    ours()
    bound()
    for r in range(size.rounds):
        for name, fn in (
            (("ours", ours), ("bound", bound)) if r % 2 == 0 else (("bound", bound), ("ours", ours))
        ):
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
    ratio = statistics.median(a / b for a, b in zip(times["ours"], times["bound"], strict=True))
    return {
        "samples": samples,
        "train_images": len(bn_x),
        "test_images": len(test["test"][1]),
        "ours_seconds": round(statistics.median(times["ours"]), 3),
        "bound_seconds": round(statistics.median(times["bound"]), 3),
        "ours_over_bound": round(ratio, 3),
        "goal_ours_over_bound": 1.10,
        "peak_mib": _peak_mib(device),
    }


def _manifest() -> dict[str, Any]:
    return {
        "dataset": "synthetic",
        "seed": 0,
        "test_fraction": 0.2,
        "val_fraction": 0.2,
        "num_classes": 10,
        "input_shape": [3, 32, 32],
        "mean": MEAN,
        "std": STD,
    }
