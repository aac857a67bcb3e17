"""Sharpness measures against brute force on a model whose Hessian is known."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.func import functional_call, hessian

from bayesavg.evaluation.sharpness import hessian_trace, sam_sharpness


def _setup() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    return model, torch.randn(20, 3, dtype=torch.float64), torch.randint(0, 2, (20,))


def _full_hessian(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    names = [n for n, _ in model.named_parameters()]
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    shapes = [p.shape for p in model.parameters()]

    def loss(vec: torch.Tensor) -> torch.Tensor:
        params, offset = {}, 0
        for name, shape in zip(names, shapes, strict=True):
            n = shape.numel()
            params[name] = vec[offset : offset + n].view(shape)
            offset += n
        return nn.functional.cross_entropy(functional_call(model, params, (x,)), y)

    return hessian(loss)(flat)


def test_hutchinson_converges_to_the_exact_trace() -> None:
    model, x, y = _setup()
    exact = torch.trace(_full_hessian(model, x, y)).item()
    gen = torch.Generator().manual_seed(0)
    estimate = hessian_trace(model, x, y, probes=400, generator=gen, batch_size=7).mean().item()
    # Rademacher variance: 2 * sum_{i != j} H_ij^2; allow 5 standard errors.
    h = _full_hessian(model, x, y)
    stderr = (2 * ((h**2).sum() - (h.diag() ** 2).sum()) / 400).sqrt().item()
    assert abs(estimate - exact) < 5 * stderr + 1e-9


def _sam_by_hand(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rho: float) -> float:
    """L(w + rho g / |g|) - L(w) on the whole batch, the model in the mode it is in."""
    loss = nn.functional.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    norm = torch.sqrt(sum((g**2).sum() for g in grads))
    with torch.no_grad():
        for p, g in zip(model.parameters(), grads, strict=True):
            p.add_(rho * g / norm)
        expected = (nn.functional.cross_entropy(model(x), y) - loss).item()
        for p, g in zip(model.parameters(), grads, strict=True):
            p.sub_(rho * g / norm)
    return expected


def test_sam_sharpness_matches_the_definition_and_restores_weights() -> None:
    model, x, y = _setup()
    before = [p.detach().clone() for p in model.parameters()]
    got = sam_sharpness(model, x, y, rho=0.1, batch_size=6)
    expected = _sam_by_hand(model, x, y, 0.1)
    assert abs(got - expected) < 1e-10
    assert got > 0
    assert all(torch.allclose(a, b) for a, b in zip(before, model.parameters(), strict=True))


class _SavedBytes:
    """The bytes autograd holds for backward at any moment, and their peak: every saved
    tensor is packed into a box whose release (its graph freed) is counted."""

    def __init__(self) -> None:
        self.alive = 0
        self.peak = 0

    def pack(self, t: torch.Tensor) -> object:
        box = _Box(t)
        size = t.numel() * t.element_size()
        self.alive += size
        self.peak = max(self.peak, self.alive)
        weakref.finalize(box, self._release, size)
        return box

    def _release(self, size: int) -> None:
        self.alive -= size

    @staticmethod
    def unpack(box: object) -> torch.Tensor:
        assert isinstance(box, _Box)
        return box.tensor


class _Box:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _peak_saved(measure: Callable[[], float]) -> int:
    saved = _SavedBytes()
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        measure()
    gc.collect()
    return saved.peak


@pytest.mark.parametrize("name", ["sam", "hessian"])
def test_memory_holds_one_batch_s_graph_not_every_point_s(name: str) -> None:
    """n_points at 224 x 224 held at once (80 GiB for a ResNet-50) was an out-of-memory
    error on a GPU: ten batches must cost what one does, not ten times it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 10))
    x, y = torch.randn(640, 32), torch.randint(0, 10, (640,))

    def run(n: int) -> Callable[[], float]:
        if name == "sam":
            return lambda: sam_sharpness(model, x[:n], y[:n], rho=0.05, batch_size=64)
        gen = torch.Generator().manual_seed(0)
        return lambda: hessian_trace(model, x[:n], y[:n], 2, gen, 64).mean().item()

    one, ten = _peak_saved(run(64)), _peak_saved(run(640))
    assert one > 0 and ten < 1.5 * one, (one, ten)


def test_batches_change_only_the_order_of_a_sum() -> None:
    """Batched, both measures are the unbatched ones up to rounding; a single batch is
    the whole set's arithmetic, bitwise."""
    model, x, y = _setup()
    whole = sam_sharpness(model, x, y, rho=0.1, batch_size=20)
    assert sam_sharpness(model, x, y, rho=0.1, batch_size=1000) == whole
    assert abs(sam_sharpness(model, x, y, rho=0.1, batch_size=3) - whole) < 1e-12

    def trace(batch_size: int) -> float:
        gen = torch.Generator().manual_seed(1)
        return hessian_trace(model, x, y, 5, gen, batch_size).mean().item()

    assert trace(1000) == trace(20)
    assert abs(trace(3) - trace(20)) < 1e-10 * abs(trace(20))


