"""The ``determinism`` part of ``scripts/gpu_check.py``: the same short run twice in one
process on the device, and the bytes of both compared (sha256)."""

from __future__ import annotations

import time
from typing import Any

import torch
from gpu_check_parts import Size, cifar_setup, digest, short_run, what
from gpu_check_runner import Context

from bayesavg.evaluation.evaluate import Evaluation, evaluate
from bayesavg.trajectories import compute_for, finetune, initial_network


def cifar_swag(
    device: torch.device, size: Size, precision: str, **options: bool
) -> tuple[dict[str, Any], Evaluation, torch.Tensor]:
    """determinism's second configuration, the CIFAR presets' kind: PreResNet-20 (BN),
    ``precision``, channels-last, crop + flip on the device, the swag trajectory 2 epochs,
    SWAG with BN recomputed per sample (3). ``options``: params to set (``compile``,
    ``cuda_graphs``). The posterior's state (without ``extra``), the test evaluation and
    the test labels."""
    n = size.cifar_train
    p, data = cifar_setup(n, size.cifar_batch, 2, size.cifar_batch, precision, augment=True)
    p = p.model_copy(update=options)
    compute = compute_for(p, device)
    result = finetune(p, "swag", data, initial_network(p, data), device, compute=compute)
    assert result is not None
    post = result.posterior
    test = {"test": (post.model_input(data.test.x, device), data.test.y)}
    bn_x = post.model_input(data.train.x, device)
    found = evaluate(
        post,
        "swag",
        test,
        n_samples=3,
        scale=0.5,
        bn_x=bn_x,
        seed=0,
        device=device,
        precision=compute.precision,
    )["test"]
    state = {k: v for k, v in post.to_dict().items() if k != "extra"}
    return state, found, data.test.y


def _cifar_run(device: torch.device, size: Size, precision: str) -> dict[str, Any]:
    state, found, _ = cifar_swag(device, size, precision)
    return {"posterior": digest(state), "swag_log_probs": digest(found.log_probs)}


def determinism(ctx: Context) -> dict[str, Any]:
    """Two runs, one after the other in this process, fresh models, seeded as the stages
    seed (``seed_everything``: deterministic kernels on CUDA): are their bytes equal?
    In one process this proves the kernels and the library's use of random streams
    deterministic; that a run in another process gives the same bytes (no dependence
    on hash seeds, allocator addresses, autotuning) is ``other_process``: bf16_vs_fp32's
    fp32 run is the same run in that part's process."""
    size, device = Size.of(ctx), torch.device(ctx.device)
    out: dict[str, Any] = {}
    runs = [short_run(ctx.device, "fp32", size) for _ in range(2)]
    other = ctx.earlier().get("bf16_vs_fp32", {})
    other = (other.get("runs") or other.get("partial", {}).get("runs") or {}).get("fp32", {})
    theirs = other.get("sha256")
    out["mnist5k_lenet5_fp32"] = {
        "what": f"the default params' configuration: {what(size)}",
        "sha256": [r["sha256"] for r in runs],
        "bitwise_equal": runs[0]["sha256"] == runs[1]["sha256"],
        "seconds": [r["seconds"] for r in runs],
        "other_process": {
            "run": "bf16_vs_fp32.runs.fp32",
            "bitwise_equal": None if theirs is None else theirs == runs[0]["sha256"],
        },
    }
    ctx.report(out)
    started = time.perf_counter()
    # bf16 as the CIFAR presets train on a GPU; fp32 on the CPU, where the pinned AVX2
    # kernels make bf16 convolutions ten times slower (a smoke run there)
    precision = "bf16" if device.type == "cuda" else "fp32"
    cifar = [_cifar_run(device, size, precision) for _ in range(2)]
    out["cifar_preresnet20"] = {
        "what": f"PreResNet-20, {precision}, channels-last on CUDA, crop + flip, "
        f"{size.cifar_train} random CIFAR-shaped images, batch {size.cifar_batch}, the swag "
        "trajectory 2 epochs, swag evaluated with 3 samples (BN recomputed)",
        "precision": precision,
        "sha256": cifar,
        "bitwise_equal": cifar[0] == cifar[1],
        "seconds": round(time.perf_counter() - started, 2),
    }
    out["bitwise_equal"] = all(v["bitwise_equal"] for v in out.values())
    return out
