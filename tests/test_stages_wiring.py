"""The stages' wiring that users and later stages rely on, in-process and fast: exit codes
once the tracking worker is done, one-line usage errors, the execution a stage joins, the
runs' links to the files they read and wrote, the dswag sweep's W, the seeds, validate, the
report's run, and where each writes what the report reads (helpers: test_stages_properties).

Found missing by mutation of stages/ (the end-to-end checks are `make test-slow`)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from pipeline_repo import ROOT
from test_stage_outputs import load_stage
from test_stages_properties import MANIFEST, _edit_params, _Tracked, _training_stage, common

__all__ = ["common"]  # the fixture


# --- the dswag sweep, the landscape, the seeds, the report ---------------------------


def _sweep_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    import bayesavg.data.prepared
    import bayesavg.posteriors.file

    stage = load_stage("dswag_sweep", tmp_path, monkeypatch)
    monkeypatch.setattr(bayesavg.posteriors.file, "load_posterior", lambda path: None)
    monkeypatch.setattr(bayesavg.data.prepared, "load_prepared", lambda path: None)
    monkeypatch.setattr(sys, "argv", ["stages/dswag_sweep.py"])
    return stage


def test_the_dswag_sweep_trains_each_w_on_w_clients_and_writes_where_the_report_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> None:
    from bayesavg.runtime.errors import UserError

    stage = _sweep_stage(tmp_path, monkeypatch)
    report = load_stage("report", tmp_path, monkeypatch)
    seen: list[tuple[int, str, Any]] = []
    monkeypatch.setattr(
        stage, "_point", lambda p, w, name, traj, *rest: seen.append((w, name, traj))
    )
    stage.run()
    sweep = common.params().evaluate.dswag_sweep
    base = common.params().finetune[sweep.trajectory]
    assert [(w, name) for w, name, _ in seen] == [(w, f"dswag_w{w}") for w in sweep.workers]
    for w, _, traj in seen:
        assert traj.clients == w
        assert (traj.phase1.rounds, traj.phase1.target_accuracy) == (
            sweep.rounds,
            sweep.target_accuracy,
        )
        same = {"clients", "phase1"}
        assert traj.model_dump(exclude=same) == base.model_dump(exclude=same)
    assert stage.point_outputs("dswag", 5) == [
        Path("models/dswag_sweep/w5"),
        report.SWEEP_PLOTS / "rounds" / "5.csv",
        report.SWEEP_PLOTS / "sigma_distance" / "5.csv",
        report.SWEEP_METRICS / "5.json",
    ]
    monkeypatch.setattr(sys, "argv", ["stages/dswag_sweep.py", "7"])
    with pytest.raises(UserError, match=r"^usage: dswag_sweep.py \[<workers>\], one of 1, 5,"):
        stage.run()
    # `dswag_sweep.py 5` rewrites W=5's files and leaves every other W's as they were
    for w in (1, 5):
        for path in stage.point_outputs("dswag", w):
            file = path if path.suffix else path / "posterior.pt"
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(f"old {w}\n")

    def point(p: Any, w: int, *rest: Any) -> None:
        Path("metrics/dswag_sweep", f"{w}.json").write_text("new\n")

    monkeypatch.setattr(stage, "_point", point)
    monkeypatch.setattr(sys, "argv", ["stages/dswag_sweep.py", "5"])
    stage.run()
    assert Path("metrics/dswag_sweep/5.json").read_text() == "new\n"
    assert not Path("models/dswag_sweep/w5").exists(), "W=5's earlier files are gone"
    for path in stage.point_outputs("dswag", 1):
        file = path if path.suffix else path / "posterior.pt"
        assert file.read_text() == "old 1\n"


def test_a_sweep_or_landscape_with_nothing_listed_leaves_the_empty_folders_dvc_expects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> None:
    sweep = _sweep_stage(tmp_path, monkeypatch)
    landscape = load_stage("landscape", tmp_path, monkeypatch)

    def nothing(raw: dict[str, Any]) -> None:
        ev = raw["evaluate"]
        ev["dswag_sweep"]["workers"] = []
        ev["plane"]["trajectories"] = []
        ev["landscape"]["lines"] = {}
        ev["landscape"]["rays"]["centres"] = []
        ev["landscape"]["swag"]["trajectories"] = []

    _edit_params(nothing)
    sweep.run()
    monkeypatch.setattr(sys, "argv", ["stages/landscape.py"])
    landscape.run()
    folders = [f.parent for f in sweep.point_outputs("dswag", 1)]
    folders += [landscape.PLOTS, landscape.METRICS, landscape.PLANES]
    assert all(f.is_dir() and not any(f.iterdir()) for f in folders)


def test_landscape_probes_read_their_posteriors_and_write_where_the_report_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> None:
    stage = load_stage("landscape", tmp_path, monkeypatch)
    report = load_stage("report", tmp_path, monkeypatch)
    tracked = _Tracked()
    monkeypatch.setattr(stage, "tracked", tracked)
    monkeypatch.setattr(sys, "argv", ["stages/landscape.py"])
    for kind in stage.KINDS:
        monkeypatch.setitem(stage.RUNNERS, kind, lambda p, name: ({}, {}, []))
    stage.run()
    land = common.params().evaluate.landscape
    post = stage._posterior_file
    for opened in tracked.opened:
        kind, name = opened["stage"].split("@")
        files = (
            [post(land.lines[name].a), post(land.lines[name].b)] if kind == "line" else [post(name)]
        )
        assert opened["inputs"] == [MANIFEST, *files]
    assert {o["stage"] for o in tracked.opened} >= {"plane@hwa", "swag_directions@swag"}
    plots, metrics = report.LANDSCAPE_PLOTS, report.LANDSCAPE_METRICS
    assert stage._unit_outputs("plane", "hwa") == [report.PLANES / "hwa"]
    assert stage._unit_outputs("swag_directions", "swag") == [
        plots / "swag" / "swag",
        metrics / "swag" / "swag.json",
    ]
    for kind in ("line", "rays"):
        assert stage._unit_outputs(kind, "n") == [plots / kind / "n.csv", metrics / kind / "n.json"]


@pytest.mark.parametrize("step", ["finetune", "evaluate"])
def test_a_replicated_seed_runs_at_its_seed_and_the_own_seed_only_marks_itself(
    step: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> None:
    """The pipeline's own seed writes a marker and reads nothing; another seed trains or
    predicts with that seed; a seed not listed is one line."""
    from bayesavg.runtime.errors import UserError

    stage = load_stage("replicate", tmp_path, monkeypatch)
    _edit_params(lambda raw: raw.update(seeds=[raw["seed"], 3]))
    tracked, seen = _Tracked(), []
    monkeypatch.setattr(stage, "tracked", tracked)

    def finetune(ps: Any, out: Path) -> None:
        seen.append((ps.seed, out))
        for name in ("a", "b"):
            (out / name).mkdir(parents=True)
            (out / name / "posterior.pt").write_text(name)

    monkeypatch.setattr(stage, "_finetune", finetune)
    monkeypatch.setattr(
        stage, "_evaluate", lambda ps, models, out, run: seen.append((ps.seed, out))
    )
    own = common.params().seed
    for seed in (own, 3):
        monkeypatch.setattr(sys, "argv", ["stages/replicate.py", step, str(seed)])
        stage.run()
    out = "models" if step == "finetune" else "results"
    marker = Path("seeds") / str(own) / out / "pipeline.json"
    assert json.loads(marker.read_text()) == {"seed": own, "source": "pipeline"}
    assert seen == [(3, Path("seeds/3") / out)]
    assert [(o["stage"], o["inputs"]) for o in tracked.opened] == [
        (f"{step}_seed@{own}", []),
        (f"{step}_seed@3", [MANIFEST]),
    ]
    if step == "finetune":  # the run names every file it wrote, for later stages' links
        [_, (marked,)] = [args for _, op, args in tracked.calls if op == "mark_outputs"]
        assert list(marked) == [f"seeds/3/models/{n}/posterior.pt" for n in ("a", "b")]
    monkeypatch.setattr(sys, "argv", ["stages/replicate.py", step, "7"])
    with pytest.raises(UserError, match=r"^seed 7 is not one of seeds: \[0, 3\]$"):
        stage.run()


def test_validate_marks_valid_params_and_a_bad_shift_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runs/validate.json is what every other stage depends on (dvc.yaml)."""
    from bayesavg.runtime.errors import UserError

    load_stage("report", tmp_path, monkeypatch)  # the scratch folder, params.yaml
    spec = importlib.util.spec_from_file_location("stage_validate", ROOT / "stages/validate.py")
    assert spec is not None and spec.loader is not None
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    stage.run()
    assert json.loads(Path("runs/validate.json").read_text()) == {"params": "valid"}
    _edit_params(lambda raw: raw["evaluate"]["shift"].update(corruptions=["no_such"]))
    with pytest.raises(UserError, match=r"^params.yaml: evaluate.shift: unknown corruption"):
        stage.run()


