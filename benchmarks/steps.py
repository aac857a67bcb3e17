"""(c) Step costs: seconds per training step of SAM, SGLD, SVI and SVI with HWA
collection, as ratios to plain SGD (or SVI) timed in the same rounds."""

from __future__ import annotations

import statistics
from functools import partial
from typing import Any

import torch
from common import SEED, Settings, init_model, theta
from timing import Outcome, Stopwatch, interleave, per_round_ratios, warm_up
from torch import nn

from bayesavg.posteriors import HWA, MeanFieldVI, svi_step
from bayesavg.training.sam import sam_step
from bayesavg.training.steps import sgd, sgd_step
from bayesavg.training.train import Tensors
from bayesavg.trajectories.sgld import SGLD

KINDS = ("sgd", "sam", "sgld", "svi", "svi+hwa")
RATIOS = (("sam", "sgd"), ("sgld", "sgd"), ("svi", "sgd"), ("svi+hwa", "svi"))


def run_steps(kind: str, data: Tensors, iters: int, batch_size: int) -> Outcome:
    """``iters`` training steps of LeNet-5 of one kind: sgd, sam, sgld, svi or svi+hwa."""
    model = init_model("lenet5", data.x.device)
    hwa: HWA | None = None
    if kind.startswith("svi"):
        target: nn.Module = MeanFieldVI(model, sigma_init=0.01)
        step = svi_step(len(data))
        params = [target.mu, target.rho]
        if kind == "svi+hwa":
            hwa = HWA(target.mu.numel(), 20, device=data.x.device)
    else:
        target, params = model, list(model.parameters())
        step = sam_step(0.05) if kind == "sam" else sgd_step
    opt = SGLD(params, len(data)) if kind == "sgld" else sgd(params, 0.9, 0.0)
    for group in opt.param_groups:
        group["lr"] = 0.01
    gen = torch.Generator().manual_seed(SEED)
    order = torch.randint(0, len(data), (iters, batch_size), generator=gen).to(data.x.device)
    target.train()
    with Stopwatch(data.x.device) as watch:
        for i in range(iters):
            opt.zero_grad(set_to_none=True)
            step(target, data.x[order[i]], data.y[order[i]])
            opt.step()
            if hwa is not None and (i + 1) % 10 == 0:
                hwa.collect(target.mu, target.rho)
    return Outcome(watch.seconds, theta(model))


def bench_steps(train_data: Tensors, s: Settings) -> dict[str, Any]:
    """Seconds per step of SAM, SGLD, SVI and SVI with HWA collection, as ratios to SGD."""
    iters = 20 if s.finetune_rounds < 5 else 100
    variants = {k: partial(run_steps, k, train_data, iters, s.batch_size) for k in KINDS}
    warm_up(variants)
    seconds = interleave(variants, s.finetune_rounds)
    ratios = {
        f"{num}_over_{den}": round(
            statistics.median(per_round_ratios(seconds[num], seconds[den])), 3
        )
        for num, den in RATIOS
    }
    return {
        "iterations": iters,
        "batch_size": s.batch_size,
        "ms_per_step": {
            k: round(1000 * statistics.median(v) / iters, 3) for k, v in seconds.items()
        },
        "ratios": ratios,
        "targets": {"sam_over_sgd": "about 2", "svi+hwa_over_svi": "<= 1.05"},
    }


def show(st: dict[str, Any]) -> None:
    """(c) in three lines: ms per step, and the ratios beside what is expected."""
    print(f"\n(c) step costs, lenet5, {st['iterations']} steps of batch {st['batch_size']}")
    print(f"  ms/step: {st['ms_per_step']}")
    print(f"  ratios (median per round): {st['ratios']}; expected {st['targets']}")
