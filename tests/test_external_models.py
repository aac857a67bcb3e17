"""Networks from outside the registry (torchvision builders, a user's factory), pretrained
weights with a new head, and the head fit: issue "Bring your own network and data" §1-§2."""

from __future__ import annotations

import copy
import urllib.error
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn

from bayesavg.config import parse_params
from bayesavg.data.pretrained_inputs import transforms_of
from bayesavg.models import build_model, head_name
from bayesavg.models.weights import fetch, load_into, read_state
from bayesavg.runtime.errors import UserError
from bayesavg.trajectories.from_weights import frozen_except

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def _model(raw: dict[str, Any], **model: Any) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    out["model"] = {"code": "networks", **model}
    return out


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"name": "torchvision:"}, "torchvision:<builder>"),
        ({"name": "resnet50"}, "unknown model 'resnet50'"),
        ({"name": "lenet5", "options": {"width": 2}}, "only torchvision and factory models"),
        ({"factory": "networks.example:small_cnn", "name": "mlp"}, "not both"),
        ({"factory": "elsewhere.nets:build"}, "must live under model.code (networks/)"),
        ({"factory": "networks.example"}, "factory"),
        ({"name": "torchvision:resnet18", "code": "../outside"}, "a folder inside the repository"),
    ],
)
def test_bad_model_sections_are_one_line(
    raw: dict[str, Any], model: dict[str, Any], message: str
) -> None:
    with pytest.raises(UserError) as err:
        parse_params(_model(raw, **model))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_weights_and_the_weights_kind_go_together(raw: dict[str, Any]) -> None:
    with pytest.raises(UserError, match="set both or neither"):
        parse_params(_model(raw, name="torchvision:resnet18", weights="w.pt"))
    alone = _model(raw, name="torchvision:resnet18")
    alone["pretrain"]["kind"] = "weights"
    with pytest.raises(UserError, match="set both or neither"):
        parse_params(alone)
    both = _model(raw, name="torchvision:resnet18", weights="w.pt")
    both["pretrain"].update(kind="weights", head_epochs=1)
    p = parse_params(both)
    assert p.model.model_name() == "torchvision:resnet18" and p.model.kwargs() == {}


def test_a_factory_is_named_and_its_options_passed(raw: dict[str, Any]) -> None:
    p = parse_params(_model(raw, factory="networks.example:small_cnn", options={"width": 4}))
    assert p.model.model_name() == "factory:networks.example:small_cnn"
    assert p.model.kwargs() == {"width": 4}
    assert p.dropout_of("mc_dropout") == 0.1  # the trajectory's own rate
    assert p.model.effective_dropout() is None  # the network's own layers decide


def test_torchvision_builders_get_a_head_for_the_data() -> None:
    heads = {
        "resnet18": "fc",
        "convnext_tiny": "classifier.2",
        "efficientnet_b0": "classifier.1",
        "vit_b_16": "heads.head",
        "mobilenet_v3_small": "classifier.3",
    }
    for builder, head in heads.items():
        with torch.device("meta"):
            model = build_model(f"torchvision:{builder}", (3, 224, 224), 7)
        assert head_name(model, 7) == head, builder
        assert model.get_submodule(head).out_features == 7
    net = build_model("torchvision:resnet18", (3, 64, 64), 3)
    assert net(torch.randn(2, 3, 64, 64)).shape == (2, 3)


def test_bad_builders_and_options_are_one_line() -> None:
    with pytest.raises(UserError, match=r"no classification builder 'resnt18'.*resnet18"):
        build_model("torchvision:resnt18", (3, 32, 32), 3)
    with pytest.raises(UserError, match=r"does not take options .*dropout"):
        build_model("torchvision:resnet18", (3, 32, 32), 3, {"dropout": 0.1})
    with pytest.raises(UserError, match="RGB images"):
        build_model("torchvision:resnet18", (1, 28, 28), 10)
    with pytest.raises(UserError, match=r"cannot import networks\.missing"):
        build_model("factory:networks.missing:build", (3, 32, 32), 3)
    with pytest.raises(UserError, match="no function 'nothing'"):
        build_model("factory:networks.example:nothing", (3, 32, 32), 3)


def test_the_example_factory_builds_with_its_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    net = build_model("factory:networks.example:small_cnn", (3, 16, 16), 4, {"width": 6})
    assert net(torch.randn(3, 3, 16, 16)).shape == (3, 4)
    assert head_name(net, 4) == "10"


@pytest.mark.parametrize(
    ("builder", "size", "aux"), [("googlenet", 64, "aux1"), ("inception_v3", 96, "AuxLogits")]
)
def test_auxiliary_classifiers_are_left_out(
    tmp_path: Path, builder: str, size: int, aux: str
) -> None:
    """GoogLeNet and Inception v3 train on their main logits: built without their auxiliary
    classifiers (whose namedtuple output no loss takes), and ImageNet-style weights that
    carry them load all the rest, as torchvision's own builders do."""
    import torchvision

    model = build_model(f"torchvision:{builder}", (3, size, size), 3).train()
    logits = model(torch.randn(2, 3, size, size))
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 3)
    assert getattr(model, aux) is None
    full = torchvision.models.get_model(builder, weights=None, aux_logits=True, init_weights=True)
    state = full.state_dict()
    assert any(k.startswith(f"{aux}.") for k in state)
    load_into(model, state, head_name(model, 3), tmp_path / "w.pt")
    for name, value in model.state_dict().items():
        if name in state and value.shape == state[name].shape and not name.startswith("fc."):
            assert torch.equal(value, state[name]), name
    with pytest.raises(UserError, match=r"^model.options.aux_logits: .*auxiliary classifiers"):
        build_model(f"torchvision:{builder}", (3, size, size), 3, {"aux_logits": True})