def test_the_report_tags_its_upstream_runs_and_weighs_the_evaluated_predictors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> None:
    """The report's run links every other stage's run in the ledger (not validate's),
    and the registry weighs the predictors whose evaluate run is known, by val NLL."""
    stage = load_stage("report", tmp_path, monkeypatch)
    _edit_params(lambda raw: (d := raw["evaluate"]["predictors"]).update(sgd=d.pop("sgd")))
    tracked, p = _Tracked(), common.params()  # map listed last: still the baseline
    monkeypatch.setattr(stage, "tracked", tracked)
    written: list[Any] = []
    monkeypatch.setattr(stage, "write_report", lambda inputs, out: written.append(inputs) or {})
    for i, (name, pred) in enumerate(p.evaluate.by_name.items()):
        files = common.predictor_files(pred.trajectory, name)
        for f in files[:3]:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps({"val": {"nll": 1.0 + i}}) if f.suffix == ".json" else "a\n1\n")
    for t in ["pretrain", *(f"finetune/{t}" for t in p.finetune)]:
        Path("plots", f"{t}.csv").parent.mkdir(parents=True, exist_ok=True)
        Path("plots", f"{t}.csv").write_text("epoch\n1\n")
    Path("seeds/0/results").mkdir(parents=True)
    Path("seeds/0/results/pipeline.json").write_text("{}")
    splits = {s: {"n": 1} for s in ("train", "val", "test")}
    MANIFEST.parent.mkdir(parents=True)
    MANIFEST.write_text(json.dumps({"dataset": "m 5", "splits": splits, "input_shape": [1]}))
    Path("runs").mkdir()
    first, second = list(p.evaluate.by_name)[:2]
    for name, run in (("data", "d"), (f"evaluate@{first}", "e1"), (f"evaluate@{second}", "e2")):
        Path("runs", f"{name}.json").write_text(json.dumps({"stage": name, "run_id": run}))
    Path("runs/validate.json").write_text(json.dumps({"stage": "validate", "run_id": "v"}))
    stage.run()
    [opened] = tracked.opened
    assert written[0].baseline == "map"
    assert opened["tags"] == {
        "upstream.data": "d",
        f"upstream.evaluate@{first}": "e1",
        f"upstream.evaluate@{second}": "e2",
    }
    [(_, _, (name, candidates))] = [c for c in tracked.calls if c[1] == "register_best"]
    assert name == "bayesavg-m_5"
    assert candidates == {
        first: {"run_id": "e1", "val_nll": 1.0},
        second: {"run_id": "e2", "val_nll": 2.0},
    }


