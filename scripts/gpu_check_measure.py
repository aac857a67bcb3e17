"""Variants timed side by side for ``scripts/gpu_check.py``'s throughput and speed parts.

``measure`` builds each variant and runs its warm-up epoch (peak memory; compilation and
capture, ``warm_up_s``), then times rounds of one epoch of each, the order rotated by one
each round (as ``benchmarks/timing.py`` does), under each variant's kernel choice
(``_modes``), and reports the numbers so far after each: a part killed at its time box
keeps them. A variant that fails (``import swag``, out of memory) is that variant's
error; the others' numbers stay.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
from gpu_check_parts import Epoch, Size, paced, peak_mib, reset_peak, rotation, timed
from gpu_check_runner import Context

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
