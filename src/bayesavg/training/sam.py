"""Sharpness-aware gradients (ALGORITHMS §5) as a step for the training loop.

One SAM step: gradient at theta, move to theta + e with e = r g / ||g||
(global norm), take the gradient there, come back. The second pass must
see the same model: BatchNorm running statistics are restored after it and
the RNG state is replayed, so dropout draws the same mask.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from .batchnorm import bn_modules
from .steps import PLAIN, Step, StepContext

LossFn = Callable[[], tuple[torch.Tensor, torch.Tensor]]


@contextlib.contextmanager
def frozen_bn_stats(model: nn.Module) -> Iterator[None]:
    """Run a forward pass without changing any BatchNorm running statistic (restored
    with one ``_foreach_copy_``, not three copies per layer)."""
    buffers = [
        t for m in bn_modules(model) for t in (m.running_mean, m.running_var, m.num_batches_tracked)
    ]
    saved = [t.clone() for t in buffers]
    try:
        yield
    finally:
        if buffers:
            with torch.no_grad():
                torch._foreach_copy_(buffers, saved)


@contextlib.contextmanager
def replayed_rng(device: torch.device) -> Iterator[Callable[[], None]]:
    """Yield a function that rewinds torch's RNG (CPU and ``device``) to entry state."""
    cpu_state = torch.get_rng_state()
    cuda = device.type == "cuda"
    cuda_state = torch.cuda.get_rng_state(device) if cuda else None

    def rewind() -> None:
        torch.set_rng_state(cpu_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state, device)

    yield rewind


def finite_or_zero(eps: list[torch.Tensor], norm: torch.Tensor) -> list[torch.Tensor]:
    """``eps``, or zeros where the gradient it came from overflowed (``norm`` not finite).

    Under fp16's loss scaler the first pass's scaled gradient overflows now and
    then; an ascent of inf or NaN would stay in the weights (theta + e - e is NaN)
    although the scaler skips the update. With e = 0 the second pass runs at theta,
    its gradient overflows too, and the scaler skips the step and lowers its scale,
    as for a plain step. ``torch.where``: no host synchronisation.
    """
    finite = torch.isfinite(norm)
    return [torch.where(finite, e, torch.zeros_like(e)) for e in eps]


def sam_gradient(
    params: list[torch.Tensor],
    loss_fn: LossFn,
    rho: float,
    model: nn.Module,
    ctx: StepContext = PLAIN,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill ``.grad`` of ``params`` with the SAM gradient; return (loss, logits) at theta.

    ``loss_fn`` computes (loss, logits) with the current parameter values;
    it is called twice, the second time with the same RNG stream and with
    BatchNorm statistics left untouched. Under data parallelism the ascent
    uses the gradient averaged over ranks (``ctx.grad``), so every rank
    perturbs to the same point, as one process with the whole batch would.
    """
    device = params[0].device
    with replayed_rng(device) as rewind:
        with ctx.autocast():
            loss, logits = loss_fn()
        grads = ctx.grad(loss, params)
        # torch._foreach_*: one call over all tensors (a fused kernel on CUDA) instead of a
        # Python loop launching one per parameter; elementwise, so the same bytes.
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        scale = rho / (norm + 1e-12)
        eps = list(torch._foreach_mul(grads, scale))
        if ctx.scaler is not None:
            eps = finite_or_zero(eps, norm)
        with torch.no_grad():
            torch._foreach_add_(params, eps)
        rewind()
        with frozen_bn_stats(model):
            with ctx.autocast():
                perturbed_loss, _ = loss_fn()
            ctx.backward(perturbed_loss)
        with torch.no_grad():
            torch._foreach_sub_(params, eps)
    return loss.detach(), logits.detach()


def sam_step(rho: float) -> Step:
    """A training-loop step (see ``steps.Step``) using the SAM gradient of cross-entropy."""

    def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ctx: StepContext = PLAIN) -> tuple:
        def loss_fn() -> tuple[torch.Tensor, torch.Tensor]:
            logits = model(x)
            return nn.functional.cross_entropy(logits.float(), y), logits

        params = [p for p in model.parameters() if p.requires_grad]
        return sam_gradient(params, loss_fn, rho, model, ctx)

    return step
