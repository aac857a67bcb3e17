"""The ``step_variants`` part of ``scripts/gpu_check.py``: do the fast steps train as the
eager one does, on this device?

The same short SWAG run (PreResNet-20, crop + flip, the determinism part's CIFAR
configuration) with each step variant of issue 27: eager, ``cuda_graphs: true``,
``compile: true`` and both. A captured step replays the kernels the eager step launches,
so ``graphs`` must give eager's bytes. A compiled step fuses kernels and sums floats in
another order, so it cannot; its yardstick is the rounding the user already accepts in
the preset: how far the eager run in bf16 lands from the same run in fp32 (on the CPU
the variants train in fp32, and bf16 is the other run). Goal: the
compiled variants' largest difference from eager (weights, SWAG moments, BN buffers)
within that gap; compiled and captured must give the compiled run's bytes. The SWAG test
NLLs are reported beside (random labels: their differences are noise-sized, no goal).

Compiling on the CPU takes minutes: ``--quick`` on the CPU skips the compiled variants.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from gpu_check_determinism import cifar_swag
from gpu_check_parts import Size, digest
from gpu_check_runner import Context

VARIANTS = {
    "eager": (False, False),
    "graphs": (False, True),
    "compiled": (True, False),
    "compiled_graphs": (True, True),
}


def _tensors(obj: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every floating-point tensor in ``obj`` with its path, dicts in key order."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            yield path, obj
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            yield from _tensors(obj[k], f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{path}[{i}]")


def max_abs_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest absolute difference between the float tensors both states hold."""
    theirs = dict(_tensors(b))
    found = 0.0
    for path, t in _tensors(a):
        other = theirs.get(path)
        if other is not None and other.shape == t.shape:
            diff = (t.double() - other.double()).abs().max().item() if t.numel() else 0.0
            found = max(found, diff)
    return found


def _run(device: torch.device, size: Size, precision: str, compile: bool, graphs: bool):
    """The run's posterior state (on the CPU), its SWAG test NLL and its seconds."""
    started = time.perf_counter()
    state, found, y = cifar_swag(device, size, precision, compile=compile, cuda_graphs=graphs)
    y = y.to(found.log_probs.device)
    nll = torch.nn.functional.nll_loss(found.log_probs.double(), y).item()
    return state, nll, time.perf_counter() - started


def step_variants(ctx: Context) -> dict[str, Any]:
    """Each variant's bytes and its distance from eager, beside bf16's own distance from
    fp32 (the yardstick); reported after each run."""
    size, device = Size.of(ctx), torch.device(ctx.device)
    # bf16 as the CIFAR presets train on a GPU; fp32 on the CPU, where the pinned AVX2
    # kernels make bf16 convolutions ten times slower (a smoke run there)
    precision = "bf16" if device.type == "cuda" else "fp32"
    out: dict[str, Any] = {
        "what": f"PreResNet-20, {precision}, crop + flip, {size.cifar_train} random "
        f"CIFAR-shaped images, batch {size.cifar_batch}, the swag trajectory 2 epochs, "
        "swag evaluated with 3 samples (BN recomputed)",
        "variants": {},
    }
    compiles = device.type == "cuda" or not ctx.quick
    eager, eager_nll, seconds = _run(device, size, precision, False, False)
    if compiles:  # the yardstick of the compiled variants
        other = "fp32" if precision == "bf16" else "bf16"
        yardstick, other_nll, other_seconds = _run(device, size, other, False, False)
        gap = max_abs_diff(eager, yardstick)
        out["bf16_vs_fp32"] = {
            "max_abs_diff": gap,
            "nll_diff": abs(eager_nll - other_nll),
            "seconds": round(other_seconds, 2),
        }
    else:
        out["bf16_vs_fp32"] = {"skipped": "no compiled variant to judge (--quick on the CPU)"}
    out["variants"]["eager"] = {
        "sha256": digest(eager),
        "swag_nll": round(eager_nll, 6),
        "seconds": round(seconds, 2),
    }
    ctx.report(out)
    for name, (compile, graphs) in VARIANTS.items():
        if name == "eager":
            continue
        if compile and not compiles:
            out["variants"][name] = {"skipped": "compiling on the CPU takes minutes"}
            continue
        state, nll, seconds = _run(device, size, precision, compile, graphs)
        found = {
            "sha256": digest(state),
            "bitwise_equal_to_eager": digest(state) == out["variants"]["eager"]["sha256"],
            "max_abs_diff": max_abs_diff(state, eager),
            "swag_nll": round(nll, 6),
            "nll_diff": abs(nll - eager_nll),
            "seconds": round(seconds, 2),
        }
        if compile:
            found["within_bf16_gap"] = found["max_abs_diff"] <= gap
        if compile and graphs and "sha256" in out["variants"].get("compiled", {}):
            found["bitwise_equal_to_compiled"] = (
                found["sha256"] == out["variants"]["compiled"]["sha256"]
            )
        out["variants"][name] = found
        ctx.report(out)
    ran = {k: v for k, v in out["variants"].items() if "skipped" not in v and k != "eager"}
    out["graphs_bitwise_equal"] = ran.get("graphs", {}).get("bitwise_equal_to_eager")
    out["ok"] = bool(out["graphs_bitwise_equal"]) and all(
        v.get("within_bf16_gap", True) and v.get("bitwise_equal_to_compiled", True)
        for v in ran.values()
    )
    return out
