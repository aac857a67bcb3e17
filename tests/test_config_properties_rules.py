"""params.yaml's rules, each at its edge: the value just past it is refused with the exact
line a user reads, the value on it is accepted; and what the validated params compute
(scales, sample counts, snapshot counts, dropout) as the stages read it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from params_edit import with_keys

from bayesavg.config import Grid, ModelParams, parse_params
from bayesavg.runtime.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
DEPTH = (
    "model.depth: preresnet depth must be 6n+2 below 44 (basic blocks) or 9n+2 "
    "from 44 on (bottlenecks), e.g. 20, 56, 110, 164; got "
)
CODE = "model.code: a folder inside the repository, e.g. networks; got "
FACTORY = "networks.tiny:build"


@pytest.fixture(scope="module")
def default_raw() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


CONSTANT = {"kind": "constant", "lr": 0.01}
WEIGHTS = "pretrain.kind: weights starts from model.weights, and model.weights is read only by it"
REFUSED: list[tuple[dict[str, Any], str]] = [
    (
        {"finetune.swag.schedule": CONSTANT, "finetune.swag.collect.start_epoch": 9},
        "finetune.swag.collect.start_epoch: evaluate.predictors.swag.swag needs >= 2 snapshots; "
        "collect from an earlier epoch or set collect.every",
    ),
    ({"model.name": "torchvision:resnet18", "model.weights": "ResNet18_Weights.DEFAULT"}, WEIGHTS),
    ({"model.name": "torchvision:resnet18", "pretrain.kind": "weights"}, WEIGHTS),
    ({"checkpoint.every": -1}, "checkpoint.every: Input should be greater than or equal to 0"),
    ({"finetune.2sgd": {"start": "pretrain"}}, "finetune.2sgd: trajectory names are lower-case"),
    ({"finetune.Sgd": {"start": "pretrain"}}, "finetune.Sgd: trajectory names are lower-case"),
    (
        {"data.augment": {"crop_padding": 4, "resized_crop": True}},
        "data.augment.resized_crop: one crop or the other; set crop_padding: 0",
    ),
    (
        {"data.dataset": "imagefolderdata"},
        "data.dataset: unknown 'imagefolderdata'; allowed: mnist5k, mnist, fashion_mnist, "
        "cifar10, cifar100, imagefolder:<DIR>",
    ),
    (
        {"data.image_size": 32, "data.resize_size": 31},
        "data.resize_size: needs image_size, and at least as large",
    ),
    ({"data.resize_size": 32}, "data.resize_size: needs image_size, and at least as large"),
    (
        {"data.test_fraction": 0.5, "data.val_fraction": 0.45},
        "data: test_fraction + val_fraction must leave at least 10% for training",
    ),
    ({"model.dropout": 1.0}, "model.dropout: Input should be less than 1 (got 1.0)"),
    ({"model.code": "/abs/networks"}, CODE + "'/abs/networks'"),
    ({"model.code": "../networks"}, CODE + "'../networks'"),
    ({"model.code": "."}, CODE + "'.'"),
    ({"model.factory": FACTORY}, "model.factory: give model.name or model.factory, not both"),
    (
        {"model.name": ..., "model.factory": "other.tiny:build"},
        "model.factory: other.tiny:build must live under model.code (networks/), the folder "
        "every stage that builds the model depends on",
    ),
    ({"model.name": ..., "model.factory": "networks.tiny"}, "model.factory: String should"),
    (
        {"model.name": "torchvision:resnet-18"},
        "model.name: torchvision:<builder>, e.g. torchvision:resnet18; got 'torchvision:resnet-18'",
    ),
    (
        {"model.options": {"x": 1}},
        "model.options: only torchvision and factory models take them (lenet5)",
    ),
    (
        {"model.weights": "W.pt", "pretrain.kind": "weights"},
        "model.weights: pretrained weights need a torchvision or factory model, not lenet5",
    ),
    ({"model.name": "preresnet", "model.depth": 44}, DEPTH + "44"),
    ({"model.name": "preresnet", "model.depth": 2}, DEPTH + "2"),
    (
        {"model.name": "lenet5", "model.batch_norm": True},
        "model.batch_norm: only mlp takes it (lenet5 has its own normalisation or none)",
    ),
    ({"tracking.experiment": ""}, "tracking.experiment: String should have at least 1 char"),
    ({"evaluate.plane.grid": 2}, "evaluate.plane.grid: Input should be greater than or equal"),
    ({"evaluate.plane.grid": 102}, "evaluate.plane.grid: Input should be less than or equal"),
    ({"evaluate.shift.angles": [361.0]}, "evaluate.shift.angles.0: Input should be less than"),
    ({"evaluate.shift.severity": 6}, "evaluate.shift.severity: Input should be less than or"),
    ({"evaluate.shift.cifar_c_severities": [0]}, "evaluate.shift.cifar_c_severities.0: Input"),
    ({"evaluate.dswag_sweep.sigma_multiples": []}, "evaluate.dswag_sweep.sigma_multiples: at"),
    ({"evaluate.dswag_sweep.target_accuracy": 1.01}, "evaluate.dswag_sweep.target_accuracy: "),
    (
        {"evaluate.landscape.t": {"start": 0.0, "stop": 1.0, "points": 1}},
        "evaluate.landscape.t.points: Input should be greater than or equal to 2 (got 1)",
    ),
    (
        {"evaluate.landscape.t": {"start": 1.0, "stop": 1.0, "points": 2}},
        "evaluate.landscape.t.stop: must exceed start",
    ),
    (
        {"evaluate.landscape.lines.Bad": {"a": "sgd", "b": "swag"}},
        "evaluate.landscape.lines.Bad: line names are lower-case identifiers",
    ),
    ({"evaluate.bn_update_fraction": 1.5}, "evaluate.bn_update_fraction: Input should be less"),
    ({"evaluate.ece_bins": 1}, "evaluate.ece_bins: Input should be greater than or equal to 2"),
    ({"monitor.fraction": 1.5}, "monitor.fraction: Input should be less than or equal to 1"),
    (
        {"finetune.swag.schedule": {"kind": "cosine", "lr": 0.05, "decay_epochs": 3}},
        "finetune.swag.schedule.decay_epochs: only the swag schedule takes it",
    ),
    (
        {"finetune.swag.schedule": {"kind": "cosine", "lr": 0.05, "lr_end": 0.06}},
        "finetune.swag.schedule.lr_end: must not exceed lr (0.05) for a cosine schedule",
    ),
    ({"finetune.swag.momentum": 1.0}, "finetune.swag.momentum: Input should be less than 1"),
    ({"finetune.swag.posterior": {"params": "("}}, "finetune.swag.posterior.params: not a reg"),
    (
        {"finetune.vi.weight_decay": 0.0005},
        "finetune.vi.weight_decay: must be 0 for vi/hwa; the prior (vi.prior_sigma) regularises",
    ),
    (
        {"finetune.vi.momentum": 0.9},
        "finetune.vi.momentum: Adam (vi.optimizer: adam) has its own; set it to 0 or use "
        "vi.optimizer: sgd",
    ),
    (
        {"finetune.hwa.collect": ...},
        "finetune.hwa.collect: an hwa trajectory needs a 'collect' section",
    ),
    (
        {"finetune.ensemble.members": ...},
        "finetune.ensemble.members: set it for ensemble trajectories, and only for them",
    ),
    ({"finetune.sgld.posterior": {"params": "fc"}}, "finetune.sgld.posterior: a sgld traject"),
    (
        {"finetune.ensemble.start": "sgd"},
        "finetune.ensemble.start: ensemble members start from pretraining (start: pretrain)",
    ),
    ({"finetune.sgld.momentum": 0.5}, "finetune.sgld.momentum: must be 0 for sgld (the noise"),
    ({"finetune.sgld.collect": ...}, "finetune.sgld.collect: an sgld trajectory needs a 'coll"),
    (
        {"finetune.dswag.phase2.snapshots_per_client": 11, "finetune.dswag.phase2.epochs": 10},
        "finetune.dswag.phase2.snapshots_per_client: at most epochs (10), one per epoch at the end",
    ),
    ({"finetune.dswag.max_rank": 1}, "finetune.dswag.max_rank: Input should be greater than"),
    ({"finetune.dswag.phase1.client_fraction": 1.1}, "finetune.dswag.phase1.client_fraction:"),
    ({"device": "cuda:"}, "device: 'cuda:' is not one of auto, cpu, cuda, cuda:N"),
    ({"seeds": [0, 0]}, "seeds: [0, 0] lists a seed twice"),
    (
        {"device": "cpu", "precision": "fp16"},
        "precision: fp16 needs a CUDA device; use bf16 or fp32 on the CPU",
    ),
    (
        {"finetune.ensemble.members": 4},
        "finetune.ensemble.members: 4 members need pretrain.members >= 4 (it is 3)",
    ),
    (
        {"finetune.loop": {"start": "loop"}},
        "finetune.loop.start: 'loop' is not pretrain, init or another trajectory",
    ),
    (
        {"finetune.chain": {"start": "hwa"}},
        "finetune.chain.start: hwa must itself start from pretrain or init",
    ),
    ({"finetune.hwa.start": "swag"}, "finetune.hwa.start: hwa continues a vi trajectory"),
    (
        {"evaluate.plane.trajectories": ["sgd"]},
        "evaluate.plane.trajectories: 'sgd' is not a finetune trajectory that collects snapshots",
    ),
    (
        {"finetune.swag.posterior": {"params": "fc"}},
        "finetune.swag.posterior: the loss plane and the SWAG directions need a posterior over "
        "every parameter; drop swag from evaluate.plane / evaluate.landscape.swag, or "
        "posterior.params",
    ),
    (
        {"evaluate.predictors.sgd.Map": {"method": "map"}},
        "evaluate.predictors.sgd.Map: predictor names are lower-case identifiers",
    ),
    (
        {"evaluate.predictors.sgd.mc": {"method": "mc_dropout"}},
        "evaluate.predictors.sgd.mc.method: mc_dropout needs dropout; set finetune.sgd.dropout "
        "(or model.dropout) above 0",
    ),
    (
        {"evaluate.predictors.sgd.map.scale": 0.5},
        "evaluate.predictors.sgd.map.scale: map has no covariance scale; remove the key",
    ),
    (
        {"evaluate.predictors.sgld.sw": {"method": "swa"}},
        "evaluate.predictors.sgld.sw.method: swa needs SWAG snapshots (an sgd trajectory with "
        "'collect'), but finetune.sgld is kind sgld",
    ),
    (
        {"evaluate.predictors.swag.v": {"method": "vi"}},
        "evaluate.predictors.swag.v.method: vi needs a variational posterior (a vi or hwa "
        "trajectory), but finetune.swag is kind sgd",
    ),
    (
        {"evaluate.predictors.sgd.sw": {"method": "swa"}},
        "evaluate.predictors.sgd.sw.method: swa needs SWAG snapshots (an sgd trajectory with "
        "'collect'), but finetune.sgd is kind sgd with no 'collect' section",
    ),
]


@pytest.mark.parametrize(("changes", "said"), REFUSED)
def test_a_value_past_a_rule_is_refused_in_one_line_naming_the_key(
    default_raw: dict[str, Any], changes: dict[str, Any], said: str
) -> None:
    """The line starts with ``params.yaml: <key>: `` and says what is allowed."""
    with pytest.raises(UserError) as refused:
        parse_params(with_keys(default_raw, changes))
    line = str(refused.value)
    assert line.startswith("params.yaml: " + said), line
    assert "\n" not in line


ACCEPTED: list[dict[str, Any]] = [
    {"finetune.swag.schedule": CONSTANT, "finetune.swag.collect.start_epoch": 8},
    {
        "model.name": "torchvision:resnet18",
        "model.weights": "ResNet18_Weights.DEFAULT",
        "pretrain.kind": "weights",
    },
    {"data.dataset": "imagefolder:data/mine"},
    {"data.image_size": 32, "data.resize_size": 32},
    {"data.test_fraction": 0.5, "data.val_fraction": 0.4},
    {"model.name": "mlp", "model.batch_norm": True},
    {"model.name": ..., "model.factory": FACTORY},
    {"model.name": ..., "model.factory": "deep.tiny:build", "model.code": "deep"},
    {"model.name": "torchvision:resnet18", "model.options": {"x": 1}},
    {"model.name": "preresnet", "model.depth": 8},
    {"model.name": "preresnet", "model.depth": 38},
    {"model.name": "preresnet", "model.depth": 47},
    {"evaluate.plane.grid": 3},
    {"evaluate.plane.grid": 101},
    {"evaluate.shift.angles": [0.0, 360.0]},
    {"evaluate.shift.severity": 5},
    {"evaluate.dswag_sweep.target_accuracy": 1.0},
    {"evaluate.bn_update_fraction": 1.0},
    {"evaluate.ece_bins": 2},
    {"monitor.fraction": 1.0},
    {"finetune.swag.schedule": {"kind": "cosine", "lr": 0.05, "lr_end": 0.05}},
    {"finetune.swag.schedule": {"kind": "constant", "lr": 0.05, "lr_end": 0.06}},
    {"finetune.swag.collect.max_rank": 2},
    {"finetune.swag.collect.start_epoch": 9},
    {"finetune.dswag.phase2.snapshots_per_client": 10, "finetune.dswag.phase2.epochs": 10},
    {"finetune.dswag.phase1.client_fraction": 1.0},
    {"device": "cuda:12", "precision": "fp16"},
    {"finetune.ensemble.members": 3},
    {"finetune.chain": {"start": "fswag"}},
    {"evaluate.predictors.swag.swag.scale": 0.0},
    {"evaluate.predictors.hwa.hwa_as_vi": {"method": "vi"}},
]


@pytest.mark.parametrize("changes", ACCEPTED)
def test_a_value_on_the_edge_of_a_rule_is_accepted(
    default_raw: dict[str, Any], changes: dict[str, Any]
) -> None:
    """Each bound is the documented one, not one step inside it."""
    parse_params(with_keys(default_raw, changes))


def test_scales_and_sample_counts_are_the_predictors_own_else_the_defaults(
    default_raw: dict[str, Any],
) -> None:
    """README: swag_diag at scale 1, swag at 0.5; a predictor's own scale and S win."""
    raw = with_keys(
        default_raw,
        {
            "evaluate.predictors.swag.swag.scale": 0.3,
            "evaluate.predictors.swag.swag.n_samples": 7,
        },
    )
    by_name = parse_params(raw).evaluate.by_name
    assert by_name["swag"].effective_scale() == 0.3
    assert by_name["swag_diag"].effective_scale() == 1.0
    assert by_name["swag"].samples_or(30) == 7
    assert by_name["swag_diag"].samples_or(30) == 30


