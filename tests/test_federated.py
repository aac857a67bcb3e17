"""DSWAG building blocks (ALGORITHMS §8): shards, client sampling, phase-2 rate, FedAvg weights."""

from __future__ import annotations

import itertools
import math
import time

import pytest
import torch

from bayesavg.dswag.federated import (
    DIRICHLET_ATTEMPTS,
    dirichlet_split,
    fedavg_weights,
    iid_split,
    phase2_rate,
    sample_clients,
)
from bayesavg.runtime.errors import UserError

LABELS = torch.arange(5000) % 10
"""5000 examples, 500 per class: the shape of mnist5k."""

UNEVEN = torch.randint(0, 7, (1237,), generator=torch.Generator().manual_seed(3))
"""A length no client count divides and unequal classes, to catch off-by-ones."""


def _check_partition(shards: list[torch.Tensor], n: int) -> None:
    """Every index 0..n-1 in exactly one shard; each shard sorted int64."""
    for shard in shards:
        assert shard.dtype == torch.int64 and shard.dim() == 1
        assert torch.equal(shard, torch.sort(shard).values)
    assert torch.equal(torch.sort(torch.cat(shards)).values, torch.arange(n))


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _class_shares(labels: torch.Tensor, shard: torch.Tensor, classes: int) -> torch.Tensor:
    return torch.bincount(labels[shard], minlength=classes).double() / shard.numel()


def _one_line_error(err: pytest.ExceptionInfo[UserError]) -> str:
    message = str(err.value)
    assert "\n" not in message and message.startswith("min_size:")
    return message


# iid_split


@pytest.mark.parametrize(("labels", "clients"), [(LABELS, 5), (LABELS, 7), (UNEVEN, 10)])
def test_iid_split_is_a_partition_with_sizes_within_one(labels: torch.Tensor, clients: int) -> None:
    shards = iid_split(labels, clients, seed=0)
    assert len(shards) == clients
    _check_partition(shards, labels.numel())
    sizes = [s.numel() for s in shards]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == labels.numel()


def test_iid_split_is_determined_by_the_seed() -> None:
    assert _same(iid_split(UNEVEN, 10, seed=4), iid_split(UNEVEN, 10, seed=4))
    assert not _same(iid_split(UNEVEN, 10, seed=4), iid_split(UNEVEN, 10, seed=5))


def test_iid_split_one_client_holds_everything() -> None:
    (shard,) = iid_split(UNEVEN, 1, seed=0)
    assert torch.equal(shard, torch.arange(UNEVEN.numel()))


def test_iid_split_more_clients_than_examples_is_a_params_error() -> None:
    with pytest.raises(UserError, match="clients: 6 is more than the 5 training examples"):
        iid_split(torch.zeros(5, dtype=torch.long), 6, seed=0)


# dirichlet_split


@pytest.mark.parametrize("alpha", [0.1, 1.0, 1e4])
@pytest.mark.parametrize(("labels", "clients"), [(LABELS, 5), (UNEVEN, 8)])
def test_dirichlet_split_is_a_partition(labels: torch.Tensor, clients: int, alpha: float) -> None:
    shards = dirichlet_split(labels, clients, alpha, min_size=0, seed=0)
    assert len(shards) == clients
    _check_partition(shards, labels.numel())


def test_dirichlet_split_is_determined_by_the_seed() -> None:
    a = dirichlet_split(LABELS, 5, 0.5, min_size=10, seed=1)
    assert _same(a, dirichlet_split(LABELS, 5, 0.5, min_size=10, seed=1))
    assert not _same(a, dirichlet_split(LABELS, 5, 0.5, min_size=10, seed=2))


def test_dirichlet_split_leaves_global_rng_alone() -> None:
    torch.manual_seed(0)
    before = torch.get_rng_state()
    dirichlet_split(LABELS, 5, 0.5, min_size=10, seed=1)
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_small_alpha_skews_the_label_histograms(seed: int) -> None:
    """alpha = 0.1: some shard has >= 75% of its examples in two classes (0.2 if IID)."""
    shards = [s for s in dirichlet_split(LABELS, 5, 0.1, min_size=0, seed=seed) if s.numel()]
    top_two = [_class_shares(LABELS, s, 10).sort(descending=True).values[:2].sum() for s in shards]
    assert max(top_two) >= 0.75
    global_shares = torch.full((10,), 0.1, dtype=torch.float64)
    deviation = max((_class_shares(LABELS, s, 10) - global_shares).abs().max() for s in shards)
    assert deviation > 0.3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_huge_alpha_is_near_iid(seed: int) -> None:
    """alpha = 1e4, 5000 labels, 5 clients: every class share within 0.01 of the global 0.1.

    (Dirichlet(1e4) proportions have sd about 0.002 here, the rounding of the
    cuts adds at most one example per class and shard: observed <= 0.003.)
    """
    shards = dirichlet_split(LABELS, 5, 1e4, min_size=0, seed=seed)
    for shard in shards:
        assert abs(shard.numel() - 1000) <= 50
        assert (_class_shares(LABELS, shard, 10) - 0.1).abs().max() < 0.01


