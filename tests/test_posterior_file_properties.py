"""The posterior file's remaining contract: blocks ``test_posterior_file`` does not corrupt
(start_theta, the data block's bounds, the input block's numbers, the format tag), and
what loading gives back: a network in eval mode with the file's weights and buffers, built
without drawing from the caller's random stream, and buffers that are the file's own.

A tiny BatchNorm MLP on 1x4x4 inputs keeps every case well under a second.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from bayesavg.models import build_model
from bayesavg.posteriors import SWAG
from bayesavg.posteriors.file import FORMAT, PosteriorFile, load_posterior, save_posterior
from bayesavg.runtime.errors import UserError

KWARGS = {"hidden": [5], "batch_norm": True}
SHAPE = (1, 4, 4)


def _posterior() -> PosteriorFile:
    """A BatchNorm MLP whose running statistics are not the initial (0, 1)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build_model("mlp", SHAPE, 3, KWARGS)
        model.train()(torch.randn(16, *SHAPE) * 3 + 1)  # one batch moves the running stats
    data = {"dataset": "mnist5k", "seed": 0, "test_fraction": 0.2, "val_fraction": 0.1}
    return _file_of(model, "swag", data)


def _file_of(model: torch.nn.Module, trajectory: str, data: dict[str, Any]) -> PosteriorFile:
    """The file of the tiny MLP ``model`` (``KWARGS`` on ``SHAPE``, 3 classes)."""
    return PosteriorFile.from_model(
        model,
        trajectory=trajectory,
        model_name="mlp",
        model_kwargs=dict(KWARGS),
        input_shape=SHAPE,
        mean=[0.5],
        std=[0.25],
        num_classes=3,
        data=data,
    )


Edit = Callable[[dict[str, Any]], None]


def _set(*keys: Any, value: Any) -> Edit:
    def edit(raw: dict[str, Any]) -> None:
        block = raw
        for key in keys[:-1]:
            block = block[key]
        block[keys[-1]] = value

    return edit


def _start_theta_nan(raw: dict[str, Any]) -> None:
    raw["start_theta"] = raw["theta"].clone()
    raw["start_theta"][2] = math.nan


