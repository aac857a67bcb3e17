"""Mean-field Gaussian VI (Bayes by Backprop) over any module's flat parameters.

q(w) = N(mu, diag softplus(rho)^2) over the same ``parameters_to_vector``
order as SWAG; the network stays a plain ``nn.Module`` and is evaluated at a
sampled vector with ``torch.func.functional_call``, so no special layers
are needed (ALGORITHMS §3). The KL to N(0, prior_sigma^2 I) is closed form
and summed over all weights, not averaged per layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call

from ..training.flat import params_vector


def inverse_softplus(sigma: float) -> float:
    """rho with softplus(rho) = sigma, stable for small sigma."""
    return sigma + math.log(-math.expm1(-sigma))


def softplus_inverse(sigma: torch.Tensor) -> torch.Tensor:
    """Elementwise rho with softplus(rho) = sigma (sigma > 0)."""
    return sigma + torch.log(-torch.expm1(-sigma))


def gaussian_kl(mu: torch.Tensor, sigma: torch.Tensor, prior_sigma: float) -> torch.Tensor:
    """KL(N(mu, sigma^2) || N(0, prior_sigma^2)), summed over all coordinates."""
    ratio = (sigma / prior_sigma) ** 2
    return 0.5 * (ratio + (mu / prior_sigma) ** 2 - 1 - torch.log(ratio)).sum()


class MeanFieldVI(nn.Module):
    """Variational parameters (mu, rho) for ``model``; ``forward`` runs the model at theta."""

    def __init__(self, model: nn.Module, sigma_init: float = 1e-3, prior_sigma: float = 1.0):
        super().__init__()
        if sigma_init <= 0 or prior_sigma <= 0:
            raise ValueError("sigma_init and prior_sigma must be > 0")
        self.net = model
        self.prior_sigma = prior_sigma
        self._shapes = [(name, p.shape) for name, p in model.named_parameters()]
        self._sizes = [math.prod(shape) for _, shape in self._shapes]
        mu = params_vector(model.parameters()).detach().clone()
        self.mu = nn.Parameter(mu)
        self.rho = nn.Parameter(torch.full_like(mu, inverse_softplus(sigma_init)))
        for p in model.parameters():
            p.requires_grad_(False)

    @property
    def sigma(self) -> torch.Tensor:
        return nn.functional.softplus(self.rho)

    def kl(self) -> torch.Tensor:
        return gaussian_kl(self.mu, self.sigma, self.prior_sigma)

    def theta(self, eps: torch.Tensor) -> torch.Tensor:
        """The reparameterised sample mu + sigma * eps (differentiable in mu, rho)."""
        return self.mu + self.sigma * eps

    def forward(
        self, x: torch.Tensor, theta: torch.Tensor | None = None, frozen_stats: bool = False
    ) -> torch.Tensor:
        """Logits at ``theta`` (default: the mean mu, used for validation curves).

        ``frozen_stats``: the pass updates copies of the network's buffers, so
        its BatchNorm running statistics stay as they were (SAM's second pass).
        Copies, not a restore afterwards: batch norm's backward keeps the
        running statistics it was given, and an in-place restore before
        ``backward()`` would invalidate them.
        """
        vec = self.mu if theta is None else theta
        # One split, not a slice per tensor: the backward of a slice writes its gradient
        # into a zero vector of the full length, one per parameter tensor (O(tensors * d)
        # memory traffic per step); split's backward concatenates them once.
        pieces = torch.split(vec, self._sizes)
        params = {
            name: piece.view(shape)
            for (name, shape), piece in zip(self._shapes, pieces, strict=True)
        }
        if frozen_stats:
            params.update({name: b.clone() for name, b in self.net.named_buffers()})
        return functional_call(self.net, params, (x,))


Likelihood = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def svi_step(
    n_train: int,
    kl_weight: float = 1.0,
    mc_samples: int = 1,
    sam_rho: float = 0.0,
    likelihood: Likelihood = nn.functional.cross_entropy,
):
    """A training-loop step for ``MeanFieldVI``: the negative ELBO per data point.

    loss = mean over ``mc_samples`` draws of NLL(f(x; mu + sigma eps), y)
    + kl_weight * KL / n_train, one eps per minibatch and draw; NLL is the
    mean negative log-likelihood per point, ``likelihood(output, y)``
    (cross-entropy for classification). With ``sam_rho`` > 0 (F-VI) the NLL
    is taken at theta + e, where e is the SAM ascent direction at the
    sampled theta, detached, computed with the same eps, the same dropout
    mask and BatchNorm statistics left untouched.
    """
    from ..training.sam import finite_or_zero, replayed_rng
    from ..training.steps import PLAIN, StepContext

    def step(vi: MeanFieldVI, x: torch.Tensor, y: torch.Tensor, ctx: StepContext = PLAIN) -> tuple:
        nll = torch.zeros((), device=x.device)
        for _ in range(mc_samples):
            theta = vi.theta(ctx.randn(vi.mu))
            if sam_rho > 0:
                with replayed_rng(x.device) as rewind:
                    probe = theta.detach().requires_grad_(True)
                    with ctx.autocast():
                        probe_nll = likelihood(vi(x, probe).float(), y)
                    (grad,) = ctx.grad(probe_nll, [probe])
                    norm = torch.linalg.vector_norm(grad)
                    e = sam_rho * grad / (norm + 1e-12)
                    if ctx.scaler is not None:
                        (e,) = finite_or_zero([e], norm)
                    rewind()
                    with ctx.autocast():
                        logits = vi(x, theta + e, frozen_stats=True)
            else:
                with ctx.autocast():
                    logits = vi(x, theta)
            nll = nll + likelihood(logits.float(), y)
        loss = nll / mc_samples + kl_weight * vi.kl() / n_train
        ctx.backward(loss)
        return loss.detach(), logits.detach()

    return step
