"""The SWA/SWAG papers' CIFAR networks: sizes, shapes and rules a trained file relies on.

Parameter counts pin the architectures to the SWAG reference code (wjmaddox/swa_gaussian);
state-dict names pin that its checkpoints load. One module-scoped WRN-28-10 keeps this fast.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from pydantic import ValidationError
from torch import nn

from bayesavg.config import DEFAULT_DROPOUT, MODEL_NAMES, ModelParams, parse_params
from bayesavg.models import (
    MODELS,
    build_model,
    dropout_modules,
    has_batchnorm,
    has_dropout,
    preresnet_blocks,
)
from bayesavg.runtime.errors import UserError

CIFAR = (3, 32, 32)
ROOT = Path(__file__).resolve().parents[1]


def _params_with_model(model: dict[str, Any]) -> dict[str, Any]:
    """The repository's params.yaml with its ``model`` section replaced."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    return {**copy.deepcopy(raw), "model": model}


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def wrn() -> nn.Module:
    torch.manual_seed(0)
    return build_model("wideresnet28x10", CIFAR, 10)


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        # He et al. 2016 / SWAG reference: "1.7M" for PreResNet-164 (bottlenecks, n = 18)
        ("preresnet", {"depth": 164}, 1_703_258),
        # the reference's PreResNet-110 and -56 are bottleneck nets (9n+2), not He's basic ones
        ("preresnet", {"depth": 110}, 1_146_842),
        ("preresnet", {"depth": 56}, 590_426),
        ("preresnet", {}, 272_282),  # depth 20: "0.27M"
        ("preresnet20", {}, 272_282),
        ("vgg16", {}, 15_245_130),  # vgg16_bn's 15,253,578 less 2 * 4224 BN parameters
    ],
)
def test_parameter_counts_match_the_reference(
    name: str, kwargs: dict[str, Any], expected: int
) -> None:
    assert _count(build_model(name, CIFAR, 10, kwargs)) == expected


def test_wideresnet_28_10_count(wrn: nn.Module) -> None:
    """36,479,194 is the published WRN-28-10 (bias-free convolutions); the SWAG reference
    gives every convolution a bias, 10,096 more parameters."""
    conv_biases = sum(m.bias.numel() for m in wrn.modules() if isinstance(m, nn.Conv2d))
    assert conv_biases == 10_096
    assert _count(wrn) == 36_489_290
    assert _count(wrn) - conv_biases == 36_479_194


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [("preresnet", {"depth": 164}), ("preresnet", {"depth": 20}), ("vgg16", {})],
)
@pytest.mark.parametrize("num_classes", [10, 100])
def test_forward_shape(name: str, kwargs: dict[str, Any], num_classes: int) -> None:
    model = build_model(name, CIFAR, num_classes, kwargs).eval()
    with torch.no_grad():
        assert model(torch.randn(2, *CIFAR)).shape == (2, num_classes)


def test_wideresnet_forward_shape(wrn: nn.Module) -> None:
    with torch.no_grad():
        out = wrn.eval()(torch.randn(2, *CIFAR))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


@pytest.mark.parametrize("depth", [8, 20, 38, 47, 56, 110, 164])
def test_valid_depths(depth: int) -> None:
    bottleneck, n = preresnet_blocks(depth)
    assert bottleneck == (depth >= 44)
    assert depth == (9 if bottleneck else 6) * n + 2


@pytest.mark.parametrize("depth", [1, 2, 21, 44, 50, 111, 165])  # 44: 6n+2, not 9n+2
def test_bad_depth_is_a_user_error_naming_the_rule(depth: int) -> None:
    with pytest.raises(UserError, match=r"6n\+2 below 44 .* 9n\+2 from 44 on") as err:
        build_model("preresnet", CIFAR, 10, {"depth": depth})
    assert str(err.value).endswith(f"got {depth}")


def test_config_depth_rule_is_the_models_rule() -> None:
    for depth in range(1, 200):
        try:
            preresnet_blocks(depth)
            valid = True
        except UserError:
            valid = False
        try:
            ModelParams(name="preresnet", depth=depth)
            accepted = True
        except ValidationError:
            accepted = False
        assert valid == accepted, depth


