"""Sections (d) and (e) of ``loop.py``, which need processes of their own: the pins' cost
per model family (a child per mode: the pins are read when torch loads) and when two
data-parallel processes pay on the CPU (two spawned gloo ranks time the all-reduce)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

FAMILIES = {
    "lenet5": ("lenet5", (1, 28, 28), {}),
    "preresnet20": ("preresnet", (3, 32, 32), {"depth": 20}),
    "preresnet164": ("preresnet", (3, 32, 32), {"depth": 164}),
    "vgg16": ("vgg16", (3, 32, 32), {}),
}


def pins_child(quick: bool) -> dict[str, Any]:
    """(d), in a child: ms per image of a training step and of a forward, per family."""
    import torch
    from torch import nn

    from bayesavg.models import build_model

    out = {}
    for family, (name, shape, kwargs) in FAMILIES.items():
        torch.manual_seed(0)
        model = build_model(name, shape, 10, kwargs)
        x, y = torch.randn(64, *shape), torch.randint(0, 10, (64,))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        steps = 2 if quick else 5

        def step(model=model, x=x, y=y, opt=opt) -> None:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        step()
        started = time.perf_counter()
        for _ in range(steps):
            step()
        train_ms = (time.perf_counter() - started) / steps / 64 * 1000
        model.eval()
        big = torch.randn(100 if quick else 500, *shape)
        with torch.inference_mode():
            model(big)
            started = time.perf_counter()
            model(big)
            forward_ms = (time.perf_counter() - started) / len(big) * 1000
        out[family] = {"train_ms": train_ms, "forward_ms": forward_ms}
    return out


def bench_pins(rounds: int, quick: bool) -> dict[str, Any]:
    """(d): child processes, portable and native alternated; medians per family."""
    import json
    import os
    import statistics
    import subprocess
    import sys

    from bayesavg.runtime import numerics

    seen: dict[str, list[dict[str, Any]]] = {"portable": [], "native": []}
    for r in range(rounds):
        for mode in ("portable", "native") if r % 2 == 0 else ("native", "portable"):
            env = dict(os.environ, BAYESAVG_NUMERICS=mode)
            for var in numerics.ISA_PINS:
                env.pop(var, None)  # this process's own pins; the child sets its mode's
            script = str(Path(__file__).with_name("loop.py"))
            argv = [sys.executable, script, "--pins-child", *(["--quick"] * quick)]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            seen[mode].append(json.loads(done.stdout.splitlines()[-1]))
    out: dict[str, Any] = {}
    for family in FAMILIES:
        row = {}
        for what in ("train_ms", "forward_ms"):
            portable = [r[family][what] for r in seen["portable"]]
            native = [r[family][what] for r in seen["native"]]
            row[f"{what}_portable"] = round(statistics.median(portable), 4)
            row[f"{what}_native"] = round(statistics.median(native), 4)
            ratios = [a / b for a, b in zip(portable, native, strict=True)]
            row[f"{what}_portable_over_native"] = round(statistics.median(ratios), 3)
        out[family] = row
    return out


def _allreduce_rank(rank: int, sizes: dict[str, int], port: int, rounds: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    found = {}
    for family, d in sizes.items():
        flat = torch.ones(d)
        dist.all_reduce(flat)
        seconds = []
        for _ in range(rounds):
            dist.barrier()
            started = time.perf_counter()
            dist.all_reduce(flat)
            seconds.append(time.perf_counter() - started)
        found[family] = sorted(seconds)[len(seconds) // 2]
    if rank == 0:
        out.update(found)
    dist.destroy_process_group()


def _step_ms(family: str, batch: int, threads: int, steps: int) -> float:
    import torch
    from torch import nn

    from bayesavg.models import build_model

    name, shape, kwargs = FAMILIES[family]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model(name, shape, 10, kwargs)
    x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seconds = []
    for _ in range(steps + 1):
        started = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        seconds.append(time.perf_counter() - started)
    return sorted(seconds[1:])[steps // 2] * 1000


def bench_data_parallel(rounds: int, quick: bool) -> dict[str, Any]:
    """(e): one process's step against half a step at one thread plus the all-reduce; the
    two steps alternated over ``rounds`` (rotated order), each a median of ``steps``."""
    import socket
    import statistics

    import torch
    import torch.multiprocessing as mp
    from timing import median_range, rotation, warn_if_oversubscribed

    from bayesavg.models import build_model

    warn_if_oversubscribed("(e): 1 process x 2 threads, and 2 ranks x 1 thread", 2)
    families = ["lenet5", "preresnet20"] + ([] if quick else ["preresnet164", "vgg16"])
    sizes = {}
    for family in families:
        name, shape, kwargs = FAMILIES[family]
        sizes[family] = sum(p.numel() for p in build_model(name, shape, 10, kwargs).parameters())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    found = mp.Manager().dict()
    mp.spawn(_allreduce_rank, (sizes, port, 5 if quick else 20, found), nprocs=2)
    threads = torch.get_num_threads()
    steps = 3 if quick else 10
    shapes = {"one": (32, 2), "half": (16, 1)}  # (batch, threads)
    out = {}
    for family in families:
        ms: dict[str, list[float]] = {"one": [], "half": []}
        for r in range(rounds):
            for which in rotation(list(shapes), r):
                ms[which].append(_step_ms(family, *shapes[which], steps))
        reduce_ms = found[family] * 1000
        ratios = [(h + reduce_ms) / o for h, o in zip(ms["half"], ms["one"], strict=True)]
        ratio, low, high = median_range(ratios)
        out[family] = {
            "parameters": sizes[family],
            "step_ms_1_process_2_threads": round(statistics.median(ms["one"]), 2),
            "step_ms_half_batch_1_thread": round(statistics.median(ms["half"]), 2),
            "allreduce_ms_2_processes": round(reduce_ms, 2),
            "two_over_one": round(ratio, 3),
            "two_over_one_range": [round(low, 3), round(high, 3)],
        }
    torch.set_num_threads(threads)
    return out
