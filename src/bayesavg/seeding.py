"""One seed in params; every random stream is derived from it by name.

Deriving by name (not by call order) keeps a stage's randomness unchanged
when another stage or client is added.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
from collections.abc import Iterator

import numpy as np
import torch

from .runtime.errors import UserError


def derive_seed(seed: int, *names: object) -> int:
    """A 63-bit seed determined by ``seed`` and the names (stage, client id, ...)."""
    text = "/".join([str(seed), *map(str, names)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def seed_everything(seed: int, device: torch.device | str = "cpu") -> None:
    """Seed python, numpy and torch; on CUDA, ask torch for deterministic kernels.

    The CPU kernels this project uses are deterministic for a given thread
    count already, and ``torch.use_deterministic_algorithms`` imports
    torch's compiler (``torch._inductor``, with dynamo and sympy: about 1 s
    per process) to set one flag there: it is asked for only where it matters.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    # torch.manual_seed seeds the same CPU and CUDA generators, and then every other
    # accelerator backend too, one of which records a stack trace each call: 0.35 ms,
    # a third of a DSWAG client's overhead (thousands of clients in the worker sweep)
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    deterministic_kernels(torch.device(device))


# The process's kernel choice on CUDA (params ``deterministic``), set where the device
# is resolved and kept by every later ``seed_everything``.
_KERNELS = {"deterministic": True}


def deterministic_kernels(device: torch.device, deterministic: bool | None = None) -> None:
    """On CUDA, deterministic kernels: a rerun on the same GPU model gives the same bytes.

    cuBLAS needs its workspace setting before its first call in the process, so this
    runs where the device is chosen (``resolve_device``), before any CUDA work. Torch
    would also fill every ``torch.empty`` with NaN in this mode, which costs a memory
    pass per allocation and matters only to code that reads memory it never wrote;
    nothing here does (outputs are always written before being read), so it is off.
    And fp32 means fp32: cuDNN runs float32 convolutions as TF32 (10-bit mantissa) by
    default on Ampere and newer, while matrix products stay IEEE; ``precision: bf16`` is
    the fast choice, and autocast is unaffected.

    ``deterministic=False`` (params ``deterministic: false``, for the process from here
    on): torch's determinism off and cuDNN's autotuner on (``cudnn.benchmark``), the
    kernels the SWAG reference code runs with: whatever is fastest, atomics included, so
    a rerun differs in the last bits. The CPU's kernels are deterministic either way.
    """
    if deterministic is not None:
        _KERNELS["deterministic"] = deterministic
    if device.type != "cuda":
        return
    on = _KERNELS["deterministic"]
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(on, warn_only=False)
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    torch.backends.cudnn.benchmark = not on
    torch.backends.cudnn.conv.fp32_precision = "ieee"  # type: ignore[attr-defined]


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def resolve_device(name: str, deterministic: bool = True) -> torch.device:
    """``auto`` picks CUDA when present; anything else is passed to torch. A CUDA device
    gets deterministic kernels from here on (``deterministic_kernels``; ``deterministic``
    false: the fastest ones): every stage and ``bayesavg evaluate`` resolve their device
    before any work, training or not."""
    try:
        device = torch.device(
            ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name
        )
    except RuntimeError:
        raise UserError(f"device: {name!r} is not one of auto, cpu, cuda, cuda:N") from None
    if device.type not in ("cpu", "cuda"):  # torch names more (mps, xpu, meta): not run here
        raise UserError(f"device: {name!r} is not one of auto, cpu, cuda, cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"device: {name} was asked for but no CUDA GPU is available; use auto or cpu"
        )
    if device.type == "cuda" and device.index is not None:
        count = torch.cuda.device_count()
        if device.index >= count:
            raise UserError(
                f"device: {name} was asked for but this machine has {count} CUDA "
                f"GPU{'s' if count > 1 else ''} (cuda:0 to cuda:{count - 1})"
            )
        # the current device too: what takes the current one (new streams, a CUDA graph's
        # capture stream, caching-allocator calls) works on the GPU asked for, not cuda:0
        torch.cuda.set_device(device)
    deterministic_kernels(device, deterministic)
    return device


def device_model(device: torch.device) -> str:
    """``cpu``, or the CUDA GPU's model: CUDA bytes repeat only on the same model, and a
    checkpoint's key holds this so that a run resumes only where it was made."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """torch's global streams a training run draws from (CPU, and ``device`` if CUDA).

    Dropout masks, VI's epsilon and SGLD's noise come from these; python's
    and numpy's streams are seeded but never drawn from during training.
    """
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda":
        if "cuda" not in state:
            raise ValueError("the saved RNG state has no CUDA stream; it was saved on the CPU")
        torch.cuda.set_rng_state(state["cuda"], device)


@contextlib.contextmanager
def isolated_rng(seed: int, device: torch.device | str = "cpu") -> Iterator[None]:
    """Run with torch's global stream (CPU and ``device``) seeded, then restore it.

    For randomness torch draws only from the global stream (dropout masks),
    without disturbing whoever seeded it outside. Exactly the streams it restores are
    seeded: ``torch.manual_seed`` would also reseed every other GPU for good, and on a
    machine whose CUDA is not initialised it queues a lazy seed with a formatted stack
    trace each call (0.15 ms, once per evaluated sample).
    """
    device = torch.device(device)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        torch.default_generator.manual_seed(seed)
        if device.type == "cuda":  # fork_rng has initialised CUDA: seeded now, not queued
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        yield
