"""``monitor.every`` / ``monitor.fraction``: cheaper curves, the same results.

Monitoring reads the network in eval mode and draws no random numbers, so
thinning it changes the curves and nothing else: every posterior is bitwise
the one of a run monitored every epoch on every image.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pipeline_repo import small_params

from bayesavg.config import parse_params
from bayesavg.posteriors.file import PosteriorFile, save_posterior
from bayesavg.runtime.io import write_csv
from bayesavg.training.batches import Tensors
from bayesavg.training.monitoring import Monitoring, row_line
from bayesavg.training.precision import Precision
from bayesavg.training.train import loss_and_accuracy
from bayesavg.trajectories import finetune, pretrain_members

CPU = torch.device("cpu")


def _params(every: int = 1, fraction: float = 1.0) -> Any:
    raw = small_params(epochs=3, pretrain_epochs=1, members=1)
    raw["monitor"] = {"every": every, "fraction": fraction}
    return parse_params(raw)


@pytest.fixture(scope="module")
def start(mnist5k_prepared: Any) -> PosteriorFile:
    return pretrain_members(_params(), mnist5k_prepared.prepared, CPU).posterior


def test_due_epochs_and_the_fixed_subset() -> None:
    m = Monitoring(every=3, fraction=0.25, seed=7)
    assert [e for e in range(1, 11) if m.due(e, 10)] == [3, 6, 9, 10]
    rows = m.rows(100, CPU)
    assert rows is not None and len(rows) == 25
    assert torch.equal(rows, rows.sort().values) and len(set(rows.tolist())) == 25
    assert torch.equal(rows, Monitoring(every=1, fraction=0.25, seed=7).rows(100, CPU))
    assert not torch.equal(rows, Monitoring(fraction=0.25, seed=8).rows(100, CPU))
    assert Monitoring().rows(100, CPU) is None
    assert len(Monitoring(fraction=0.001).rows(100, CPU)) == 1
    with pytest.raises(ValueError):
        Monitoring(every=0)


@pytest.mark.parametrize("name", ["swag", "vi"])
def test_thinner_monitoring_leaves_the_posterior_bitwise(
    name: str, start: PosteriorFile, mnist5k_prepared: Any, tmp_path: Path
) -> None:
    prepared = mnist5k_prepared.prepared
    full = finetune(_params(), name, prepared, start, CPU)
    thin = finetune(_params(every=2, fraction=0.3), name, prepared, start, CPU)
    for result, file in ((full, "full.pt"), (thin, "thin.pt")):
        save_posterior(tmp_path / file, result.posterior)
    assert (tmp_path / "full.pt").read_bytes() == (tmp_path / "thin.pt").read_bytes()
    for a, b in zip(full.history, thin.history, strict=True):
        assert a["train_loss"] == b["train_loss"] and a["epoch"] == b["epoch"]
    monitored = [row["epoch"] for row in thin.history if "val_loss" in row]
    assert monitored == [2, 3]
    assert all("test_loss" in row for row in full.history)
    # the curves are of fewer images, so they move, but not far at 30% of them
    a, b = full.history[-1], thin.history[-1]
    assert a["test_loss"] != b["test_loss"]
    assert abs(a["test_accuracy"] - b["test_accuracy"]) < 0.1


def test_monitoring_runs_at_the_training_precision(mnist5k_prepared: Any) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    prepared = mnist5k_prepared.prepared
    data = Tensors(prepared.val.x.float().div(255), prepared.val.y)
    fp32, _ = loss_and_accuracy(model, data)
    again, _ = loss_and_accuracy(model, data, precision=Precision())
    bf16, _ = loss_and_accuracy(model, data, precision=Precision("bf16"))
    assert fp32.item() == again.item()
    assert fp32.item() != bf16.item() and abs(fp32.item() - bf16.item()) < 0.02 * fp32.item()


def test_a_history_with_unmonitored_epochs_writes_empty_cells(tmp_path: Path) -> None:
    rows = [{"epoch": 1, "train_loss": 0.5}, {"epoch": 2, "train_loss": 0.25, "val_loss": 0.75}]
    write_csv(tmp_path / "h.csv", rows)
    lines = (tmp_path / "h.csv").read_text().splitlines()
    assert lines == ["epoch,train_loss,val_loss", "1,0.5,", "2,0.25,0.75"]


def test_an_epoch_s_log_line_leaves_out_what_does_not_exist_yet() -> None:
    """The running average has no metrics before its first snapshot: its NaN stays in the
    history (one column per metric) but not in the log line, where 'nan' read as a fault."""
    row = {"epoch": 3, "lr": 0.05, "train_loss": 0.123456, "avg_test_loss": float("nan")}
    row["seconds"] = 1.5
    assert row_line(row) == "lr=0.05, train_loss=0.1235"
    assert row_line({"val_accuracy": 0.9, "avg_test_accuracy": 0.875}) == (
        "val_accuracy=0.9, avg_test_accuracy=0.875"
    )
