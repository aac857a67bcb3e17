"""Elementwise functions whose CPU results are the same bytes on every x86-64 CPU.

``torch.sqrt`` on the CPU calls MKL's vector square root (``vsSqrt``, within
one ulp), whose last bit depends on the code path MKL picks for the CPU, even
with ``MKL_CBWR`` pinned: this machine's AMD CPU and emulated Intel and AMD
CPUs gave three different results (``tests/test_numerics.py``). The other
elementwise functions the project uses (exp, log, log1p, softplus, tanh,
log-softmax) agreed everywhere, as did the training loop's arithmetic.
"""

from __future__ import annotations

import torch


def sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root (IEEE 754's, as the hardware instruction gives).

    For a float32 tensor on the CPU it is the float64 square root rounded to float32:
    the square root of a float32 lies at least four float64 ulps away from any
    float32 rounding boundary, so a float64 result within one ulp (MKL's) rounds to
    the exact answer whatever its last bit. Other dtypes and devices: ``torch.sqrt``
    (CUDA's is correctly rounded).
    """
    if x.dtype != torch.float32 or x.device.type != "cpu":
        return x.sqrt()
    return x.double().sqrt().float()
