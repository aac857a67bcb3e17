"""Temperature scaling (Guo et al. 2017): one scalar T fitted on the validation split.

``p_T ∝ p^(1/T)``: dividing a predictive's log-probabilities by T and renormalising
is dividing a network's logits by T, since log-softmax only shifts them. The NLL
of ``softmax(z / T)`` is convex in 1/T (a log-sum-exp minus a linear term), so a
golden-section search on log T within a bracket finds the minimum to float64
precision, deterministically; LBFGS on a scalar buys nothing and can stop early.
"""

from __future__ import annotations

import math

import torch

# The bracket of the search: a temperature outside it means a broken predictive, not
# a miscalibrated one, and is refused rather than extrapolated.
T_MIN, T_MAX = 0.05, 20.0
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def apply_temperature(log_probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probabilities of ``p^(1/T)`` renormalised (rows are points, columns classes)."""
    return torch.log_softmax(log_probs / temperature, dim=-1)


def tempered_nll(log_probs: torch.Tensor, y: torch.Tensor, temperature: float) -> float:
    """Mean NLL of the labels under the tempered predictive, in float64."""
    scaled = apply_temperature(log_probs.double(), temperature)
    return float(-scaled.gather(1, y.long()[:, None]).mean())


def fit_temperature(log_probs: torch.Tensor, y: torch.Tensor, tol: float = 1e-6) -> float:
    """The T in [``T_MIN``, ``T_MAX``] minimising the NLL of ``y`` under
    ``apply_temperature(log_probs, T)``, to ``tol`` in log T.

    Raises ValueError for empty or non-finite inputs, and when the minimum lies on the
    bracket's edge (the predictive is degenerate: constant, or always right with
    growing confidence).
    """
    if log_probs.ndim != 2 or log_probs.shape[0] == 0 or log_probs.shape[0] != y.shape[0]:
        raise ValueError(f"log_probs {tuple(log_probs.shape)} and labels {tuple(y.shape)}")
    if not bool(torch.isfinite(log_probs).all()):
        raise ValueError("log_probs are not all finite")
    x = log_probs.detach().double().cpu()
    labels = y.detach().cpu()

    def loss(log_t: float) -> float:
        return tempered_nll(x, labels, math.exp(log_t))

    lo, hi = math.log(T_MIN), math.log(T_MAX)
    a, b = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
    fa, fb = loss(a), loss(b)
    while hi - lo > tol:
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - _GOLDEN * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + _GOLDEN * (hi - lo)
            fb = loss(b)
    log_t = (lo + hi) / 2.0
    if log_t - math.log(T_MIN) < 10 * tol or math.log(T_MAX) - log_t < 10 * tol:
        raise ValueError(
            f"the fitted temperature {math.exp(log_t):.3g} is at the edge of "
            f"[{T_MIN:g}, {T_MAX:g}]: the predictive is degenerate"
        )
    return math.exp(log_t)
