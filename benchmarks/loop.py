"""The training loop on the CPU: compiled against eager steps, VI's step with one split of
theta against one slice per tensor, and what monitoring costs per epoch.

(a) ``compile``: one epoch of SWAG-style SGD through ``bayesavg.training.train.train``
    (LeNet-5 on mnist5k's 3,600 training images; PreResNet-20 on 1,024 CIFAR-shaped
    images), eager against ``compile: true``; the compilation (the warm-up, once) is
    reported apart. Ratio: eager seconds over compiled, per round.
(b) VI: one forward and backward of the negative ELBO (``svi_step``) at batch 64 (LeNet-5)
    and 128 (PreResNet-20), parameters as views of one ``torch.split`` of theta (the
    library's) against one slice of theta per parameter tensor (before issue 25: each
    slice's backward writes a full-length gradient). Ratio: slices over split.
(c) Monitoring: the curves' seconds per epoch (validation, the iterate's test pass, the
    running average's BatchNorm recomputation over the training images and its test
    pass) as a share of a training epoch's, at every 1 on every image (the default)
    and at the CIFAR presets' ``monitor`` (PreResNet-20 on CIFAR-shaped images at a
    tenth of CIFAR-10's split: 4,500 training, 500 validation, 1,000 test).

(d) The cross-machine pins (``BAYESAVG_NUMERICS=portable``: AVX2 on this CPU) against
    ``native`` (the widest instructions the CPU has) per model family: milliseconds
    per image of a training step (batch 64) and of a forward pass (batch 500, eval),
    in child processes (the pins are read when torch loads), alternated.
(e) When data parallelism pays on the CPU: a step of batch 32 on one process (2
    threads) against a rank's step of half of it (1 thread) plus the all-reduce of
    the gradient (gloo, 2 processes on this machine), per model family; the two steps
    alternated over the rounds, the ratio per round.

Side by side in one process, rounds in rotated order (``timing.py``); nothing asserted.
Run ``python benchmarks/loop.py [--quick] [--only SECTION ...]`` (about 20 minutes on 2
cores, 2 quick); results go to ``benchmarks/loop.json`` (``--only``: that section replaced,
the rest kept, with the rerun's machine and date under ``reruns``).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
SECTIONS = ("compile", "vi_step", "monitoring", "pins", "data_parallel")
EPOCH_IMAGES = {"lenet5": 3600, "preresnet20": 1024}


def _cifar(n: int, seed: int) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=gen)
    return x, torch.randint(0, 10, (n,), generator=gen)


def _train_data(name: str, quick: bool) -> Any:
    from common import mnist5k

    from bayesavg.training.batches import TrainData

    if name == "lenet5":
        prep = mnist5k()
        m = prep.manifest
        n = 512 if quick else len(prep.train)
        return TrainData(prep.train.x[:n], prep.train.y[:n], m["mean"], m["std"])
    x, y = _cifar(128 if quick else EPOCH_IMAGES[name], 0)
    return TrainData(x, y, [0.49, 0.48, 0.45], [0.25, 0.24, 0.26], channels_last=True)


def _model(name: str, data: Any) -> Any:
    import torch

    from bayesavg.models import build_model

    torch.manual_seed(0)
    kwargs = {"depth": 20} if name == "preresnet20" else {}
    model = build_model(
        "preresnet" if name == "preresnet20" else name, data.x.shape[1:], 10, kwargs
    )
    return model.to(memory_format=torch.channels_last) if data.channels_last else model


def bench_compile(name: str, rounds: int, quick: bool) -> dict[str, Any]:
    """(a): seconds per epoch, eager and compiled, and the compilation apart."""
    import torch
    from timing import Outcome, interleave, ratio, ratio_fields, rounded

    from bayesavg.training.compiled import CompiledStep
    from bayesavg.training.steps import sgd
    from bayesavg.training.train import train

    data = _train_data(name, quick)
    runs: dict[str, Callable[[], Outcome]] = {}
    compile_s = 0.0

    def epoch(model: Any, opt: Any, compiled: Any, seed: int) -> float:
        started = time.perf_counter()
        gen = torch.Generator().manual_seed(seed)
        train(
            model,
            opt,
            data,
            epochs=1,
            batch_size=64,
            lr=lambda i: 0.01,
            generator=gen,
            log_epochs=False,
            compiled=compiled,
        )
        return time.perf_counter() - started

    for variant in ("eager", "compiled"):
        model = _model(name, data)
        opt = sgd(model, 0.9, 5e-4)
        compiled = CompiledStep(model) if variant == "compiled" else None
        if compiled is not None:
            first = epoch(model, opt, compiled, 0)
            compile_s = compiled.seconds
            print(f"  {name}: compiled in {compile_s:.1f} s (first epoch {first:.1f} s)")

        def run(model=model, opt=opt, compiled=compiled) -> Outcome:
            return Outcome(epoch(model, opt, compiled, 1))

        run()  # warm-up (allocation, oneDNN primitives)
        runs[variant] = run
    seconds = interleave(runs, rounds)
    return {
        "images_per_epoch": len(data),
        "compile_seconds": round(compile_s, 1),
        **ratio_fields("eager_over_compiled", ratio(seconds["eager"], seconds["compiled"]), 3),
        "seconds": rounded(seconds),
    }


class _SlicedVI:
    """VI's forward as before issue 25: one slice of theta per parameter tensor."""

    @staticmethod
    def forward(vi: Any, x: Any, theta: Any = None, frozen_stats: bool = False) -> Any:
        from torch.func import functional_call

        vec = vi.mu if theta is None else theta
        params, offset = {}, 0
        for (name, shape), size in zip(vi._shapes, vi._sizes, strict=True):
            params[name] = vec[offset : offset + size].view(shape)
            offset += size
        return functional_call(vi.net, params, (x,))