def test_dirichlet_split_redraws_until_min_size_holds() -> None:
    """min_size = 0 returns attempt 0's draw; where that breaks min_size, a redraw is used."""
    first = dirichlet_split(LABELS, 10, 0.3, min_size=0, seed=0)
    assert min(s.numel() for s in first) < 300
    shards = dirichlet_split(LABELS, 10, 0.3, min_size=300, seed=0)
    _check_partition(shards, LABELS.numel())
    assert min(s.numel() for s in shards) >= 300
    assert _same(shards, dirichlet_split(LABELS, 10, 0.3, min_size=300, seed=0))


def test_impossible_min_size_is_a_params_error_at_once() -> None:
    start = time.perf_counter()
    with pytest.raises(UserError) as err:
        dirichlet_split(LABELS, 50, 1.0, min_size=101, seed=0)
    assert time.perf_counter() - start < 0.05
    message = _one_line_error(err)
    assert "101 x 50 clients needs 5050 examples but there are 5000" in message
    assert "min_size <= 100" in message
    dirichlet_split(LABELS, 50, 1e4, min_size=90, seed=0)  # feasible just below is fine


def test_unreachable_min_size_gives_up_after_bounded_attempts() -> None:
    """alpha = 0.01 puts each of 10 classes on about one client: 50 shards of >= 90 never come."""
    start = time.perf_counter()
    with pytest.raises(UserError) as err:
        dirichlet_split(LABELS, 50, 0.01, min_size=90, seed=0)
    assert time.perf_counter() - start < 1.0
    message = _one_line_error(err)
    assert f"in {DIRICHLET_ATTEMPTS} attempts; lower min_size or raise alpha" in message


@pytest.mark.parametrize("alpha", [0.0, -1.0, math.inf, math.nan])
def test_bad_alpha_is_a_params_error(alpha: float) -> None:
    with pytest.raises(UserError, match="alpha"):
        dirichlet_split(LABELS, 5, alpha, min_size=0, seed=0)


# sample_clients


@pytest.mark.parametrize(
    ("clients", "fraction", "k"),
    [(50, 0.1, 5), (50, 0.2, 10), (10, 0.01, 1), (7, 0.5, 4), (5, 0.5, 2), (3, 1 / 3, 1),
     (100, 0.15, 15), (1, 0.5, 1), (8, 1.0, 8)],
)  # fmt: skip
def test_sample_clients_draws_k_distinct_sorted_ids(clients: int, fraction: float, k: int) -> None:
    assert k == max(1, round(fraction * clients))
    for round_ in range(5):
        ids = sample_clients(clients, fraction, seed=0, round_=round_)
        assert len(ids) == k == len(set(ids))
        assert ids == sorted(ids) and all(0 <= i < clients for i in ids)


def test_sample_clients_is_determined_by_seed_and_round() -> None:
    rounds = [sample_clients(50, 0.1, seed=7, round_=r) for r in range(20)]
    assert rounds == [sample_clients(50, 0.1, seed=7, round_=r) for r in range(20)]
    assert len({tuple(ids) for ids in rounds}) == 20
    assert rounds != [sample_clients(50, 0.1, seed=8, round_=r) for r in range(20)]


def test_sample_clients_fraction_one_takes_everyone() -> None:
    assert sample_clients(13, 1.0, seed=3, round_=9) == list(range(13))


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_sample_clients_bad_fraction_is_a_params_error(fraction: float) -> None:
    with pytest.raises(UserError, match="fraction"):
        sample_clients(10, fraction, seed=0, round_=0)


# phase2_rate


@pytest.mark.parametrize(("c", "a1", "a2"), [(1, 0.05, 0.01), (4, 0.1, 0.001), (10, 0.01, 0.05)])
def test_phase2_rate_is_the_papers_linear_ramp(c: int, a1: float, a2: float) -> None:
    assert phase2_rate(0, c, a1, a2) == a1
    for t in {0, min(1, c - 1), c - 1}:
        assert phase2_rate(t, c, a1, a2) == (1 - t / c) * a1 + (t / c) * a2
    rates = [phase2_rate(t, c, a1, a2) for t in range(c)]
    steps = [b - a for a, b in itertools.pairwise(rates)]
    assert steps == pytest.approx([(a2 - a1) / c] * (c - 1))


def test_phase2_rate_known_values() -> None:
    assert [phase2_rate(t, 4, 0.1, 0.02) for t in range(4)] == pytest.approx(
        [0.1, 0.08, 0.06, 0.04]
    )


@pytest.mark.parametrize(("epoch", "epochs"), [(-1, 4), (4, 4), (0, 0)])
def test_phase2_rate_rejects_epochs_outside_the_phase(epoch: int, epochs: int) -> None:
    with pytest.raises(ValueError):
        phase2_rate(epoch, epochs, 0.1, 0.01)


# fedavg_weights


@pytest.mark.parametrize(
    "sizes", [[100], [1, 1], [1, 2, 3], [1000, 999, 1001, 7], list(range(1, 51)), [3] * 49]
)
def test_fedavg_weights_are_data_shares_summing_to_one(sizes: list[int]) -> None:
    weights = fedavg_weights(sizes)
    assert all(isinstance(w, float) for w in weights)
    assert abs(sum(weights) - 1.0) <= 1e-15
    assert weights == [n / sum(sizes) for n in sizes]


def test_fedavg_single_client_weight_is_exactly_one() -> None:
    assert fedavg_weights([1234]) == [1.0]


@pytest.mark.parametrize("sizes", [[], [0, 3], [5, -1]])
def test_fedavg_weights_need_positive_sizes(sizes: list[int]) -> None:
    with pytest.raises(ValueError):
        fedavg_weights(sizes)
