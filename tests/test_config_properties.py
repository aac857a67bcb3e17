"""params.yaml as a user meets it: the one error line's exact form, the defaults a key
takes when left out, and exit code 2 from the validate stage (the rules themselves:
``test_config_properties_rules.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from params_edit import with_keys

from bayesavg.config import Params, load_params, parse_params
from bayesavg.runtime.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
# The least params.yaml the schema takes: every other key is its default.
LEAST: dict[str, Any] = {
    "finetune": {"sgd": {"start": "pretrain"}},
    "evaluate": {"predictors": {"sgd": {"map": {"method": "map"}}}},
}


@pytest.fixture(scope="module")
def default_raw() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def _with(raw: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``with_keys`` with the dotted keys as keywords (``__`` for the dots)."""
    return with_keys(raw, {k.replace("__", "."): v for k, v in changes.items()})


def _refusal(raw: dict[str, Any]) -> str:
    """The line ``parse_params`` refuses ``raw`` with (one line, always)."""
    with pytest.raises(UserError) as refused:
        parse_params(raw)
    line = str(refused.value)
    assert "\n" not in line
    return line


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        (
            {"channels_last": "x"},
            "params.yaml: channels_last: Input should be 'auto' or a valid boolean (got 'x')",
        ),
        (
            {"finetune__laplace__prior_precision": 0.0},
            "params.yaml: finetune.laplace.prior_precision: Input should be 'marglik' or "
            "greater than 0 (got 0.0)",
        ),
        (
            {"finetune__laplace__prior_precision": "flat"},
            "params.yaml: finetune.laplace.prior_precision: Input should be 'marglik' or a "
            "valid number (got 'flat')",
        ),
    ],
)
def test_a_union_key_is_named_with_every_form_it_takes(
    default_raw: dict[str, Any], changes: dict[str, Any], line: str
) -> None:
    """Regression: the line named pydantic's union member (``channels_last.literal['auto']``)
    and only that member's rule, as if ``true`` / a number were not allowed."""
    assert _refusal(_with(default_raw, **changes)) == line


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        (
            {"evaluate__shift__angles": [0.0, float("nan")]},
            "params.yaml: evaluate.shift.angles.1: must be a finite number (got nan)",
        ),
        (
            {"evaluate__dswag_sweep__sigma_multiples": [1.0, float("inf")]},
            "params.yaml: evaluate.dswag_sweep.sigma_multiples.1: must be a finite number "
            "(got inf)",
        ),
        (
            {"evaluate__landscape__swag__sigma_multiples": [float("inf")]},
            "params.yaml: evaluate.landscape.swag.sigma_multiples.0: must be a finite number "
            "(got inf)",
        ),
    ],
)
def test_a_nan_or_inf_inside_a_list_is_not_finite(
    default_raw: dict[str, Any], changes: dict[str, Any], line: str
) -> None:
    """Regression: an inf multiple of sigma was accepted (every sampled weight inf), and a
    NaN angle was refused as 'less than or equal to 360'."""
    assert _refusal(_with(default_raw, **changes)) == line


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        (
            {"data__augment__flip2": True},
            "params.yaml: unknown key 'data.augment.flip2'; remove it or fix its spelling",
        ),
        ({"evaluate__predictors__sgd__map": {}}, "params.yaml: missing key "),
        (
            {"finetune__swag__collect": [1]},
            "params.yaml: finetune.swag.collect: Input should be a valid dictionary or "
            "instance of Collect",
        ),
        (
            {"finetune__dswag__clients": 0},
            "params.yaml: finetune.dswag.clients: Input should be greater than or equal to 1 "
            "(got 0)",
        ),
        (
            {"finetune__laplace__batch_size": 0},
            "params.yaml: finetune.laplace.batch_size: Input should be greater than or equal "
            "to 1 (got 0)",
        ),
        (
            {"data__test_fraction": 0.5, "data__val_fraction": 0.45},
            "params.yaml: data: test_fraction + val_fraction must leave at least 10% for training",
        ),
        (
            {"model__name": "lenet5", "model__batch_norm": True},
            "params.yaml: model.batch_norm: only mlp takes it (lenet5 has its own "
            "normalisation or none)",
        ),
    ],
)
def test_the_line_names_the_key_as_params_yaml_spells_it(
    default_raw: dict[str, Any], changes: dict[str, Any], line: str
) -> None:
    """Union tags (``dswag``, ``laplace``) are not keys; a validator's own ``key:`` joins
    its section's; a mapping or list is not echoed as ``(got ...)``, a scalar is."""
    found = _refusal(_with(default_raw, **changes))
    if line.endswith("missing key "):
        assert found == "params.yaml: missing key 'evaluate.predictors.sgd.map.method'"
    else:
        assert found == line