@pytest.mark.parametrize(
    ("collect", "schedule", "epochs"),
    [
        ({"start_epoch": 0}, {"kind": "constant"}, 3),
        ({"start_epoch": 1, "every": 1}, {"kind": "constant"}, 3),
        ({"start_epoch": 2, "every": 7}, {"kind": "constant"}, 5),
        ({"start_epoch": 1}, {"kind": "cyclic", "lr_end": 0.001, "cycle_length": 6}, 4),
    ],
)
def test_the_snapshot_count_is_how_many_steps_collect(
    default_raw: dict[str, Any], collect: dict[str, Any], schedule: dict[str, Any], epochs: int
) -> None:
    """``snapshots`` (what the posterior file is sized for) counts exactly the steps
    ``collects_after`` takes one after, the first at the end of epoch ``start_epoch``."""
    raw = with_keys(
        default_raw,
        {
            "finetune.swag.epochs": epochs,
            "finetune.swag.collect": {**collect, "max_rank": 5},
            "finetune.swag.schedule": {**schedule, "lr": 0.01},
        },
    )
    traj = parse_params(raw).finetune["swag"]
    steps = [i for i in range(epochs * 10) if traj.collects_after(i, iters_per_epoch=10)]
    assert len(steps) == traj.snapshots(iters_per_epoch=10) > 0
    assert steps[0] >= collect["start_epoch"] * 10
    every = collect.get("every") or schedule.get("cycle_length") or 10
    assert all((i + 1) % every == 0 for i in steps)
    if collect.get("every") == 1:
        assert steps[0] == collect["start_epoch"] * 10


