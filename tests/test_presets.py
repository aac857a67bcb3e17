"""The papers' CIFAR protocol as presets (presets/*.yaml, scripts/preset.py).

The fast tests check that each preset is valid params with the SWAG paper's
numbers; the slow one (``make test-slow``) runs the CIFAR-10 preset end to end,
epochs shrunk, on 32x32 RGB images written as an ``imagefolder:``.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from PIL import Image
from pipeline_repo import BIN, DVC, ROOT, env, make_repo, sh

from bayesavg.config import parse_params

spec = importlib.util.spec_from_file_location("preset", ROOT / "scripts" / "preset.py")
preset = importlib.util.module_from_spec(spec)
spec.loader.exec_module(preset)


@pytest.mark.parametrize(
    ("name", "swa_lr", "dataset"), [("cifar10", 0.01, "cifar10"), ("cifar100", 0.05, "cifar100")]
)
def test_preset_is_the_swag_papers_protocol(name: str, swa_lr: float, dataset: str) -> None:
    raw, _ = preset.resolve(name, {})
    p = parse_params(raw)
    assert p.data.dataset == dataset
    assert (p.data.augment.crop_padding, p.data.augment.flip) == (4, True)
    assert (p.model.name, p.model.depth) == ("preresnet", 164)
    swag, sgd = p.finetune["swag"], p.finetune["sgd"]
    for traj in (swag, sgd):
        assert (traj.epochs, traj.batch_size, traj.momentum) == (300, 128, 0.9)
        assert traj.weight_decay == 0.0003 and traj.schedule.kind == "swag"
        assert traj.schedule.lr == 0.1
    assert swag.schedule.lr_end == swa_lr and swag.schedule.decay_epochs == 161
    assert (swag.collect.start_epoch, swag.collect.every, swag.collect.max_rank) == (161, 0, 20)
    assert sgd.schedule.lr_end == pytest.approx(0.01 * sgd.schedule.lr)
    assert sgd.schedule.decay_epochs is None  # over all 300 epochs
    assert p.evaluate.n_samples == 30
    assert p.evaluate.by_name["swag"].effective_scale() == 0.5
    assert p.finetune["fswag"].sam_rho > 0
    multi = p.finetune["multiswag"]  # MultiSWAG: the swag rates from each pretrained member
    assert multi.members == 3 and multi.schedule.lr_end == swa_lr
    assert multi.collect.start_epoch == multi.schedule.decay_epochs == 161 - p.pretrain.epochs
    assert {"map_ts", "swa_ts", "laplace", "laplace_mc", "multiswag"} <= set(p.evaluate.by_name)


def test_cifar100_differs_from_cifar10_only_where_it_says() -> None:
    ten, _ = preset.resolve("cifar10", {})
    hundred, _ = preset.resolve("cifar100", {})
    assert hundred["finetune"]["swag"]["schedule"]["lr_end"] == 0.05
    hundred["finetune"]["swag"]["schedule"]["lr_end"] = 0.01
    hundred["finetune"]["fswag"]["schedule"]["lr_end"] = 0.01
    hundred["finetune"]["multiswag"]["schedule"]["lr_end"] = 0.01
    # the flat-seeking paper's SAM radius: 0.05 on CIFAR-10, 0.1 on CIFAR-100 (ALGORITHMS §5)
    flat = [k for k, t in ten["finetune"].items() if isinstance(t, dict) and t.get("sam_rho")]
    assert set(flat) == {"fswag", "fvi", "fhwa", "f_mc_dropout", "f_ensemble", "f_sgld"}
    for name in flat:
        assert (ten["finetune"][name]["sam_rho"], hundred["finetune"][name]["sam_rho"]) == (
            0.05,
            0.1,
        )
        hundred["finetune"][name]["sam_rho"] = 0.05
    assert (ten["evaluate"]["sharpness"]["rho"], hundred["evaluate"]["sharpness"]["rho"]) == (
        0.05,
        0.1,
    )
    hundred["evaluate"]["sharpness"]["rho"] = 0.05
    for key in ("tracking", "report"):
        hundred[key] = ten[key]
    hundred["data"]["dataset"] = "cifar10"
    assert hundred["evaluate"]["ood"]["sets"] == ["cifar10", "svhn"]  # not itself
    hundred["evaluate"]["ood"]["sets"] = ["cifar100", "svhn"]
    assert hundred == ten


@pytest.mark.parametrize("name", preset.names())
def test_a_preset_has_every_param_the_pipeline_reads(name: str) -> None:
    """DVC reads each stage's params from params.yaml and stops at the first stage whose
    key is missing ('Parameters ... are missing'): a preset must hold every key
    dvc.yaml names, even where the defaults would do."""
    raw, _ = preset.resolve(name, {})
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    missing = set()
    for stage in stages.values():
        body = stage.get("do", stage)
        for key in body.get("params", []):
            if not isinstance(key, str) or "$" in key:
                continue
            node: Any = raw
            for part in key.split("."):
                if not isinstance(node, dict) or part not in node:
                    missing.add(key)
                    break
                node = node[part]
    assert not missing, f"presets/{name}.yaml lacks {sorted(missing)}"


def test_applying_a_preset_keeps_its_comments(tmp_path: Path) -> None:
    out = tmp_path / "params.yaml"
    assert preset.main(["cifar10", "--out", str(out)]) == 0
    assert out.read_text() == (ROOT / "presets" / "cifar10.yaml").read_text()
    assert preset.main(["cifar100", "--out", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["data"]["dataset"] == "cifar100"


def test_a_bad_preset_or_override_is_one_line_and_leaves_params_alone(tmp_path: Path) -> None:
    out = tmp_path / "cifar.yaml"
    out.write_text("untouched\n")
    said = []
    for args in (["nope"], ["cifar10", "--set", "model.depth=44"], ["cifar10", "--set", "x.y=1"]):
        proc = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "preset.py"), *args, "--out", str(out)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("error: ")
        said.append(proc.stderr)
    assert out.read_text() == "untouched\n"
    # the file being written and where its params come from, not params.yaml
    assert said[1].startswith("error: cifar.yaml from presets/cifar10.yaml: model.depth: ")


def write_images(root: Path, classes: int = 10, per_class: int = 12) -> Path:
    """32x32 RGB PNGs, each class a different dominant colour channel and band."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / str(c)
        folder.mkdir(parents=True)
        for i in range(per_class):
            img = rng.integers(0, 90, (32, 32, 3), dtype=np.uint8)
            img[3 * c : 3 * c + 3, :, c % 3] += 150
            Image.fromarray(img).save(folder / f"{i}.png")
    return root