def test_config_depth_reaches_the_model() -> None:
    params = ModelParams(name="preresnet", depth=164)
    assert params.kwargs() == {"depth": 164}
    assert ModelParams(name="preresnet").kwargs() == {}
    model = build_model(params.name, CIFAR, 10, params.kwargs())
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == 3 * 3 * 18 + 1


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ({"name": "preresnet20", "depth": 20}, "depth: only preresnet takes it"),
        ({"name": "wideresnet28x10", "depth": 28}, "depth: only preresnet takes it"),
        ({"name": "preresnet", "depth": 50}, "depth: preresnet depth must be 6n+2"),
        ({"name": "preresnet", "depth": 0}, "depth: Input should be greater than or equal to 1"),
    ],
)
def test_config_rejects_bad_depth(model: dict[str, Any], expected: str) -> None:
    with pytest.raises(UserError) as err:
        parse_params(_params_with_model(model))
    message = str(err.value)
    assert message.startswith("params.yaml: ") and expected in message and "\n" not in message


def test_config_knows_the_new_models() -> None:
    assert set(MODEL_NAMES) == set(MODELS)
    assert DEFAULT_DROPOUT["vgg16"] == 0.5
    for name in ("preresnet", "wideresnet28x10", "vgg16"):
        assert parse_params(_params_with_model({"name": name})).model.name == name


def test_vgg16_has_no_batchnorm_and_reference_init() -> None:
    torch.manual_seed(0)
    model = build_model("vgg16", CIFAR, 10)
    assert not has_batchnorm(model)
    assert has_dropout(model) and all(m.p == 0.5 for m in dropout_modules(model))
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 13 and all(torch.count_nonzero(c.bias) == 0 for c in convs)
    last = convs[-1].weight  # 2.4 M draws: the sample std is within 0.5% of sqrt(2 / 9*512)
    assert float(last.detach().std()) == pytest.approx(math.sqrt(2 / (9 * 512)), rel=0.01)
    names = set(model.state_dict())
    assert {"features.0.weight", "features.28.bias", "classifier.6.weight"} <= names


def test_preresnet_reference_layout_and_init() -> None:
    torch.manual_seed(0)
    model = build_model("preresnet", CIFAR, 10, {"depth": 164})
    names = set(model.state_dict())
    assert {"conv1.weight", "layer1.0.downsample.0.weight", "layer3.17.conv3.weight"} <= names
    assert {"bn.weight", "fc.weight"} <= names
    conv = model.get_submodule("layer3.17.conv2").weight  # 3x3, 64 out: std sqrt(2 / 576)
    assert float(conv.detach().std()) == pytest.approx(math.sqrt(2 / 576), rel=0.02)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)


def test_preresnet20_keeps_its_own_network() -> None:
    """``preresnet20`` predates ``preresnet``: same parameter vector layout, its own init."""
    torch.manual_seed(0)
    old = build_model("preresnet20", CIFAR, 10)
    torch.manual_seed(0)
    new = build_model("preresnet", CIFAR, 10, {"depth": 20})
    assert [p.shape for p in old.parameters()] == [p.shape for p in new.parameters()]
    assert "blocks.0.conv1.weight" in old.state_dict()
    assert not torch.equal(old.get_parameter("conv.weight"), new.get_parameter("conv1.weight"))


def test_wideresnet_reference_details(wrn: nn.Module) -> None:
    bns = [m for m in wrn.modules() if isinstance(m, nn.BatchNorm2d)]
    assert [m.momentum for m in bns] == [0.1] * (len(bns) - 1) + [0.9]
    assert {"layer1.0.shortcut.0.weight", "bn1.running_mean", "linear.weight"} <= set(
        wrn.state_dict()
    )
    assert len(dropout_modules(wrn)) == 12 and not has_dropout(wrn)


@pytest.mark.parametrize(
    ("name", "kwargs", "layers"),
    [("wideresnet28x10", {}, 12), ("preresnet", {"depth": 56}, 1), ("vgg16", {}, 2)],
)
def test_dropout_rate_keeps_the_parameter_vector(
    name: str, kwargs: dict[str, Any], layers: int
) -> None:
    if name == "wideresnet28x10":  # a narrow WRN: the same code path, 50x cheaper
        from bayesavg.models import WideResNet

        plain: nn.Module = WideResNet(CIFAR, 10, depth=28, widen_factor=1, dropout=0.0)
        dropped: nn.Module = WideResNet(CIFAR, 10, depth=28, widen_factor=1, dropout=0.3)
    else:
        plain = build_model(name, CIFAR, 10, {**kwargs, "dropout": 0.0})
        dropped = build_model(name, CIFAR, 10, {**kwargs, "dropout": 0.3})
    assert [p.shape for p in plain.parameters()] == [p.shape for p in dropped.parameters()]
    assert len(dropout_modules(plain)) == len(dropout_modules(dropped)) == layers
    assert not has_dropout(plain) and has_dropout(dropped)
