"""DSWAG and analyses properties found missing by mutation testing: shard and sampling
boundaries (ALGORITHMS §8), the phase-1 history and early stop, the width's strict level
and bisection, principal directions and plane axes against brute force (§9), and the
sweep's BatchNorm recompute."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from dswag_workers import make_net, make_splits, problem_spec, run_spec
from torch import nn

from bayesavg.analyses.landscape import filter_normalise, principal_directions, width
from bayesavg.analyses.plane import _axis, grid_axes
from bayesavg.analyses.sweep import rounds_to_target, sigma_distance
from bayesavg.dswag import rounds as dswag
from bayesavg.dswag.federated import dirichlet_split, iid_split, sample_clients
from bayesavg.posteriors import SWAG
from bayesavg.posteriors.file import load_posterior, load_theta
from bayesavg.runtime import numerics
from bayesavg.runtime.errors import UserError
from bayesavg.seeding import derive_seed

LABELS = torch.arange(200) % 4


def test_iid_split_gives_the_extra_examples_to_the_first_clients() -> None:
    sizes = [len(s) for s in iid_split(torch.zeros(23), 5, seed=0)]
    assert sizes == [5, 5, 5, 4, 4]


def test_dirichlet_split_is_the_documented_draw() -> None:
    """Brute force of attempt 0: classes ascending, each shuffled and cut at
    rint(cumsum(p) * n_c), p ~ Dirichlet(alpha) over the clients."""
    clients, alpha, seed = 3, 0.5, 11
    rng = np.random.default_rng(derive_seed(seed, "dirichlet_split", 0))
    pieces: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for c in range(4):
        idx = rng.permutation(np.flatnonzero(LABELS.numpy() == c))
        p = rng.dirichlet(np.full(clients, alpha))
        cuts = np.rint(np.cumsum(p)[:-1] * idx.size).astype(np.int64)
        for i, part in enumerate(np.split(idx, cuts)):
            pieces[i].append(part)
    want = [sorted(np.concatenate(p).tolist()) for p in pieces]
    got = dirichlet_split(LABELS, clients, alpha, 0, seed)
    assert [s.tolist() for s in got] == want


def test_dirichlet_min_size_is_inclusive() -> None:
    """A draw whose smallest shard holds exactly min_size is kept, not redrawn."""
    first = dirichlet_split(LABELS, 4, 1.0, 0, seed=2)
    smallest = min(len(s) for s in first)
    assert smallest > 0
    again = dirichlet_split(LABELS, 4, 1.0, smallest, seed=2)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    whole = dirichlet_split(LABELS, 1, 1.0, len(LABELS), seed=2)  # min_size * clients == n
    assert whole[0].tolist() == list(range(len(LABELS)))


def test_negative_min_size_and_a_fraction_above_one_are_params_errors() -> None:
    with pytest.raises(UserError, match="min_size"):
        dirichlet_split(LABELS, 2, 1.0, -1, seed=0)
    with pytest.raises(UserError, match="fraction"):
        sample_clients(10, 1.2, seed=0, round_=0)


def test_every_client_of_a_round_has_its_own_seed() -> None:
    for phase, round_ in ((1, 0), (1, 5), (2, dswag.PHASE2_ROUND)):
        seeds = {dswag.client_seed(3, phase, round_, c) for c in range(50)}
        assert len(seeds) == 50


SPEC = problem_spec(
    {
        "clients": 3,
        "batch_size": 32,
        "max_rank": 2,
        "phase1": {"rounds": 3, "client_fraction": 0.67, "local_epochs": 1},
        "phase2": {"epochs": 1, "snapshots_per_client": 1},
    },
    n_train=120,
)


def _alone(spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[dict]]:
    """``run_dswag`` in this process, outside any torch.distributed run."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(numerics.THREADS_ENV, "1")
    out = run_spec(spec)
    assert out is not None
    return out


def test_history_rows_are_the_global_models_own_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows are numbered 1..T; the last one is theta_T's loss and accuracy on each split,
    and each round samples its clients with its own round's seed."""
    calls: list[int] = []

    def spy(clients: int, fraction: float, seed: int, round_: int) -> list[int]:
        calls.append(round_)
        return sample_clients(clients, fraction, seed, round_)

    monkeypatch.setattr(dswag, "sample_clients", spy)
    posterior, history = _alone(SPEC, monkeypatch)
    assert [row["epoch"] for row in history] == [1, 2, 3]
    assert calls == [0, 1, 2, dswag.PHASE2_ROUND]
    net = make_net(SPEC)
    state = posterior.to_dict()
    load_theta(net, state["theta"], state["buffers"])
    net.eval()
    with torch.no_grad():
        for name, split in make_splits(SPEC).items():
            logits = net(split.x)
            loss = nn.functional.cross_entropy(logits.double(), split.y).item()
            accuracy = (logits.argmax(1) == split.y).double().mean().item()
            assert history[-1][f"{name}_loss"] == pytest.approx(loss, rel=1e-5)
            assert history[-1][f"{name}_accuracy"] == pytest.approx(accuracy, abs=1e-12)


