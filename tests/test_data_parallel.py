"""Data-parallel trajectories: N processes against one (tests/dp_workers.py).

Every kind runs on 1 and on 2 spawned gloo ranks with one intra-op thread
each. Ranks split every global batch, average gradients and share the draws
that define a step, so:
- the replicas hold the same weights after training, for every kind;
- swag, fswag (SAM) and vi on 2 processes match 1 process to float-sum
  rounding (the gradient is summed in another order): TOLERANCE below;
- ensemble and pretrained members are spread across ranks and bitwise equal;
- a run killed after an epoch and resumed on 2 processes is bitwise the
  uninterrupted 2-process run.
"""

from __future__ import annotations

from pathlib import Path

import dp_workers
import pytest
import torch
from pipeline_repo import DVC, env, make_repo, prune_landscape, sh, small_params
from ranks import spawn_ranks

SPAWN_DEADLINE = 180.0
# |theta_2 - theta_1| / |theta_1| after 18 steps: summing two half-batch gradients instead
# of one batch's changes the last bits of each step, and the steps compound them.
TOLERANCE = 1e-5

JOBS = {
    "swag": {"trajectory": "swag"},
    "fswag": {"trajectory": "fswag"},
    "vi": {"trajectory": "vi"},
    "hwa": {"trajectory": "hwa"},
    "sgld": {"trajectory": "sgld"},
    "ensemble": {"trajectory": "ensemble", "members": 3},
    "pretrain": {"trajectory": "pretrain", "members": 3},
    "swag_resumed": {"trajectory": "swag", "resume_after": 1},
}


def _spawn(world: int, folder: Path) -> None:
    args = (world, str(folder), list(JOBS.items()))
    spawn_ranks(dp_workers.rank_main, world, args, folder, SPAWN_DEADLINE, f"error-{world}-*.txt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("dp")
    _spawn(1, folder)
    _spawn(2, folder)
    return folder


def _load(folder: Path, job: str, world: int) -> dict:
    return torch.load(folder / f"{job}-{world}.pt", weights_only=True)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


# pretraining and the ensemble spread members over the ranks: nothing is replicated
@pytest.mark.parametrize("job", [j for j in JOBS if j not in ("pretrain", "ensemble")])
def test_replicas_hold_the_same_weights(runs: Path, job: str) -> None:
    for rank in range(2):
        assert (runs / f"agree-{job}-2-{rank}").read_text() == "True"


@pytest.mark.parametrize("job", ["swag", "fswag", "vi"])
def test_two_processes_match_one_within_float_rounding(runs: Path, job: str) -> None:
    one, two = _load(runs, job, 1)["posterior"], _load(runs, job, 2)["posterior"]
    assert not torch.equal(one["theta"], two["theta"])  # the sums really ran on two ranks
    assert _relative(two["theta"], one["theta"]) < TOLERANCE
    if job == "vi":
        assert _relative(two["rho"], one["rho"]) < TOLERANCE
    else:
        c1, c2 = one["collector"], two["collector"]
        assert c1["n_collected"] == c2["n_collected"] == 3
        assert _relative(c2["mean"], c1["mean"]) < TOLERANCE


def test_histories_agree_across_process_counts(runs: Path) -> None:
    one, two = _load(runs, "swag", 1)["history"], _load(runs, "swag", 2)["history"]
    assert [r["epoch"] for r in one] == [r["epoch"] for r in two] == [1, 2, 3]
    for a, b in zip(one, two, strict=True):
        assert abs(a["train_loss"] - b["train_loss"]) < 1e-5
        assert a["train_accuracy"] == pytest.approx(b["train_accuracy"], abs=1 / 96)
        assert "val_loss" in b and "test_loss" in b


@pytest.mark.parametrize("job", ["ensemble", "pretrain"])
def test_members_spread_over_ranks_are_bitwise_the_sequential_ones(runs: Path, job: str) -> None:
    one, two = _load(runs, job, 1)["posterior"], _load(runs, job, 2)["posterior"]
    assert one["samples"]["theta"].shape[0] == 3
    assert torch.equal(one["samples"]["theta"], two["samples"]["theta"])
    assert torch.equal(one["theta"], two["theta"])


def test_resumed_two_process_run_is_bitwise_the_uninterrupted_one(runs: Path) -> None:
    whole, resumed = _load(runs, "swag", 2), _load(runs, "swag_resumed", 2)
    assert torch.equal(whole["posterior"]["theta"], resumed["posterior"]["theta"])
    assert torch.equal(
        whole["posterior"]["collector"]["mean"], resumed["posterior"]["collector"]["mean"]
    )
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in whole["history"]]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in resumed["history"]]


