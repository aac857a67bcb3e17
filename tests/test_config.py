"""params.yaml validation: every bad value is one clear line naming the key."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from params_edit import with_keys

from bayesavg.config import load_params, parse_params
from bayesavg.runtime.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def default_raw() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def _with(raw: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """``raw`` with one dotted key set (or deleted when value is ...)."""
    return with_keys(raw, {dotted: value})


def test_default_params_are_valid(default_raw: dict[str, Any]) -> None:
    params = load_params(ROOT / "params.yaml")
    assert params.data.dataset == "mnist5k"
    assert set(params.evaluate.by_name) >= {"map", "swa", "swag_diag", "swag"}
    assert params.finetune["swag"].collect is not None
    assert params.evaluate.by_name["swag"].effective_scale() == 0.5
    assert params.evaluate.by_name["swag_diag"].effective_scale() == 1.0
    assert params.evaluate.by_name["swag"].trajectory == "swag"
    assert params.evaluate.by_name["fedavg"].trajectory == "dswag"
    assert parse_params(default_raw) == params


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("seed", -1, "seed: Input should be greater than or equal to 0"),
        ("seed", "0", "seed: Input should be a valid integer"),
        ("seed", 2**63, "seed: Input should be less than or equal to 9223372036854775807"),
        ("seeds", [0, 2**64], "seeds.1: Input should be less than or equal to 922337203685477"),
        ("report.bootstrap.seed", 2**63, "report.bootstrap.seed: Input should be less than or"),
        ("seeds", [1, 2], "seeds: [1, 2] does not list the pipeline's seed 0, whose results"),
        ("seed", 3, "set both (-S seed=3 -S 'seeds=[3]')"),
        ("seeds", [0, 1, 1], "seeds: [0, 1, 1] lists a seed twice"),
        ("evaluate.predictors.multiswag.multiswag.n_samples", 0, "multiswag.n_samples: Input"),
        ("finetune.laplace.start", "init", "a Laplace approximation needs one trained network"),
        ("finetune.laplace.start", "ensemble", "needs one trained network (pretrain or a"),
        ("finetune.laplace.prior_precision", 0.0, "finetune.laplace.prior_precision"),
        ("finetune.laplace.epochs", 3, "unknown key 'finetune.laplace.epochs'"),
        ("finetune.multiswag.collect", None, "multiswa needs SWAG snapshots of every ensemble"),
        ("device", "tpu", "device: 'tpu' is not one of auto, cpu, cuda, cuda:N"),
        ("data.dataset", "imagenet", "data.dataset: unknown 'imagenet'"),
        ("data.val_fraction", 1.5, "data.val_fraction: Input should be less than 1"),
        ("data.test_fraction", "0.2", "data.test_fraction: Input should be a valid number"),
        ("model.name", "resnet50", "model.name: unknown model 'resnet50'; choose one of mlp"),
        ("pretrain.epochs", 0, "pretrain.epochs: Input should be greater than or equal to 1"),
        ("pretrain.schedule.kind", "step", "pretrain.schedule.kind: Input should be"),
        ("pretrain.schedule.lr", float("nan"), "pretrain.schedule.lr"),
        ("pretrain.momentum", 1.0, "pretrain.momentum: Input should be less than 1"),
        ("finetune.swag.collect.max_rank", 1, "finetune.swag.collect.max_rank: Input should be"),
        ("finetune.swag.collect.start_epoch", 10, "finetune.swag.collect.start_epoch: must be <"),
        ("finetune.swag.schedule", {"kind": "cyclic", "lr": 0.05, "lr_end": 0.0}, "lr_end"),
        ("evaluate.n_samples", 0, "evaluate.n_samples: Input should be greater than or equal to 1"),
        ("evaluate.bn_update_fraction", 0.0, "evaluate.bn_update_fraction"),
        ("evaluate.predictors.nope", {"p": {"method": "map"}}, "'nope' is not a finetune traj"),
        ("evaluate.predictors.swag.swag.method", "laplace", "evaluate.predictors.swag.swag.method"),
        ("evaluate.predictors.swag.swag.trajectory", "swag", "unknown key 'evaluate.predictors"),
        ("evaluate.predictors.vi", {}, "evaluate.predictors.vi: no predictors; list one"),
        ("evaluate.predictors.vi.swa", {"method": "vi"}, "'swa' is also listed under swag"),
        (
            "evaluate.predictors.mine",
            {"trajectory": "swag", "method": "swa"},
            "listed under their trajectory: evaluate.predictors.swag.mine: {method: swa}",
        ),
        ("finetune.swag.collect", None, "finetune.swag is kind sgd with no 'collect' section"),
        ("finetune.swag.start", "nowhere", "finetune.swag.start: 'nowhere' is not pretrain"),
        ("finetune.swag.kind", "vi", "finetune.swag.vi: a vi trajectory needs a 'vi' section"),
        ("finetune.sgd.reset_to_average", True, "reset_to_average: only hwa trajectories"),
        ("finetune.dswag.clients", 0, "finetune.dswag.clients: Input should be greater than"),
        ("finetune.dswag.split.kind", "skewed", "finetune.dswag.split.kind: Input should be"),
        ("finetune.dswag.phase1.client_fraction", 0.0, "finetune.dswag.phase1.client_fraction"),
        ("finetune.dswag.phase2.snapshots_per_client", 9, "snapshots_per_client: at most epochs"),
        ("finetune.dswag.epochs", 10, "unknown key 'finetune.dswag.epochs'"),
        ("finetune.dswag.start", "nowhere", "finetune.dswag.start: 'nowhere' is not pretrain"),
        ("evaluate.dswag_sweep.trajectory", "swag", "'swag' is not a finetune trajectory of kind"),
        ("evaluate.dswag_sweep.workers", [5, 5], "evaluate.dswag_sweep.workers: each number"),
        ("finetune.dswag.start", "pretrain", "dswag must start from init (the sweep"),
        ("finetune.init", {"start": "pretrain"}, "finetune.init: the name 'init' is a stage's"),
        (
            "evaluate.landscape.rays.centres",
            ["ensemble"],
            "'ensemble' is not a finetune trajectory",
        ),
        ("evaluate.landscape.lines.sgd_swag.b", "nope", "lines.sgd_swag.b: 'nope' is not a"),
        ("evaluate.landscape.swag.trajectories", ["vi"], "'vi' is not a finetune trajectory that"),
        ("evaluate.landscape.rays.distances.start", 1.0, "rays start at the centre"),
        ("evaluate.landscape.t.stop", -2.0, "evaluate.landscape.t.stop: must exceed start"),
        ("evaluate.shift.angles", [0.0, 400.0], "evaluate.shift.angles.1: Input should be less"),
        ("evaluate.ood.sets", ["animal_mnist", "animal_mnist"], "each OOD set once"),
        ("report.bootstrap.resamples", 999, "report.bootstrap.resamples: Input should be"),
        (  # naming every one-network method, Laplace's mean included, as the CLI's help
            "evaluate.predictors.swag.swag.temperature",
            "fit",
            "evaluate.predictors.swag.swag: temperature scaling tempers one network's "
            "predictive; method swag averages several networks (use it with map, swa, laplace)",
        ),
        ("evaluate.predictors.sgd.map_ts.temperature", 1.5, "map_ts.temperature: Input should"),
    ],
)
def test_bad_value_names_key(
    default_raw: dict[str, Any], key: str, value: Any, expected: str
) -> None:
    with pytest.raises(UserError) as err:
        parse_params(_with(default_raw, key, value))
    message = str(err.value)
    assert expected in message
    assert message.startswith("params.yaml: ")
    assert "\n" not in message


def test_the_sweep_owns_its_model_names(default_raw: dict[str, Any]) -> None:
    raw = _with(default_raw, "finetune.dswag_sweep", copy.deepcopy(default_raw["finetune"]["sgd"]))
    with pytest.raises(UserError, match=r"finetune\.dswag_sweep: the name is the worker sweep's"):
        parse_params(raw)


def test_dswag_snapshots_need_not_fill_a_swag_predictor(default_raw: dict[str, Any]) -> None:
    """One explorer with one snapshot is a valid trajectory for map and swa (no variance)."""
    raw = _with(default_raw, "finetune.dswag.phase2.client_fraction", 0.05)
    raw["finetune"]["dswag"]["phase2"]["snapshots_per_client"] = 1
    raw["evaluate"]["predictors"] = {
        "dswag": {"fedavg": {"method": "map"}, "dswa": {"method": "swa"}},
    }
    raw["finetune"].pop("fedavg_swag")
    swag = raw["evaluate"]["landscape"]["swag"]
    swag["trajectories"] = ["swag", "dswag"]
    with pytest.raises(UserError, match=r"swag\.trajectories: 'dswag' has 1 snapshot"):
        parse_params(raw)
    swag["trajectories"] = ["swag"]
    params = parse_params(raw)
    assert params.finetune["dswag"].snapshots() == 1
    raw["evaluate"]["predictors"]["dswag"]["dswag"] = {"method": "swag"}
    with pytest.raises(
        UserError, match=r"finetune\.dswag\.phase2: evaluate\.predictors\.dswag\.dswag "
    ):
        parse_params(raw)


def test_unknown_key_is_rejected(default_raw: dict[str, Any]) -> None:
    with pytest.raises(UserError, match=r"unknown key 'finetune\.swag\.colect'"):
        parse_params(_with(default_raw, "finetune.swag.colect", {"max_rank": 3}))


def test_missing_required_section(default_raw: dict[str, Any]) -> None:
    with pytest.raises(UserError, match="missing key 'evaluate'"):
        parse_params(_with(default_raw, "evaluate", ...))


def test_bool_is_not_an_int(default_raw: dict[str, Any]) -> None:
    with pytest.raises(UserError, match=r"pretrain\.epochs"):
        parse_params(_with(default_raw, "pretrain.epochs", True))


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read"):
        load_params(tmp_path / "missing.yaml")
    bad = tmp_path / "params.yaml"
    bad.write_text("seed: [1,\n")
    with pytest.raises(UserError, match="not valid YAML at line 2, column 1: expected"):
        load_params(bad)
    bad.write_text("seed: 0\nevaluate:\n\tece_bins: 15\n")
    with pytest.raises(UserError, match=r"at line 3, column 1: found character '\\t'"):
        load_params(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(UserError, match="top level must be a mapping"):
        load_params(bad)


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    """PyYAML would keep the last value silently (and DVC's own reader refuses the file)."""
    bad = tmp_path / "params.yaml"
    bad.write_text("seed: 0\nevaluate:\n  ece_bins: 20\n  ece_bins: 15\n")
    with pytest.raises(UserError) as refused:
        load_params(bad)
    assert str(refused.value) == (
        f"{bad}: not valid YAML at line 4, column 3: key 'ece_bins' given twice (lines 3 and 4)"
    )


def test_a_nan_is_named_as_not_finite(default_raw: dict[str, Any]) -> None:
    with pytest.raises(UserError, match=r"^params.yaml: data.test_fraction: must be a finite"):
        parse_params(_with(default_raw, "data.test_fraction", float("nan")))


def test_snapshot_count(default_raw: dict[str, Any]) -> None:
    raw = _with(default_raw, "finetune.swag.epochs", 4)
    raw = _with(raw, "finetune.swag.schedule", {"kind": "constant", "lr": 0.01})
    raw = _with(raw, "finetune.swag.collect", {"start_epoch": 1, "every": 0, "max_rank": 5})
    traj = parse_params(raw).finetune["swag"]
    assert traj.snapshots(iters_per_epoch=10) == 3
    raw = _with(raw, "finetune.swag.collect", {"start_epoch": 1, "every": 4, "max_rank": 5})
    # every 4 steps counted from the run's first step: after steps 12, 16, ..., 40
    assert parse_params(raw).finetune["swag"].snapshots(iters_per_epoch=10) == 8
    cyclic = {"kind": "cyclic", "lr": 0.05, "lr_end": 0.005, "cycle_length": 6}
    raw = _with(raw, "finetune.swag.schedule", cyclic)
    raw = _with(raw, "finetune.swag.collect", {"start_epoch": 1, "every": 0, "max_rank": 5})
    assert parse_params(raw).finetune["swag"].snapshots(iters_per_epoch=10) == 5


def _resolve(dotted: str, raw: dict[str, Any]) -> str:
    if dotted in ("key", "item"):
        return "${" + dotted + "}"
    node: Any = raw
    for part in dotted.split("."):
        node = node[part]
    return str(node)


def test_every_dvc_param_exists_in_params_yaml(default_raw: dict[str, Any]) -> None:
    """DVC fails on a params key missing from params.yaml even when the schema has a default."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        body = stage.get("do", stage)
        keys = [
            k
            for entry in body.get("params", [])
            for k in ([entry] if isinstance(entry, str) else entry)
        ]
        items = {
            "finetune": default_raw["finetune"],
            "evaluate": default_raw["evaluate"]["predictors"],
            "plane": default_raw["evaluate"]["plane"]["trajectories"],
            "line": default_raw["evaluate"]["landscape"]["lines"],
        }
        for key in keys:
            # A value interpolated from params (not the foreach item) is resolved first.
            key = re.sub(r"\$\{([a-z_.]+)\}", lambda m: _resolve(m[1], default_raw), key)
            templated = "${key}" in key or "${item}" in key
            for item in items.get(name, [None]) if templated else [None]:
                node: Any = default_raw
                for part in (
                    key.replace("${key}", str(item)).replace("${item}", str(item)).split(".")
                ):
                    assert isinstance(node, dict) and part in node, f"{name}: {key} ({item})"
                    node = node[part]