def bench_vi(name: str, rounds: int, quick: bool) -> dict[str, Any]:
    """(b): seconds per VI step, one split against per-tensor slices."""
    import types

    import torch
    from timing import Outcome, interleave, ratio, ratio_fields, rounded

    from bayesavg.posteriors import MeanFieldVI, svi_step

    data = _train_data(name, quick)
    batch = 64 if name == "lenet5" else 128
    idx = torch.arange(min(batch, len(data)))
    x, y = data.batch(idx)
    step = svi_step(len(data))
    runs: dict[str, Callable[[], Outcome]] = {}
    steps = 5 if quick else 20
    for variant in ("split", "slices"):
        vi = MeanFieldVI(_model(name, data), sigma_init=0.01).train()
        if variant == "slices":
            vi.forward = types.MethodType(_SlicedVI.forward, vi)

        def run(vi=vi) -> Outcome:
            started = time.perf_counter()
            for _ in range(steps):
                vi.zero_grad(set_to_none=True)
                step(vi, x, y)
            return Outcome((time.perf_counter() - started) / steps)

        run()
        runs[variant] = run
    seconds = interleave(runs, rounds)
    return {
        "batch_size": len(idx),
        **ratio_fields("slices_over_split", ratio(seconds["slices"], seconds["split"]), 3),
        "seconds_per_step": rounded(seconds, 5),
    }


def bench_monitoring(rounds: int, quick: bool) -> dict[str, Any]:
    """(c): the curves' seconds as a share of a training epoch's, PreResNet-20."""
    import torch
    import yaml
    from timing import median_range

    from bayesavg.training.batches import Tensors, TrainData
    from bayesavg.training.batchnorm import update_bn
    from bayesavg.training.monitoring import Monitoring
    from bayesavg.training.steps import sgd
    from bayesavg.training.train import loss_and_accuracy, train

    scale = 8 if quick else 1
    n_train, n_val, n_test = 4500 // scale, 500 // scale, 1000 // scale
    (x, y), mean, std = _cifar(n_train + n_val + n_test, 2), [0.49] * 3, [0.25] * 3
    train_data = TrainData(x[:n_train], y[:n_train], mean, std, channels_last=True)

    def split(lo: int, hi: int) -> Tensors:
        part = TrainData(x[lo:hi], y[lo:hi], mean, std, channels_last=True)
        return Tensors(part.inputs(), y[lo:hi])

    val, test = split(n_train, n_train + n_val), split(n_train + n_val, len(y))
    model = _model("preresnet20", train_data)
    average = copy.deepcopy(model)
    opt = sgd(model, 0.9, 5e-4)

    def curves(m: Monitoring) -> float:
        started = time.perf_counter()
        loss_and_accuracy(model, m.subset(val))
        loss_and_accuracy(model, m.subset(test))
        update_bn(average, m.inputs(train_data.inputs()))
        loss_and_accuracy(average, m.subset(test))
        return time.perf_counter() - started

    preset = yaml.safe_load((HERE.parent / "presets" / "cifar10.yaml").read_text())["monitor"]
    every, fraction = preset["every"], preset["fraction"]
    settings = {"every_1_all": Monitoring(), "preset": Monitoring(every, fraction)}
    epoch_s: list[float] = []
    curve_s: dict[str, list[float]] = {k: [] for k in settings}
    gen = torch.Generator().manual_seed(0)
    for _ in range(rounds):
        started = time.perf_counter()
        train(
            model,
            opt,
            train_data,
            epochs=1,
            batch_size=128,
            lr=lambda i: 0.01,
            generator=gen,
            log_epochs=False,
        )
        epoch_s.append(time.perf_counter() - started)
        for key, m in settings.items():
            curve_s[key].append(curves(m) / m.every)
    out: dict[str, Any] = {"images": {"train": n_train, "val": n_val, "test": n_test}}
    out["preset"] = {"every": every, "fraction": fraction}
    out["epoch_seconds"] = round(median_range(epoch_s)[0], 3)
    for key, values in curve_s.items():
        shares = [c / e for c, e in zip(values, epoch_s, strict=True)]
        mid, lo, hi = median_range(shares)
        out[f"share_of_epoch_{key}"] = round(mid, 4)
        out[f"share_of_epoch_{key}_range"] = [round(lo, 4), round(hi, 4)]
    return out


