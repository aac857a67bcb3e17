"""``make ui``'s address: the project's experiment in the store, read without mlflow."""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline_repo import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import ui_url


def test_the_address_opens_the_params_experiment(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    (tmp_path / "params.yaml").write_text("tracking: {experiment: mine}\n")
    assert "no experiment 'mine' in mlflow.db yet" in ui_url.url(tmp_path, 5000)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    client.create_experiment("other")
    assert "no experiment 'mine'" in ui_url.url(tmp_path, 5000)
    exp_id = client.create_experiment("mine")
    assert ui_url.url(tmp_path, 5001) == (
        f"http://127.0.0.1:5001/#/experiments/{exp_id}/runs?workflowType=machine_learning"
    )