def _leaves(node: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    if isinstance(node, dict) and node:
        return [leaf for k, v in node.items() for leaf in _leaves(v, (*path, k))]
    return [(path, node)]


def _value(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj[key] if isinstance(obj, dict) else getattr(obj, key)
    return obj.model_dump() if hasattr(obj, "model_dump") else obj


# Keys params.yaml sets to the experiment's own value, not the schema's default.
CHOSEN = {
    "data.val_fraction",
    "model.dropout",
    "pretrain.epochs",
    "pretrain.members",
    "evaluate.plane.trajectories",
    "evaluate.plane.n_points",
    "evaluate.dswag_sweep.workers",
    "evaluate.landscape.lines",
    "evaluate.landscape.rays.centres",
    "evaluate.landscape.rays.directions",
    "evaluate.landscape.rays.distances.stop",
    "evaluate.landscape.rays.distances.points",
    "evaluate.landscape.swag.trajectories",
    "report.title",
    "report.notes",
}


def test_a_key_left_out_takes_the_value_params_yaml_shows(default_raw: dict[str, Any]) -> None:
    """params.yaml writes out the defaults it documents in its comments: deleting such a
    key changes nothing. Trajectories and predictors are the experiment's own."""
    least = parse_params(LEAST)
    differ = []
    for path, value in _leaves({k: v for k, v in default_raw.items() if k != "finetune"}):
        dotted = ".".join(path)
        if path[:2] == ("evaluate", "predictors") or dotted.startswith(tuple(CHOSEN)):
            continue
        if _value(least, path) != value:
            differ.append(f"{dotted}: params.yaml {value!r}, default {_value(least, path)!r}")
    assert differ == []


def test_the_documented_top_level_defaults(default_raw: dict[str, Any]) -> None:
    """README's tables and params.yaml's comments: what a key left out means."""
    least = parse_params(LEAST)
    assert (least.seed, least.seeds, least.device, least.precision) == (0, [0], "auto", "fp32")
    assert (least.channels_last, least.compile, least.cuda_graphs) == ("auto", False, False)
    assert least.deterministic is True
    assert (least.monitor.every, least.monitor.fraction, least.checkpoint.every) == (1, 1.0, 1)
    assert least.data.augment.model_dump() == {
        "crop_padding": 0,
        "flip": False,
        "resized_crop": False,
    }
    assert (least.data.dataset, least.data.storage, least.model.code) == (
        "mnist5k",
        "auto",
        "networks",
    )
    assert (least.data.test_fraction, least.data.val_fraction) == (0.2, 0.1)
    documented = (ROOT / "params.yaml").read_text().split("val_fraction:")[1].split("raw_dir:")[0]
    assert "# 0.1 if left out" in documented
    assert (least.tracking.experiment, least.report.bootstrap.resamples) == ("bayesavg", 2000)
    assert least.report.title == "bayesavg report"
    assert Params.model_fields["finetune"].is_required()


def test_the_trajectory_kinds_defaults() -> None:
    """What a new trajectory of each kind gets for the keys it leaves out."""
    raw = _with(
        LEAST,
        finetune__d={"kind": "dswag"},
        finetune__l={"kind": "laplace", "start": "pretrain"},
    )
    params = parse_params(raw)
    sgd, dswag, laplace = (params.finetune[k] for k in ("sgd", "d", "l"))
    assert sgd.model_dump(exclude={"start"}) == {
        "epochs": 10,
        "batch_size": 64,
        "momentum": 0.9,
        "weight_decay": 5e-4,
        "compile": None,
        "cuda_graphs": None,
        "kind": "sgd",
        "schedule": {
            "kind": "constant",
            "lr": 0.01,
            "lr_end": 0.0,
            "cycle_length": 100,
            "decay_epochs": None,
        },
        "collect": None,
        "sam_rho": 0.0,
        "vi": None,
        "reset_to_average": False,
        "dropout": None,
        "members": None,
        "posterior": None,
    }
    assert dswag.model_dump() == {
        "kind": "dswag",
        "start": "init",
        "clients": 10,
        "split": {"kind": "iid", "alpha": 0.5, "min_size": 1},
        "phase1": {
            "rounds": 20,
            "client_fraction": 1.0,
            "local_epochs": 1,
            "schedule": {
                "kind": "constant",
                "lr": 0.05,
                "lr_end": 0.0,
                "cycle_length": 100,
                "decay_epochs": None,
            },
            "target_accuracy": None,
        },
        "phase2": {
            "client_fraction": 1.0,
            "epochs": 10,
            "lr_start": 0.05,
            "lr_end": 0.005,
            "snapshots_per_client": 2,
        },
        "batch_size": 32,
        "momentum": 0.9,
        "weight_decay": 5e-4,
        "max_rank": 20,
        "dropout": None,
    }
    assert (laplace.prior_precision, laplace.batch_size) == ("marglik", 256)
    assert params.pretrain.schedule.model_dump() == {
        "kind": "cosine",
        "lr": 0.05,
        "lr_end": 0.0005,
        "cycle_length": 100,
        "decay_epochs": None,
    }
    vi = parse_params(
        _with(
            LEAST,
            finetune__v={"kind": "vi", "start": "pretrain", "vi": {}, "weight_decay": 0.0},
            finetune__v__momentum=0.0,
        )
    ).finetune["v"]
    assert vi.vi is not None and vi.vi.model_dump() == {
        "sigma_init": 0.001,
        "prior_sigma": 1.0,
        "mc_samples": 1,
        "kl_weight": 1.0,
        "optimizer": "adam",
    }
    collect = parse_params(_with(LEAST, finetune__sgd__collect={})).finetune["sgd"].collect
    assert collect is not None
    assert collect.model_dump() == {"start_epoch": 0, "every": 0, "max_rank": 20}


def test_the_evaluation_defaults() -> None:
    """The analyses' sizes and grids a params.yaml without them gets."""
    ev = parse_params(LEAST).evaluate
    assert (ev.n_samples, ev.batch_size, ev.bn_update_fraction, ev.ece_bins) == (30, 1000, 1.0, 20)
    assert ev.sharpness.model_dump() == {
        "rho": 0.05,
        "probes": 3,
        "n_points": 1000,
        "batch_size": None,
    }
    assert (ev.plane.grid, ev.plane.margin, ev.plane.n_points) == (21, 0.25, 1000)
    assert ev.shift.angles == [float(a) for a in range(0, 181, 15)]
    assert (ev.shift.severity, ev.shift.n_points, ev.shift.cifar_c_severities) == (
        None,
        200,
        [1, 2, 3, 4, 5],
    )
    assert (ev.ood.sets, ev.ood.n_points) == (["animal_mnist"], 1000)
    multiples = [0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
    assert ev.dswag_sweep.model_dump() == {
        "trajectory": "dswag",
        "workers": [],
        "rounds": 40,
        "target_accuracy": 0.95,
        "sigma_multiples": multiples,
        "sigma_draws": 5,
    }
    land = ev.landscape
    assert (land.n_points, land.t.values()[0], land.t.values()[-1], len(land.t.values())) == (
        1000,
        -1.0,
        2.0,
        31,
    )
    assert land.t.values()[1] == pytest.approx(-0.9)
    assert land.rays.distances.values() == [float(d) for d in range(0, 21, 2)]
    assert (land.rays.directions, land.rays.delta, land.rays.filter_normalise) == (3, 0.1, False)
    assert land.swag.offsets.values() == [float(o) for o in range(-10, 11, 2)]
    assert (land.swag.directions, land.swag.sigma_multiples, land.swag.sigma_draws) == (
        2,
        multiples,
        5,
    )


def test_a_bad_key_stops_the_validate_stage_with_exit_code_2(
    default_raw: dict[str, Any], tmp_path: Path
) -> None:
    """How a user meets a bad value: ``dvc repro`` runs stage validate first, which stops
    with the one line on stderr, exit code 2, no traceback and no output written."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(_with(default_raw, channels_last="x")))
    done = subprocess.run(
        [sys.executable, str(ROOT / "stages" / "validate.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "error: params.yaml: channels_last: Input should be 'auto' or a valid boolean (got 'x')\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("nosuchset", "unknown data spec 'nosuchset'"),
        ("imagefolder:{tmp}/absent", "imagefolder: {tmp}/absent is not a directory"),
    ],
)
def test_an_ood_set_no_stage_could_read_stops_the_validate_stage(
    default_raw: dict[str, Any], tmp_path: Path, spec: str, said: str
) -> None:
    """The evaluate stages would fail on it only after every training stage had run."""
    spec, said = spec.format(tmp=tmp_path), said.format(tmp=tmp_path)
    sets = ["animal_mnist", spec]
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump(_with(default_raw, evaluate__ood__sets=sets))
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "stages" / "validate.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: params.yaml: evaluate.ood.sets: OOD set {spec}: {said}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_an_unreadable_params_file_says_why(tmp_path: Path) -> None:
    """The OS's reason, not only that it failed: a missing file reads differently from a
    folder or a permission problem."""
    with pytest.raises(UserError) as refused:
        load_params(tmp_path / "missing.yaml")
    assert (
        str(refused.value) == f"cannot read {tmp_path / 'missing.yaml'}: No such file or directory"
    )
