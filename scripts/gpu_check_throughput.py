"""Training throughput for ``scripts/gpu_check.py``: SWAG fine-tuning, ours against a bare
PyTorch loop and the SWAG reference code's own loop, timed side by side.

All three train the same architecture from the same kind of data (CIFAR-shaped random
uint8 images, 10 classes), SGD lr 0.05, momentum 0.9, weight decay 3e-4, random crop
(padding 4) + horizontal flip, one SWAG snapshot at the end of each epoch (not in the
bare loop). Each variant runs one warm-up epoch; then every round runs one epoch of each,
the order rotated by one each round (as ``benchmarks/timing.py`` does); images/s is the
median over rounds, ratios are taken per round and their median reported.

The rounds, their reports and a failing variant's error are ``gpu_check_measure``'s;
rounds stop early where another would not fit the box.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from typing import Any

import torch
from gpu_check_measure import measure, paired, timed_only
from gpu_check_parts import (
    LR,
    MEAN,
    MODELS,
    MOMENTUM,
    STD,
    WEIGHT_DECAY,
    Epoch,
    Size,
    cifar_shaped,
)
from gpu_check_reference import _reference
from gpu_check_runner import Context
from torch import nn

from bayesavg.config import Trajectory
from bayesavg.models import build_model
from bayesavg.training.augment import Augment, apply, draw_epoch
from bayesavg.training.batches import StreamedData, TrainData, batches_per_epoch
from bayesavg.training.compiled import CompiledStep
from bayesavg.training.graphs import GraphStep
from bayesavg.training.precision import Precision
from bayesavg.training.steps import StepContext
from bayesavg.training.train import Compute, train
from bayesavg.trajectories import gradient

# The input and the augmentation each network is trained with: CIFAR's crop (padding 4)
# and flip at 32x32; torchvision's random resized crop and flip at 224x224 for ResNet-50.
SHAPES = {"resnet50": (3, 224, 224)}
REFERENCE_MODELS = ("preresnet20", "preresnet164", "wideresnet28x10")  # the reference's own
AUGMENTS = {"resnet50": Augment(0, True, True)}


def shape_of(model_name: str) -> tuple[int, int, int]:
    return SHAPES.get(model_name, (3, 32, 32))


def augment_of(model_name: str) -> Augment:
    return AUGMENTS.get(model_name, Augment(4, True))


def _ours(
    model_name: str,
    device: torch.device,
    prec: Precision,
    x,
    y,
    size: Size,
    compile: bool = False,
    graphs: bool = False,
    streamed: bool = False,
) -> Epoch:
    """One epoch of ``bayesavg.training.train.train`` with a SWAG trajectory's plan
    (``gradient.plan``: its step, optimizer and SWAG collector, snapshots timed by
    ``Trajectory.collects_after``), the data on the device as uint8, crop + flip on the
    device, channels-last and autocast on CUDA. ``run_plan`` is not called: it adds a
    validation pass per epoch, work the bare loop does not do (see benchmarks/README.md).
    ``compile``: the step through ``torch.compile``; ``graphs``: the graph-ready step,
    captured on CUDA; both made once, so the warm-up epoch compiles and captures.
    ``streamed``: the images stay on the host and stream to the device as
    ``data.storage: stream`` has them (``StreamedData``: prefetched, pinned, copied
    non-blocking on a side stream)."""
    name, kwargs = MODELS[model_name]
    augment = augment_of(model_name)
    compute = Compute(device, prec, device.type == "cuda", augment=augment)
    model = compute.prepare(build_model(name, shape_of(model_name), 10, kwargs))
    ctx = StepContext(prec)
    traj = Trajectory(
        start="pretrain",
        epochs=1,
        batch_size=size.batch_size,
        momentum=MOMENTUM,
        weight_decay=WEIGHT_DECAY,
        schedule={"kind": "constant", "lr": LR},
        collect={"start_epoch": 0, "every": 0, "max_rank": size.max_rank},
    )
    plan = gradient.plan(traj, model, compute, ctx, len(y))
    collect = plan.collect
    assert collect is not None
    kind = StreamedData if streamed else TrainData
    images = x if streamed else x.to(device)
    data = kind(images, y.to(device), MEAN, STD, augment, compute.channels_last)
    per_epoch = batches_per_epoch(len(y), size.batch_size, True)
    shuffle = torch.Generator().manual_seed(0)
    epochs = itertools.count()

    def after_step(i: int) -> None:
        if traj.collects_after(i, per_epoch):
            collect()

    compiled = CompiledStep(model) if compile else None
    graph: GraphStep | bool = False
    if graphs:
        stepper = compiled.view if compiled is not None else model
        graph = GraphStep(stepper, plan.optimizer, plan.step, ctx, device)

    def epoch() -> None:
        train(
            model,
            plan.optimizer,
            data,
            epochs=1,
            batch_size=size.batch_size,
            lr=lambda i: LR,
            generator=shuffle,
            step=plan.step,
            after_step=after_step,
            log_epochs=False,
            ctx=ctx,
            augment_seed=next(epochs),
            compiled=compiled,
            graphs=graph,
        )

    return epoch


def _bare(model_name: str, device: torch.device, prec: Precision, x, y, size: Size) -> Epoch:
    """The same training in plain PyTorch: ``torch.optim.SGD`` (fused on CUDA, as ours
    steps there: the bookkeeping is what differs, not the kernel), ``torch.autocast`` (bf16
    on CUDA), channels-last on CUDA, the data on the device, crop + flip by the same
    ``bayesavg.training.augment`` ops; no schedule, metrics, checks or SWAG collection."""
    name, kwargs = MODELS[model_name]
    layout = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    model = build_model(name, shape_of(model_name), 10, kwargs).to(device, memory_format=layout)
    fused = device.type == "cuda"
    opt = torch.optim.SGD(model.parameters(), LR, MOMENTUM, weight_decay=WEIGHT_DECAY, fused=fused)
    augment, xd, yd = augment_of(model_name), x.to(device), y.to(device)
    mean = torch.tensor(MEAN, device=device).view(1, -1, 1, 1)
    std = torch.tensor(STD, device=device).view(1, -1, 1, 1)
    gen = torch.Generator().manual_seed(0)
    bs, n = size.batch_size, len(y)
    dtype = torch.bfloat16 if prec.name == "bf16" else None

    def epoch() -> None:
        model.train()
        order = torch.randperm(n, generator=gen).to(device)
        draws = draw_epoch(n, augment, gen).to(device)
        for start in range(0, n - bs + 1, bs):
            idx = order[start : start + bs]
            xb = apply(xd[idx], draws.take(idx), augment).float().div_(255)
            xb = xb.sub_(mean).div_(std).contiguous(memory_format=layout)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = nn.functional.cross_entropy(model(xb).float(), yd[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    return epoch


GOALS = (
    ("bare_pytorch", "ours_over_bare", 0.95),
    ("reference_swag_code", "ours_over_reference", 3.0),
)
DETERMINISTIC = {
    "ours": True,
    "ours_streamed": True,
    "bare_pytorch": True,
    "reference_swag_code": False,
}
STREAMED = ("resnet50",)  # ImageNet-sized images: where a split outgrows the device


def _summary(
    head: dict[str, Any], n: int, seconds: dict[str, list[float | None]]
) -> dict[str, Any]:
    """``head`` with images/s and the ratios of the rounds timed so far."""
    out = dict(head)
    timed_ = timed_only(seconds)
    out["rounds_done"] = {k: len(timed_.get(k, [])) for k in seconds}
    out["images_per_s"] = {k: round(n / statistics.median(v), 1) for k, v in timed_.items()}
    out["images_per_s_range"] = {
        k: [round(n / max(v), 1), round(n / min(v), 1)] for k, v in timed_.items()
    }
    for other, key, goal in GOALS:
        out[f"goal_{key}"] = goal
        pairs = paired(seconds.get("ours", []), seconds.get(other, []))
        if pairs:
            ratios = [b / a for a, b in pairs]
            out[key] = round(statistics.median(ratios), 3)
            out[f"{key}_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
            out[f"{key}_goal_met"] = out[key] >= goal
    pairs = paired(seconds.get("ours", []), seconds.get("ours_streamed", []))
    if pairs:  # images/s streamed over in memory: the copies hidden behind the compute
        ratios = [a / b for a, b in pairs]
        out["streamed_over_in_memory"] = round(statistics.median(ratios), 3)
        out["streamed_over_in_memory_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
    return out


def throughput(model_name: str, ctx: Context) -> dict[str, Any]:
    """Images/s of SWAG fine-tuning of ``model_name`` for each variant; ours/bare (goal
    >= 0.95: the library's bookkeeping costs under 5%) and ours/reference (goal >= 3)."""
    size, device = Size.of(ctx), torch.device(ctx.device)
    prec = Precision("bf16" if device.type == "cuda" else "fp32", device.type)
    n = size.batch_size * dict(size.batches)[model_name]
    x, y = cifar_shaped(n, shape=shape_of(model_name))
    builders: dict[str, Callable[[], Epoch | str]] = {
        "ours": lambda: _ours(model_name, device, prec, x, y, size),
        "bare_pytorch": lambda: _bare(model_name, device, prec, x, y, size),
    }
    if model_name in STREAMED:
        builders["ours_streamed"] = lambda: _ours(
            model_name, device, prec, x, y, size, streamed=True
        )
    if model_name in REFERENCE_MODELS:
        builders["reference_swag_code"] = lambda: _reference(model_name, device, x, y, size)
    head: dict[str, Any] = {
        "images_per_epoch": len(y),
        "batch_size": size.batch_size,
        "rounds": size.rounds,
        "precision": {
            "ours": prec.name,
            "ours_streamed": prec.name,
            "bare_pytorch": prec.name,
            "reference_swag_code": "fp32",
        },
        "channels_last": device.type == "cuda",
        "deterministic_algorithms": DETERMINISTIC,
        "loader_workers_reference": size.workers,
    }
    return measure(builders, DETERMINISTIC, head, len(y), ctx, _summary)
