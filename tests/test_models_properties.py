"""The registry's networks against their definitions, not only their sizes.

``test_models_cifar`` pins parameter counts and state-dict names, which a stride moved
to the other convolution, a dropped ReLU or a shortcut fed the wrong tensor all keep.
Here each network's output is compared with a forward pass written out from the SWAG
reference code (strides, pre-activation order and shortcuts spelled out, not read from
the modules), initialisations with their stated formulas, and the small models, pooling,
external builders and weights loading with their documented rules.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bayesavg.models import (
    PreResNet,
    PreResNet20,
    WideResNet,
    build_model,
    dropout_modules,
    for_inference,
    has_batchnorm,
    has_dropout,
    head_name,
)
from bayesavg.models.pooling import DeterministicAdaptiveAvgPool2d, deterministic_pooling
from bayesavg.models.small import MaxPool2x2
from bayesavg.models.weights import fetch, load_into, read_state
from bayesavg.runtime.errors import UserError

SMALL = (3, 8, 8)  # 8 -> 4 -> 2 through the two strided stages: every block is exercised
VGG16_D = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def _randomise_batchnorm(model: nn.Module, seed: int) -> nn.Module:
    """Running statistics and affine parameters away from (0, 1), so that a BatchNorm
    skipped or applied in the wrong place changes the output."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.running_mean.copy_(0.1 * torch.randn(c, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(c, generator=gen))
                m.weight.copy_(0.5 + torch.rand(c, generator=gen))
                m.bias.copy_(0.1 * torch.randn(c, generator=gen))
    return model.eval()