def test_at_least_one_client_explores(default_raw: dict[str, Any]) -> None:
    """ALGORITHMS §8: max(1, round(fraction * clients)) clients explore in phase 2."""
    raw = with_keys(default_raw, {"finetune.dswag.phase2.client_fraction": 0.01})
    raw["finetune"]["dswag"]["phase2"]["snapshots_per_client"] = 1
    raw["evaluate"]["landscape"]["swag"]["trajectories"] = ["swag"]
    raw["finetune"].pop("fedavg_swag")
    raw["evaluate"]["predictors"].pop("fedavg_swag")
    raw["evaluate"]["predictors"]["dswag"] = {"fedavg": {"method": "map"}}
    dswag = parse_params(raw).finetune["dswag"]
    assert (dswag.explorers(), dswag.snapshots()) == (1, 1)


def test_the_dropout_a_trajectory_trainswith_keys(default_raw: dict[str, Any]) -> None:
    """Its own rate, else its start's (a trajectory started from mc_dropout keeps 0.1), else
    the model's: vgg16's own 0.5, 0 for lenet5, unknown (None) for a torchvision net."""
    raw = with_keys(default_raw, {"finetune.more": {"start": "mc_dropout"}})
    params = parse_params(raw)
    assert params.dropout_of("more") == 0.1
    assert params.dropout_of("sgd") == 0.0
    assert ModelParams(name="vgg16").effective_dropout() == 0.5
    assert ModelParams(name="vgg16_bn").effective_dropout() == 0.5
    assert ModelParams(name="lenet5").effective_dropout() == 0.0
    assert ModelParams(name="torchvision:resnet18").effective_dropout() is None


