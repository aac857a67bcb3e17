"""Elementwise functions whose CPU results are the same bytes on every x86-64 CPU.

``torch.sqrt`` on the CPU calls MKL's vector square root (``vsSqrt``/``vdSqrt``, within
one ulp), whose last bit depends on the code path MKL picks for the CPU, even with
``MKL_CBWR`` pinned, in float32 and float64 alike: this machine's AMD CPU and emulated
Intel and AMD CPUs gave three different results (``tests/test_numerics.py``). The other
elementwise functions the project uses (exp, log, log1p, softplus, tanh, sigmoid, erf,
log-softmax, logsumexp, reciprocal, rsqrt, division) agreed everywhere, as did the
training loop's arithmetic.
"""

from __future__ import annotations

import numpy as np
import torch


def sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root (IEEE 754's, as the hardware instruction gives).

    For a float32 tensor on the CPU it is the float64 square root rounded to float32:
    the square root of a float32 lies at least four float64 ulps away from any
    float32 rounding boundary, so a float64 result within one ulp (MKL's) rounds to
    the exact answer whatever its last bit. A float64 tensor on the CPU has no wider
    type to round from: NumPy's square root (the hardware instruction) computes it,
    without autograd. Other dtypes and devices: ``torch.sqrt`` (CUDA's is correctly
    rounded).
    """
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return x.sqrt()
    if x.dtype == torch.float32:
        return x.double().sqrt().float()
    if x.requires_grad:
        raise ValueError("ieee.sqrt of a float64 CPU tensor is not differentiable: detach it")
    values = x.numpy()
    return torch.from_numpy(np.sqrt(values, out=np.empty_like(values)))
