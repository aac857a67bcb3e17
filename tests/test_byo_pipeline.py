"""Bring your own network and data, end to end and offline (issue §5): a torchvision
resnet18 from a local weights file (random, saved by the test) with a new head fitted
alone, on an ``imagefolder:`` of generated 64x64 RGB images in three classes, through
SWAG, MultiSWAG, a last-layer Laplace, temperature scaling, evaluation and the report;
and a factory network of the repository's ``networks/`` folder, whose edits rerun every
stage that builds the model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from pipeline_repo import DVC, default_params, env, make_repo, prune_landscape, sh

from bayesavg.models import build_model
from bayesavg.posteriors.file import load_posterior

ROOT = Path(__file__).resolve().parents[1]
PREDICTORS = {
    "swag": {
        "swa": {"method": "swa"},
        "swa_ts": {"method": "swa", "temperature": "fit"},
        "swag": {"method": "swag", "scale": 0.5},
    },
    "multiswag": {"multiswag": {"method": "multiswag", "scale": 0.5, "n_samples": 2}},
    "laplace": {"laplace": {"method": "laplace"}},
}


def write_images(root: Path, per_class: int = 14, size: int = 64) -> Path:
    """RGB PNGs of three classes, each a brighter band in its own colour channel."""
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / str(c)).mkdir(parents=True)
        for i in range(per_class):
            img = rng.integers(0, 90, (size, size, 3), dtype=np.uint8)
            img[8 * c : 8 * c + 16, :, c] += 150
            Image.fromarray(img).save(root / str(c) / f"{i}.png")
    return root


def _trajectory(**extra: Any) -> dict[str, Any]:
    out = {
        "start": "pretrain",
        "epochs": 2,
        "batch_size": 8,
        "momentum": 0.9,
        "weight_decay": 0.0005,
        "schedule": {"kind": "constant", "lr": 0.01},
        "collect": {"start_epoch": 0, "every": 0, "max_rank": 2},
    }
    return {**out, **extra}


def byo_params(raw: dict[str, Any], images: Path, model: dict[str, Any]) -> dict[str, Any]:
    """The default params on ``images``, three trajectories, small budgets, no analyses."""
    raw["device"] = "cpu"
    raw["data"].update(dataset=f"imagefolder:{images}", test_fraction=0.2, val_fraction=0.2)
    raw["data"]["augment"] = {"crop_padding": 0, "flip": True, "resized_crop": True}
    raw["model"] = {"code": "networks", "weights": None, **model}
    raw["pretrain"].update(epochs=1, batch_size=8, members=2)
    raw["finetune"] = {
        "swag": _trajectory(),
        "multiswag": _trajectory(kind="ensemble", members=2),
        "laplace": {"kind": "laplace", "start": "swag", "prior_precision": 1.0, "batch_size": 8},
    }
    e = raw["evaluate"]
    e.update(n_samples=2, batch_size=16, predictors=PREDICTORS)
    e["sharpness"].update(n_points=8, probes=1)
    e["plane"]["trajectories"] = []
    e["dswag_sweep"].update(workers=[], trajectory="swag")  # dvc.yaml names its params
    e["shift"].update(n_points=6, angles=[0.0, 90.0], corruptions=["brightness"])
    e["ood"]["sets"] = []
    e["landscape"]["n_points"] = 8
    raw["report"]["bootstrap"]["resamples"] = 1000
    return prune_landscape(raw)


@pytest.mark.slow  # ~3 minutes on 2 cores: resnet18 through 12 stages
def test_a_pretrained_torchvision_model_on_an_image_folder(tmp_path: Path) -> None:
    images = write_images(tmp_path / "images")
    torch.manual_seed(7)
    weights = tmp_path / "resnet18.pt"
    imagenet = build_model("torchvision:resnet18", (3, 64, 64), 1000).state_dict()
    torch.save(imagenet, weights)
    raw = byo_params(
        default_params(), images, {"name": "torchvision:resnet18", "weights": str(weights)}
    )
    raw["data"]["image_size"] = 56
    raw["pretrain"].update(kind="weights", head_epochs=1)
    (tmp_path / "repo").mkdir()
    repo = make_repo(tmp_path / "repo", raw)
    environ = env(MLFLOW_TRACKING_URI=f"sqlite:///{repo / 'mlflow.db'}")
    proc = sh(repo, DVC, "repro", environ=environ)
    assert "report" in proc.stdout
    manifest = json.loads((repo / "data/prepared/manifest.json").read_text())
    assert manifest["input_shape"] == [3, 56, 56] and manifest["resize_size"] == 64
    pre = load_posterior(repo / "models/pretrain/posterior.pt")
    assert pre.model_name == "torchvision:resnet18" and pre.samples is not None
    members = pre.samples["theta"]
    head = slice(-(512 * 3 + 3), None)  # fc is the last parameter block
    assert not torch.equal(members[0][head], members[1][head])  # heads seeded per member
    body = torch.cat([v.flatten() for k, v in imagenet.items() if k.startswith("conv1.")])
    assert torch.equal(members[0][: body.numel()], body)  # the weights, frozen in the fit
    assert torch.equal(members[1][: body.numel()], body)
    for traj, group in PREDICTORS.items():
        for name in group:
            metrics = json.loads((repo / "metrics/evaluate" / traj / f"{name}.json").read_text())
            assert 0 <= metrics["accuracy"] <= 1 and metrics["n"] == 9  # 3 per class held out
    out = tmp_path / "cli.json"
    cli = [str(Path(DVC).parent / "bayesavg"), "evaluate", "--posterior"]
    cli += [str(repo / "models/swag/posterior.pt"), "--predictor", "swag", "--samples", "2"]
    sh(repo, *cli, "--data", f"imagefolder:{images}", "--out", str(out), environ=environ)
    assert json.loads(out.read_text())["n"] == 42
    assert (repo / "reports" / "report.html").stat().st_size > 0
    assert "changed" not in sh(repo, DVC, "status", environ=environ).stdout


@pytest.mark.slow  # ~25 s: dvc repro finetune@swag on streamed arrays, then dvc status
def test_editing_the_factory_reruns_the_stages_that_build_the_model(tmp_path: Path) -> None:
    """Also the data stage's streamed storage under DVC: training reads the arrays."""
    images = write_images(tmp_path / "images", per_class=6, size=16)
    model = {"factory": "networks.example:small_cnn", "options": {"width": 4}}
    raw = byo_params(default_params(), images, model)
    raw["data"]["augment"] = {"crop_padding": 2, "flip": True}
    raw["data"]["storage"] = "stream"  # and the split streamed from a DVC-tracked array
    (tmp_path / "repo").mkdir()
    repo = make_repo(tmp_path / "repo", raw)
    environ = env(MLFLOW_TRACKING_URI=f"sqlite:///{repo / 'mlflow.db'}")
    sh(repo, DVC, "repro", "finetune@swag", environ=environ)
    manifest = json.loads((repo / "data/prepared/manifest.json").read_text())
    assert manifest["storage"] == "stream" and (repo / "data/prepared/train.x.npy").is_file()
    post = load_posterior(repo / "models/swag/posterior.pt")
    assert post.model_name == "factory:networks.example:small_cnn"
    assert post.model_kwargs == {"width": 4} and post.collector is not None
    assert (
        sh(repo, DVC, "status", "finetune@swag", environ=environ)
        .stdout.strip()
        .endswith("up to date.")
    )
    factory = repo / "networks" / "example.py"
    factory.write_text(factory.read_text() + "\n# edited\n")
    status = sh(repo, DVC, "status", "--with-deps", "finetune@swag", environ=environ).stdout
    assert "pretrain:" in status and "finetune@swag:" in status and "modified:" in status
    assert "networks" in status