def test_a_tensorflow_ported_weights_name_gets_transform_input() -> None:
    """torchvision builds googlenet / inception_v3 with ``transform_input=True`` for their
    ImageNet weights; a local file's origin is unknown, so nothing is added."""
    named = ModelParams(name="torchvision:googlenet", weights="GoogLeNet_Weights.IMAGENET1K_V1")
    assert named.kwargs() == {"transform_input": True}
    assert ModelParams(name="torchvision:googlenet", weights="mine.pt").kwargs() == {}
    assert ModelParams(name="mlp").kwargs() == {"hidden": [512, 256]}
    assert ModelParams(name="lenet5").kwargs() == {}


def test_a_grid_is_its_points_from_start_to_stop() -> None:
    assert Grid(start=0.0, stop=1.0, points=5).values() == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_a_predictor_without_a_scale_gets_its_methods_documented_one(
    default_raw: dict[str, Any],
) -> None:
    """README / ALGORITHMS §1: swag at 0.5, swag_diag at 1; params.yaml writes the rest's
    (hwa, multiswag) out: dropping a scale params.yaml writes changes nothing."""
    written = parse_params(default_raw).evaluate.by_name
    raw = copy.deepcopy(default_raw)
    for group in raw["evaluate"]["predictors"].values():
        for entry in group.values():
            entry.pop("scale", None)
    left_out = parse_params(raw).evaluate.by_name
    assert {name: p.effective_scale() for name, p in left_out.items()} == {
        name: p.effective_scale() for name, p in written.items()
    }
    assert (left_out["swag"].effective_scale(), left_out["swag_diag"].effective_scale()) == (
        0.5,
        1.0,
    )
