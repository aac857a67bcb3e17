"""``finetune.<t>.posterior.params``: a posterior over some of the parameters (issue
"Bring your own network and data" §1): what it collects, what stays, how it samples."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from test_methods import CPU, SGD, _params, _split

from bayesavg.config.methods import REGISTRY
from bayesavg.evaluation.evaluate import evaluate
from bayesavg.posteriors.file import PosteriorFile, load_posterior, save_posterior
from bayesavg.predictors.sampling import draws
from bayesavg.runtime.errors import UserError
from bayesavg.trajectories import finetune, pretrain_members

HEAD = {"params": r"^4\.", "rest": "frozen"}  # the MLP's last Linear: 16 x 10 + 10
SWAG_RUN = {**SGD, "epochs": 2, "collect": {"start_epoch": 0, "every": 4, "max_rank": 5}}
PREDICTORS = {
    "swa": {"trajectory": "s", "method": "swa"},
    "swag": {"trajectory": "s", "method": "swag"},
}


@pytest.fixture(scope="module")
def runs(mnist5k_prepared: Any) -> dict[str, PosteriorFile]:
    prepared = mnist5k_prepared.prepared
    out = {}
    base = _params({"s": dict(SWAG_RUN)}, PREDICTORS, members=2)
    start = pretrain_members(base, prepared, CPU).posterior
    out["start"] = start
    for rest in ("frozen", "train"):
        p = _params({"s": {**SWAG_RUN, "posterior": {**HEAD, "rest": rest}}}, PREDICTORS)
        out[rest] = finetune(p, "s", prepared, start, CPU).posterior
    multi = {**SWAG_RUN, "kind": "ensemble", "members": 2, "posterior": HEAD}
    p = _params({"m": multi}, {"multiswag": {"trajectory": "m", "method": "multiswag"}}, 2)
    out["multi"] = finetune(p, "m", prepared, start, CPU).posterior
    return out


def _head(theta: torch.Tensor) -> slice:
    return slice(theta.numel() - 170, theta.numel())


def test_the_collector_covers_the_matched_parameters_only(runs: dict[str, PosteriorFile]) -> None:
    frozen, start = runs["frozen"], runs["start"]
    assert frozen.covers == ["4.weight", "4.bias"]
    assert frozen.collector is not None and frozen.collector["num_params"] == 170
    assert frozen.collector["deviations"].shape[1] == 170
    body = slice(0, start.theta.numel() - 170)
    assert torch.equal(frozen.theta[body], start.theta[body])  # the rest did not train
    assert not torch.equal(frozen.theta[_head(start.theta)], start.theta[_head(start.theta)])
    trained = runs["train"]
    assert trained.covers == ["4.weight", "4.bias"]
    assert not torch.equal(trained.theta[body], start.theta[body])  # rest: train


def test_samples_move_the_covered_weights_and_keep_the_rest(
    runs: dict[str, PosteriorFile],
) -> None:
    for name in ("frozen", "train"):
        post = runs[name]
        gen = torch.Generator().manual_seed(0)
        found = draws(post, REGISTRY["swag"], 0.5, gen, CPU, 3)
        body = slice(0, post.theta.numel() - 170)
        thetas = [found.draw(s)[0] for s in range(3)]
        for theta in thetas:
            assert theta.shape == post.theta.shape
            assert torch.equal(theta[body], post.theta[body])  # the file's rest, as trained
        assert not torch.equal(thetas[0], thetas[1])
        swa = draws(post, REGISTRY["swa"], 0.5, gen, CPU, 1).draw(0)[0]
        assert torch.equal(swa[body], post.theta[body])
        mean = post.collector["mean"].to(swa.dtype)  # type: ignore[index]
        assert torch.equal(swa[_head(swa)], mean)


def test_multiswag_members_keep_their_own_rest(runs: dict[str, PosteriorFile]) -> None:
    multi = runs["multi"]
    assert multi.covers == ["4.weight", "4.bias"] and multi.samples is not None
    thetas = multi.samples["theta"]
    body = slice(0, thetas.shape[1] - 170)
    found = draws(multi, REGISTRY["multiswag"], 0.5, torch.Generator().manual_seed(0), CPU, 2)
    for s in range(4):
        assert torch.equal(found.draw(s)[0][body], thetas[s % 2][body])


def test_a_scoped_posterior_evaluates_and_round_trips(
    runs: dict[str, PosteriorFile], mnist5k_prepared: Any, tmp_path: Path
) -> None:
    post = runs["frozen"]
    save_posterior(tmp_path / "p.pt", post)
    loaded = load_posterior(tmp_path / "p.pt")
    assert loaded.covers == post.covers
    split = _split(loaded, mnist5k_prepared.prepared)
    acc = evaluate(loaded, "swag", split, n_samples=3, scale=0.5, seed=0)["val"].metrics
    assert 0.5 < acc["accuracy"] <= 1
    bad = copy.deepcopy(post.to_dict())
    bad["covers"] = ["9.weight"]
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(UserError, match=r"covers names \['9.weight'\]"):
        load_posterior(tmp_path / "bad.pt")


def test_a_whole_posterior_writes_no_covers_key(runs: dict[str, PosteriorFile]) -> None:
    """Files without posterior.params hold no ``covers`` key, so they are the files written
    before the key existed (the pipeline's posteriors kept their md5 in dvc.lock)."""
    assert "covers" not in runs["start"].to_dict()
    assert runs["frozen"].to_dict()["covers"] == ["4.weight", "4.bias"]


def test_params_that_match_nothing_or_cannot_cover(mnist5k_prepared: Any) -> None:
    prepared = mnist5k_prepared.prepared
    p = _params({"s": {**SWAG_RUN, "posterior": {"params": "^layer4"}}}, PREDICTORS)
    start = pretrain_members(p, prepared, CPU).posterior
    with pytest.raises(UserError, match=r"matches no parameter .*named like 1\.weight"):
        finetune(p, "s", prepared, start, CPU)
    with pytest.raises(UserError, match="not a regular expression"):
        _params({"s": {**SWAG_RUN, "posterior": {"params": "(["}}}, PREDICTORS)
    vi = {
        **SGD,
        "kind": "vi",
        "momentum": 0.0,
        "weight_decay": 0.0,
        "posterior": {"params": "4"},
        "vi": {"sigma_init": 0.03},
    }
    with pytest.raises(UserError, match="covers every parameter"):
        _params({"v": vi}, {"vi": {"trajectory": "v", "method": "vi"}})


def test_landscape_directions_need_a_whole_posterior() -> None:
    from pipeline_repo import default_params

    from bayesavg.config import parse_params

    raw: dict[str, Any] = default_params()
    raw["finetune"]["swag"]["posterior"] = {"params": "fc"}
    with pytest.raises(UserError, match="need a posterior over every parameter"):
        parse_params(raw)
