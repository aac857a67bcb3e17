"""``pretrain.kind: weights`` in-process: the head fit trains for ``pretrain.head_epochs``
(not ``pretrain.epochs``), and without a fit the start is measured on the validation split,
never the test split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pipeline_repo import ROOT, small_params

from bayesavg.config import parse_params
from bayesavg.models import build_model
from bayesavg.training.batches import Tensors
from bayesavg.training.train import loss_and_accuracy
from bayesavg.trajectories import pretrain

CPU = torch.device("cpu")


def _weights_params(weights: Path, head_epochs: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The example factory's small CNN from ``weights``, three pretrain epochs listed."""
    monkeypatch.chdir(ROOT)  # model.code: networks/ of the repository
    raw = small_params(epochs=1, pretrain_epochs=3, members=1)
    raw["model"] = {
        "code": "networks",
        "factory": "networks.example:small_cnn",
        "options": {"width": 4},
        "weights": str(weights),
    }
    raw["pretrain"].update(kind="weights", head_epochs=head_epochs)
    return parse_params(raw)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory, mnist5k_prepared: Any) -> Path:
    torch.manual_seed(3)
    shape = tuple(mnist5k_prepared.prepared.input_shape)
    path = tmp_path_factory.mktemp("weights") / "small_cnn.pt"
    torch.save(
        build_model("factory:networks.example:small_cnn", shape, 10, {"width": 4}).state_dict(),
        path,
    )
    return path


@pytest.mark.parametrize("head_epochs", [1, 2])
def test_the_head_fit_runs_head_epochs_not_pretrain_epochs(
    weights: Path, mnist5k_prepared: Any, monkeypatch: pytest.MonkeyPatch, head_epochs: int
) -> None:
    params = _weights_params(weights, head_epochs, monkeypatch)
    assert params.pretrain.epochs == 3
    history = pretrain(params, mnist5k_prepared.prepared, CPU).history
    assert [row["epoch"] for row in history] == list(range(1, head_epochs + 1))


def test_no_head_fit_measures_the_start_on_validation(
    weights: Path, mnist5k_prepared: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared = mnist5k_prepared.prepared
    result = pretrain(_weights_params(weights, 0, monkeypatch), prepared, CPU)
    model = result.posterior.build_model()
    [row] = result.history
    measured = {}
    for split in ("val", "test"):
        data = getattr(prepared, split)
        loss, acc = loss_and_accuracy(model, Tensors(result.posterior.model_input(data.x), data.y))
        measured[split] = (loss.item(), acc.item())
    assert measured["val"] != measured["test"]  # the two splits tell apart
    assert (row["val_loss"], row["val_accuracy"]) == pytest.approx(measured["val"], rel=1e-6)
    assert row["epoch"] == 0
