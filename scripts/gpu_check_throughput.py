"""Training throughput for ``scripts/gpu_check.py``: ours against a bare PyTorch loop and
the SWAG reference code's own loop, side by side."""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gpu_check_parts import MEAN, MODELS, STD, Size, _peak_mib, _reset_peak, _sync, cifar_shaped
from torch import nn

from bayesavg.augment import Augment, apply, draw_epoch
from bayesavg.config import Trajectory
from bayesavg.models import build_model
from bayesavg.precision import Precision
from bayesavg.train import Compute, StepContext, TrainData, train
from bayesavg.trajectories import gradient

# --- training throughput -----------------------------------------------------------------


def _normalise(x: torch.Tensor, layout: torch.memory_format) -> torch.Tensor:
    m = torch.tensor(MEAN, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(STD, device=x.device).view(1, -1, 1, 1)
    return ((x.float() / 255 - m) / s).contiguous(memory_format=layout)


def _ours(model_name: str, device: torch.device, prec: Precision, x, y) -> Callable[[], None]:
    """One epoch of ``bayesavg.train.train`` with SWAG collection at its end, as a SWAG
    trajectory runs (bf16 on CUDA, channels-last, crop + flip on the device)."""
    name, kwargs = MODELS[model_name]
    augment = Augment(4, True)
    compute = Compute(device, prec, device.type == "cuda", augment=augment)
    model = compute.prepare(build_model(name, (3, 32, 32), 10, kwargs))
    ctx = StepContext(prec)
    traj = Trajectory(
        start="pretrain",
        batch_size=128,
        momentum=0.9,
        weight_decay=0.0003,
        collect={"start_epoch": 0, "max_rank": 20},
    )
    plan = gradient.plan(traj, model, compute, ctx, len(y))
    data = TrainData(x.to(device), y.to(device), MEAN, STD, augment, compute.channels_last)
    per_epoch = -(-len(y) // 128)
    shuffle = torch.Generator().manual_seed(0)

    def epoch() -> None:
        assert plan.collect is not None
        train(
            model,
            plan.optimizer,
            data,
            epochs=1,
            batch_size=128,
            lr=lambda i: 0.05,
            generator=shuffle,
            step=plan.step,
            ctx=ctx,
            log_epochs=False,
            after_step=lambda i: plan.collect() if (i + 1) % per_epoch == 0 else None,
        )

    return epoch


def _bare(model_name: str, device: torch.device, prec: Precision, x, y) -> Callable[[], None]:
    """The same training in plain PyTorch: torch.optim.SGD, autocast, channels-last and the
    same augmentation ops; no schedule, metrics or collection."""
    name, kwargs = MODELS[model_name]
    layout = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    model = build_model(name, (3, 32, 32), 10, kwargs).to(device, memory_format=layout)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.0003)
    augment, xd, yd = Augment(4, True), x.to(device), y.to(device)
    gen = torch.Generator().manual_seed(0)

    def epoch() -> None:
        model.train()
        order = torch.randperm(len(yd), generator=gen).to(device)
        draws = draw_epoch(len(yd), augment, gen).to(device)
        for start in range(0, len(yd), 128):
            idx = order[start : start + 128]
            xb = _normalise(apply(xd[idx], draws.take(idx), augment), layout)
            with prec.autocast():
                loss = nn.functional.cross_entropy(model(xb).float(), yd[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    return epoch


def _reference_modules() -> dict[str, Any] | str:
    """swa-gaussian's utils, losses and models, loaded by file: its package __init__ imports
    gpytorch, which the benchmark does not need (installed with --no-deps)."""
    spec = importlib.util.find_spec("swag")
    if spec is None or spec.origin is None:
        return "swa-gaussian is not installed (make bench-install)"
    root = Path(spec.origin).parent
    out = {}
    for key, rel in (
        ("utils", "utils.py"),
        ("losses", "losses.py"),
        ("preresnet", "models/preresnet.py"),
        ("wide", "models/wide_resnet.py"),
    ):
        mspec = importlib.util.spec_from_file_location(f"swag_reference_{key}", root / rel)
        module = importlib.util.module_from_spec(mspec)
        mspec.loader.exec_module(module)
        out[key] = module
    return out


def _reference(model_name: str, device: torch.device, size: Size, x, y) -> Callable[[], None] | str:
    """The SWAG reference code's loop: ``train_epoch`` over a DataLoader of PIL images with
    torchvision's transforms, fp32, its own model classes (without its SWAG collection,
    which needs gpytorch)."""
    ref = _reference_modules()
    if isinstance(ref, str):
        return ref
    import torchvision.transforms as T
    from PIL import Image

    if model_name == "preresnet20":
        model = ref["preresnet"].PreResNet(num_classes=10, depth=20)
    else:
        model = ref["wide"].WideResNet(num_classes=10, depth=28, widen_factor=10)
    model = model.to(device)
    transform = T.Compose(
        [
            T.RandomCrop(32, padding=4),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(MEAN, STD),
        ]
    )
    images = x.permute(0, 2, 3, 1).numpy()
    labels = y.tolist()

    class Images(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(labels)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            return transform(Image.fromarray(np.ascontiguousarray(images[i]))), labels[i]

    loader = torch.utils.data.DataLoader(
        Images(),
        batch_size=128,
        shuffle=True,
        num_workers=size.workers,
        pin_memory=device.type == "cuda",
        persistent_workers=size.workers > 0,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.0003)
    return lambda: ref["utils"].train_epoch(loader, model, ref["losses"].cross_entropy, opt, device)


def throughput(model_name: str, device: torch.device, size: Size) -> dict[str, Any]:
    """Images/s of one epoch per variant, median over rounds in rotated order after a
    warm-up epoch; peak memory per variant."""
    prec = Precision("bf16" if device.type == "cuda" else "fp32", device.type)
    x, y = cifar_shaped(size.cifar_images)
    variants: dict[str, Any] = {
        "ours": _ours(model_name, device, prec, x, y),
        "bare_pytorch": _bare(model_name, device, prec, x, y),
        "reference_swag_code": _reference(model_name, device, size, x, y),
    }
    skipped = {k: v for k, v in variants.items() if isinstance(v, str)}
    runs = {k: v for k, v in variants.items() if not isinstance(v, str)}
    seconds: dict[str, list[float]] = {k: [] for k in runs}
    peak: dict[str, float | None] = {}
    for name, fn in runs.items():
        _reset_peak(device)
        fn()
        _sync(device)
        peak[name] = _peak_mib(device)
    names = list(runs)
    for r in range(size.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            _sync(device)
            t0 = time.perf_counter()
            runs[name]()
            _sync(device)
            seconds[name].append(time.perf_counter() - t0)
    rate = {k: round(len(y) / statistics.median(v), 1) for k, v in seconds.items()}
    out: dict[str, Any] = {
        "images": len(y),
        "batch_size": 128,
        "precision": {"ours": prec.name, "bare_pytorch": prec.name, "reference_swag_code": "fp32"},
        "images_per_s": rate,
        "peak_mib": peak,
        "ours_over_bare": round(rate["ours"] / rate["bare_pytorch"], 3),
        "goal_ours_over_bare": 0.95,
    }
    if "reference_swag_code" in rate:
        out["ours_over_reference"] = round(rate["ours"] / rate["reference_swag_code"], 2)
    out["goal_ours_over_reference"] = 3.0
    if skipped:
        out["skipped"] = skipped
    return out
