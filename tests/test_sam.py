"""SAM step against a hand-written two-pass computation (ALGORITHMS §5)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from bayesavg.training.sam import sam_step


def _model(dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(dropout), nn.Linear(8, 3)
    )


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(16, 5, generator=gen), torch.randint(0, 3, (16,), generator=gen)


def _manual_sam(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rho: float, seed: int):
    """The definition written out: grad at theta, e = rho g/||g||, grad at theta+e."""
    params = list(model.parameters())
    torch.manual_seed(seed)
    loss = nn.functional.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, params)
    norm = torch.sqrt(sum((g**2).sum() for g in grads))
    bn_state = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    with torch.no_grad():
        for p, g in zip(params, grads, strict=True):
            p.add_(rho * g / norm)
    torch.manual_seed(seed)
    perturbed = nn.functional.cross_entropy(model(x), y)
    sam_grads = torch.autograd.grad(perturbed, params)
    with torch.no_grad():
        for p, g in zip(params, grads, strict=True):
            p.sub_(rho * g / norm)
    return loss, sam_grads, bn_state


def test_sam_gradient_matches_two_pass_definition() -> None:
    x, y = _data()
    for dropout in (0.0, 0.5):
        model = _model(dropout).train()
        reference = copy.deepcopy(model)
        theta = [p.detach().clone() for p in model.parameters()]
        torch.manual_seed(7)
        loss, _ = sam_step(0.05)(model, x, y)
        ref_loss, ref_grads, bn_after_first = _manual_sam(reference, x, y, 0.05, seed=7)
        assert torch.allclose(loss, ref_loss)
        for p, g in zip(model.parameters(), ref_grads, strict=True):
            assert torch.allclose(p.grad, g, atol=1e-6)
        for p, t in zip(model.parameters(), theta, strict=True):
            assert torch.allclose(p, t, atol=1e-7)
        # BN statistics are those of the first pass only.
        for key, value in bn_after_first.items():
            assert torch.equal(model.state_dict()[key], value)


def test_second_pass_leaves_bn_buffers_as_a_plain_step() -> None:
    x, y = _data()
    sam_model, plain = _model().train(), _model().train()
    sam_step(0.1)(sam_model, x, y)
    nn.functional.cross_entropy(plain(x), y).backward()
    for (name, a), (_, b) in zip(sam_model.named_buffers(), plain.named_buffers(), strict=True):
        assert torch.equal(a, b), name


def test_same_dropout_mask_in_both_passes() -> None:
    """With rho -> 0 the SAM gradient equals the plain gradient under the same mask."""
    x, y = _data()
    model, plain = _model(0.5).train(), _model(0.5).train()
    torch.manual_seed(3)
    sam_step(1e-9)(model, x, y)
    torch.manual_seed(3)
    nn.functional.cross_entropy(plain(x), y).backward()
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-5)


def test_an_overflowing_fp16_gradient_gives_no_ascent_and_a_skipped_step() -> None:
    """fp16 under a loss scaler: the first pass's scaled gradient overflows now and then.
    The ascent must then be zero (theta + inf - inf would leave NaN in the weights, which
    the scaler's skipped update does not undo), and the step is skipped as usual."""
    from bayesavg.training.optim import SGD
    from bayesavg.training.steps import StepContext

    model = _model()
    x, y = _data()
    x = x * 1e3  # gradients of order 10-100: scaled by 2^127 they overflow float32
    before = [p.detach().clone() for p in model.parameters()]
    ctx = StepContext()
    ctx.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)
    sam_step(0.05)(model, x, y, ctx)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert not all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    optimizer = SGD(model.parameters(), lr=0.1)
    ctx.scaler.step(optimizer)
    ctx.scaler.update()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert ctx.scaler.get_scale() < 2.0**127
    ctx.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)  # and a finite one trains
    sam_step(0.05)(model, x, y, ctx)
    ctx.scaler.step(optimizer)
    assert not all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_the_ascent_unscales_on_the_device_without_reading_the_scale() -> None:
    """SAM's ascent direction under fp16's scaler is the unscaled gradient, bitwise,
    with the scale never read on the host (``get_scale()``: a sync every step)."""
    from bayesavg.training.steps import StepContext

    model = _model()
    x, y = _data()
    params = list(model.parameters())
    want = torch.autograd.grad(nn.functional.cross_entropy(model(x), y), params)
    ctx = StepContext()
    ctx.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)

    def read_on_host() -> float:
        raise AssertionError("the scale was read on the host")

    ctx.scaler.get_scale = read_on_host  # type: ignore[method-assign]
    got = ctx.grad(nn.functional.cross_entropy(model(x), y), params)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
