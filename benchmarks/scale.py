"""How data-parallel SWAG fine-tuning scales on the CPU, beside what the machine allows.

(1) Images/s of ``trajectories.finetune`` (SWAG) on 1 process x 1 thread,
    2 processes x 1 thread (gloo) and 1 process x 2 threads: LeNet-5 on
    mnist5k (batch 32), PreResNet-20 on CIFAR-shaped random images (batch
    128, crop 4 + flip).
(2) In the same rounds, the machine's two-process ceiling: one fixed
    forward+backward kernel at a rank's batch (B/2), a run's steps on 1
    process against 2 independent processes sharing them (a shared VM often
    gives less than 2.0); and the gain of splitting B in two on one core.
    Ceiling x that gain bounds what 2 ranks can gain over 1 process.
(3) ``augment.draw_epoch`` + ``apply`` over a 50,000-image CIFAR epoch,
    against PreResNet-20's epoch time from (1) and torchvision per image
    (``augmentation.py``).

Variants are warmed up, then run once per round in a rotated order
(``timing.interleave``); medians and ranges over rounds are reported. Workers
start once and take jobs from queues: process start-up is never timed.
Nothing is asserted. ``python benchmarks/scale.py [--quick]`` writes
``benchmarks/scale.json``; see ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import augmentation
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from common import SEED, mnist5k
from timing import (
    Outcome,
    Stopwatch,
    busy,
    finish,
    fmt_range,
    interleave,
    machine_info,
    median_range,
    per_round_ratios,
    warn_if_oversubscribed,
    write_results,
)

from bayesavg.config import Params, parse_params
from bayesavg.data.prepared import Prepared, Split, channel_stats
from bayesavg.models import build_model
from bayesavg.training.augment import Augment
from bayesavg.training.distributed import World
from bayesavg.training.train import Compute
from bayesavg.trajectories import finetune, initial_network
from bayesavg.trajectories import run as run_module

OUT = Path(__file__).resolve().parent / "scale.json"


class ModelCase(NamedTuple):
    """One model of (1): its params.yaml model section, batch size and augmentation."""

    model: dict[str, Any]
    batch_size: int
    augment: Augment


CASES = {  # lenet5 on mnist5k, preresnet20 on CIFAR-shaped random images
    "lenet5": ModelCase({"name": "lenet5"}, 32, Augment()),
    "preresnet20": ModelCase({"name": "preresnet", "depth": 20}, 128, Augment(4, True)),
}


class Settings(NamedTuple):
    """Work per measurement (rounds, epochs per model); ``--quick`` shrinks it."""

    rounds: dict[str, int]
    epochs: dict[str, int]
    cifar_images: int
    aug_images: int
    aug_rounds: int
    warmup_images: int = 256


FULL = Settings({"lenet5": 9, "preresnet20": 7}, {"lenet5": 3, "preresnet20": 1}, 1024, 50_000, 3)
QUICK = Settings({"lenet5": 2, "preresnet20": 2}, {"lenet5": 1, "preresnet20": 1}, 128, 2000, 2)


def params(case: ModelCase, epochs: int) -> Params:
    """A swag trajectory as the pipeline's default: constant lr, one snapshot per epoch."""
    swag = dict(epochs=epochs, batch_size=case.batch_size, start="pretrain")
    swag |= dict(collect={"max_rank": 20}, schedule={"kind": "constant", "lr": 0.01})
    predictors = {"swag": {"map": {"method": "map"}}}
    raw = {"model": case.model, "finetune": {"swag": swag}, "evaluate": {"predictors": predictors}}
    return parse_params(raw)


def problem(name: str, n: int) -> Prepared:
    """mnist5k split by the pipeline's code (val 0.1), or ``n`` CIFAR-shaped random images
    (+ 64 val/test)."""
    if name == "lenet5":
        return mnist5k()
    g = torch.Generator().manual_seed(SEED)
    x = torch.randint(0, 256, (n + 128, 3, 32, 32), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 10, (n + 128,), generator=g)
    train, val, test = (Split(x[a:b], y[a:b]) for a, b in ((0, n), (n, n + 64), (n + 64, None)))
    mean, std = channel_stats(train.x)
    manifest = {"dataset": "synthetic", "seed": SEED, "test_fraction": 0.2, "val_fraction": 0.1}
    manifest |= {"num_classes": 10, "input_shape": [3, 32, 32], "mean": mean, "std": std}
    return Prepared(train, val, test, manifest)


def timed_train(real: Callable[..., Any], spent: list[float]) -> Callable[..., Any]:
    """``train`` adding to ``spent``, per epoch, its start to its last step's end (SWAG
    collection included): the work data parallelism splits. Rank 0's serial validation and
    monitoring (a BN pass for the running average) count only in the whole finetune."""

    def wrapped(*args: Any, after_step: Any = None, on_epoch: Any = None, **kwargs: Any) -> Any:
        mark = [time.perf_counter(), 0.0]

        def step_hook(i: int) -> None:
            if after_step is not None:
                after_step(i)
            mark[1] = time.perf_counter()

        def epoch_hook(progress: Any) -> None:
            spent.append(mark[1] - mark[0])
            if on_epoch is not None:
                on_epoch(progress)
            mark[0] = time.perf_counter()

        return real(*args, after_step=step_hook, on_epoch=epoch_hook, **kwargs)

    return wrapped


