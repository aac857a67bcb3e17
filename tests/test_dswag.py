"""Distributed SWAG (ALGORITHMS §8) end to end on CPU: process-count independence,
the moments and FedAvg against references built by hand, and `dvc repro` on 1 and 2
processes. The launcher's handling of a rank's failure or a stop is tests/test_launch.py.

The pure helpers (shards, client sampling, phase-2 rate, FedAvg weights) are
tested in tests/test_federated.py. Ranks are spawned with torch.multiprocessing
(gloo, a fresh file store per run, see tests/dswag_workers.py); every spawned
run has a deadline, so a hang fails the test instead of blocking it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from dswag_workers import make_net, make_splits, problem_spec, rank_main, run_spec, trajectory
from pipeline_repo import DVC, ROOT, env, make_repo, prune_landscape, sh, small_params
from ranks import spawn_ranks
from torch.nn.utils import parameters_to_vector

from bayesavg.config import parse_params
from bayesavg.dswag import rounds as dswag
from bayesavg.dswag.federated import sample_clients
from bayesavg.posteriors import SWAG
from bayesavg.posteriors.file import load_theta
from bayesavg.runtime import numerics
from bayesavg.runtime.errors import UserError
from bayesavg.seeding import generator, seed_everything
from bayesavg.training.batches import Tensors
from bayesavg.training.optim import SGD
from bayesavg.training.train import train

SPAWN_DEADLINE = 120.0  # seconds for a whole spawned run; a hang fails, never blocks

P2 = {"epochs": 3, "lr_start": 0.05, "lr_end": 0.005, "snapshots_per_client": 2}

# The runs compared on 1, 2 and 3 processes (test 1), each hard in its own way.
JOBS: dict[str, dict[str, Any]] = {
    # BatchNorm buffers and dropout masks through FedAvg; half the clients a round and
    # half exploring; a cosine rate over the rounds; an early stop at round 3 of 6; 4
    # snapshots into 3 deviation rows (the ring wraps).
    "bn_sampled_early_stop": problem_spec(
        {
            "clients": 4,
            "batch_size": 32,
            "max_rank": 3,
            "phase1": {
                "rounds": 6,
                "client_fraction": 0.5,
                "local_epochs": 2,
                "schedule": {"kind": "cosine", "lr": 0.1, "lr_end": 0.01},
                "target_accuracy": 0.8,
            },
            "phase2": {"client_fraction": 0.5, **P2},
        },
        batch_norm=True,
        dropout=0.1,
    ),
    # Fewer clients than processes: rank 2 of 3 computes nothing.
    "two_clients": problem_spec(
        {
            "clients": 2,
            "batch_size": 32,
            "max_rank": 4,
            "phase1": {"rounds": 2, "local_epochs": 1},
            "phase2": P2,
        },
        batch_norm=True,
    ),
    # Unequal non-IID shards, 3 of 5 clients a round and exploring; 6 snapshots, rank 4.
    # In float64, so that a FedAvg sum in another order than the clients' shows.
    "dirichlet": problem_spec(
        {
            "clients": 5,
            "batch_size": 16,
            "max_rank": 4,
            "split": {"kind": "dirichlet", "alpha": 0.3, "min_size": 8},
            "phase1": {"rounds": 2, "client_fraction": 0.6, "local_epochs": 1},
            "phase2": {"client_fraction": 0.6, **P2},
        },
        float64=True,
    ),
}

# Test 7: a thousand logical clients of 2 examples each, every one in the FedAvg round
# (float64: see problem_spec).
MANY = problem_spec(
    {
        "clients": 1000,
        "batch_size": 2,
        "max_rank": 5,
        "phase1": {"rounds": 1, "client_fraction": 1.0, "local_epochs": 1},
        "phase2": {"client_fraction": 0.01, **P2},
    },
    n_train=2000,
    features=8,
    hidden=(8,),
    float64=True,
)


# --- helpers ----------------------------------------------------------------------------


def _spawn(world: int, jobs: list[tuple[str, dict[str, Any]]], folder: Path) -> None:
    """Run ``jobs`` on ``world`` spawned ranks (``ranks.spawn_ranks``)."""
    spawn_ranks(
        rank_main, world, (world, str(folder), jobs), folder, SPAWN_DEADLINE, f"error-{world}-*.txt"
    )


def _alone(spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``run_dswag`` in this process, outside any torch.distributed run, at the thread
    count ranks get by default (1 each: N ranks never run more than 2 threads)."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(numerics.THREADS_ENV, "1")
    out = run_spec(spec)
    assert out is not None
    posterior, history = out
    return {"posterior": posterior.to_dict(), "history": history}


def _load(folder: Path, job: str, world: int) -> dict[str, Any]:
    """Rank 0's result of ``job`` on ``world`` processes; every other rank got None."""
    markers = [(folder / f"ok-{job}-{world}-{rank}").read_text() for rank in range(world)]
    assert markers == ["result"] + ["none"] * (world - 1)
    return torch.load(folder / f"{job}-{world}.pt", weights_only=True)


