"""Training throughput for ``scripts/gpu_check.py``: SWAG fine-tuning, ours against a bare
PyTorch loop and the SWAG reference code's own loop, timed side by side.

All three train the same architecture from the same kind of data (CIFAR-shaped random
uint8 images, 10 classes), SGD lr 0.05, momentum 0.9, weight decay 3e-4, random crop
(padding 4) + horizontal flip, one SWAG snapshot at the end of each epoch (not in the
bare loop). Each variant runs one warm-up epoch; then every round runs one epoch of each,
the order rotated by one each round (as ``benchmarks/timing.py`` does); images/s is the
median over rounds, ratios are taken per round and their median reported.

A variant that fails (``import swag``, out of memory) is that variant's error: the
others' numbers stay. After each warm-up and each round the numbers so far are reported
(kept if the part is killed at its time box); rounds stop early where another would
not fit the box.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
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
    paced,
    peak_mib,
    reset_peak,
    rotation,
    timed,
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


# torch's default for float32 convolutions on CUDA: TF32 (10-bit mantissa) on Ampere
# and newer; the reference's scripts leave it, the library pins IEEE (``seeding``)
TORCH_DEFAULT_CONV_FP32 = "tf32"


@contextlib.contextmanager
def _modes(name: str, deterministic: bool) -> Iterator[None]:
    """torch's kernel choice for variant ``name``, restored after: the pipeline runs with
    deterministic algorithms and without their NaN fill of every new allocation
    (``seeding.deterministic_kernels`` on CUDA; with ``deterministic`` false, cuDNN's
    autotuner instead); the reference's run_swag.py sets ``cudnn.benchmark = True``,
    leaves determinism off and float32 convolutions at torch's default, TF32. The
    library's own seeding pins them to IEEE for the whole process, so a reference
    variant timed after ours would otherwise run IEEE convolutions: slower than the
    reference code runs."""
    fill = torch.utils.deterministic
    conv = getattr(torch.backends.cudnn, "conv", None)  # fp32_precision: torch >= 2.9
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.benchmark,
        fill.fill_uninitialized_memory,
        conv.fp32_precision if conv is not None else None,
    )
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.benchmark = not deterministic
    fill.fill_uninitialized_memory = False
    if conv is not None and name.startswith("reference"):
        conv.fp32_precision = TORCH_DEFAULT_CONV_FP32
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.benchmark = before[1]
        fill.fill_uninitialized_memory = before[2]
        if conv is not None:
            conv.fp32_precision = before[3]


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


def _error(err: BaseException) -> dict[str, str]:
    return {
        "error": f"{type(err).__name__}: {err}"[:1000],
        "traceback": traceback.format_exc()[-3000:],
    }


def timed_only(seconds: dict[str, list[float | None]]) -> dict[str, list[float]]:
    """Each variant's timed rounds (``None``: a round it missed), for those with any."""
    found = {k: [t for t in v if t is not None] for k, v in seconds.items()}
    return {k: v for k, v in found.items() if v}


def paired(a: list[float | None], b: list[float | None]) -> list[tuple[float, float]]:
    """The rounds both variants timed, as (a, b): per-round ratios compare the two on
    the same round only."""
    return [(x, y) for x, y in zip(a, b, strict=False) if x is not None and y is not None]


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


Summary = Callable[[dict[str, Any], int, dict[str, list[float | None]]], dict[str, Any]]


def measure(
    builders: dict[str, Callable[[], Epoch | str]],
    deterministic: dict[str, bool],
    head: dict[str, Any],
    n: int,
    ctx: Context,
    summary: Summary,
    late: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Build each variant and run its warm-up epoch (its peak memory, and its
    compilation where it compiles: ``warm_up_s``), then time rounds of one epoch of
    each, the order rotated; ``summary(head, n, seconds)`` is reported after each.

    The ``late`` variants (those that compile: minutes for a deep network, cold) are
    built after one round of the others is timed, so a part cut at its box during a
    compilation still has the others' numbers; they join from the next round, and a
    round they missed is ``None`` in their list (``timed_only``, ``paired``)."""
    device = torch.device(ctx.device)
    head = dict(head, peak_mib={}, warm_up_s={})
    skipped: dict[str, str] = {}
    failed: dict[str, dict[str, str]] = {}
    runs: dict[str, Epoch] = {}
    seconds: dict[str, list[float | None]] = {}
    rounds = Size.of(ctx).rounds
    done = 0

    def report() -> dict[str, Any]:
        extra = {"skipped": skipped} if skipped else {}
        found = {**summary(head, n, seconds), **extra, **({"failed": failed} if failed else {})}
        ctx.report(found)
        return found

    def build(name: str) -> None:  # then a warm-up epoch: its own footprint
        det = deterministic[name]
        try:
            with _modes(name, det):
                resident = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
                reset_peak(device)
                fn = builders[name]()
                if isinstance(fn, str):
                    skipped[name] = fn
                    return
                head["warm_up_s"][name] = round(timed(fn, device), 2)
                found = peak_mib(device)
                head["peak_mib"][name] = (
                    None if found is None else round(found - resident / 2**20, 1)
                )
                runs[name], seconds[name] = fn, [None] * done
        except Exception as err:  # this variant's error; the others still run
            failed[name] = _error(err)
        report()

    def timed_rounds(count: int, longest: float = 0.0) -> float:
        """``count`` more rounds (fewer where the box would not hold one more); the
        longest one's seconds."""
        nonlocal done
        for _ in paced(count, ctx.left, longest=longest):
            started = time.monotonic()
            for name in rotation(list(runs), done):
                det = deterministic[name]
                try:
                    with _modes(name, det):
                        seconds[name].append(timed(runs[name], device))
                except Exception as err:
                    failed[name] = _error(err)
                    del runs[name]  # its list keeps the rounds it timed
            done += 1
            longest = max(longest, time.monotonic() - started)
            report()
        return longest

    early = [name for name in builders if name not in late]
    for name in early:
        build(name)
    longest = timed_rounds(1) if late and rounds > 1 else 0.0
    before = len(runs)
    for name in builders:
        if name in late:
            build(name)
    if longest and before:  # a round of every variant, from one of the others
        longest *= len(runs) / before
    timed_rounds(rounds - done, longest)
    return report()
