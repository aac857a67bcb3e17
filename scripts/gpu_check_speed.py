"""The training step's speed-ups for ``scripts/gpu_check.py --speed``: SWAG fine-tuning in
bf16, eager against compiled (``compile: true``), graph-captured (``cuda_graphs: true``)
and both, and the projected wall time of the CIFAR-10 preset's SWAG protocol.

Every variant is ``gpu_check_throughput._ours`` (the library's loop, a SWAG trajectory's
plan) on the same CIFAR-shaped images, timed side by side as the throughput part times
its loops (``measure``): a warm-up epoch each (where compilation and capture happen,
reported as ``warm_up_s``), then rounds of one epoch of each, the order rotated. Goals
(issue 27): the best variant at least 2x eager on PreResNet-20, 1.2x on WideResNet-28x10.

PreResNet-164 (the preset's network) also runs the bare PyTorch loop of the throughput
parts (``eager_over_bare``) and the SWAG reference code's loop, the latter for the
projection of the preset's whole SWAG protocol, ours at our best variant's images/s and
the reference's at its own (``gpu_check_protocol``: training, each one's monitoring and
the 30-sample evaluation, in images; forward images at each one's rate for one
evaluation sample, ``gpu_check_forward``, timed first). Goal: ours at least 5x
faster. The figure without the reference's monitoring (in its favour) is beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch
from gpu_check_forward import forward_rates
from gpu_check_measure import Summary, measure, paired, timed_only
from gpu_check_parts import Epoch, Size, cifar_shaped
from gpu_check_protocol import cifar10, projection
from gpu_check_reference import _reference
from gpu_check_runner import Context
from gpu_check_throughput import _bare, _ours

from bayesavg.training.precision import Precision

VARIANTS = {
    "eager": (False, False),
    "compiled": (True, False),
    "graphs": (False, True),
    "compiled_graphs": (True, True),
}
# What deterministic kernels cost (no goal; the default, params deterministic: true):
# the captured step with torch's determinism off and cuDNN's autotuner on, as
# ``deterministic: false`` runs and the reference code does, against the captured step.
UNPINNED = "graphs_unpinned_kernels"
GOALS = {"preresnet20": 2.0, "wideresnet28x10": 1.2}


def _summary(model_name: str) -> Summary:
    def summary(
        head: dict[str, Any], n: int, seconds: dict[str, list[float | None]]
    ) -> dict[str, Any]:
        out = dict(head)
        timed = timed_only(seconds)
        out["rounds_done"] = {k: len(timed.get(k, [])) for k in seconds}
        out["images_per_s"] = {k: round(n / statistics.median(v), 1) for k, v in timed.items()}
        eager = seconds.get("eager", [])
        speedups = {}
        for name in VARIANTS:
            pairs = paired(eager, seconds.get(name, []))
            if name != "eager" and pairs:
                speedups[name] = round(statistics.median(a / b for a, b in pairs), 3)
        out["over_eager"] = speedups
        pairs = paired(seconds.get("eager", []), seconds.get("bare_pytorch", []))
        if pairs:  # the library's eager loop against plain PyTorch's (the throughput parts')
            out["eager_over_bare"] = round(statistics.median(b / a for a, b in pairs), 3)
        pairs = paired(seconds.get("graphs", []), seconds.get(UNPINNED, []))
        if pairs:
            out["unpinned_kernels_over_graphs"] = round(
                statistics.median(a / b for a, b in pairs), 3
            )
        if speedups:
            best = max(speedups, key=speedups.__getitem__)
            out["best"], out["best_over_eager"] = best, speedups[best]
            if model_name in GOALS:
                out["goal_best_over_eager"] = GOALS[model_name]
                out["goal_met"] = speedups[best] >= GOALS[model_name]
        ips = out["images_per_s"]
        ours = max((ips[k] for k in VARIANTS if k in ips), default=None)
        if "reference_swag_code" in ips and ours is not None:
            forward = head.get("forward", {}).get("images_per_s")
            fastest = ips.get(UNPINNED)  # the captured step, deterministic: false
            out.update(projection(ours, ips["reference_swag_code"], forward, fastest))
        return out

    return summary


def speed(model_name: str, ctx: Context) -> dict[str, Any]:
    """Images/s of the four step variants of ``model_name`` (and, for PreResNet-164, the
    reference code's loop and the protocol's projection)."""
    size, device = Size.of(ctx), torch.device(ctx.device)
    prec = Precision("bf16" if device.type == "cuda" else "fp32", device.type)
    x, y = cifar_shaped(size.batch_size * dict(size.batches)[model_name])
    builders: dict[str, Callable[[], Epoch | str]] = {}
    for name, (compile, graphs) in VARIANTS.items():
        if compile and device.type != "cuda" and ctx.quick:
            builders[name] = lambda: "compiling on the CPU takes minutes: not in --quick"
            continue
        builders[name] = lambda c=compile, g=graphs: _ours(
            model_name, device, prec, x, y, size, compile=c, graphs=g
        )
    deterministic = dict.fromkeys(VARIANTS, True)
    if device.type == "cuda":
        builders[UNPINNED] = lambda: _ours(model_name, device, prec, x, y, size, graphs=True)
        deterministic[UNPINNED] = False
    head: dict[str, Any] = {
        "images_per_epoch": len(y),
        "batch_size": size.batch_size,
        "precision": prec.name,
    }
    if model_name == "preresnet164":
        builders["reference_swag_code"] = lambda: _reference(model_name, device, x, y, size)
        deterministic["reference_swag_code"] = False
        builders["bare_pytorch"] = lambda: _bare(model_name, device, prec, x, y, size)
        deterministic["bare_pytorch"] = True
        protocol = cifar10()
        head["protocol"] = protocol.as_dict()
        batch, quick = protocol.eval_batch, ctx.quick
        ctx.report(dict(head, forward="timing one evaluation sample of each"))
        head["forward"] = forward_rates(model_name, device, prec.name, batch, size, quick)
        ctx.report(head)
    compiled = frozenset(name for name, (compile, _) in VARIANTS.items() if compile)
    return measure(builders, deterministic, head, len(y), ctx, _summary(model_name), compiled)
