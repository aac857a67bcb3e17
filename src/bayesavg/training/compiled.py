"""``compile: true``: the training step's forward and backward through ``torch.compile``.

The step calls a compiled view of the trained module (``torch.compile`` of it, sharing
its parameters and buffers); monitoring, BatchNorm recomputation, checkpoints and
posterior files use the plain module, so everything saved is as in eager mode. On CUDA
inductor writes Triton kernels, on the CPU C++ (gcc). ``torch._dynamo`` is imported
only here, when asked: it costs about 1.2 s of start-up (``optim``).

Every batch shape compiles before training, in ``CompiledStep.warm_up``: the step runs
once on each shape an epoch has (the full batch and a shorter last one), then every
tensor it touched (parameters, buffers, the shared generator, torch's RNG streams) is
put back bitwise. The run that follows is then the same whether or not it was warmed
up (rerun, resume), and the time it took is the compilation time, reported apart from
training (``compile_seconds``). Random draws inside the step (dropout) come from torch's
generator as in eager mode (inductor's ``fallback_random``), so a compiled run differs
from an eager one by the order of float sums only. Shapes are static (``dynamic=False``): kernels
specialised to the batch are the fast ones, and an epoch has at most two.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..seeding import rng_state, set_rng_state
from .batches import Tensors, TrainData, shard

if TYPE_CHECKING:
    from .steps import Step, StepContext

log = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor]


class CompiledStep:
    """The compiled view of ``module`` that steps call, and the shapes it has compiled."""

    def __init__(self, module: nn.Module) -> None:
        import torch._dynamo  # only a compiled run pays for it
        import torch._inductor.config

        # Dropout masks from torch's own generator, as in eager mode, not inductor's
        # Philox stream: the same masks for the same seed, compiled or not.
        torch._inductor.config.fallback_random = True
        self.module = module
        self.view: nn.Module = torch.compile(module, dynamic=False)  # type: ignore[assignment]
        self.warmed: set[object] = set()
        self.seconds = 0.0

    def warm_up(
        self,
        run: Callable[[nn.Module, torch.Tensor, torch.Tensor], object],
        batches: Sequence[Batch],
        key: object,
        shared: torch.Generator | None = None,
    ) -> float:
        """Compile ``run(view, x, y)`` (one step) on each of ``batches`` unless ``key``
        (what fixes their shapes: the same on every rank, so that ranks run the same
        collectives) was warmed up before; leave the module, its gradients and every RNG
        stream as they were. Returns the seconds it took."""
        if key in self.warmed or not batches:
            return 0.0
        started = time.perf_counter()
        device = batches[0][0].device
        tensors = [*self.module.parameters(), *self.module.buffers()]
        saved = [t.detach().clone() for t in tensors]
        grads = [p.grad for p in self.module.parameters()]
        streams = rng_state(device)
        shared_state = shared.get_state() if shared is not None else None
        try:
            for x, y in batches:
                run(self.view, x, y)
            self.warmed.add(key)
        finally:
            with torch.no_grad():
                torch._foreach_copy_(tensors, saved)
            for p, g in zip(self.module.parameters(), grads, strict=True):
                p.grad = g
            set_rng_state(streams, device)
            if shared is not None:
                shared.set_state(shared_state)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
        self.seconds += seconds
        shapes = sorted({tuple(x.shape) for x, _ in batches})
        log.info("compiled the training step for batches of %s in %.1f s", shapes, seconds)
        return seconds

    def warm_up_epoch(
        self, step: Step, data: Tensors | TrainData, batch_size: int, iters: int, ctx: StepContext
    ) -> float:
        """Compile ``step`` for an epoch's batch shapes: the full batch and the last one
        (this rank's shares of them), on the first examples, not augmented. Nothing is
        gathered once they are compiled (every later epoch)."""
        n = len(data)
        if (n, batch_size) in self.warmed:
            return 0.0
        device = data.y.device
        sizes = dict.fromkeys([min(batch_size, n), n - (iters - 1) * batch_size])
        batches, weights = [], []
        for size in sizes:
            idx = torch.arange(size, device=device)
            local = shard(idx, ctx.world)
            batches.append(data.batch(local))
            weights.append(local.shape[0] / size)
        turns = iter(weights)

        def run(view: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
            ctx.weight = next(turns)
            step(view, x, y, ctx)

        return self.warm_up(run, batches, (n, batch_size), ctx.shared)