CORRUPTIONS: dict[str, tuple[Edit, str]] = {
    "start-theta-nan": (_start_theta_nan, "start_theta has non-finite values (1 of "),
    "start-theta-shape": (
        _set("start_theta", value=torch.zeros(7)),
        "start_theta has shape (7), expected (",
    ),
    "num-classes-zero": (_set("num_classes", value=0), "num_classes is 0, expected >= 1"),
    "trajectory-int": (_set("trajectory", value=3), "trajectory is 3 (int), expected a string"),
    "input-side-zero": (
        _set("input", "shape", value=[1, 0, 4]),
        "input.shape is (1, 0, 4) (tuple), expected 3 positive ints",
    ),
    "input-mean-inf": (
        _set("input", "mean", value=[math.inf]),
        "input.mean[0] is inf, expected a finite number",
    ),
    "input-mean-nan": (
        _set("input", "mean", value=[math.nan]),
        "input.mean[0] is nan, expected a finite number",
    ),
    "input-std-bool": (
        _set("input", "std", value=[True]),
        "input.std[0] is True (bool), expected a number",
    ),
    "test-fraction-one": (
        _set("data", "test_fraction", value=1.0),
        "data.test_fraction is 1.0, expected in [0, 1)",
    ),
    "val-fraction-negative": (
        _set("data", "val_fraction", value=-0.1),
        "data.val_fraction is -0.1, expected in [0, 1)",
    ),
    "resize-size-zero": (
        _set("data", "resize_size", value=0),
        "data.resize_size is 0, expected >= 1",
    ),
    "data-seed-float": (
        _set("data", "seed", value=0.0),
        "data.seed is 0.0 (float), expected an int",
    ),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_a_corrupt_block_is_one_line_naming_it(tmp_path: Path, case: str) -> None:
    edit, expected = CORRUPTIONS[case]
    raw = copy.deepcopy(_posterior().to_dict())
    edit(raw)
    path = tmp_path / "posterior.pt"
    torch.save(raw, path)
    with pytest.raises(UserError) as err:
        load_posterior(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    assert expected in message, message


def test_a_valid_start_theta_and_resize_size_load(tmp_path: Path) -> None:
    """The corruptions above fail for what they change: the same blocks, valid, load."""
    post = _posterior()
    post = dataclasses.replace(
        post, start_theta=post.theta + 1, data={**post.data, "resize_size": 32}
    )
    save_posterior(tmp_path / "posterior.pt", post)
    loaded = load_posterior(tmp_path / "posterior.pt")
    assert loaded.start_theta is not None and torch.equal(loaded.start_theta, post.theta + 1)


def test_a_file_without_the_format_tag_is_not_a_posterior(tmp_path: Path) -> None:
    raw = _posterior().to_dict()
    del raw["format"]
    torch.save(raw, tmp_path / "posterior.pt")
    with pytest.raises(
        UserError, match=rf"is not a bayesavg posterior file \(expected format {FORMAT}\)$"
    ):
        load_posterior(tmp_path / "posterior.pt")


def test_a_folder_is_named_as_one(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"is a folder: give the \.pt file inside it$"):
        load_posterior(tmp_path)


def test_the_built_network_is_the_files_in_eval_mode(tmp_path: Path) -> None:
    """Parameters and BatchNorm buffers as stored, eval mode, the caller's stream untouched."""
    post = _posterior()
    save_posterior(tmp_path / "posterior.pt", post)
    loaded = load_posterior(tmp_path / "posterior.pt")
    rng = torch.get_rng_state()
    model = loaded.build_model()
    assert torch.equal(torch.get_rng_state(), rng), "building must not draw random numbers"
    assert not model.training
    theta = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.equal(theta, post.theta)
    buffers = dict(model.named_buffers())
    assert buffers.keys() == post.buffers.keys()
    assert not torch.equal(post.buffers["2.running_mean"], torch.zeros(5))
    for name, value in post.buffers.items():
        assert torch.equal(buffers[name], value), name


def test_from_model_copies_the_buffers() -> None:
    """Training the network on after making the file must not change the file's buffers."""
    torch.manual_seed(0)
    model = build_model("mlp", SHAPE, 3, KWARGS)
    post = _file_of(model, "sgd", {})
    before = {k: v.clone() for k, v in post.buffers.items()}
    model.train()(torch.randn(8, *SHAPE) + 2)
    assert all(torch.equal(post.buffers[k], v) for k, v in before.items())


HEAD = ["5.weight", "5.bias"]  # the MLP's classifier: 5 x 3 + 3 parameters


def _scoped_multiswag() -> PosteriorFile:
    """Two members whose SWAG collectors cover the classifier only (``covers``): each
    collector holds 18 values while theta and every sample stay whole."""
    post = _posterior()
    gen = torch.Generator().manual_seed(0)
    collectors = []
    for _ in range(2):
        swag = SWAG(18, max_rank=2)
        for _ in range(3):
            swag.collect(torch.randn(18, generator=gen))
        collectors.append(swag.state_dict())
    samples = {
        "theta": torch.stack([post.theta, post.theta + 0.01]),
        "buffers": [dict(post.buffers), dict(post.buffers)],
        "collectors": collectors,
    }
    return dataclasses.replace(post, trajectory="multiswag", covers=list(HEAD), samples=samples)


def test_member_collectors_cover_the_covered_parameters(tmp_path: Path) -> None:
    """``samples.collectors`` are over the ``covers`` parameters, as the collector is; one
    over the whole vector is refused."""
    post = _scoped_multiswag()
    save_posterior(tmp_path / "scoped.pt", post)
    loaded = load_posterior(tmp_path / "scoped.pt")
    assert loaded.covers == HEAD and loaded.provides() >= {"members", "member_snapshots"}
    raw = copy.deepcopy(post.to_dict())
    raw["samples"]["collectors"][1]["num_params"] = post.theta.numel()
    torch.save(raw, tmp_path / "whole.pt")
    with pytest.raises(
        UserError, match=r"samples\.collectors\[1\]\.num_params is 113, expected 18 "
    ):
        load_posterior(tmp_path / "whole.pt")


def test_covers_out_of_the_models_order_is_refused(tmp_path: Path) -> None:
    raw = _scoped_multiswag().to_dict()
    raw["covers"] = list(reversed(HEAD))
    torch.save(raw, tmp_path / "posterior.pt")
    with pytest.raises(UserError, match=r": covers lists the parameters out of the model's order$"):
        load_posterior(tmp_path / "posterior.pt")


def test_covers_naming_a_parameter_twice_is_refused(tmp_path: Path) -> None:
    """Counted twice in the collector's length (2 x 18 values) but found once by
    ``covered_positions``: it loaded, and SWAG sampling failed in ``index_copy_``."""
    post = _posterior()
    swag = SWAG(36, max_rank=2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        swag.collect(torch.randn(36, generator=gen))
    twice = [*HEAD, HEAD[0]]
    raw = dataclasses.replace(post, covers=twice, collector=swag.state_dict()).to_dict()
    raw["covers"] = [HEAD[0], HEAD[0], HEAD[1]]  # in the model's order, one name twice
    torch.save(raw, tmp_path / "posterior.pt")
    with pytest.raises(UserError, match=r": covers names \['5\.weight'\] more than once$"):
        load_posterior(tmp_path / "posterior.pt")


def test_member_collectors_are_checked_without_member_buffers(tmp_path: Path) -> None:
    """``samples.buffers: None`` beside collectors: they were not looked at, so junk
    loaded, the file said it provides ``member_snapshots``, and MultiSWAG failed with a
    KeyError."""
    raw = _scoped_multiswag().to_dict()
    raw["samples"]["buffers"] = None
    raw["samples"]["collectors"] = [{"junk": 1}, "not a dict"]
    torch.save(raw, tmp_path / "posterior.pt")
    with pytest.raises(UserError, match=r": samples\.collectors\[0\]"):
        load_posterior(tmp_path / "posterior.pt")