def main() -> None:
    from bayesavg.runtime import numerics

    numerics.pin()  # as every entry point: threads and instruction set before torch
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument("--out", type=Path, default=HERE / "loop.json")
    parser.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        help="rerun this section alone (repeatable), keeping the others already in --out",
    )
    parser.add_argument("--pins-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch
    from loop_processes import bench_data_parallel, bench_pins, pins_child

    if args.pins_child:
        torch.set_num_threads(numerics.threads())
        print(json.dumps(pins_child(args.quick)))
        return
    from timing import finish, machine_info, write_results

    torch.set_num_threads(numerics.threads())
    rounds = 2 if args.quick else 5
    started = time.perf_counter()
    sections: dict[str, Callable[[], Any]] = {
        "compile": lambda: {m: bench_compile(m, rounds, args.quick) for m in EPOCH_IMAGES},
        "vi_step": lambda: {m: bench_vi(m, rounds, args.quick) for m in EPOCH_IMAGES},
        "monitoring": lambda: bench_monitoring(rounds, args.quick),
        "pins": lambda: bench_pins(rounds, args.quick),
        "data_parallel": lambda: bench_data_parallel(rounds, args.quick),
    }
    machine = machine_info(torch.device("cpu"), False)
    mode = "quick" if args.quick else "full"
    if args.only:
        results = json.loads(args.out.read_text()) if args.out.exists() else {}
        ran = {name: sections[name]() for name in args.only}
        stamp = {"machine": machine, "mode": mode, "date": time.strftime("%Y-%m-%d")}
        wall = finish(stamp, started)  # the rerun's own load and time, beside the first run's
        results.update(ran)
        results.setdefault("reruns", {}).update({name: stamp for name in ran})
    else:
        results = {"machine": machine, "mode": mode}
        results.update({name: run() for name, run in sections.items()})
        wall = finish(results, started)
    write_results(args.out, results)
    print(f"\ntraining loop on the CPU ({mode}, {wall:.0f} s):")
    for m, r in results.get("compile", {}).items():
        print(
            f"  compile {m}: eager/compiled {r['eager_over_compiled']} "
            f"{r['eager_over_compiled_range']}, compilation {r['compile_seconds']} s"
        )
    for m, r in results.get("vi_step", {}).items():
        print(
            f"  VI step {m}: slices/split {r['slices_over_split']} {r['slices_over_split_range']}"
        )
    if mon := results.get("monitoring"):
        print(
            f"  monitoring per epoch (PreResNet-20): every 1 on all "
            f"{mon['share_of_epoch_every_1_all']:.1%}, the CIFAR presets' (every "
            f"{mon['preset']['every']} on {mon['preset']['fraction']:.0%}) "
            f"{mon['share_of_epoch_preset']:.1%} (goal < 5%)"
        )
    for family, r in results.get("pins", {}).items():
        print(
            f"  pins {family}: training step {r['train_ms_portable_over_native']}x, "
            f"forward {r['forward_ms_portable_over_native']}x (portable over native)"
        )
    for family, r in results.get("data_parallel", {}).items():
        print(
            f"  data parallel {family}: 2 processes / 1 = {r['two_over_one']} "
            f"{r.get('two_over_one_range', '')} (step "
            f"{r['step_ms_1_process_2_threads']} ms; half step {r['step_ms_half_batch_1_thread']}"
            f" ms + all-reduce {r['allreduce_ms_2_processes']} ms)"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
