"""The kernels each timed variant of ``gpu_check --speed`` runs with (``_modes``)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from gpu_check_measure import TORCH_DEFAULT_CONV_FP32, _modes

conv = torch.backends.cudnn.conv


def test_the_reference_runs_torch_s_default_convolutions_after_ours_pinned_them() -> None:
    """Our stages' seeding pins IEEE float32 convolutions for the whole process; the
    reference code, timed after, runs as its scripts do: TF32, autotuned, nondeterministic."""
    before = (conv.fp32_precision, torch.are_deterministic_algorithms_enabled())
    try:
        conv.fp32_precision = "ieee"  # what seeding.deterministic_kernels leaves on CUDA
        with _modes("reference_swag_code", False):
            assert conv.fp32_precision == TORCH_DEFAULT_CONV_FP32 == "tf32"
            assert torch.backends.cudnn.benchmark
            assert not torch.are_deterministic_algorithms_enabled()
        assert conv.fp32_precision == "ieee"
        with _modes("graphs", True):
            assert conv.fp32_precision == "ieee"
            assert not torch.backends.cudnn.benchmark
            assert torch.are_deterministic_algorithms_enabled()
        assert conv.fp32_precision == "ieee"
    finally:
        conv.fp32_precision = before[0]
        torch.use_deterministic_algorithms(before[1])