_CACHE: dict[Any, Any] = {}  # a worker's problems and kernel inputs, kept between jobs


def _problem(name: str, n: int) -> Prepared:
    if name not in _CACHE:
        _CACHE[name] = problem(name, _CACHE["cifar_images"])
    full: Prepared = _CACHE[name]
    if n >= len(full.train):
        return full
    return Prepared(Split(full.train.x[:n], full.train.y[:n]), full.val, full.test, full.manifest)


def job_finetune(name: str, epochs: int, n: int) -> dict[str, float]:
    """One SWAG fine-tuning run on this rank; rank 0's times are the ones reported."""
    case, data = CASES[name], _problem(name, n)
    p = params(case, epochs)
    start = initial_network(p, data)
    compute = Compute(world=_CACHE["world"], augment=case.augment)
    spent: list[float] = []
    real = run_module.train
    run_module.train = timed_train(real, spent)
    try:
        if _CACHE["world"] is not None:
            dist.barrier()
        with Stopwatch() as whole:
            finetune(p, "swag", data, start, torch.device("cpu"), compute=compute)
    finally:
        run_module.train = real
    return {"train": sum(spent), "whole": whole.seconds}


def job_kernel(name: str, steps: int, batch: int) -> dict[str, float]:
    """``steps`` forward+backward passes on one fixed batch; no communication."""
    key = ("kernel", name, batch)
    if key not in _CACHE:
        case, data = CASES[name], _problem(name, batch)
        torch.manual_seed(SEED)
        kw = params(case, 1).model.kwargs()
        net = build_model(case.model["name"], data.input_shape, data.num_classes, kw)
        x, y = torch.randn(batch, *data.input_shape), torch.randint(0, 10, (batch,))
        _CACHE[key] = (net.train(), x, y)
    net, x, y = _CACHE[key]
    if _CACHE["world"] is not None:
        dist.barrier()
    with Stopwatch() as watch:
        for _ in range(steps):
            net.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(x), y).backward()
    return {"train": watch.seconds}


JOBS = {"finetune": job_finetune, "kernel": job_kernel}


def worker_main(
    rank: int, size: int, threads: int, store: str, inboxes: list[Any], outbox: Any, images: int
) -> None:
    """One process of a group: join it (gloo), then run jobs until told to stop."""
    torch.set_num_threads(threads)
    try:
        world = None
        if size > 1:
            url = f"file://{store}"
            dist.init_process_group("gloo", init_method=url, rank=rank, world_size=size)
            world = World(rank, size, torch.device("cpu"))
        _CACHE.update(world=world, cifar_images=images)
        while (job := inboxes[rank].get()) is not None:
            outbox.put((rank, JOBS[job[0]](*job[1:])))
        if size > 1:
            dist.destroy_process_group()
    except BaseException:
        outbox.put((rank, {"error": traceback.format_exc()}))
        raise


class Group:
    """``size`` worker processes of ``threads`` intra-op threads each, started once."""

    def __init__(self, size: int, threads: int, tmp: Path, images: int) -> None:
        ctx = mp.get_context("spawn")
        self.inboxes = [ctx.Queue() for _ in range(size)]
        self.outbox = ctx.Queue()
        store = str(tmp / f"store-{size}x{threads}")
        args = (size, threads, store, self.inboxes, self.outbox, images)
        self.procs = mp.start_processes(worker_main, args, nprocs=size, join=False)

    def run(self, *job: Any) -> list[dict[str, float]]:
        for inbox in self.inboxes:
            inbox.put(job)
        results = dict(self.outbox.get(timeout=900) for _ in self.inboxes)
        if errors := [r["error"] for r in results.values() if "error" in r]:
            raise RuntimeError(f"a worker failed:\n{errors[0]}")
        return [results[rank] for rank in sorted(results)]

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        self.procs.join()


GROUPS = {"1x1": (1, 1), "2x1": (2, 1), "1x2": (1, 2)}  # processes, threads each
RATIOS = {  # per round, t(first) / t(second); then speed-up / ceiling and / bound
    "speedup_2_processes": ("1x1", "2x1"),  # training loops
    "speedup_2_processes_whole_finetune": ("whole 1x1", "whole 2x1"),
    "speedup_2_threads": ("1x1", "1x2"),
    "ceiling": ("kernel 1x1", "kernel 2x1"),  # the same half batches, 1 process vs 2
    "split_batch_gain": ("kernel 1x1 full batch", "kernel 1x1"),  # 1 process: B vs 2 x B/2
    "bound": ("kernel 1x1 full batch", "kernel 2x1"),  # = ceiling x split_batch_gain
}


