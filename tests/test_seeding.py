"""seed_everything: the streams torch.manual_seed would give, without its cost."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pytest
import torch

from bayesavg.runtime.errors import UserError
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


@pytest.mark.parametrize("name", ["auto", "cuda"])
def test_choosing_a_cuda_device_turns_on_deterministic_kernels(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every stage (evaluate and landscape too, which train nothing) and ``bayesavg
    evaluate`` resolve their device first: on CUDA that must ask for deterministic kernels
    and cuBLAS's fixed workspace, and leave torch's NaN fill of ``torch.empty`` off."""
    from bayesavg.seeding import resolve_device

    asked: list[bool] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda on, **_: asked.append(on))
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    fill = torch.utils.deterministic.fill_uninitialized_memory
    conv = torch.backends.cudnn.conv.fp32_precision
    try:
        assert resolve_device(name).type == "cuda"
        assert asked == [True]
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.utils.deterministic.fill_uninitialized_memory is False
        assert torch.backends.cudnn.conv.fp32_precision == "ieee"  # fp32, not TF32
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
        torch.backends.cudnn.conv.fp32_precision = conv
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto").type == "cpu" and asked == [True]  # the CPU: untouched


def test_deterministic_false_asks_cuda_for_its_fastest_kernels_for_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``deterministic: false`` is a process's choice: the device's resolution sets it, and
    every later seeding (``seed_everything`` calls ``deterministic_kernels``) keeps it;
    fp32 stays IEEE. The default gives deterministic kernels back."""
    from bayesavg import seeding

    asked: list[bool] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda on, **_: asked.append(on))
    monkeypatch.setitem(seeding._KERNELS, "deterministic", True)
    saved = (
        torch.utils.deterministic.fill_uninitialized_memory,
        torch.backends.cudnn.conv.fp32_precision,
        torch.backends.cudnn.benchmark,
    )
    try:
        assert seeding.resolve_device("cuda", deterministic=False).type == "cuda"
        assert asked == [False] and torch.backends.cudnn.benchmark is True
        assert torch.backends.cudnn.conv.fp32_precision == "ieee"
        seeding.deterministic_kernels(torch.device("cuda"))  # what seed_everything does
        assert asked == [False, False] and torch.backends.cudnn.benchmark is True
        seeding.resolve_device("cuda")
        assert asked == [False, False, True] and torch.backends.cudnn.benchmark is False
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = saved[0]
        torch.backends.cudnn.conv.fp32_precision = saved[1]
        torch.backends.cudnn.benchmark = saved[2]


def test_the_device_model_names_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint's key holds it: ``device: auto`` made on the CPU must not resume on a
    GPU (its RNG state has no CUDA stream), nor one from an H100 on another GPU model."""
    from bayesavg.seeding import device_model

    assert device_model(torch.device("cpu")) == "cpu"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: f"GPU of {d}")
    assert device_model(torch.device("cuda", 1)) == "GPU of cuda:1"


def test_an_indexed_gpu_must_exist_and_becomes_the_current_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``cuda:N`` past the GPUs there are is one line, not torch's "invalid device
    ordinal" traceback at the first kernel; one that exists is made the current device,
    so what takes the current one (new streams, a graph's capture) is on it."""
    from bayesavg.seeding import resolve_device

    current: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda on, **_: None)
    fill = torch.utils.deterministic.fill_uninitialized_memory
    conv = torch.backends.cudnn.conv.fp32_precision
    try:
        with pytest.raises(UserError, match=r"^device: cuda:2 was asked for but this machine "):
            resolve_device("cuda:2")
        assert current == []
        assert resolve_device("cuda:1") == torch.device("cuda", 1)
        assert current == [torch.device("cuda", 1)]
        resolve_device("cuda")  # no index: the current device stays as it is
        assert current == [torch.device("cuda", 1)]
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
        torch.backends.cudnn.conv.fp32_precision = conv


@pytest.mark.parametrize(
    ("device", "env", "expected"),
    [
        ("cuda", {}, "cuda"),  # no launcher: as asked
        ("cuda", {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, "cuda:1"),
        ("cuda:1", {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, "cuda:1"),
        ("cuda:1", {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, "names one GPU, but the 2"),
        ("cuda", {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "3"}, "has no GPU of its own"),
        ("cpu", {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, "cpu"),
    ],
)
def test_each_process_of_a_node_gets_its_own_gpu(
    device: str, env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bayesavg.training.distributed import local_device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if ":" in expected or expected in ("cuda", "cpu"):
        assert local_device(torch.device(device)) == torch.device(expected)
    else:
        with pytest.raises(UserError, match=expected):
            local_device(torch.device(device))