def _rows(history: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in history]


def _assert_same_tensors(a: dict[str, Any], b: dict[str, Any], what: str) -> None:
    assert a.keys() == b.keys(), what
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == b[key].dtype, f"{what}.{key}"
            assert torch.equal(value, b[key]), f"{what}.{key} differs"
        else:
            assert value == b[key], f"{what}.{key}: {value} != {b[key]}"


def _assert_same_run(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Bitwise the same posterior (theta, buffers, every collector tensor) and history."""
    pa, pb = a["posterior"], b["posterior"]
    assert torch.equal(pa["theta"], pb["theta"]), "theta (FedAvg model) differs"
    _assert_same_tensors(pa["buffers"], pb["buffers"], "buffers")
    _assert_same_tensors(pa["collector"], pb["collector"], "collector")
    rest = ("theta", "buffers", "collector")
    assert {k: v for k, v in pa.items() if k not in rest} == {
        k: v for k, v in pb.items() if k not in rest
    }
    assert _rows(a["history"]) == _rows(b["history"])


@pytest.fixture
def one_thread() -> Any:
    """The thread count ``_alone`` runs ``run_dswag`` at (the ranks' default, 1), for
    references built here."""
    before = torch.get_num_threads()
    torch.set_num_threads(numerics.threads({"WORLD_SIZE": "2"}))
    yield
    torch.set_num_threads(before)


def _shard(spec: dict[str, Any], client: int) -> Tensors:
    train_t = make_splits(spec)["train"]
    idx = dswag.shards(trajectory(spec), train_t.y, spec["seed"])[client]
    return Tensors(train_t.x[idx], train_t.y[idx])


def _local_sgd(
    net: torch.nn.Module,
    spec: dict[str, Any],
    data: Tensors,
    epochs: int,
    rate: Any,
    seed: int,
    on_epoch: Any = None,
) -> None:
    """A client's training as the paper has it: its own seed, a fresh SGD."""
    traj = trajectory(spec)
    seed_everything(seed)
    opt = SGD(list(net.parameters()), momentum=traj.momentum, weight_decay=traj.weight_decay)
    train(
        net,
        opt,
        data,
        epochs=epochs,
        batch_size=traj.batch_size,
        lr=rate,
        generator=generator(seed),
        on_epoch=on_epoch,
        log_epochs=False,
    )


# --- 1 and 7: the same bytes on 1, 2 and 3 processes ------------------------------------


@pytest.fixture(scope="module")
def spawned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every job of JOBS on 2 and on 3 spawned ranks, and MANY on 2."""
    folder = tmp_path_factory.mktemp("dswag_ranks")
    _spawn(2, [*JOBS.items(), ("many", MANY)], folder)
    _spawn(3, list(JOBS.items()), folder)
    return folder


@pytest.mark.parametrize("job", sorted(JOBS))
def test_result_does_not_depend_on_the_number_of_processes(
    spawned: Path, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = JOBS[job]
    alone = _alone(spec, monkeypatch)
    for world in (2, 3):
        _assert_same_run(alone, _load(spawned, job, world))
    # Each job really is the case it stands for.
    traj = trajectory(spec)
    fraction = traj.phase2.client_fraction
    explorers = sample_clients(traj.clients, fraction, spec["seed"], dswag.PHASE2_ROUND)
    assert alone["posterior"]["collector"]["n_collected"] == len(explorers) * 2
    if job == "bn_sampled_early_stop":
        assert 1 < len(alone["history"]) < traj.phase1.rounds, "no early stop"
        assert all(row["clients"] == 2 for row in alone["history"])
        assert any(k.endswith("num_batches_tracked") for k in alone["posterior"]["buffers"])
        assert alone["posterior"]["collector"]["n_collected"] > traj.max_rank
    if job == "two_clients":
        assert traj.clients < 3
    if job == "dirichlet":
        sizes = [len(s) for s in dswag.shards(traj, make_splits(spec)["train"].y, spec["seed"])]
        assert max(sizes) > 2 * min(sizes), sizes
        assert all(row["clients"] == 3 for row in alone["history"])


def test_a_thousand_clients_on_two_processes(
    spawned: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone = _alone(MANY, monkeypatch)
    _assert_same_run(alone, _load(spawned, "many", 2))
    assert alone["history"][0]["clients"] == 1000
    assert alone["posterior"]["collector"]["n_collected"] == 10 * 2  # 1% of 1000 explore


# --- 2: the moments are SWAG.collect over the explorers' snapshots -------------------


def test_moments_are_swag_over_the_explorers_snapshots_in_client_order(
    monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    spec = problem_spec(
        {
            "clients": 5,
            "batch_size": 16,
            "max_rank": 4,
            "phase1": {"rounds": 2, "client_fraction": 0.6},
            "phase2": {"client_fraction": 0.6, **P2},
        },
        batch_norm=True,
        dropout=0.2,
    )
    posterior = _alone(spec, monkeypatch)["posterior"]
    traj, seed, p2 = trajectory(spec), spec["seed"], trajectory(spec).phase2
    explorers = sample_clients(traj.clients, p2.client_fraction, seed, dswag.PHASE2_ROUND)
    assert len(explorers) == 3 and explorers == sorted(explorers)

    snapshots: dict[int, list[torch.Tensor]] = {}
    for client in explorers:
        net = make_net(spec)  # theta_T: the posterior's weights and buffers
        load_theta(net, posterior["theta"], posterior["buffers"])
        data = _shard(spec, client)
        steps = math.ceil(len(data) / traj.batch_size)

        def rate(i: int, steps: int = steps) -> float:
            t = (i // steps) / p2.epochs  # alpha(t) = (1 - t/c) a1 + (t/c) a2, t the epoch
            return (1 - t) * p2.lr_start + t * p2.lr_end

        snaps: list[torch.Tensor] = []

        def keep(progress: Any, net: torch.nn.Module = net, snaps: list = snaps) -> None:
            if progress.epoch > p2.epochs - p2.snapshots_per_client:
                snaps.append(parameters_to_vector(net.parameters()).detach().clone())

        seed_ = dswag.client_seed(seed, 2, dswag.PHASE2_ROUND, client)
        _local_sgd(net, spec, data, p2.epochs, rate, seed_, on_epoch=keep)
        assert len(snaps) == p2.snapshots_per_client
        snapshots[client] = snaps

    d = posterior["theta"].numel()
    reference = SWAG(d, traj.max_rank)
    for client in explorers:
        for snap in snapshots[client]:
            reference.collect(snap)
    assert reference.n_collected > traj.max_rank  # the ring of deviations wrapped
    _assert_same_tensors(reference.state_dict(), posterior["collector"], "collector")

    # The order matters, so the comparison above checks it: clients reversed differ.
    backwards = SWAG(d, traj.max_rank)
    for client in reversed(explorers):
        for snap in snapshots[client]:
            backwards.collect(snap)
    assert not torch.equal(backwards.state_dict()["deviations"], reference.deviations)


# --- 3: one client, every round: phase 1 is SGD restarted each round -----------------


def test_one_client_phase1_is_sgd_restarted_each_round(
    monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    rounds, lr, lr_end = 3, 0.1, 0.01
    spec = problem_spec(
        {
            "clients": 1,
            "batch_size": 32,
            "max_rank": 2,
            "phase1": {
                "rounds": rounds,
                "local_epochs": 2,
                "schedule": {"kind": "cosine", "lr": lr, "lr_end": lr_end},
            },
            "phase2": {"epochs": 1, "snapshots_per_client": 1},
        },
        batch_norm=True,
        dropout=0.1,
    )
    result = _alone(spec, monkeypatch)
    traj, seed = trajectory(spec), spec["seed"]
    net = make_net(spec)
    train_t = make_splits(spec)["train"]
    rates = []
    for round_ in range(rounds):
        rate = lr_end + (lr - lr_end) * 0.5 * (1 + math.cos(math.pi * round_ / (rounds - 1)))
        rates.append(rate)
        seed_ = dswag.client_seed(seed, 1, round_, 0)
        _local_sgd(net, spec, train_t, traj.phase1.local_epochs, lambda i, r=rate: r, seed_)
    posterior = result["posterior"]
    assert torch.equal(posterior["theta"], parameters_to_vector(net.parameters()).detach())
    _assert_same_tensors(posterior["buffers"], dict(net.named_buffers()), "buffers")
    assert [row["lr"] for row in result["history"]] == rates
    assert rates[0] != rates[-1]


# --- 4: FedAvg is the data-size-weighted mean over the sampled clients ---------------


def test_fedavg_is_the_size_weighted_mean_of_the_sampled_clients(
    monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    spec = problem_spec(
        {
            "clients": 4,
            "batch_size": 16,
            "max_rank": 2,
            "split": {"kind": "dirichlet", "alpha": 0.3, "min_size": 10},
            "phase1": {"rounds": 1, "client_fraction": 0.5, "local_epochs": 2},
            "phase2": {"epochs": 1, "snapshots_per_client": 1},
        },
        batch_norm=True,
    )
    posterior = _alone(spec, monkeypatch)["posterior"]
    traj, seed = trajectory(spec), spec["seed"]
    rate = traj.phase1.schedule.lr
    sampled = sample_clients(traj.clients, traj.phase1.client_fraction, seed, 0)
    assert len(sampled) == 2 < traj.clients

    sizes, states = [], []
    buffer_names: list[str] = []
    for client in sampled:
        net = make_net(spec)
        data = _shard(spec, client)
        _local_sgd(
            net,
            spec,
            data,
            traj.phase1.local_epochs,
            lambda i: rate,
            dswag.client_seed(seed, 1, 0, client),
        )
        buffer_names = [name for name, _ in net.named_buffers()]
        parts = [p.detach().double().reshape(-1) for p in net.parameters()]
        parts += [b.double().reshape(-1) for b in net.buffers()]
        sizes.append(len(data))
        states.append(torch.cat(parts))
    assert sizes[0] != sizes[1], "equal shards would not test the weighting"
    weighted = sum(n * s for n, s in zip(sizes, states, strict=True)) / sum(sizes)
    plain = sum(states) / len(states)

    got = torch.cat(
        [posterior["theta"].double()]
        + [posterior["buffers"][name].double().reshape(-1) for name in buffer_names]
    )
    # The engine adds (n_i / N) * theta_i in float64, the reference divides sum n_i theta_i
    # by N at the end: the float64 values differ by a few of their ulps, which can move the
    # final float32 rounding by one float32 ulp (2**-23 relative), never more.
    floating = torch.tensor(
        [True] * posterior["theta"].numel()
        + [
            posterior["buffers"][name].is_floating_point()
            for name in buffer_names
            for _ in range(posterior["buffers"][name].numel())
        ]
    )
    torch.testing.assert_close(got[floating], weighted[floating], rtol=2**-23, atol=1e-12)
    # Integer buffers (BatchNorm's step counts): the weighted mean, rounded.
    assert torch.equal(got[~floating], weighted[~floating].round())
    assert (weighted - plain).abs().max() > 1e-3, "the weighting must matter for this check"


# --- 5: a single snapshot: no variance, never NaN, and no swag predictor -------------


def test_one_explorer_one_snapshot_has_no_variance_and_no_nan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    traj = {
        "clients": 4,
        "batch_size": 32,
        "max_rank": 5,
        "phase1": {"rounds": 1},
        "phase2": {"client_fraction": 0.1, "epochs": 2, "snapshots_per_client": 1},
    }
    spec = problem_spec(traj)
    assert trajectory(spec).explorers() == 1 and trajectory(spec).snapshots() == 1
    posterior = _alone(spec, monkeypatch)["posterior"]
    state = posterior["collector"]
    assert state["n_collected"] == 1
    for key in ("mean", "m2", "deviations"):
        assert torch.isfinite(state[key]).all(), key
    assert torch.equal(state["m2"], torch.zeros_like(state["m2"]))
    assert state["deviations"].shape == (1, posterior["theta"].numel())
    swag = SWAG.from_state_dict(state)
    assert torch.equal(swag.variance(), torch.full_like(swag.variance(), 1e-30))
    sample = swag.sample(0.5, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(sample).all()
    assert (sample - swag.mean).abs().max() < 1e-6  # no spread to sample from

    def params(method: str, snapshots: int = 1) -> dict[str, Any]:
        one = {**traj, "kind": "dswag", "phase2": {**traj["phase2"]}}
        one["phase2"]["snapshots_per_client"] = snapshots
        pred = {"method": method}
        return {"finetune": {"dswag": one}, "evaluate": {"predictors": {"dswag": {"p": pred}}}}

    with pytest.raises(UserError, match=r"evaluate\.predictors\.dswag\.p needs >= 2 snapshots"):
        parse_params(params("swag"))
    for method in ("map", "swa", "swag_diag"):
        parse_params(params(method))
    parse_params(params("swag", snapshots=2))


def test_a_client_with_a_last_batch_of_one_example_is_no_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """BatchNorm cannot train on one example. With W shards of sizes set by the split
    (Dirichlet above all), some shard of k * batch_size + 1 examples is likely: that
    client trains the lone example with the batch before (``batches.batches_per_epoch``)."""
    spec = problem_spec(
        {
            "clients": 3,
            "batch_size": 30,
            "phase1": {"rounds": 1},
            "phase2": {"epochs": 1, "snapshots_per_client": 1},
        },
        n_train=91,
        batch_norm=True,
    )
    labels = make_splits(spec)["train"].y
    sizes = [len(s) for s in dswag.shards(trajectory(spec), labels, spec["seed"])]
    assert sorted(sizes) == [30, 30, 31]
    out = _alone(spec, monkeypatch)
    assert out["posterior"]["collector"]["n_collected"] == 3
    assert all(math.isfinite(row["train_loss"]) for row in out["history"])


# --- 8: dvc repro on 1 and 2 processes: the same bytes, one finished run each --------


def _runs(repo: Path, name: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bayesavg")
    return [r for r in client.search_runs([exp.experiment_id]) if r.info.run_name == name]


def _stage_processes(traces: Path) -> int:
    """How many processes ran ``stages/finetune.py dswag`` (tests/trace records each)."""
    records = [json.loads(p.read_text()) for p in traces.glob("*.json")]
    return sum(r["argv"][-2:] == ["stages/finetune.py", "dswag"] for r in records)


def _traced(tmp_path: Path, nproc: int, **extra: str) -> dict[str, str]:
    """The stages' environment on ``nproc`` processes, every Python process traced."""
    traces = tmp_path / f"traces{nproc}"
    traces.mkdir()
    return env(
        BAYESAVG_NPROC=str(nproc),
        PYTHONPATH=str(ROOT / "tests" / "trace"),
        BAYESAVG_TRACE_DIR=str(traces),
        **extra,
    )


@pytest.mark.slow  # ~30 s on 2 cores: two dvc repro runs, one under torchrun
def test_dvc_repro_on_one_and_two_processes_writes_the_same_posterior(tmp_path: Path) -> None:
    raw = small_params(epochs=2, pretrain_epochs=1, members=1)
    raw["device"] = "cpu"
    raw["finetune"] = {"dswag": raw["finetune"]["dswag"]}
    raw["finetune"]["dswag"]["phase1"]["client_fraction"] = 0.5
    raw["finetune"]["dswag"]["phase2"]["client_fraction"] = 0.75
    raw["evaluate"]["predictors"] = {"dswag": {"dswag": {"method": "swag"}}}
    raw["evaluate"]["plane"]["trajectories"] = []
    prune_landscape(raw)
    parse_params(yaml.safe_load(yaml.safe_dump(raw)))
    (tmp_path / "repo").mkdir()
    repo = make_repo(tmp_path / "repo", raw)
    out = repo / "models" / "dswag" / "posterior.pt"

    # 1 process at the thread count 2 ranks get by default (1 each: never oversubscribed)
    sh(repo, DVC, "repro", "finetune@dswag", environ=_traced(tmp_path, 1, BAYESAVG_THREADS="1"))
    assert _stage_processes(tmp_path / "traces1") == 1
    one = out.read_bytes()
    runs = _runs(repo, "finetune@dswag")
    assert [r.info.status for r in runs] == ["FINISHED"]

    # --single-item: only this stage again (its upstream stages are unchanged).
    again = ("repro", "--force", "--single-item", "finetune@dswag")
    sh(repo, DVC, *again, environ=_traced(tmp_path, 2))
    assert _stage_processes(tmp_path / "traces2") == 3, "the launcher and its 2 ranks"
    assert out.read_bytes() == one
    runs = _runs(repo, "finetune@dswag")
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"], "one run per repro"
    assert len({r.info.run_id for r in runs}) == 2
    assert {r.data.metrics["snapshots"] for r in runs} == {3 * 2}
