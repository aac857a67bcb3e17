"""SGD and Adam for the training loop, stepping with torch's own update functions.

``torch.optim.Optimizer`` imports ``torch._dynamo`` the first time a param
group is added (with sympy and parts of inductor: about 1.2 s per process,
most of a training stage's start-up), to mark its methods as not
compilable. Nothing here is compiled, so only the bookkeeping is written
here: param groups (``lr`` set per iteration by the training loop, as with
``torch.optim``), per-parameter state and ``state_dict`` for checkpoints.
The arithmetic is torch's public functional API (``torch.optim.sgd.sgd``,
``torch.optim.adam.adam``), so every step is bitwise the one ``torch.optim.SGD`` /
``torch.optim.Adam(fused=True)`` take (tests/test_optim.py); on CUDA, SGD is
``torch.optim.SGD(fused=True)`` at the rate rounded to float32 (``fused_sgd``).
``bayesavg.trajectories.sgld.SGLD`` builds on the same base.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable
from typing import Any

import torch
from torch.optim.adam import adam
from torch.optim.sgd import sgd


class Optimizer:
    """One param group (a dict with ``params`` and the hyperparameters, ``lr`` among
    them) and a state dict per parameter, in ``torch.optim``'s ``state_dict`` format."""

    def __init__(self, params: Iterable[torch.Tensor], **defaults: Any) -> None:
        params = list(params)
        if not params:
            raise ValueError("the optimizer got no parameters")
        self.param_groups: list[dict[str, Any]] = [{"params": params, **defaults}]
        self.state: dict[torch.Tensor, dict[str, Any]] = {}

    @property
    def params(self) -> list[torch.Tensor]:
        return self.param_groups[0]["params"]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Parameters by index, as ``torch.optim.Optimizer.state_dict`` has them."""
        index = {id(p): i for i, p in enumerate(self.params)}
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        return {
            "state": {index[id(p)]: dict(s) for p, s in self.state.items()},
            "param_groups": [{**group, "params": list(range(len(self.params)))}],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        (group,) = state["param_groups"]
        if len(group["params"]) != len(self.params):
            raise ValueError(
                f"the saved state has {len(group['params'])} parameters, "
                f"this optimizer {len(self.params)}"
            )
        self.param_groups[0].update({k: v for k, v in group.items() if k != "params"})
        self.state = {
            p: {k: _placed(v, p) for k, v in s.items()}
            for i, p in enumerate(self.params)
            if (s := state["state"].get(i)) is not None
        }

    def _with_grads(self) -> list[torch.Tensor]:
        return [p for p in self.params if p.grad is not None]


def _placed(value: Any, param: torch.Tensor) -> Any:
    """A loaded state value on its parameter's device and, shaped like it (momentum, Adam's
    moments), in its memory layout: torch's fused kernels refuse buffers whose strides
    differ from the parameter's, as a checkpoint written without ``channels_last`` and
    resumed with it would give."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.shape == param.shape and value.dtype == param.dtype:
        return torch.empty_like(param).copy_(value)
    return value.to(param.device)


class SGD(Optimizer):
    """``torch.optim.SGD``'s step (momentum, weight decay, no dampening or Nesterov)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 0.0,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        params = self._with_grads()
        buffers = [self.state.get(p, {}).get("momentum_buffer") for p in params]
        lr = group["lr"]
        tensor_rate = isinstance(lr, torch.Tensor)
        some_new = any(b is None for b in buffers) and not all(b is None for b in buffers)
        fused = fused_sgd(params)
        # on CUDA a float rate is rounded as the captured step's float32 tensor is, also
        # where some buffers are new (torch's default step): plain = captured, bitwise
        rate = float32(lr) if fused and not tensor_rate else lr
        if fused and not some_new:
            step = functools.partial(sgd, fused=True)
        else:
            step = _sgd_at_tensor_rate if tensor_rate else sgd
        step(
            params,
            [p.grad for p in params],
            buffers,
            weight_decay=group["weight_decay"],
            momentum=group["momentum"],
            lr=rate,
            dampening=0.0,
            nesterov=False,
            maximize=False,
        )
        if group["momentum"]:
            for p, buf in zip(params, buffers, strict=True):
                self.state.setdefault(p, {})["momentum_buffer"] = buf


def fused_sgd(params: list[torch.Tensor]) -> bool:
    """Whether SGD steps ``params`` with torch's fused kernel: on CUDA.

    One multi-tensor launch for every parameter's update, where torch's default
    (foreach) launches several and the tensor-rate step of a captured graph one per
    parameter and operation: PreResNet-164's 494 tensors made about 2,000 tiny kernels a
    step. The fused kernel reads a tensor rate as float32 (``lr.data_ptr<float>()``), so
    the plain step passes the float32 rate too (``float32``): a captured step and a plain
    one take the same update, bitwise. The CPU keeps torch's default: its bytes are the
    pipeline's committed ones.
    """
    return bool(params) and params[0].is_cuda


def float32(rate: float) -> float:
    """``rate`` rounded to float32, as the fused CUDA kernel reads a tensor rate."""
    return struct.unpack("f", struct.pack("f", rate))[0]


def _sgd_at_tensor_rate(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    buffers: list[torch.Tensor | None],
    *,
    weight_decay: float,
    momentum: float,
    lr: torch.Tensor,
    **_: object,
) -> None:
    """``torch.optim.sgd.sgd``'s arithmetic at a rate held in a float64 device tensor
    (a CUDA-graph step; torch's own converts it to a Python number, a host sync).

    ``p.addcmul_(d, lr, value=-1)`` is bitwise ``p.add_(d, alpha=-lr)``; weight decay
    and momentum are torch's own operations, so the bytes are those of ``sgd``
    (tests/test_graphs.py). ``buffers`` gets each new momentum buffer, as ``sgd``.
    """
    if weight_decay:
        grads = [g.add(p, alpha=weight_decay) for g, p in zip(grads, params, strict=True)]
    if momentum:
        for i, g in enumerate(grads):
            buf = buffers[i]
            if buf is None:
                buffers[i] = g.detach().clone()
            else:
                buf.mul_(momentum).add_(g)
        grads = [b for b in buffers if b is not None]
    for p, d in zip(params, grads, strict=True):
        p.addcmul_(d, lr, value=-1)


class Adam(Optimizer):
    """``torch.optim.Adam(fused=True)``'s step (no AMSGrad), with L2 ``weight_decay``.

    Fused: its kernel takes the square root with the hardware instruction, the
    same bytes on every CPU; torch's default (foreach or per-tensor) step calls
    MKL's vector square root, whose last bit depends on the CPU (``bayesavg.training.ieee``).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        params = self._with_grads()
        for p in params:
            if p not in self.state:
                self.state[p] = {
                    "step": torch.tensor(0.0, dtype=torch.float32, device=p.device),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }
        states = [self.state[p] for p in params]
        beta1, beta2 = group["betas"]
        adam(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
            fused=True,
        )


def build(
    name: str, params: Iterable[torch.Tensor], *, momentum: float = 0.0, weight_decay: float = 0.0
) -> Optimizer:
    """The training loop's optimizer by name, ``sgd`` or ``adam``; the loop sets ``lr``."""
    if name == "sgd":
        return SGD(params, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return Adam(params, lr=0.0, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; choose sgd or adam")