def test_ported_weights_get_the_input_transform_torchvision_gives_them(
    raw: dict[str, Any],
) -> None:
    """GoogLeNet's and Inception v3's ImageNet weights expect inputs in [-1, 1]: with them,
    torchvision builds the network with transform_input=True, and so does the pipeline."""

    def kwargs(**model: Any) -> dict[str, Any]:
        raw_ = _model(raw, **model)
        raw_["pretrain"]["kind"] = "weights"
        return parse_params(raw_).model.kwargs()

    named = kwargs(name="torchvision:googlenet", weights="GoogLeNet_Weights.IMAGENET1K_V1")
    assert named == {"transform_input": True}
    assert kwargs(name="torchvision:inception_v3", weights="Inception_V3_Weights.DEFAULT") == {
        "transform_input": True
    }
    assert kwargs(name="torchvision:googlenet", weights="weights/googlenet.pt") == {}
    assert kwargs(name="torchvision:resnet18", weights="ResNet18_Weights.DEFAULT") == {}
    own = kwargs(
        name="torchvision:googlenet",
        weights="GoogLeNet_Weights.DEFAULT",
        options={"transform_input": False},
    )
    assert own == {"transform_input": False}


def _imagenet_resnet18(path: Path) -> dict[str, torch.Tensor]:
    """A 1000-class resnet18's random weights saved as a local weights file."""
    torch.manual_seed(1)
    state = build_model("torchvision:resnet18", (3, 64, 64), 1000).state_dict()
    torch.save(state, path)
    return state


def test_weights_load_all_but_the_new_head(tmp_path: Path) -> None:
    state = _imagenet_resnet18(tmp_path / "r18.pt")
    torch.manual_seed(2)
    model = build_model("torchvision:resnet18", (3, 64, 64), 3)
    head_before = model.fc.weight.detach().clone()
    path = fetch(str(tmp_path / "r18.pt"), tmp_path)
    load_into(model, read_state(path), head_name(model, 3), path)
    for name, value in model.state_dict().items():
        if not name.startswith("fc."):
            assert torch.equal(value, state[name]), name
    assert torch.equal(model.fc.weight, head_before)


def test_a_checkpoint_wrapping_its_state_dict_is_unwrapped(tmp_path: Path) -> None:
    state = _imagenet_resnet18(tmp_path / "plain.pt")
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}}, tmp_path / "c.pt")
    got = read_state(tmp_path / "c.pt")
    assert got.keys() == state.keys()
    assert all(torch.equal(got[k], v) for k, v in state.items())


def test_safetensors_weights(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    state = _imagenet_resnet18(tmp_path / "r18.pt")
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "r18.safetensors"))
    loaded = read_state(tmp_path / "r18.safetensors")
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_weights_that_do_not_fit_are_one_line(tmp_path: Path) -> None:
    torch.save(build_model("torchvision:resnet34", (3, 64, 64), 3).state_dict(), tmp_path / "a.pt")
    model = build_model("torchvision:resnet18", (3, 64, 64), 3)
    with pytest.raises(UserError, match=r"does not fit the model .*unexpected"):
        load_into(model, read_state(tmp_path / "a.pt"), "fc", tmp_path / "a.pt")
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match=r"cannot read .*bad.pt"):
        read_state(tmp_path / "bad.pt")
    with pytest.raises(UserError, match="does not exist"):
        fetch(str(tmp_path / "missing.pt"), tmp_path)
    with pytest.raises(UserError, match="neither a local file"):
        fetch("NoSuch_Weights.V1", tmp_path)


def test_offline_weights_name_the_file_and_the_way_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline(url: str, dst: str, **kwargs: Any) -> None:
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    with pytest.raises(UserError) as err:
        fetch("ResNet18_Weights.IMAGENET1K_V1", tmp_path)
    line = str(err.value)
    assert "\n" not in line
    assert str(tmp_path / "weights" / "resnet18-f37072fd.pth") in line
    assert "model.weights to a local state_dict file" in line
    # a file put there by hand is used, and checked against its hash prefix
    (tmp_path / "weights" / "resnet18-f37072fd.pth").write_bytes(b"other bytes")
    with pytest.raises(UserError, match="does not match its sha256 prefix f37072fd"):
        fetch("ResNet18_Weights.IMAGENET1K_V1", tmp_path)


def test_torchvision_weights_bring_their_normalisation() -> None:
    t = transforms_of("ResNet50_Weights.IMAGENET1K_V2")
    assert t is not None
    assert t.mean == [0.485, 0.456, 0.406] and t.std == [0.229, 0.224, 0.225]
    assert (t.resize_size, t.crop_size) == (232, 224)
    assert transforms_of("local/w.pt") is None and transforms_of(None) is None


def test_the_head_fit_trains_the_head_alone_in_eval_mode() -> None:
    torch.manual_seed(0)
    model = build_model("torchvision:resnet18", (3, 32, 32), 3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD([p for p in model.parameters()], lr=0.1)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 3, (8,))
    with frozen_except(model, "fc"):
        model.train()
        assert model.fc.training and not model.layer1.training and not model.bn1.training
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        assert trainable == ["fc.weight", "fc.bias"]
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    after = model.state_dict()
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert changed == ["fc.bias", "fc.weight"]  # BN statistics untouched too
    model.train()
    assert model.layer1.training and all(p.requires_grad for p in model.parameters())
