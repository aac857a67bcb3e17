"""The loss plane: exact snapshot reconstruction, PCA geometry, losses checked directly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bayesavg.analyses.plane import grid_axes, loss_plane, pca_plane, snapshots
from bayesavg.data.prepared import to_input
from bayesavg.models import build_model
from bayesavg.posteriors import HWA, SWAG, MomentCollector
from bayesavg.posteriors.file import load_posterior, load_theta
from bayesavg.runtime.errors import UserError


def _collected(n: int, max_rank: int, d: int = 50, dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(n * 100 + max_rank)
    vectors = torch.randn(n, d, generator=gen) + 3.0
    collector = MomentCollector(d, max_rank, dtype=dtype)
    for v in vectors:
        collector.collect(v)
    return collector, vectors.double()


@pytest.mark.parametrize(("n", "max_rank"), [(1, 5), (4, 5), (5, 5), (13, 5), (40, 7)])
def test_snapshots_are_the_last_k_collected_vectors(n: int, max_rank: int) -> None:
    collector, vectors = _collected(n, max_rank)
    rebuilt = snapshots(collector.state_dict())
    k = min(n, max_rank)
    assert rebuilt.dtype == torch.float64 and rebuilt.shape == (k, vectors.shape[1])
    # Deviations are float32 (relative error ~6e-8 of values ~3); the recursion adds little.
    torch.testing.assert_close(rebuilt, vectors[n - k :], rtol=0, atol=2e-6)


def test_snapshots_exact_with_float64_deviations() -> None:
    collector, vectors = _collected(30, 6, dtype=torch.float64)
    torch.testing.assert_close(snapshots(collector.state_dict()), vectors[-6:], rtol=0, atol=1e-12)


def test_snapshots_of_an_hwa_mu_collector() -> None:
    gen = torch.Generator().manual_seed(1)
    mus = torch.randn(9, 20, generator=gen)
    hwa = HWA(20, max_rank=4)
    for mu in mus:
        hwa.collect(mu, torch.full((20,), -3.0))
    rebuilt = snapshots(hwa.state_dict()["mu"])
    torch.testing.assert_close(rebuilt, mus[-4:].double(), rtol=0, atol=1e-6)


def _orthonormal(d: int, m: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, m, generator=gen, dtype=torch.float64))
    return q.T


def test_pca_recovers_a_plane_the_snapshots_lie_on() -> None:
    d = 40
    v = _orthonormal(d, 2, 0)
    gen = torch.Generator().manual_seed(2)
    coeff = torch.randn(7, 2, generator=gen, dtype=torch.float64) * torch.tensor([3.0, 1.0])
    origin = torch.randn(d, generator=gen, dtype=torch.float64)
    snaps = origin + coeff @ v
    centre = snaps.mean(0)  # the average lies on the same plane
    plane = pca_plane(snaps, centre)
    torch.testing.assert_close(plane.basis @ plane.basis.T, torch.eye(2, dtype=torch.float64))
    # Same plane: the true directions are reproduced by the basis.
    torch.testing.assert_close(
        torch.linalg.matrix_norm(v @ plane.basis.T), torch.tensor(2.0**0.5, dtype=torch.float64)
    )
    coords, dist = plane.project(snaps)
    torch.testing.assert_close(centre + coords @ plane.basis, snaps)
    assert float(dist.max()) < 1e-10
    assert plane.explained[0] > plane.explained[1] > 0
    assert sum(plane.explained) == pytest.approx(1.0)
    for row in plane.basis:
        assert row[row.abs().argmax()] > 0


def test_pca_matches_brute_force_covariance_eigenvectors() -> None:
    gen = torch.Generator().manual_seed(3)
    scales = torch.tensor([5.0, 2.0, 1.0, 0.5, 0.2], dtype=torch.float64)
    snaps = (torch.randn(12, 5, generator=gen, dtype=torch.float64) * scales) @ _orthonormal(
        30, 5, 4
    )
    plane = pca_plane(snaps, snaps[-1])
    centred = snaps - snaps.mean(0)
    evals, evecs = torch.linalg.eigh(centred.T @ centred)
    top = evecs[:, [-1, -2]].T
    torch.testing.assert_close((plane.basis * top).sum(1).abs(), torch.ones(2, dtype=torch.float64))
    expected = (evals[[-1, -2]] / evals.sum()).tolist()
    assert plane.explained == pytest.approx(expected, rel=1e-9)
    coords, dist = plane.project(snaps[0])
    residual = snaps[0] - plane.centre - coords[0] @ plane.basis
    assert float(dist[0]) == pytest.approx(float(residual.norm()), rel=1e-12)
    torch.testing.assert_close(residual @ plane.basis.T, torch.zeros(2, dtype=torch.float64))


def test_pca_needs_three_distinct_snapshots() -> None:
    with pytest.raises(UserError, match="needs at least 3 snapshots"):
        pca_plane(torch.randn(2, 10, dtype=torch.float64), torch.zeros(10))
    with pytest.raises(UserError, match="distinct"):
        pca_plane(torch.ones(4, 10, dtype=torch.float64), torch.zeros(10))


def test_grid_axes_cover_points_with_margin_and_the_origin_on_a_node() -> None:
    points = torch.tensor([[1.0, -2.0], [3.0, -1.0], [2.0, -0.5]], dtype=torch.float64)
    a, b = grid_axes(points, grid=11, margin=0.25)
    assert a.shape == b.shape == (11,)
    for axis in (a, b):
        assert (axis == 0).sum() == 1
        steps = axis.diff()
        torch.testing.assert_close(steps, steps[:1].expand_as(steps))
    # a: points span [1, 3], the origin widens it to [0, 3]; +-0.75 margin.
    assert float(a.min()) <= -0.75 + 1e-12 and float(a.max()) >= 3.75 - 1e-12
    assert float(b.min()) <= -2.5 + 1e-12 and float(b.max()) >= 0.5 - 1e-12
    # Degenerate axis (all zero) borrows the other's range instead of collapsing.
    a, b = grid_axes(torch.tensor([[1.0, 0.0], [2.0, 0.0]], dtype=torch.float64), 5, 0.0)
    assert float(b.max() - b.min()) > 0 and (b == 0).sum() == 1


def _direct(model: nn.Module, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor):
    """Loss and accuracy of a fresh copy of the network at ``theta``, in one pass."""
    load_theta(model, theta.float(), {})
    with torch.no_grad():
        logits = model.eval()(x)
    loss = nn.functional.cross_entropy(logits.double(), y).item()
    return loss, (logits.argmax(1) == y).double().mean().item()


def test_loss_plane_on_a_trained_mlp(mnist5k_prepared, tiny_posteriors) -> None:
    prepared = mnist5k_prepared.prepared
    posterior = load_posterior(tiny_posteriors.swag)
    start = load_posterior(tiny_posteriors.plain).theta
    part = prepared.train.random_subset(300, 0)
    x = to_input(part.x, posterior.mean, posterior.std)
    state = posterior.collector
    result = loss_plane(
        posterior.build_model(), state, x, part.y, grid=5, margin=0.25, start=start, batch_size=128
    )
    k = tiny_posteriors.swag_rank
    reference = build_model("mlp", prepared.input_shape, prepared.num_classes, {"hidden": [32]})
    rel = {"rel": 1e-5, "abs": 1e-6}

    assert len(result.grid) == 25 and set(result.grid[0]) == {"a", "b", "loss", "accuracy"}
    assert [r["kind"] for r in result.path] == ["start", *["snapshot"] * k, "average"]
    # The collector holds the last k of k + 1 snapshots: numbered 2..k+1.
    assert [r["index"] for r in result.path[1:-1]] == list(range(2, k + 2))

    average = result.path[-1]
    assert (average["a"], average["b"], average["distance"]) == (0.0, 0.0, 0.0)
    centre_loss, centre_acc = _direct(reference, state["mean"], x, part.y)
    assert average["loss"] == pytest.approx(centre_loss, **rel)
    assert average["accuracy"] == pytest.approx(centre_acc)
    origin = [r for r in result.grid if r["a"] == 0.0 and r["b"] == 0.0]
    assert len(origin) == 1 and origin[0]["loss"] == average["loss"]

    plane = result.plane
    for row in result.grid[::7]:
        loss, acc = _direct(reference, plane.point(row["a"], row["b"]), x, part.y)
        assert row["loss"] == pytest.approx(loss, **rel) and row["accuracy"] == pytest.approx(acc)

    for row, snap in zip(result.path[1:-1], snapshots(state), strict=True):
        assert row["loss"] == pytest.approx(_direct(reference, snap, x, part.y)[0], **rel)
        assert row["distance"] >= 0
    first = result.path[0]
    residual = start.double() - plane.point(first["a"], first["b"])
    assert first["distance"] == pytest.approx(float(residual.norm()), rel=1e-9)
    assert first["distance"] > 0.1  # the pretrained weights lie far off the noise plane
    assert first["loss"] == pytest.approx(_direct(reference, start, x, part.y)[0], **rel)

    a_values = sorted({r["a"] for r in result.grid})
    coords = [(r["a"], r["b"]) for r in result.path]
    assert a_values[0] < min(c[0] for c in coords) and a_values[-1] > max(c[0] for c in coords)

    summary = result.summary()
    assert summary["n_collected"] == k + 1 and summary["n_snapshots"] == k
    assert summary["centre_loss"] == average["loss"]
    assert summary["start_distance"] == first["distance"]
    assert summary["explained_variance_ratio"] == list(plane.explained)


def test_loss_plane_batchnorm_needs_bn_inputs() -> None:
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))
    d = sum(p.numel() for p in model.parameters())
    swag = SWAG(d, max_rank=4)
    gen = torch.Generator().manual_seed(5)
    for _ in range(4):
        swag.collect(torch.randn(d, generator=gen))
    x, y = torch.randn(16, 4, generator=gen), torch.randint(0, 3, (16,), generator=gen)
    with pytest.raises(UserError, match="BatchNorm"):
        loss_plane(model, swag.state_dict(), x, y, grid=3)
    result = loss_plane(model, swag.state_dict(), x, y, grid=3, bn_x=x, batch_size=8)
    # BN statistics at the average: the full-data mean and unbiased variance of its input.
    reference = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))
    load_theta(reference, swag.state_dict()["mean"].float(), {})
    with torch.no_grad():
        hidden = reference[0](x)
        reference[1].running_mean.copy_(hidden.mean(0))
        reference[1].running_var.copy_(hidden.var(0))
        logits = reference.eval()(x)
    expected = nn.functional.cross_entropy(logits.double(), y).item()
    assert result.path[-1]["loss"] == pytest.approx(expected, rel=1e-5)