def test_phase1_stops_when_the_target_is_reached_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    _, history = _alone(SPEC, monkeypatch)
    spec = {**SPEC, "traj": {**SPEC["traj"]}}
    spec["traj"]["phase1"] = {**SPEC["traj"]["phase1"]}
    spec["traj"]["phase1"]["target_accuracy"] = history[0]["train_accuracy"]
    _, stopped = _alone(spec, monkeypatch)
    assert len(stopped) == 1


def test_width_needs_the_loss_strictly_above_the_level() -> None:
    """L(s) = floor(s) delta: L(1) = L(0) + delta is not above it; L(2) is."""
    delta = 0.25
    found = width(lambda s: float(np.floor(s)) * delta, delta, [0, 0.5, 1, 1.5, 2, 2.5, 3])
    assert found == pytest.approx(2.0, abs=1e-3)


def test_width_bisects_between_the_crossing_and_the_grid_point_before() -> None:
    """The bisection starts from the grid point before (9, not 0): its tolerance is
    relative to that step, so the crossing is found to within tolerance * 1 / 2."""
    found = width(lambda s: float(s > 9.5), 0.5, [0.0, 9.0, 10.0], tolerance=0.05)
    assert abs(found - 9.5) <= 0.05 / 2


def test_width_scans_the_first_point_of_a_grid_without_zero() -> None:
    """0 is put before a grid that lacks it, so the first grid point (4) is scanned."""

    def loss(s: float) -> float:
        return float(3.9 < s < 4.1 or s > 9.0)

    assert width(loss, 0.5, [4.0, 10.0]) == pytest.approx(3.9, abs=1e-3)


def test_principal_directions_std_is_the_projections_sample_std() -> None:
    g = torch.Generator().manual_seed(0)
    devs = torch.randn(6, 10, generator=g, dtype=torch.float64) * torch.linspace(3, 0.1, 10)
    dirs, std = principal_directions({"deviations": devs}, 10)
    assert dirs.shape == (6, 10), "no more directions than deviations"
    brute = ((devs @ dirs.T) ** 2).sum(0).div(5).sqrt()
    torch.testing.assert_close(std, brute, rtol=1e-10, atol=0)
    peak = dirs.gather(1, dirs.abs().argmax(1, keepdim=True))
    assert (peak > 0).all(), "each direction's largest component is positive"


def test_filter_normalise_refuses_a_direction_of_another_length() -> None:
    net = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="the model 8"):
        filter_normalise(torch.zeros(9), torch.zeros(9), net)


@pytest.mark.parametrize(("lo", "hi", "grid"), [(-0.01, 10.0, 5), (-10.0, 0.01, 5), (-1, 3, 4)])
def test_an_axis_covers_its_range_with_zero_on_a_node(lo: float, hi: float, grid: int) -> None:
    axis = _axis(lo, hi, grid)
    assert len(axis) == grid and (axis == 0).sum() == 1
    assert float(axis.min()) <= lo and float(axis.max()) >= hi


def test_a_zero_range_axis_borrows_the_others_span() -> None:
    _, b = grid_axes(torch.tensor([[1.0, 0.0], [4.0, 0.0]], dtype=torch.float64), 5, 0.0)
    assert float(b.max() - b.min()) >= 4.0 - 1e-12


def test_rounds_to_target_is_the_first_round_reaching_it_inclusive() -> None:
    history = [{"epoch": 1, "train_accuracy": 0.5}, {"epoch": 2, "train_accuracy": 0.8}]
    assert rounds_to_target(history, 0.8) == 2
    assert rounds_to_target(history, 0.81) is None


def test_sigma_distance_recomputes_batchnorm_at_every_network(
    bn_swag_posterior, mnist5k_prepared
) -> None:
    posterior = load_posterior(bn_swag_posterior)
    prepared = mnist5k_prepared.prepared
    test, train = prepared.test, prepared.train.random_subset(1000, 0)
    x, bn_x = posterior.inputs(test.x), posterior.inputs(train.x)
    with pytest.raises(ValueError, match="BatchNorm"):
        sigma_distance(posterior, x, test.y, [1.0], 1, seed=3)
    (row,) = sigma_distance(posterior, x, test.y, [1.0], 1, seed=3, bn_x=bn_x)

    swag = SWAG.from_state_dict(posterior.collector)
    z = torch.randn(swag.mean.shape, generator=torch.Generator().manual_seed(3))
    model = posterior.build_model()
    load_theta(model, swag.mean + swag.variance().sqrt() * z, {})
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.reset_running_stats()
                m.momentum = None
        model.train()(posterior.model_input(train.x))
        logp = torch.log_softmax(model.eval()(posterior.model_input(test.x)).double(), 1)
    assert row["nll"] == pytest.approx(nn.functional.nll_loss(logp, test.y).item(), rel=1e-4)