class _Left(Exception):
    """``_leave`` called: the process would end here."""


def test_a_stage_leaves_once_its_tracking_worker_is_done_and_an_error_with_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    common: ModuleType,
) -> None:
    """``main``: the worker carries out the last calls (else lost, the run KILLED) and the
    id file gets its ``finish``, then exit 0; a UserError is one line and exit code 2."""
    import _bootstrap

    from bayesavg.runtime.errors import UserError

    events: list[object] = []

    def leave(code: object) -> None:
        events.append(code)
        raise _Left

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(common, "_leave", leave)
    monkeypatch.setattr(
        _bootstrap, "tracker", SimpleNamespace(close=lambda: events.append("close"))
    )
    record: dict[str, Any] = {"run_id": "r", "seconds": {"compute": 1.0, "finish": 0.0}}
    monkeypatch.setattr(common._Ledger, "last", (Path("last.json"), record))
    with pytest.raises(_Left):
        common.main(lambda: events.append("ran"))
    assert events == ["ran", "close", 0] and _bootstrap.tracker is None
    assert set(json.loads(Path("last.json").read_text())["seconds"]) == {"compute", "finish"}

    def bad() -> None:
        raise UserError("params.yaml: wrong")

    events.clear()
    with pytest.raises(_Left):
        common.main(bad)
    assert events == [2]
    assert capsys.readouterr().err == "error: params.yaml: wrong\n"


def test_a_stage_s_command_line_is_checked_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> None:
    from bayesavg.runtime.errors import UserError

    wrong = {
        "finetune": (["swag", "extra"], r"^usage: finetune.py <trajectory>, one of "),
        "evaluate": (["swag", "swa", "x"], r"^usage: evaluate.py <trajectory> \[<predictor>\]"),
        "landscape": (["plane", "nope"], r"^landscape.py plane: 'nope' is not listed in "),
    }
    wrong["evaluate_one"] = (["swag", "map"], r"^evaluate.py swag: 'map' is not one of its")
    for name, (args, said) in wrong.items():
        stage = load_stage(name.split("_")[0], tmp_path, monkeypatch)
        monkeypatch.setattr(sys, "argv", [f"stages/{name}.py", *args])
        with pytest.raises(UserError, match=said):
            stage.run()


