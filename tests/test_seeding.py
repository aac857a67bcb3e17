"""seed_everything: the streams torch.manual_seed would give, without its cost."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from bayesavg.seeding import seed_everything


def _draws() -> tuple[Any, ...]:
    return (torch.rand(5), torch.randn(3, 2), torch.randperm(9), random.random(), np.random.rand())


def test_seed_everything_gives_torch_manual_seeds_streams() -> None:
    """It seeds the CPU generator (and CUDA's, where there is one) directly: the draws
    after it are the ones after torch.manual_seed, for torch, numpy and python."""
    for seed in (0, 7, 2**40 + 3):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        expected = _draws()
        torch.manual_seed(seed + 1)  # a different state in between
        seed_everything(seed)
        got = _draws()
        for a, b in zip(expected[:3], got[:3], strict=True):
            assert torch.equal(a, b)
        assert expected[3:] == got[3:]
