"""Mixed precision in one place: autocast around forward and loss, fp32 master weights.

``fp32`` runs as before (no autocast at all, so the bytes are today's).
``bf16`` autocasts matrix products and convolutions to bfloat16 on CUDA or
CPU; ``fp16`` autocasts to float16 on CUDA only, with a gradient scaler
(float16 gradients underflow without one). Parameters, optimizer state and
posterior moments stay float32/float64 whatever the precision, and every
metric (NLL, ECE) is computed from logits cast to float32 or wider.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..runtime.errors import UserError

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    """A precision on a device type (``cpu`` or ``cuda``)."""

    name: str = "fp32"
    device_type: str = "cpu"

    def __post_init__(self) -> None:
        if self.name not in PRECISIONS:
            raise UserError(f"precision: {self.name!r} is not one of {', '.join(PRECISIONS)}")
        if self.name == "fp16" and self.device_type != "cuda":
            raise UserError("precision: fp16 needs a CUDA device; use bf16 or fp32 on the CPU")

    @property
    def mixed(self) -> bool:
        return self.name != "fp32"

    @property
    def scaled(self) -> bool:
        """Whether gradients need a loss scaler (float16 only)."""
        return self.name == "fp16"

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Forward and loss in the lower precision; a no-op for fp32."""
        if not self.mixed:
            yield
            return
        with torch.autocast(self.device_type, dtype=_DTYPES[self.name]):
            yield

    def scaler(self) -> torch.amp.GradScaler | None:
        """A fresh gradient scaler for fp16, else None."""
        return torch.amp.GradScaler(self.device_type) if self.scaled else None


def precision_for(name: str, device: torch.device | str) -> Precision:
    return Precision(name, torch.device(device).type)
