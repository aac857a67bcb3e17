"""``bayesavg evaluate --temperature``: the pipeline's temperature-scaled predictors (map_ts,
swa_ts) outside the pipeline, fitted exactly as the evaluate stage fits them."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from PIL import Image
from pipeline_repo import ROOT, default_params

from bayesavg.cli import main
from bayesavg.config import parse_params
from bayesavg.data.prepared import Prepared, load_eval_split
from bayesavg.evaluation.evaluate import Evaluation, bn_inputs, evaluate, needs_bn_data
from bayesavg.posteriors.file import PosteriorFile, load_posterior, save_posterior
from bayesavg.predictors.calibration import fit_temperature
from bayesavg.seeding import derive_seed
from bayesavg.training.distributed import World

if TYPE_CHECKING:
    from conftest import ImageFolderFactory, PreparedDir, TinyPosteriors

PIPELINE_SEED = 0  # params.yaml's seed, which the fixtures' posteriors record as the data seed


def _args(posterior: Path, predictor: str, data: str, out: Path, *extra: str) -> list[str]:
    return [
        *["evaluate", "--posterior", str(posterior), "--predictor", predictor],
        *["--data", data, "--out", str(out), "--device", "cpu", *extra],
    ]


def _run_ok(args: list[str], out: Path) -> dict[str, Any]:
    main(args)
    return json.loads(out.read_text())


def _stage_predict(
    posterior: PosteriorFile, name: str, data: Prepared, monkeypatch: pytest.MonkeyPatch
) -> tuple[float, dict[str, Evaluation]]:
    """The evaluate stage's own ``predict`` (stages/evaluate.py) for a predictor with
    ``temperature: fit``, under the repo's params.yaml, on one CPU process: its test and
    val predictions (BatchNorm images drawn as the stage draws them) and its fitted T."""
    monkeypatch.syspath_prepend(str(ROOT / "stages"))  # for its `_common`
    # under a name of its own: benchmarks/ has an `evaluate` module too
    spec = importlib.util.spec_from_file_location("stage_evaluate", ROOT / "stages/evaluate.py")
    assert spec is not None and spec.loader is not None
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    monkeypatch.setattr(stage, "TEMPERATURES", {})
    p = parse_params(default_params())
    assert p.seed == PIPELINE_SEED and p.evaluate.by_name[name].temperature == "fit"
    cpu = torch.device("cpu")
    method = p.evaluate.by_name[name].method
    bn_x = None
    if posterior.has_batchnorm and needs_bn_data(method):
        bn_x = bn_inputs(posterior, data.train, p.evaluate.bn_update_fraction, p.seed, cpu)
    splits = {
        split: (posterior.inputs(part.x, cpu), part.y)
        for split, part in (("test", data.test), ("val", data.val))
    }
    found = stage.Inputs(data, posterior, bn_x, splits, data.test, [], {}, [])
    results = stage.predict(p, name, found, World(0, 1, cpu), cpu)
    return stage.TEMPERATURES[name], results


def test_the_val_split_is_the_data_stages(mnist5k_prepared: PreparedDir) -> None:
    """``load_eval_split(..., 'val', ...)`` recomputes the prepared val split, order included."""
    prepared = mnist5k_prepared.prepared
    val = load_eval_split("mnist5k", "unused-raw-dir", (1, 28, 28), "val", 0, 0.2, 0.1)
    assert torch.equal(val.x, prepared.val.x) and torch.equal(val.y, prepared.val.y)


@pytest.mark.parametrize(("name", "method"), [("map_ts", "map"), ("swa_ts", "swa")])
def test_fit_on_val_reproduces_the_pipelines_predictor(
    tiny_posteriors: TinyPosteriors,
    bn_swag_posterior: Path,
    mnist5k_prepared: PreparedDir,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    method: str,
) -> None:
    """``--temperature fit --val mnist5k`` with the stage's seed gives the stage's fitted T
    and its tempered test metrics, bitwise (swa_ts: BatchNorm recomputed on the same
    images in the fit and in the tempered evaluation)."""
    path = tiny_posteriors.plain if method == "map" else bn_swag_posterior
    posterior = load_posterior(path)
    assert posterior.has_batchnorm == (method == "swa")
    temperature, stage = _stage_predict(posterior, name, mnist5k_prepared.prepared, monkeypatch)

    out = tmp_path / "m.json"
    seed = str(derive_seed(PIPELINE_SEED, "evaluate", name))
    args = _args(path, method, "mnist5k", out, "--raw-dir", str(tmp_path), "--seed", seed)
    got = _run_ok([*args, "--temperature", "fit", "--val", "mnist5k"], out)
    assert got["temperature"] == temperature
    assert got["temperature_fitted_on"] == "mnist5k"
    assert {k: got[k] for k in stage["test"].metrics} == stage["test"].metrics
    untempered = _run_ok(args, out)
    assert "temperature" not in untempered
    assert untempered["nll"] != got["nll"], "the fitted T changes the predictive"


def test_fit_on_an_imagefolder_uses_all_of_it(
    tiny_posteriors: TinyPosteriors, mnist5k_prepared: PreparedDir, tmp_path: Path
) -> None:
    """``--val imagefolder:<DIR>``: T is fitted on every image of the folder."""
    val = mnist5k_prepared.prepared.val
    picked = torch.cat([torch.nonzero(val.y == c).flatten()[:20] for c in range(10)])
    root = tmp_path / "val_digits"
    for i in picked.tolist():
        folder = root / str(int(val.y[i]))
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(val.x[i, 0].numpy()).save(folder / f"{i:04d}.png")
    posterior = load_posterior(tiny_posteriors.plain)
    # The folder is read in label order, then file name order: the order of ``picked``
    # within each class, which ``picked`` already is class by class.
    images = (posterior.model_input(val.x[picked]), val.y[picked])
    plain = evaluate(posterior, "map", {"val": images})
    expected = fit_temperature(plain["val"].log_probs, val.y[picked])

    out = tmp_path / "m.json"
    spec = f"imagefolder:{root}"
    args = _args(tiny_posteriors.plain, "map", "mnist5k", out, "--raw-dir", str(tmp_path))
    got = _run_ok([*args, "--temperature", "fit", "--val", spec], out)
    assert got["temperature"] == expected
    assert got["temperature_fitted_on"] == spec


@pytest.mark.parametrize("predictor", ["map", "swa"])
def test_a_given_temperature_tempers_the_predictive(
    tiny_posteriors: TinyPosteriors, mnist5k_prepared: PreparedDir, tmp_path: Path, predictor: str
) -> None:
    """``--temperature T`` is ``evaluate(temperature=T)``, bitwise; T = 1 renormalises an
    already normalised predictive, so it leaves the metrics equal to the last bits."""
    posterior = load_posterior(tiny_posteriors.swag)
    test = mnist5k_prepared.prepared.test
    split = {"test": (posterior.model_input(test.x), test.y)}
    direct = evaluate(posterior, predictor, split, n_samples=3, seed=0, temperature=2.5)
    out = tmp_path / "m.json"
    args = _args(tiny_posteriors.swag, predictor, "mnist5k", out, "--samples", "3")
    args += ["--raw-dir", str(tmp_path)]
    got = _run_ok([*args, "--temperature", "2.5"], out)
    assert got["temperature"] == 2.5 and "temperature_fitted_on" not in got
    assert {k: got[k] for k in direct["test"].metrics} == direct["test"].metrics

    plain = _run_ok(args, out)
    assert set(plain) == {*direct["test"].metrics, "predictor", "data", "seed"}
    one = _run_ok([*args, "--temperature", "1"], out)
    assert one.pop("temperature") == 1.0
    assert one.keys() == plain.keys()
    for key, value in plain.items():
        close = value if isinstance(value, str) else pytest.approx(value, rel=1e-12, abs=1e-15)
        assert one[key] == close, key


def _zero_posterior(tiny_posteriors: TinyPosteriors, tmp_path: Path) -> Path:
    """All weights zero: a uniform predictive, whose tempered NLL is flat in T."""
    post = load_posterior(tiny_posteriors.plain)
    path = tmp_path / "zero.pt"
    save_posterior(path, dataclasses.replace(post, theta=torch.zeros_like(post.theta)))
    return path


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--temperature", "fit"], "--temperature fit: needs --val"),
        (["--val", "mnist5k"], "--val: only used with --temperature fit"),
        (["--temperature", "2", "--val", "mnist5k"], "--val: only used with --temperature fit"),
        (["--temperature", "0"], "--temperature: 'fit' or a finite number > 0"),
        (["--temperature", "-1.5"], "--temperature: 'fit' or a finite number > 0"),
        (["--temperature", "warm"], "--temperature: 'fit' or a finite number > 0"),
        (["--temperature", "nan"], "--temperature: 'fit' or a finite number > 0"),
        (["--temperature", "inf"], "--temperature: 'fit' or a finite number > 0"),
        (["--temperature", "fit", "--val", "twelve"], "has labels up to 11"),
        (["--temperature", "fit", "--val", "zero"], "the predictive is degenerate"),
        (["--temperature", "2", "swag"], "--predictor swag averages several"),
    ],
    ids=[
        *["fit_no_val", "val_no_fit", "val_with_t", "zero", "negative", "word", "nan", "inf"],
        *["val_labels", "degenerate_fit", "several_networks"],
    ],
)
def test_user_errors_exit_2_with_one_line(
    tiny_posteriors: TinyPosteriors,
    imagefolder_factory: ImageFolderFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    expected: str,
) -> None:
    posterior, predictor, images = tiny_posteriors.plain, "map", imagefolder_factory()
    if extra[-1] == "swag":
        posterior, predictor, extra = tiny_posteriors.swag, "swag", extra[:-1]
    elif extra[-1] == "twelve":
        twelve = imagefolder_factory(num_classes=12, per_class=1, name="twelve")
        extra = [*extra[:-1], f"imagefolder:{twelve}"]
    elif extra[-1] == "zero":
        # fit_temperature refuses a flat NLL: the fit ends on the bracket's edge.
        posterior = _zero_posterior(tiny_posteriors, tmp_path)
        extra = [*extra[:-1], f"imagefolder:{images}"]
    out = tmp_path / "m.json"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(_args(posterior, predictor, f"imagefolder:{images}", out, *extra))
    assert exc.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert expected in lines[0]
    assert not out.exists()