def _bn(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    assert isinstance(m, nn.BatchNorm2d)
    return F.batch_norm(x, m.running_mean, m.running_var, m.weight, m.bias, False, 0.0, m.eps)


def _conv(m: nn.Module, x: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    assert isinstance(m, nn.Conv2d)
    return F.conv2d(x, m.weight, m.bias, stride, padding)


def _head(model: nn.Module, out: torch.Tensor, bn: nn.Module, fc: nn.Module) -> torch.Tensor:
    """relu(bn(.)), global average pooling, the linear classifier."""
    pooled = F.relu(_bn(bn, out)).mean(dim=(2, 3))
    return F.linear(pooled, fc.weight, fc.bias)


def _reference_preresnet(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """bearpaw/SWAG ``PreResNet.forward``: basic blocks stride their first 3x3 convolution,
    bottlenecks their 3x3 (middle) one; the 1x1 shortcut takes the block's raw input."""
    out = _conv(model.conv1, x, 1, 1)
    for layer, first_stride in ((model.layer1, 1), (model.layer2, 2), (model.layer3, 2)):
        for i, b in enumerate(layer):
            s = first_stride if i == 0 else 1
            pre = F.relu(_bn(b.bn1, out))
            if hasattr(b, "conv3"):  # bottleneck: 1x1, 3x3 (strided), 1x1 x4
                a = _conv(b.conv1, pre, 1, 0)
                a = _conv(b.conv2, F.relu(_bn(b.bn2, a)), s, 1)
                a = _conv(b.conv3, F.relu(_bn(b.bn3, a)), 1, 0)
            else:  # basic: 3x3 (strided), 3x3
                a = _conv(b.conv1, pre, s, 1)
                a = _conv(b.conv2, F.relu(_bn(b.bn2, a)), 1, 1)
            short = out if b.downsample is None else _conv(b.downsample[0], out, s, 0)
            out = a + short
    return _head(model, out, model.bn, model.fc)


@pytest.mark.parametrize("depth", [20, 47])  # basic blocks; bottlenecks (9n+2, n = 5)
def test_preresnet_forward_is_the_reference_forward(depth: int) -> None:
    torch.manual_seed(0)
    model = _randomise_batchnorm(PreResNet(SMALL, 10, depth=depth), seed=depth)
    x = torch.randn(2, *SMALL, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(x), _reference_preresnet(model, x))


def test_preresnet20_shortcut_takes_the_preactivated_input() -> None:
    """``preresnet20`` (this project's original network): stride on the first 3x3 of a
    stage's first block, and its projection shortcut on relu(bn1(x)), unlike ``preresnet``."""
    torch.manual_seed(0)
    model = _randomise_batchnorm(PreResNet20(SMALL, 10), seed=3)
    x = torch.randn(2, *SMALL, generator=torch.Generator().manual_seed(1))
    out = _conv(model.conv, x, 1, 1)
    for i, b in enumerate(model.blocks):
        s = 2 if i in (3, 6) else 1
        pre = F.relu(_bn(b.bn1, out))
        short = out if b.shortcut is None else _conv(b.shortcut, pre, s, 0)
        a = _conv(b.conv1, pre, s, 1)
        out = _conv(b.conv2, F.relu(_bn(b.bn2, a)), 1, 1) + short
    with torch.no_grad():
        torch.testing.assert_close(model(x), _head(model, out, model.bn, model.fc))


@pytest.mark.parametrize("factory", [PreResNet, PreResNet20])
def test_dropout_sits_before_the_classifier(factory: type[nn.Module]) -> None:
    """Rate 1 in train mode zeroes the pooled features: every row is the fc bias."""
    model = factory(SMALL, 10, depth=20, dropout=1.0).train()
    with torch.no_grad():
        out = model(torch.randn(4, *SMALL))
    torch.testing.assert_close(out, model.fc.bias.expand(4, 10))


@pytest.mark.parametrize(("name", "kwargs"), [("preresnet", {"depth": 47}), ("vgg16", {})])
def test_convolutions_start_at_n_0_2_over_k_k_out_channels(
    name: str, kwargs: dict[str, Any]
) -> None:
    """The reference's He init by fan-out, every convolution (in != out for many of them)."""
    torch.manual_seed(0)
    model = build_model(name, (3, 32, 32), 10, kwargs)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert any(c.in_channels != c.out_channels for c in convs)
    for c in convs:
        want = math.sqrt(2.0 / (c.kernel_size[0] * c.kernel_size[1] * c.out_channels))
        assert float(c.weight.detach().std()) == pytest.approx(want, rel=0.1), c


def _reference_wide_resnet(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """meliketoy/SWAG ``Wide_ResNet.forward``: ``wide_basic`` strides its second 3x3
    convolution, its 1x1 shortcut (with bias) takes the raw input."""
    out = _conv(model.conv1, x, 1, 1)
    for layer, first_stride in ((model.layer1, 1), (model.layer2, 2), (model.layer3, 2)):
        for i, b in enumerate(layer):
            s = first_stride if i == 0 else 1
            a = _conv(b.conv1, F.relu(_bn(b.bn1, out)), 1, 1)
            a = _conv(b.conv2, F.relu(_bn(b.bn2, a)), s, 1)
            short = _conv(b.shortcut[0], out, s, 0) if len(b.shortcut) else out
            out = a + short
    return _head(model, out, model.bn1, model.linear)


def test_wide_resnet_forward_is_the_reference_forward() -> None:
    torch.manual_seed(0)
    model = _randomise_batchnorm(WideResNet(SMALL, 10, depth=16, widen_factor=2), seed=5)
    x = torch.randn(2, *SMALL, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(x), _reference_wide_resnet(model, x))


def test_wide_resnet_dropout_follows_the_first_convolution() -> None:
    """Rate 1 in train mode: what the block's second BatchNorm sees is all zeros."""
    model = WideResNet(SMALL, 10, depth=10, widen_factor=1, dropout=1.0).train()
    seen: list[torch.Tensor] = []
    for layer in (model.layer1, model.layer2, model.layer3):
        layer[0].bn2.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    with torch.no_grad():
        model(torch.randn(2, *SMALL))
    assert len(seen) == 3 and all(torch.count_nonzero(t) == 0 for t in seen)


@pytest.mark.parametrize("depth", [10, 16, 22, 28, 40])
def test_wide_resnet_valid_depths_have_n_blocks_per_stage(depth: int) -> None:
    with torch.device("meta"):
        model = WideResNet((3, 32, 32), 10, depth=depth, widen_factor=1)
    assert [len(s) for s in (model.layer1, model.layer2, model.layer3)] == [(depth - 4) // 6] * 3


@pytest.mark.parametrize("depth", [4, 8, 27])  # 4 = 6 * 0 + 4: no blocks at all
def test_wide_resnet_bad_depth_is_a_user_error(depth: int) -> None:
    with pytest.raises(
        UserError, match=rf"^WideResNet depth must be 6n\+4 with n >= 1, got {depth}$"
    ):
        WideResNet((3, 32, 32), 10, depth=depth)


def test_wideresnet28x10_takes_its_dropout_rate() -> None:
    with torch.device("meta"):
        model = build_model("wideresnet28x10", (3, 32, 32), 10, {"dropout": 0.3})
    rates = [m.p for m in dropout_modules(model)]
    assert rates == [0.3] * 12 and has_dropout(model)


def _reference_vgg16(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Configuration D: 3x3 convolutions (padding 1) with ReLU, 2x2 max pooling at each
    "M", then Linear-ReLU-Linear-ReLU-Linear (dropout is the identity in eval mode)."""
    convs = iter(m for m in model.features if isinstance(m, nn.Conv2d))
    out = x
    for v in VGG16_D:
        out = F.max_pool2d(out, 2, 2) if v == "M" else F.relu(_conv(next(convs), out, 1, 1))
    linears = [m for m in model.classifier if isinstance(m, nn.Linear)]
    out = torch.flatten(out, 1)
    for i, lin in enumerate(linears):
        out = F.linear(out, lin.weight, lin.bias)
        out = F.relu(out) if i < len(linears) - 1 else out
    return out


def test_vgg16_forward_is_configuration_d_with_the_swag_classifier() -> None:
    torch.manual_seed(0)
    model = build_model("vgg16", (3, 32, 32), 10).eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(x), _reference_vgg16(model, x))


@pytest.mark.parametrize("name", ["vgg16", "vgg16_bn"])
@pytest.mark.parametrize("side", [16, 48, 40])
def test_vgg_sides_must_be_multiples_of_32(name: str, side: int) -> None:
    with pytest.raises(
        UserError, match=rf"^{name} needs image sides divisible by 32, got {side}x32$"
    ):
        build_model(name, (3, side, 32), 10)


def test_vgg16_classifier_width_follows_a_non_square_input() -> None:
    """32 x 64 images: 1 x 2 features of 512 channels after five poolings."""
    model = build_model("vgg16", (3, 32, 64), 10).eval()
    assert model.classifier[1].in_features == 1024
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 64)).shape == (2, 10)


def test_vgg16_bn_is_the_swag_papers_network() -> None:
    """15,253,578 parameters, BatchNorm, dropout 0.5 by default; grey images take a
    one-channel first convolution and keep every spatial size."""
    model = build_model("vgg16_bn", (3, 32, 32), 10)
    assert sum(p.numel() for p in model.parameters()) == 15_253_578
    assert has_batchnorm(model)
    assert [m.p for m in dropout_modules(model)] == [0.5, 0.5]
    grey = build_model("vgg16_bn", (1, 32, 32), 10).eval()
    with torch.no_grad():
        assert grey(torch.randn(2, 1, 32, 32)).shape == (2, 10)


def test_mlp_puts_batchnorm_between_each_hidden_linear_and_its_relu() -> None:
    model = build_model("mlp", (1, 4, 4), 3, {"hidden": [8, 6], "batch_norm": True})
    kinds = [type(m).__name__ for m in model]
    hidden = ["Linear", "BatchNorm1d", "ReLU", "Dropout"]
    assert kinds == ["Flatten", *hidden, *hidden, "Linear"]
    assert has_batchnorm(model)


def test_mlp_default_is_the_config_default() -> None:
    """``build_model("mlp")`` without kwargs builds what ``model: {name: mlp}`` does."""
    from bayesavg.config import ModelParams

    kwargs = ModelParams(name="mlp").kwargs()
    plain, configured = (
        build_model("mlp", (1, 28, 28), 10),
        build_model("mlp", (1, 28, 28), 10, kwargs),
    )
    assert [p.shape for p in plain.parameters()] == [p.shape for p in configured.parameters()]


@pytest.mark.parametrize(("shape", "padding"), [((1, 28, 28), 2), ((3, 32, 32), 0)])
def test_lenet5_is_the_original_layout(shape: tuple[int, int, int], padding: int) -> None:
    """28x28 images padded to 32x32, so the flattened features are 16 x 5 x 5 either way;
    dropout after each of the two hidden fully connected layers."""
    model = build_model("lenet5", shape, 10, {"dropout": 0.2})
    convs = [m for m in model if isinstance(m, nn.Conv2d)]
    assert [c.padding for c in convs] == [(padding, padding), (0, 0)]
    linears = [m for m in model if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(400, 120), (120, 84), (84, 10)]
    kinds = [type(m).__name__ for m in model][-7:]
    assert kinds == ["Linear", "ReLU", "Dropout", "Linear", "ReLU", "Dropout", "Linear"]
    assert [m.p for m in dropout_modules(model)] == [0.2, 0.2]


@pytest.mark.parametrize("size", [(7, 8), (8, 7), (7, 7)])
def test_max_pool_of_odd_sizes_without_autograd_is_max_pool(size: tuple[int, int]) -> None:
    """An odd height with an even width (and the reverse) floors like nn.MaxPool2d."""
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = MaxPool2x2()(x)
    assert torch.equal(got, F.max_pool2d(x, 2))


def test_adaptive_pooling_is_replaced_inside_submodules() -> None:
    """A pooling layer nested in a child module is replaced where it is."""
    inner = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(3))
    net = nn.Sequential(inner, nn.Flatten())
    assert deterministic_pooling(net) is net
    assert type(inner[1]) is DeterministicAdaptiveAvgPool2d
    assert [name for name, _ in net.named_children()] == ["0", "1"]
    assert net(torch.randn(2, 3, 9, 9)).shape == (2, 36)


def test_dropout_modules_are_every_kind_of_dropout() -> None:
    """MC dropout needs each dropout layer, 2-D and alpha dropout included (a factory's)."""
    net = nn.Sequential(nn.Dropout2d(0.2), nn.Conv2d(3, 3, 1), nn.AlphaDropout(0.1), nn.Dropout(0))
    assert len(dropout_modules(net)) == 3 and has_dropout(net)


def test_for_inference_puts_convolutions_in_channels_last() -> None:
    """(The first convolution's one input channel makes both layouts the same bytes.)"""
    model = for_inference(build_model("lenet5", (1, 28, 28), 10))
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    assert not convs[1].weight.is_contiguous()


def test_an_unknown_model_is_a_user_error_naming_the_choices() -> None:
    with pytest.raises(UserError, match=r"^unknown model 'resnet9000'; choose one of lenet5, mlp,"):
        build_model("resnet9000", (3, 32, 32), 10)


def test_head_name_is_the_last_linear_or_1x1_convolution_with_the_class_count() -> None:
    """A hidden layer as wide as the class count is not the head; a 3x3 convolution with
    that many channels is not one either (None: no head)."""
    mlp = build_model("mlp", (1, 4, 4), 10, {"hidden": [10]})
    assert head_name(mlp, 10) == "4"
    conv_only = nn.Sequential(nn.Conv2d(3, 10, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    assert head_name(conv_only, 10) is None
    squeeze_like = nn.Sequential(nn.Conv2d(3, 10, 3), nn.Conv2d(10, 10, 1), nn.Flatten())
    assert head_name(squeeze_like, 10) == "1"


def test_torchvision_networks_refuse_other_than_three_channels() -> None:
    with pytest.raises(UserError, match=r"takes RGB images \(3 channels\); the data has 4$"):
        build_model("torchvision:resnet18", (4, 32, 32), 3)


def test_a_users_init_weights_option_reaches_torchvision(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults for auxiliary-classifier builders yield to the options given."""
    import torchvision.models

    seen: dict[str, Any] = {}

    def fake(builder: str, **kwargs: Any) -> nn.Module:
        seen.update(kwargs)
        return nn.Linear(2, 3)

    monkeypatch.setattr(torchvision.models, "get_model", fake)
    build_model("torchvision:googlenet", (3, 64, 64), 3, {"init_weights": False})
    assert seen["init_weights"] is False and seen["aux_logits"] is False


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An importable module of factories, one per way a user's factory can go wrong."""
    name = f"audit_factories_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(
        "from torch import nn\n"
        "NOT_A_FUNCTION = 3\n"
        "def number(shape, classes):\n    return 3\n"
        "def broken(shape, classes):\n    return nn.Linear(2, 3, bad=True)\n"
        "def sized(shape, classes, width=1):\n    return nn.Linear(width, classes)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_factory_that_is_not_a_function_or_returns_no_module_is_one_line(factories: str) -> None:
    with pytest.raises(UserError, match=r"has no function 'NOT_A_FUNCTION'$"):
        build_model(f"factory:{factories}:NOT_A_FUNCTION", (3, 8, 8), 3)
    with pytest.raises(UserError, match=rf"^model.factory: {factories}:number returned int, not"):
        build_model(f"factory:{factories}:number", (3, 8, 8), 3)


def test_a_factory_is_called_with_the_model_options(factories: str) -> None:
    """``build(input_shape, num_classes, **model.options)``: the options reach it."""
    model = build_model(f"factory:{factories}:sized", (3, 8, 8), 3, {"width": 4})
    assert isinstance(model, nn.Linear) and (model.in_features, model.out_features) == (4, 3)


def test_a_factorys_own_type_error_without_options_is_not_blamed_on_options(
    factories: str,
) -> None:
    """No options were given, so a TypeError is the factory's bug: raised as it is."""
    with pytest.raises(TypeError, match="bad"):
        build_model(f"factory:{factories}:broken", (3, 8, 8), 3)


def test_a_factory_module_in_the_working_directory_is_found_off_sys_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console script does not put the working directory (a stage's repository root)
    on ``sys.path``; a factory module there is imported from it all the same."""
    name = f"audit_cwd_factory_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(
        "from torch import nn\ndef net(shape, classes):\n    return nn.Linear(2, classes)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    try:
        model = build_model(f"factory:{name}:net", (3, 8, 8), 4)
    finally:
        sys.modules.pop(name, None)
    assert isinstance(model, nn.Linear) and model.out_features == 4


class _TwoHeads(nn.Module):
    """``fc`` is the head; ``fc_in`` merely shares its name's start."""

    def __init__(self) -> None:
        super().__init__()
        self.fc_in = nn.Linear(4, 6)
        self.fc = nn.Linear(6, 3)


def test_weights_load_every_module_but_the_head_itself(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source, model = _TwoHeads(), _TwoHeads()
    head = model.fc.weight.detach().clone()
    load_into(model, source.state_dict(), "fc", tmp_path / "w.pt")
    assert torch.equal(model.fc_in.weight, source.fc_in.weight)
    assert torch.equal(model.fc.weight, head)


def test_weights_of_the_wrong_shape_are_one_line(tmp_path: Path) -> None:
    state = _TwoHeads().state_dict()
    state["fc_in.weight"] = torch.zeros(6, 5)
    with pytest.raises(UserError, match=r"does not fit the model \(shape of \['fc_in.weight'\]\)$"):
        load_into(_TwoHeads(), state, "fc", tmp_path / "w.pt")


def test_weights_files_unwrap_model_and_refuse_what_is_not_tensors(tmp_path: Path) -> None:
    state = _TwoHeads().state_dict()
    torch.save({"model": state, "epoch": 3}, tmp_path / "ckpt.pt")
    got = read_state(tmp_path / "ckpt.pt")
    assert got.keys() == state.keys() and all(torch.equal(got[k], v) for k, v in state.items())
    torch.save({**state, "epoch": 3}, tmp_path / "mixed.pt")
    with pytest.raises(UserError, match=r"does not hold a state_dict of tensors$"):
        read_state(tmp_path / "mixed.pt")


class _Planted:
    """Unpickling it would create a folder: loading must never run code."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.mkdir, (self.path,)


def test_reading_weights_never_executes_code(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    torch.save({"w": torch.zeros(1), "x": _Planted(str(marker))}, tmp_path / "evil.pt")
    with pytest.raises(UserError, match="cannot read"):
        read_state(tmp_path / "evil.pt")
    assert not marker.exists()


def test_a_local_weights_folder_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"does not exist$"):
        fetch(str(tmp_path), tmp_path)