def scaling(name: str, groups: dict[str, Group], s: Settings) -> dict[str, Any]:
    """(1) and (2) for one model: data-parallel variants and the kernels, interleaved."""
    case, epochs = CASES[name], s.epochs[name]
    n = len(problem(name, s.cifar_images).train)
    steps = epochs * math.ceil(n / case.batch_size)  # those of the 1-process run
    whole: dict[str, list[float]] = {}

    def dp(group: str, images: int = n, epochs: int = epochs) -> Outcome:
        r = groups[group].run("finetune", name, epochs, images)[0]
        whole.setdefault(group, []).append(r["whole"])
        return Outcome(r["train"])

    def kernel(group: str, steps: int, batch: int) -> Outcome:
        rs = groups[group].run("kernel", name, steps, batch)
        return Outcome(max(r["train"] for r in rs))

    variants = {g: (lambda g=g: dp(g)) for g in groups}
    kernels = {  # a run's steps: on 1 process, shared by 2, and at the full batch
        "kernel 1x1": ("1x1", 2 * steps, case.batch_size // 2),  # a rank's share of B
        "kernel 2x1": ("2x1", steps, case.batch_size // 2),
        "kernel 1x1 full batch": ("1x1", steps, case.batch_size),
    }
    variants |= {k: (lambda a=a: kernel(*a)) for k, a in kernels.items()}
    for g in groups:  # warm-up: a smaller fine-tuning run; the kernels once
        dp(g, min(n, s.warmup_images), 1)
    for k in kernels:
        variants[k]()
    whole.clear()
    sec = interleave(variants, s.rounds[name])
    images = epochs * n
    rates = {g: median_range([images / v for v in sec[g]]) for g in groups}
    sec |= {f"whole {g}": v for g, v in whole.items()}
    per_round = {key: per_round_ratios(sec[a], sec[b]) for key, (a, b) in RATIOS.items()}
    dp_speedup = per_round["speedup_2_processes"]
    for key in ("ceiling", "bound"):
        per_round[f"speedup_over_{key}"] = per_round_ratios(dp_speedup, per_round[key])
    return {
        "images_per_run": images,
        "epochs": epochs,
        "batch_size": case.batch_size,
        "rounds": s.rounds[name],
        "kernel_steps_1_process": steps,
        "train_images_per_s": rates,
        "finetune_images_per_s": {g: median_range([images / v for v in whole[g]]) for g in groups},
        "ratios": {key: median_range(v) for key, v in per_round.items()},
        "seconds_per_round": sec,
    }


def summary(results: dict[str, Any]) -> None:
    m = results["machine"]
    load = m["load_average_start"][0], m["load_average_end"][0]
    note = "\n  note: load >= CPUs, other work competes: 2-thread runs suffer most"
    print(
        f"\nscaling ({results['mode']}): torch {m['torch']}, {m['cpu_count']} CPUs, load "
        f"{load[0]} -> {load[1]}, {results['wall_seconds']} s" + (note if busy(m) else "")
    )
    for name, r in results["models"].items():
        print(
            f"\n{name}: {r['epochs']} epoch(s) x {r['images_per_run'] // r['epochs']} images, "
            f"batch {r['batch_size']}, median [range] of {r['rounds']} rounds"
        )
        print(f"  {'processes x threads':<20} {'train img/s':>11} {'range':>18} {'finetune':>9}")
        for g, (procs, threads) in GROUPS.items():
            med, lo, hi = r["train_images_per_s"][g]
            spread = fmt_range(lo, hi, "{:.0f}")
            fin = r["finetune_images_per_s"][g][0]
            print(f"  {procs} x {threads:<16} {med:>11.0f} {spread:>18} {fin:>9.0f}")
        for key, (med, lo, hi) in r["ratios"].items():
            print(f"  {key.replace('_', ' '):<34} {med:>5.2f} {fmt_range(lo, hi, '{:.2f}')}")
    augmentation.show(results["augmentation"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (< 60 s)")
    parser.add_argument("--out", type=Path, default=OUT, help="results JSON path")
    args = parser.parse_args()
    s = QUICK if args.quick else FULL
    torch.set_num_threads(1)  # (3) runs here; the main process is idle during (1) and (2)
    started = time.perf_counter()
    machine = machine_info(torch.device("cpu"), True)
    for procs, threads in GROUPS.values():
        warn_if_oversubscribed(f"{procs} process(es) x {threads} thread(s)", procs * threads)
    with tempfile.TemporaryDirectory() as tmp:
        groups = {g: Group(*pt, Path(tmp), s.cifar_images) for g, pt in GROUPS.items()}
        try:
            scaled = {name: scaling(name, groups, s) for name in CASES}
        finally:
            for group in groups.values():
                group.close()
    results: dict[str, Any] = {"mode": "quick" if args.quick else "full", "machine": machine}
    results["models"] = scaled
    rate = scaled["preresnet20"]["train_images_per_s"]["1x1"][0]
    results["augmentation"] = augmentation.augmentation(s.aug_images, s.aug_rounds, rate)
    finish(results, started)
    write_results(args.out, results)
    summary(results)
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