def test_each_probe_is_v_h_v_and_the_standard_error_is_their_spread() -> None:
    """Per probe, v^T H v with the full Hessian and the Rademacher v the generator gives
    (drawn per probe, per parameter); the evaluation's tr(H) is their mean and its
    standard error their standard deviation over sqrt(probes)."""
    model, x, y = _setup()
    h = _full_hessian(model, x, y)
    gen = torch.Generator().manual_seed(3)
    got = hessian_trace(model, x, y, probes=4, generator=gen, batch_size=7)
    draw = torch.Generator().manual_seed(3)
    expected = []
    for _ in range(4):
        v = torch.cat(
            [
                torch.randint(0, 2, p.shape, generator=draw).flatten() * 2 - 1
                for p in model.parameters()
            ]
        ).double()
        expected.append(v @ h @ v)
    torch.testing.assert_close(got, torch.stack(expected), rtol=1e-10, atol=1e-12)
    assert got.std().item() > 0, "the probes differ, so the estimate has an error"


def test_centre_sharpness_reports_the_trace_s_standard_error() -> None:
    """One centre: the SE over the probes; an ensemble's mean of m traces: the root sum
    of their squared SEs over m. With one probe there is none to give."""
    from bayesavg.evaluation import centre as ev

    model, x, y = _setup()

    def measured(members: int, probes: int) -> dict[str, float]:
        fake = _FakePosterior(model, members)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ev, "centres", lambda post, method: [(i, None) for i in range(members)])
            mp.setattr(ev, "center_model", lambda post, theta, *a: fake.member(theta))
            return ev.centre_sharpness(
                fake, "swa", x, y, bn_x=None, rho=0.1, probes=probes, seed=5, device="cpu"
            )

    gen = torch.Generator().manual_seed(5)
    one = hessian_trace(model, x, y, probes=6, generator=gen)
    found = measured(1, 6)
    assert found["hessian_trace"] == one.mean().item()
    assert found["hessian_trace_se"] == pytest.approx(one.std().item() / 6**0.5, rel=1e-12)
    gen = torch.Generator().manual_seed(5)
    first = hessian_trace(_FakePosterior(model, 2).member(0), x, y, 6, gen)
    second = hessian_trace(_FakePosterior(model, 2).member(1), x, y, 6, gen)
    ses = [t.std().item() / 6**0.5 for t in (first, second)]
    pair = measured(2, 6)
    assert pair["hessian_trace_se"] == pytest.approx((ses[0] ** 2 + ses[1] ** 2) ** 0.5 / 2)
    assert "hessian_trace_se" not in measured(1, 1)


class _FakePosterior:
    """Members: the model with its weights scaled by 1 + member / 2 (distinct Hessians)."""

    def __init__(self, model: nn.Module, members: int) -> None:
        self.model, self.members = model, members

    def member(self, index: int) -> nn.Module:
        import copy

        found = copy.deepcopy(self.model)
        with torch.no_grad():
            for p in found.parameters():
                p.mul_(1 + index / 2)
        return found


def _dropout_setup() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A model whose train-mode loss is random (dropout): in eval mode it is a fixed
    function of the weights, which both sharpness measures rely on."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Dropout(0.5), nn.Linear(6, 2)).double()
    return model, torch.randn(16, 3, dtype=torch.float64), torch.randint(0, 2, (16,))


def test_sam_sharpness_measures_the_eval_mode_loss() -> None:
    """The one-step SAM increase of the deterministic (eval-mode) loss, even when the
    model arrives in train mode."""
    model, x, y = _dropout_setup()
    expected = _sam_by_hand(model.eval(), x, y, 0.1)
    model.train()
    assert sam_sharpness(model, x, y, rho=0.1, batch_size=5) == pytest.approx(expected, abs=1e-10)


def test_hessian_trace_probes_the_eval_mode_hessian() -> None:
    """Each probe is v^T H v with H the eval-mode Hessian, even from a train-mode model."""
    model, x, y = _dropout_setup()
    h = _full_hessian(model.eval(), x, y)
    shapes = [p.shape for p in model.parameters()]
    model.train()
    got = hessian_trace(model, x, y, probes=3, generator=torch.Generator().manual_seed(4))
    draw = torch.Generator().manual_seed(4)
    for estimate in got:
        v = torch.cat(
            [torch.randint(0, 2, s, generator=draw).flatten() * 2 - 1 for s in shapes]
        ).double()
        assert float(estimate) == pytest.approx(float(v @ h @ v), rel=1e-9, abs=1e-12)