@pytest.mark.slow  # ~80 s on 2 cores: torchrun starts, two ranks per stage
def test_stages_train_data_parallel_under_torchrun(tmp_path: Path) -> None:
    """`BAYESAVG_NPROC=2 dvc repro` of finetune stages: the launcher and its ranks, rank 0
    tracking and writing; members bitwise and swag within rounding of one process (each
    rank with the thread count one process has here, so only the sum order differs)."""
    raw = small_params(epochs=2, pretrain_epochs=1, members=2)
    raw["device"] = "cpu"
    # no BatchNorm: each rank normalises its half-batch by its own statistics (README),
    # which is a different computation from one process's, not a rounding difference
    raw["model"]["batch_norm"] = False
    ensemble = dict(raw["finetune"]["ensemble"], members=2)
    raw["finetune"] = {"swag": raw["finetune"]["swag"], "ensemble": ensemble}
    raw["evaluate"]["predictors"] = {  # two predictors in one stage: every rank does both
        "swag": {"swa": {"method": "swa"}, "swag": {"method": "swag"}},
        "ensemble": {"ensemble": {"method": "ensemble"}},
    }
    raw["evaluate"]["plane"]["trajectories"] = []
    raw["evaluate"]["dswag_sweep"]["workers"] = []
    prune_landscape(raw)
    (tmp_path / "repo").mkdir()
    repo = make_repo(tmp_path / "repo", raw)
    stages = ("finetune@swag", "finetune@ensemble")
    sh(repo, DVC, "repro", *stages)
    one = {s: _posterior(repo, s) for s in stages}
    two_procs = env(BAYESAVG_NPROC="2", BAYESAVG_THREADS=str(torch.get_num_threads()))
    for stage in stages:
        sh(repo, DVC, "repro", "--force", "--single-item", stage, environ=two_procs)
    two = {s: _posterior(repo, s) for s in stages}
    assert torch.equal(one[stages[1]]["samples"]["theta"], two[stages[1]]["samples"]["theta"])
    assert not torch.equal(one[stages[0]]["theta"], two[stages[0]]["theta"])
    assert _relative(two[stages[0]]["theta"], one[stages[0]]["theta"]) < TOLERANCE
    assert two[stages[0]]["collector"]["n_collected"] == one[stages[0]]["collector"]["n_collected"]
    assert not list(repo.glob("checkpoints/*.pt")), "finished stages leave no checkpoint"

    # evaluate@: samples spread over the ranks, combined in sample order: the same bytes
    evaluations = ("evaluate@swag", "evaluate@ensemble")
    outputs = [
        f"{kind}/{traj}/{pred}.{ext}"
        for traj, pred in (("swag", "swa"), ("swag", "swag"), ("ensemble", "ensemble"))
        for kind, ext in (("metrics/evaluate", "json"), ("predictions", "npz"))
    ]
    sh(repo, DVC, "repro", *evaluations)
    one_eval = {o: (repo / o).read_bytes() for o in outputs}
    for stage in evaluations:
        sh(repo, DVC, "repro", "--force", "--single-item", stage, environ=two_procs)
    assert {o: (repo / o).read_bytes() for o in outputs} == one_eval


def _posterior(repo: Path, stage: str) -> dict:
    name = stage.split("@")[1]
    return torch.load(repo / "models" / name / "posterior.pt", weights_only=True)