def tiny(raw: dict[str, Any], images: Path, ood: Path) -> dict[str, Any]:
    """The preset with every budget cut to a smoke run; structure and settings kept. The
    OOD sets (CIFAR-100 and SVHN, downloads) become the image folder ``ood``: no network."""
    raw["data"]["dataset"] = f"imagefolder:{images}"
    raw["model"]["depth"] = 20
    raw["pretrain"].update(epochs=1, batch_size=16)
    for traj in raw["finetune"].values():
        traj["batch_size"] = 16
        if traj.get("kind") == "dswag":
            traj.update(clients=2)
            traj["phase1"]["rounds"] = 1
            traj["phase2"].update(epochs=1, snapshots_per_client=1)
            continue
        if traj.get("kind") == "laplace":  # a Laplace fit trains nothing
            continue
        traj["epochs"] = 2
        schedule = traj["schedule"]
        if "decay_epochs" in schedule:
            schedule["decay_epochs"] = 1
        if schedule["kind"] == "cyclic":
            schedule["cycle_length"] = 3
        if "collect" in traj:
            traj["collect"]["start_epoch"] = 0
    e = raw["evaluate"]
    e.update(n_samples=2, batch_size=64)
    for group in e["predictors"].values():  # a predictor's own count (multiswag: 3 x 10)
        for predictor in group.values():
            if "n_samples" in predictor:
                predictor["n_samples"] = 2
    e["sharpness"].update(n_points=20, probes=1)
    e["plane"].update(grid=3, n_points=20)
    e["shift"]["n_points"] = 10
    e["ood"].update(sets=[f"imagefolder:{ood}"], n_points=10)
    land = e["landscape"]
    land.update(n_points=20, t={"start": -1.0, "stop": 2.0, "points": 3})
    land["rays"].update(directions=1, distances={"start": 0.0, "stop": 4.0, "points": 3})
    land["swag"].update(offsets={"start": -1.0, "stop": 1.0, "points": 3}, sigma_draws=1)
    land["swag"]["sigma_multiples"] = [0.0, 1.0]
    raw["report"]["bootstrap"]["resamples"] = 1000
    return raw


@pytest.mark.slow
def test_cifar10_preset_runs_end_to_end(tmp_path: Path) -> None:
    images = write_images(tmp_path / "images")
    raw, _ = preset.resolve("cifar10", {})
    (tmp_path / "repo").mkdir()
    ood = write_images(tmp_path / "ood", classes=2, per_class=5)
    repo = make_repo(tmp_path / "repo", tiny(raw, images, ood))
    environ = env(MLFLOW_TRACKING_URI=f"sqlite:///{repo / 'mlflow.db'}")
    # as make run does: two stages side by side (the same bytes as one at a time)
    proc = sh(
        repo, str(BIN / "python"), str(ROOT / "scripts/repro.py"), "--jobs", "2", environ=environ
    )
    assert re.search(r"^report +\| finished in", proc.stdout, re.M), proc.stdout[-2000:]
    for traj, group in raw["evaluate"]["predictors"].items():
        for name in group:
            metrics = json.loads((repo / "metrics/evaluate" / traj / f"{name}.json").read_text())
            assert 0 <= metrics["accuracy"] <= 1 and metrics["n"] == 20  # 2 per class held out
    manifest = json.loads((repo / "data/prepared/manifest.json").read_text())
    assert manifest["input_shape"] == [3, 32, 32]
    assert (repo / "reports" / "report.html").stat().st_size > 0
    status = sh(repo, DVC, "status", environ=environ)
    assert "changed" not in status.stdout
