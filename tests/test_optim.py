"""bayesavg.training.optim: bitwise the steps of torch.optim, without importing torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from bayesavg.training.optim import SGD, Adam


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def _train(net: nn.Module, opt: object, steps: int, lrs: list[float]) -> None:
    gen = torch.Generator().manual_seed(1)
    for i in range(steps):
        x = torch.randn(8, 6, generator=gen)
        y = torch.randint(0, 3, (8,), generator=gen)
        for group in opt.param_groups:  # type: ignore[attr-defined]
            group["lr"] = lrs[i % len(lrs)]
        opt.zero_grad(set_to_none=True)  # type: ignore[attr-defined]
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()  # type: ignore[attr-defined]


CASES = [
    (
        lambda p: SGD(p, momentum=0.9, weight_decay=5e-4),
        lambda p: torch.optim.SGD(p, lr=0.0, momentum=0.9, weight_decay=5e-4),
    ),
    (lambda p: SGD(p), lambda p: torch.optim.SGD(p, lr=0.0)),
    (
        lambda p: Adam(p, weight_decay=1e-3),
        lambda p: torch.optim.Adam(p, lr=0.0, weight_decay=1e-3, fused=True),
    ),
]


@pytest.mark.parametrize(("ours", "theirs"), CASES)
def test_steps_are_bitwise_torch_optim(ours: object, theirs: object) -> None:
    a, b = _net(), _net()
    lrs = [0.05, 0.01, 0.003]
    _train(a, ours(list(a.parameters())), 25, lrs)  # type: ignore[operator]
    _train(b, theirs(list(b.parameters())), 25, lrs)  # type: ignore[operator]
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("make", [lambda p: SGD(p, momentum=0.9), lambda p: Adam(p)])
def test_state_dict_round_trip_continues_exactly(make: object) -> None:
    """Stop after 10 steps, save, load into a fresh optimizer, go on: same as 20 straight."""
    straight, resumed = _net(), _net()
    _train(straight, make(list(straight.parameters())), 20, [0.01])  # type: ignore[operator]
    first = make(list(resumed.parameters()))  # type: ignore[operator]
    _train(resumed, first, 10, [0.01])
    state = first.state_dict()
    assert set(state["state"]) == set(range(4))
    second = make(list(resumed.parameters()))  # type: ignore[operator]
    second.load_state_dict(state)
    gen = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(20)
    ]
    for x, y in batches[10:]:  # the data of steps 11..20 of the straight run
        second.zero_grad()
        nn.functional.cross_entropy(resumed(x), y).backward()
        second.step()
    for p, q in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(p, q)


def test_parameters_without_gradients_are_left_alone() -> None:
    a, b = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3))
    opt = SGD([a, b], lr=0.1, momentum=0.9)
    a.grad = torch.ones(3)
    opt.step()
    assert torch.equal(b, torch.ones(3)) and b not in opt.state


def test_no_dynamo_import() -> None:
    """The point of the module: a training step imports neither dynamo nor sympy."""
    code = (
        "import sys, torch\n"
        "from bayesavg.training.optim import SGD, Adam\n"
        "p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.ones(3)\n"
        "for o in (SGD([p], lr=0.1, momentum=0.9), Adam([p])):\n"
        "    o.step(); o.state_dict(); o.zero_grad()\n"
        "assert 'torch._dynamo' not in sys.modules and 'sympy' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