def test_an_evaluate_run_reads_the_trajectory_s_posterior(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> None:
    """Inputs (upstream links): manifest, posterior; logged: the seed it samples with."""
    import bayesavg.evaluation.evaluate
    from bayesavg.seeding import derive_seed

    stage = load_stage("evaluate", tmp_path, monkeypatch)
    tracked, seeds = _Tracked(), []
    monkeypatch.setattr(stage, "tracked", tracked)

    def stop(*args: Any, seed: int, **kwargs: Any) -> None:
        seeds.append(seed)
        raise _Left

    monkeypatch.setattr(bayesavg.evaluation.evaluate, "evaluate", stop)
    found = SimpleNamespace(posterior=None, bn_x=None, splits={}, ood={})
    with pytest.raises(_Left):
        stage._predictor(common.params(), "swag_diag", found, None, "cpu")
    [opened] = tracked.opened
    assert opened["stage"] == "evaluate@swag_diag"
    assert opened["inputs"] == [MANIFEST, Path("models/swag/posterior.pt")]
    assert opened["logged"]["sampling_seed"] == derive_seed(0, "evaluate", "swag_diag")
    assert seeds == [opened["logged"]["sampling_seed"]]


def test_the_data_stage_links_its_manifest_and_splits_to_its_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> None:
    """Later stages find the data run by its manifest's digest; weights' (mean, std)."""
    import bayesavg.data.prepared
    import bayesavg.data.pretrained_inputs
    from bayesavg.runtime.io import sha256_file

    stage = load_stage("data", tmp_path, monkeypatch)
    tracked, seen = _Tracked(), {}
    monkeypatch.setattr(stage, "tracked", tracked)
    weights = bayesavg.data.pretrained_inputs.WeightsTransforms([0.1], [0.2], 256, 224)
    monkeypatch.setattr(bayesavg.data.pretrained_inputs, "transforms_of", lambda spec: weights)
    splits = {"train": {"file": "train.pt", "sha256": "ab", "n": 3}}

    def prepare(*args: Any) -> SimpleNamespace:
        seen["normalise"] = args[7]
        MANIFEST.parent.mkdir(parents=True)
        MANIFEST.write_text(json.dumps({"dataset": "m", "splits": splits}))
        return SimpleNamespace(manifest={"splits": splits})

    monkeypatch.setattr(bayesavg.data.prepared, "prepare", prepare)
    stage.run()
    assert seen["normalise"] == ([0.1], [0.2])
    calls = {op: args for _, op, args in tracked.calls}
    assert calls["mark_outputs"] == ({str(MANIFEST): sha256_file(MANIFEST)},)
    assert calls["log_datasets"] == (common.prepared_datasets(MANIFEST),)
    assert calls["log_metrics"] == ({"n_train": 3},)


def test_pretrain_interrupted_in_init_leaves_no_half_set_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> None:
    """A Ctrl-C while init is written leaves neither network (earlier files back) but the
    checkpoint, which the rerun continues from. (A regression: pretrain's files stayed,
    its checkpoint already gone.)"""
    import bayesavg.trajectories

    stage, trainer, _ = _training_stage("pretrain", tmp_path, monkeypatch, common)
    Path("metrics").mkdir()
    Path("metrics/pretrain.json").write_text("earlier\n")

    def stopped(*args: Any) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(bayesavg.trajectories, "initial_network", stopped)
        with pytest.raises(KeyboardInterrupt):
            stage.run()
    assert sorted(str(p) for p in Path().rglob("*") if p.is_file()) == [
        "checkpoints/pretrain.pt",
        str(MANIFEST),
        "metrics/pretrain.json",
        "models/pretrain/posterior.pt",  # the earlier one (_training_stage), back
        "params.yaml",
    ]
    assert Path("metrics/pretrain.json").read_text() == "earlier\n"
    assert Path("models/pretrain/posterior.pt").read_text() == "start"
    common._digests.clear()
    stage.run()
    assert trainer.resumed == [None, {"epoch": 1}]
    assert Path("models/init/posterior.sha256").is_file()
    assert not Path("checkpoints/pretrain.pt").exists()
