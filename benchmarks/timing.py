"""Side-by-side timing shared by every benchmark here.

Absolute seconds depend on the machine and on whatever else it runs, so the
benchmarks compare variants timed in the same rounds: each round runs every
variant once, the order rotated by one each round, so that load drift hits
all of them alike; ratios are taken per round and summarised as the median
and range over rounds, beside the best-of (fastest round against fastest
round). The load average around a run says how busy the machine was.

torch is imported only where a function needs it: ``pipeline.py`` and
``dswag.py`` time other processes and should not pay for its import.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from bayesavg.runtime.io import write_text

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


class Outcome(NamedTuple):
    """Seconds one variant took, and what it computed (for the agreement checks)."""

    seconds: float
    result: Any = None


Variant = Callable[[], Outcome]


class Ratio(NamedTuple):
    """A variant against a baseline: per-round median and range, and the best-of ratio."""

    median: float
    low: float
    high: float
    best: float


def sync(device: torch.device | None) -> None:
    """Wait for queued CUDA kernels, so that a timing covers the work it launched."""
    if device is not None and device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


class Stopwatch:
    """Wall time of a ``with`` block, the device synchronised at both ends."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> Stopwatch:
        sync(self.device)
        self._start = time.perf_counter()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        sync(self.device)
        self.seconds = time.perf_counter() - self._start


def rotation(names: Sequence[T], r: int) -> list[T]:
    """Round ``r``'s order: ``names`` rotated by ``r``, so each takes every place in turn."""
    shift = r % len(names)
    return [*names[shift:], *names[:shift]]


def warm_up(variants: Mapping[str, Variant]) -> dict[str, Outcome]:
    """Every variant once, untimed (first calls pay for allocation and kernel selection)."""
    return {name: variant() for name, variant in variants.items()}


def interleave(variants: Mapping[str, Variant], rounds: int) -> dict[str, list[float]]:
    """Seconds per round for every variant; round r starts at variant r (rotated order)."""
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        for name in rotation(list(variants), r):
            seconds[name].append(variants[name]().seconds)
    return seconds


def median_range(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def per_round_ratios(num: list[float], den: list[float]) -> list[float]:
    return [a / b for a, b in zip(num, den, strict=True)]


def ratio(num: list[float], den: list[float]) -> Ratio:
    """``num`` over ``den`` round by round, and fastest over fastest."""
    return Ratio(*median_range(per_round_ratios(num, den)), min(num) / min(den))


def ratio_fields(key: str, r: Ratio, digits: int, best: bool = True) -> dict[str, Any]:
    """``key``, ``key_range`` (and ``key_best``) of a results section, rounded."""
    fields: dict[str, Any] = {
        key: round(r.median, digits),
        f"{key}_range": [round(r.low, digits), round(r.high, digits)],
    }
    if best:
        fields[f"{key}_best"] = round(r.best, digits)
    return fields


def rounded(seconds: Mapping[str, list[float]], digits: int = 4) -> dict[str, list[float]]:
    """Raw seconds per round, kept for re-analysis."""
    return {k: [round(t, digits) for t in v] for k, v in seconds.items()}


def fmt_range(lo: float, hi: float, pattern: str) -> str:
    return f"[{pattern.format(lo)} .. {pattern.format(hi)}]"


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages: how much else competed for the cores."""
    return [round(v, 2) for v in os.getloadavg()]


def machine_info(device: torch.device, threads_from_flag: bool) -> dict[str, Any]:
    """What the numbers were measured on; ``load_average_end`` is added by ``finish``."""
    import torch

    from bayesavg.runtime.numerics import usable_cores

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "threads_from_flag": threads_from_flag,
        "device": str(device),
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_start": load_average(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def warn_if_oversubscribed(what: str, threads_in_all: int) -> None:
    """``make bench``'s warning where a configuration runs more threads than this process
    may use cores: its times then measure the contention, not the code."""
    from bayesavg.runtime.numerics import usable_cores

    have = usable_cores()
    if threads_in_all > have:
        print(
            f"warning: {what}: {threads_in_all} threads on {have} usable cores: "
            "oversubscribed, its times measure the contention",
            flush=True,
        )


def busy(machine: Mapping[str, Any]) -> bool:
    """Whether the load reached the CPU count: other work competed, absolute times inflate."""
    peak = max(machine["load_average_start"][0], machine["load_average_end"][0])
    return peak >= (machine["cpu_count"] or 1)


def finish(results: dict[str, Any], started: float) -> float:
    """Record the load at the end and the wall time since ``started``; return the latter."""
    results["machine"]["load_average_end"] = load_average()
    wall = time.perf_counter() - started
    results["wall_seconds"] = round(wall, 1)
    return wall


def write_results(path: Path, results: Mapping[str, Any]) -> None:
    """Indented JSON in the order the benchmark built it, written atomically."""
    write_text(path, json.dumps(results, indent=2) + "\n")
