"""The operators a CUDA run with deterministic algorithms refuses, found on the CPU.

Every CUDA run here turns deterministic algorithms on (``seeding.deterministic_kernels``),
and torch then raises "... does not have a deterministic implementation" at the first
call of an operator whose CUDA kernel has no deterministic variant: on the GPU only, after
the stage has started. The CPU dispatches the same aten operators (autograd's backward
formulas and the composite operators' decompositions do not depend on the device), so
``Recorder`` notes each such call while CPU code runs, with where in the project it was
made, and a test fails before any GPU sees it.

``REFUSED`` is torch's own list (the docstring of ``torch.use_deterministic_algorithms``,
the operations that "throw a RuntimeError"), by aten operator; ``test_cuda_determinism``
checks that every entry of the installed torch's list is mapped here, so a torch that adds
one fails until it is. Where the list names a condition (``bincount`` with weights,
``median`` with indices, ``scatter_reduce``'s product, ``EmbeddingBag`` in max mode) it is
checked on the call's arguments. ``NLLLoss`` is mapped to ``nll_loss2d_forward``: CUDA's
one-dimensional ``nll_loss_forward`` has a deterministic kernel (CUDA training with
cross-entropy ran deterministically on the H100, ``benchmarks/gpu/``); the spatial one
accumulates with atomics.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _always(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return True


def _argument(index: int, name: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    return lambda args, kwargs: kwargs.get(name, args[index] if len(args) > index else None)


_weights = _argument(1, "weights")
_reduce = _argument(4, "reduce")
_mode = _argument(7, "mode")

# The docstring's entry (its first reference) -> {aten operator: condition on its call}.
REFUSED: dict[str, dict[str, Callable[[tuple[Any, ...], dict[str, Any]], bool]]] = {
    "torch.nn.AvgPool3d": {"avg_pool3d_backward": _always},
    "torch.nn.AdaptiveAvgPool2d": {"_adaptive_avg_pool2d_backward": _always},
    "torch.nn.AdaptiveAvgPool3d": {"_adaptive_avg_pool3d_backward": _always},
    "torch.nn.AdaptiveMaxPool2d": {"adaptive_max_pool2d_backward": _always},
    "torch.nn.FractionalMaxPool2d": {"fractional_max_pool2d_backward": _always},
    "torch.nn.FractionalMaxPool3d": {"fractional_max_pool3d_backward": _always},
    "torch.nn.MaxUnpool1d": {"max_unpool2d": _always},  # 1-d unpooling is the 2-d operator
    "torch.nn.MaxUnpool2d": {"max_unpool2d": _always},
    "torch.nn.MaxUnpool3d": {"max_unpool3d": _always},
    "torch.nn.functional.interpolate": {
        name: _always
        for name in (
            "upsample_linear1d_backward",
            "upsample_bilinear2d_backward",
            "upsample_bicubic2d_backward",
            "upsample_trilinear3d_backward",
            "_upsample_bilinear2d_aa_backward",
            "_upsample_bicubic2d_aa_backward",
        )
    },
    "torch.nn.ReflectionPad1d": {"reflection_pad1d_backward": _always},
    "torch.nn.ReflectionPad2d": {"reflection_pad2d_backward": _always},
    "torch.nn.ReflectionPad3d": {"reflection_pad3d_backward": _always},
    "torch.nn.NLLLoss": {"nll_loss2d_forward": _always},
    "torch.nn.CTCLoss": {"_ctc_loss_backward": _always},
    "torch.nn.EmbeddingBag": {
        "_embedding_bag_dense_backward": lambda a, k: _mode(a, k) == 2,  # mode "max"
    },
    "torch.Tensor.put_": {"put_": _always, "put": _always},  # both accumulate modes on CUDA
    "torch.histc": {"histc": _always},
    "torch.bincount": {"bincount": lambda a, k: _weights(a, k) is not None},
    "torch.median": {"median.dim": _always, "nanmedian.dim": _always},  # with indices
    "torch.nn.functional.grid_sample": {
        "grid_sampler_2d_backward": _always,
        "grid_sampler_3d_backward": _always,
    },
    "torch.Tensor.scatter_reduce": {"scatter_reduce.two": lambda a, k: _reduce(a, k) == "prod"},
    "torch.Tensor.resize_": {},  # quantized tensors only: none here
}

# aten operator (``name`` or ``name.overload``) -> the conditions under which CUDA refuses it
_BY_OPERATOR: dict[str, list[Callable[[tuple[Any, ...], dict[str, Any]], bool]]] = {}
for _ops in REFUSED.values():
    for _name, _condition in _ops.items():
        _BY_OPERATOR.setdefault(_name, []).append(_condition)


def documented_entries(doc: str | None = None) -> list[str]:
    """The first reference of each entry torch's docstring lists as raising."""
    doc = doc if doc is not None else torch.use_deterministic_algorithms.__doc__ or ""
    start = doc.index("will throw a\n    :class:`RuntimeError` when ``mode=True``")
    section = doc[start : doc.index("In addition, several", start)]
    return re.findall(r"^\s+\* :\w+:`([\w.]+)`", section, re.MULTILINE)


def refused(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The aten operator's name if CUDA refuses this call under deterministic algorithms."""
    packet = func.overloadpacket.__name__
    for name in (packet, f"{packet}.{func._overloadname}"):
        if any(condition(args, kwargs) for condition in _BY_OPERATOR.get(name, ())):
            return name
    return None


def project_frame(roots: tuple[str, ...]) -> str:
    """``file:line`` of the innermost frame of the call stack inside ``roots`` (this
    module's own left out)."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith(roots) and frame.filename != __file__:
            return f"{frame.filename}:{frame.lineno}"
    return "(outside the project)"


class Recorder(TorchDispatchMode):
    """While active, every call CUDA would refuse: (operator, innermost frame in ``roots``)."""

    def __init__(self, roots: tuple[str, ...] = ("",)) -> None:
        super().__init__()
        self.roots = roots
        self.calls: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = refused(func, args, kwargs)
        if name is not None:
            self.calls.append((name, project_frame(self.roots)))
        return func(*args, **kwargs)
