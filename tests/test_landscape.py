"""Loss-landscape probes against brute force and known answers."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from bayesavg.analyses.landscape import (
    Probe,
    evaluate_at,
    filter_normalise,
    flat_parameters,
    line,
    principal_directions,
    random_directions,
    ray,
    ray_width,
    train_loss_at,
    unit,
    width,
)
from bayesavg.posteriors import SWAG


def _net(batch_norm: bool = False) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(5, 8)]
    if batch_norm:
        layers.append(nn.BatchNorm1d(8))
    layers += [nn.ReLU(), nn.Linear(8, 3)]
    return nn.Sequential(*layers)


def _probe(weight_decay: float = 0.0, batch_norm: bool = False) -> Probe:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 5, generator=g), torch.randint(0, 3, (64,), generator=g)
    tx, ty = torch.randn(40, 5, generator=g), torch.randint(0, 3, (40,), generator=g)
    return Probe(
        x, y, tx, ty, bn_x=x if batch_norm else None, weight_decay=weight_decay, batch_size=16
    )


def _brute(net: nn.Module, theta: torch.Tensor, probe: Probe) -> dict[str, float]:
    """The same metrics the slow way: a fresh copy, full-batch statistics, one pass."""
    torch.nn.utils.vector_to_parameters(theta, net.parameters())
    with torch.no_grad():
        if probe.bn_x is not None:
            net.train()
            for m in net.modules():
                if isinstance(m, nn.BatchNorm1d):
                    m.reset_running_stats()
                    m.momentum = None  # cumulative average over the one full batch
            net(probe.bn_x)
        net.eval()
        train = net(probe.train_x).double()
        test = net(probe.test_x).double()
    return {
        "train_loss": nn.functional.cross_entropy(train, probe.train_y).item(),
        "train_error": (train.argmax(1) != probe.train_y).double().mean().item(),
        "test_error": (test.argmax(1) != probe.test_y).double().mean().item(),
        "test_nll": nn.functional.cross_entropy(test, probe.test_y).item(),
        "weight_decay_term": 0.5 * probe.weight_decay * theta.double().square().sum().item(),
    }


@pytest.mark.parametrize("batch_norm", [False, True])
def test_line_endpoints_are_the_centres_own_evaluation(batch_norm: bool) -> None:
    net, probe = _net(batch_norm), _probe(5e-4, batch_norm)
    a = flat_parameters(net).clone()
    b = a + 0.1 * torch.randn(a.shape, generator=torch.Generator().manual_seed(2))
    rows = line(net, a, b, [-1.0, 0.0, 0.5, 1.0, 2.0], probe)
    assert [r["t"] for r in rows] == [-1.0, 0.0, 0.5, 1.0, 2.0]
    assert rows[1] == {"t": 0.0, **evaluate_at(net, a, probe)}
    assert rows[3] == {"t": 1.0, **evaluate_at(net, b, probe)}
    for row, theta in ((rows[1], a), (rows[3], b), (rows[2], (a + b) / 2)):
        brute = _brute(_net(batch_norm), theta, probe)
        for key, value in brute.items():
            assert row[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert rows[4]["weight_decay_term"] == pytest.approx(
        0.5 * 5e-4 * float((2 * b.double() - a.double()).square().sum()), rel=1e-6
    )


def test_directions_are_seeded_unit_and_the_same_for_every_centre() -> None:
    d = random_directions(100, 3, seed=7)
    assert torch.equal(d, random_directions(100, 3, seed=7))
    assert not torch.equal(d, random_directions(100, 3, seed=8))
    for row in d:
        assert torch.linalg.vector_norm(unit(row)).item() == pytest.approx(1.0, abs=1e-12)
    net, probe = _net(), _probe()
    w0 = flat_parameters(net)
    e = random_directions(w0.numel(), 1, seed=7)[0]
    rows = ray(net, w0, e, [0.0, 0.5], probe)
    moved = w0.double() + 0.5 * unit(e)
    assert rows[1] == {"distance": 0.5, **evaluate_at(net, moved.float(), probe)}


def test_filter_normalisation_gives_each_row_its_norm_in_w0() -> None:
    net = _net(batch_norm=True)
    w0 = flat_parameters(net).double() * 3
    d = filter_normalise(random_directions(w0.numel(), 1, seed=3)[0], w0, net)
    offset = 0
    for p in net.parameters():
        n = p.numel()
        part, ref = d[offset : offset + n], w0[offset : offset + n]
        if p.dim() > 1:
            got = torch.linalg.vector_norm(part.reshape(p.shape[0], -1), dim=1)
            want = torch.linalg.vector_norm(ref.reshape(p.shape[0], -1), dim=1)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
        else:
            assert torch.equal(part, torch.zeros_like(part)), "1-D parameters stay at zero"
        offset += n


@pytest.mark.parametrize(("a", "delta"), [(2.0, 0.1), (0.5, 0.3), (10.0, 0.01)])
def test_width_on_a_quadratic_is_sqrt_two_delta_over_a(a: float, delta: float) -> None:
    """On L(theta) = a/2 |theta|^2 along a unit direction, L(s) = a s^2 / 2 exceeds L(0) + delta
    at s = sqrt(2 delta / a)."""
    theta0 = torch.zeros(4, dtype=torch.float64)
    u = unit(random_directions(4, 1, seed=0)[0])

    def loss_at(s: float) -> float:
        return 0.5 * a * float((theta0 + s * u).square().sum())

    grid = [0.05 * i for i in range(0, 41)]
    assert width(loss_at, delta, grid) == pytest.approx(math.sqrt(2 * delta / a), rel=1e-3)
    assert width(loss_at, 1e6, grid) is None


def test_principal_directions_are_the_deviations_svd() -> None:
    g = torch.Generator().manual_seed(4)
    basis = torch.linalg.qr(torch.randn(30, 2, generator=g, dtype=torch.float64))[0].T
    swag = SWAG(30, max_rank=20)
    coeffs = torch.randn(20, 2, generator=g, dtype=torch.float64) * torch.tensor([3.0, 0.5])
    for c in coeffs:
        swag.collect((c @ basis).float())
    dirs, std = principal_directions(swag.state_dict(), 2)
    assert dirs.shape == (2, 30) and std.shape == (2,)
    torch.testing.assert_close(dirs @ dirs.T, torch.eye(2, dtype=torch.float64), atol=1e-10, rtol=0)
    # The directions span the plane the snapshots were drawn in, the first the wider one.
    assert torch.linalg.vector_norm(dirs @ basis.T, dim=1).min().item() > 1 - 1e-5
    assert abs((dirs[0] @ basis[0]).item()) > 0.99
    assert std[0] > 3 * std[1] > 0
    with pytest.raises(ValueError, match="at least 2 deviations"):
        principal_directions({"deviations": torch.zeros(1, 30)}, 1)


@pytest.mark.parametrize("batch_norm", [False, True])
def test_ray_width_reuses_the_grid_and_equals_the_direct_bisection(batch_norm: bool) -> None:
    net, probe = _net(batch_norm), _probe(batch_norm=batch_norm)
    w0 = flat_parameters(net).clone()
    d = random_directions(w0.numel(), 1, seed=4)[0]
    grid = [0.0, 1.0, 2.0, 4.0, 8.0]
    rows = ray(net, w0, d, grid, probe)
    for row in rows:
        moved = (w0.double() + row["distance"] * unit(d)).float()
        assert train_loss_at(net, moved, probe) == row["train_loss"]

    def direct(s: float) -> float:
        return evaluate_at(net, (w0.double() + s * unit(d)).float(), probe)["train_loss"]

    delta = 0.5 * (rows[-1]["train_loss"] - rows[0]["train_loss"])
    assert delta > 0
    found = ray_width(net, w0, d, rows, delta, probe)
    assert found == pytest.approx(width(direct, delta, grid, tolerance=1e-3), rel=1e-9)
    assert direct(found) == pytest.approx(rows[0]["train_loss"] + delta, abs=1e-2)
    assert ray_width(net, w0, d, rows, 1e9, probe) is None
