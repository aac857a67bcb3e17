"""``bayesavg evaluate``: metrics JSON for each predictor, determinism, one-line user errors."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from cli_runs import run_ok, user_error_line
from PIL import Image

import bayesavg.runtime.io
from bayesavg.cli import main
from bayesavg.data.prepared import to_input
from bayesavg.models import build_model
from bayesavg.posteriors import SWAG
from bayesavg.posteriors.file import load_posterior, save_posterior

if TYPE_CHECKING:
    from conftest import ImageFolderFactory, PreparedDir, TinyPosteriors

BAYESAVG = Path(sys.executable).with_name("bayesavg")
METRIC_KEYS = {"accuracy", "nll", "ece", "brier", "n"}


def _evaluate_args(posterior: Path, predictor: str, data: str, out: Path, *extra: str) -> list[str]:
    return [
        "evaluate",
        "--posterior",
        str(posterior),
        "--predictor",
        predictor,
        "--data",
        data,
        "--out",
        str(out),
        "--device",
        "cpu",
        *extra,
    ]


def _check_metrics(metrics: dict[str, Any], n: int) -> None:
    assert metrics.keys() >= METRIC_KEYS
    assert metrics["n"] == n
    assert 0.0 <= metrics["accuracy"] <= 1.0
    assert math.isfinite(metrics["nll"]) and metrics["nll"] > 0
    assert 0.0 <= metrics["ece"] <= 1.0
    assert 0.0 <= metrics["brier"] <= 2.0


@pytest.fixture
def digits_folder(tmp_path: Path, mnist5k_prepared: PreparedDir) -> tuple[Path, torch.Tensor]:
    """Three mnist5k test digits per class as 28x28 greyscale PNGs, and those digits."""
    test = mnist5k_prepared.prepared.test
    picked = torch.cat([torch.nonzero(test.y == c).flatten()[:3] for c in range(10)])
    root = tmp_path / "digits"
    for i in picked.tolist():
        folder = root / str(int(test.y[i]))
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(test.x[i, 0].numpy()).save(folder / f"{i:04d}.png")
    return root, picked


@pytest.mark.parametrize(
    ("which", "predictor", "n_samples"),
    [
        ("plain", "map", 1),
        ("swag", "map", 1),
        ("swag", "swa", 1),
        ("swag", "swag_diag", 3),
        ("swag", "swag", 3),
    ],
)
def test_evaluate_imagefolder_writes_metrics(
    tiny_posteriors: TinyPosteriors,
    imagefolder: Path,
    tmp_path: Path,
    which: str,
    predictor: str,
    n_samples: int,
) -> None:
    """RGB 12x10 images are converted to the posterior's 1x28x28 and all of them evaluated."""
    out = tmp_path / "m.json"
    posterior = getattr(tiny_posteriors, which)
    args = _evaluate_args(posterior, predictor, f"imagefolder:{imagefolder}", out)
    metrics = run_ok([*args, "--samples", "3", "--seed", "0"], out)
    _check_metrics(metrics, n=6)
    assert metrics["n_samples"] == n_samples
    assert metrics["predictor"] == predictor


def test_evaluate_matches_a_direct_prediction(
    tiny_posteriors: TinyPosteriors,
    mnist5k_prepared: PreparedDir,
    digits_folder: tuple[Path, torch.Tensor],
    tmp_path: Path,
) -> None:
    """map on PNGs of known digits gives the network's own accuracy and NLL on those digits."""
    root, picked = digits_folder
    out = tmp_path / "m.json"
    metrics = run_ok(_evaluate_args(tiny_posteriors.plain, "map", f"imagefolder:{root}", out), out)
    prepared = mnist5k_prepared.prepared
    x = prepared.test.x[picked]
    y = prepared.test.y[picked]
    with torch.no_grad():
        logits = tiny_posteriors.model(
            to_input(x, prepared.manifest["mean"], prepared.manifest["std"])
        )
    log_probs = torch.log_softmax(logits.double(), dim=1)
    assert metrics["n"] == 30
    expected_accuracy = (log_probs.argmax(1) == y).double().mean().item()
    assert metrics["accuracy"] == pytest.approx(expected_accuracy, abs=1e-12)
    expected_nll = -log_probs[torch.arange(len(y)), y].mean().item()
    assert metrics["nll"] == pytest.approx(expected_nll, rel=1e-5)


def test_evaluate_mnist5k_uses_the_held_out_test_split(
    tiny_posteriors: TinyPosteriors, mnist5k_prepared: PreparedDir, tmp_path: Path
) -> None:
    out = tmp_path / "m.json"
    args = _evaluate_args(tiny_posteriors.plain, "map", "mnist5k", out, "--raw-dir", str(tmp_path))
    metrics = run_ok(args, out)
    _check_metrics(metrics, n=1000)
    prepared = mnist5k_prepared.prepared
    with torch.no_grad():
        logits = tiny_posteriors.model(
            to_input(prepared.test.x, prepared.manifest["mean"], prepared.manifest["std"])
        )
    expected = (logits.argmax(1) == prepared.test.y).double().mean().item()
    assert metrics["accuracy"] == pytest.approx(expected, abs=1e-12)
    assert metrics["accuracy"] > 0.7, "the tiny trained MLP should be far above chance"
    assert metrics["data"] == "mnist5k"


@pytest.mark.parametrize("predictor", ["swag", "swag_diag"])
def test_evaluate_is_deterministic_given_the_seed(
    tiny_posteriors: TinyPosteriors, imagefolder: Path, tmp_path: Path, predictor: str
) -> None:
    outs = {name: tmp_path / f"{name}.json" for name in ("a", "b", "c")}
    seeds = {"a": "0", "b": "0", "c": "1"}
    for name, out in outs.items():
        args = _evaluate_args(tiny_posteriors.swag, predictor, f"imagefolder:{imagefolder}", out)
        main([*args, "--samples", "3", "--seed", seeds[name]])
    assert outs["a"].read_bytes() == outs["b"].read_bytes()
    first, other = (json.loads(outs[k].read_text()) for k in ("a", "c"))
    assert first["nll"] != other["nll"]


@dataclasses.dataclass(frozen=True)
class ConsoleRun:
    """One finished ``bayesavg`` process and the --out path it was given."""

    proc: subprocess.CompletedProcess[str]
    out: Path


@pytest.fixture(scope="module")
def console_runs(
    tiny_posteriors: TinyPosteriors, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, ConsoleRun]:
    """A successful and a failing run of the console script, started together.

    Each process spends ~7 s importing torch on this machine; running both at
    once keeps the suite fast.
    """
    root = tmp_path_factory.mktemp("console")
    images = root / "images"
    for label in range(2):
        (images / str(label)).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (10, 12), (40 * label + i, 0, 90)).save(
                images / str(label) / f"{i}.png"
            )
    plans = {
        "ok": (tiny_posteriors.swag, "swag"),
        "no_collector": (tiny_posteriors.plain, "swag"),
    }
    procs = {}
    for name, (posterior, predictor) in plans.items():
        out = root / f"{name}.json"
        args = _evaluate_args(posterior, predictor, f"imagefolder:{images}", out, "--samples", "3")
        popen = subprocess.Popen(
            [str(BAYESAVG), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        procs[name] = (popen, args, out)
    runs = {}
    for name, (popen, args, out) in procs.items():
        stdout, stderr = popen.communicate(timeout=180)
        runs[name] = ConsoleRun(
            subprocess.CompletedProcess(args, popen.returncode, stdout, stderr), out
        )
    return runs


def test_console_script_writes_metrics(console_runs: dict[str, ConsoleRun]) -> None:
    run = console_runs["ok"]
    assert run.proc.returncode == 0, run.proc.stderr
    metrics = json.loads(run.out.read_text())
    _check_metrics(metrics, n=4)
    assert metrics["n_samples"] == 3


def test_console_script_user_error_is_one_line(console_runs: dict[str, ConsoleRun]) -> None:
    """swag asked of a posterior without a collector: exit 2, one line, no traceback, no output."""
    run = console_runs["no_collector"]
    assert run.proc.returncode == 2
    lines = run.proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), run.proc.stderr
    assert "needs SWAG snapshots" in lines[0]
    assert not run.out.exists()


def _corrupt_bytes(kind: str, valid: Path) -> bytes:
    """Ways a posterior file can be damaged: truncation, garbage, malformed pickles."""
    if kind == "empty":
        return b""
    if kind == "truncated":
        return valid.read_bytes()[: valid.stat().st_size // 2]
    if kind == "text":
        return b"this is not a torch file\n"
    if kind.startswith("random"):
        return random.Random(int(kind.removeprefix("random"))).randbytes(256)
    return {
        "pickle_empty_stack": b"\x80\x02.",
        "pickle_bad_utf8": b"X\x01\x00\x00\x00\xff.",
        "pickle_bad_memo": b"h\x05.",
        "pickle_high_protocol": b"\x80\x8a.",
    }[kind]


@pytest.mark.parametrize(
    "kind",
    [
        "empty",
        "truncated",
        "text",
        "random0",
        "random2",
        "pickle_empty_stack",
        "pickle_bad_utf8",
        "pickle_bad_memo",
        "pickle_high_protocol",
    ],
)
def test_corrupt_posterior_file(
    tiny_posteriors: TinyPosteriors,
    imagefolder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    posterior = tmp_path / "posterior.pt"
    posterior.write_bytes(_corrupt_bytes(kind, tiny_posteriors.plain))
    out = tmp_path / "m.json"
    line = user_error_line(
        _evaluate_args(posterior, "map", f"imagefolder:{imagefolder}", out), capsys
    )
    assert str(posterior) in line
    assert not out.exists()


@pytest.mark.parametrize("content", ["tensor", "state_dict", "module"])
def test_torch_file_that_is_not_a_posterior(
    imagefolder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    """Valid torch files: a tensor, a model's state dict, a pickled module (refused unread)."""
    model = build_model("mlp", (1, 28, 28), 10, {"hidden": [4]})
    obj = {"tensor": torch.zeros(3), "state_dict": model.state_dict(), "module": model}[content]
    posterior = tmp_path / "posterior.pt"
    torch.save(obj, posterior)
    out = tmp_path / "m.json"
    line = user_error_line(
        _evaluate_args(posterior, "map", f"imagefolder:{imagefolder}", out), capsys
    )
    assert str(posterior) in line
    assert not out.exists()


@pytest.mark.parametrize("defect", ["theta_too_short", "theta_too_long", "no_data_seed"])
def test_inconsistent_posterior_file(
    tiny_posteriors: TinyPosteriors,
    imagefolder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    defect: str,
) -> None:
    """A file in the right format whose contents do not fit together is a corrupt file too."""
    good = load_posterior(tiny_posteriors.plain)
    theta = good.theta
    broken = {
        "theta_too_short": dataclasses.replace(good, theta=theta[:-7]),
        "theta_too_long": dataclasses.replace(good, theta=torch.cat([theta, torch.zeros(7)])),
        "no_data_seed": dataclasses.replace(good, data={"dataset": "mnist5k"}),
    }[defect]
    posterior = tmp_path / "posterior.pt"
    save_posterior(posterior, broken)
    out = tmp_path / "m.json"
    user_error_line(_evaluate_args(posterior, "map", f"imagefolder:{imagefolder}", out), capsys)
    assert not out.exists()


def _offline(*args: Any, **kwargs: Any) -> Any:
    raise urllib.error.URLError("offline")


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("unknown_predictor", "--predictor"),
        ("zero_samples", "--samples"),
        ("missing_posterior", "does not exist"),
        ("missing_imagefolder", "is not a directory"),
        ("swag_without_collector", "needs SWAG snapshots"),
        ("swa_without_collector", "needs SWAG snapshots"),
        ("unknown_data", "unknown data spec"),
        ("too_many_classes", "classes"),
        ("offline_download", "by hand"),
        ("negative_scale", "--scale"),
        ("nan_scale", "--scale: must be a finite number >= 0 (got nan)"),
        ("negative_seed", "--seed: must be in [0, 2**63 - 1]"),
        ("seed_over_63_bits", "--seed: must be in [0, 2**63 - 1], as the pipeline's (got 92233"),
        ("unknown_shift", "--shift: unknown shift 'fog'"),
    ],
)
def test_user_errors_exit_2_with_one_line(
    tiny_posteriors: TinyPosteriors,
    imagefolder: Path,
    imagefolder_factory: ImageFolderFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    expected: str,
) -> None:
    out = tmp_path / "m.json"
    posterior, predictor, data = tiny_posteriors.swag, "map", f"imagefolder:{imagefolder}"
    extra: list[str] = []
    if case == "unknown_predictor":
        predictor = "deep_kernel"
    elif case == "zero_samples":
        extra = ["--samples", "0"]
    elif case == "missing_posterior":
        posterior = tmp_path / "nowhere" / "posterior.pt"
    elif case == "missing_imagefolder":
        data = f"imagefolder:{tmp_path / 'no-such-dir'}"
    elif case in ("swag_without_collector", "swa_without_collector"):
        posterior, predictor = tiny_posteriors.plain, case.split("_")[0]
    elif case == "unknown_data":
        data = "stl10"
    elif case == "too_many_classes":
        data = f"imagefolder:{imagefolder_factory(num_classes=12, per_class=1, name='twelve')}"
    elif case == "offline_download":
        monkeypatch.setattr(urllib.request, "urlopen", _offline)
        data = "mnist"
        extra = ["--raw-dir", str(tmp_path / "raw")]
    elif case == "negative_scale":
        predictor, extra = "swag", ["--scale", "-1"]
    elif case == "nan_scale":
        predictor, extra = "swag", ["--scale", "nan"]
    elif case == "negative_seed":
        extra = ["--seed", "-1"]
    elif case == "seed_over_63_bits":
        extra = ["--seed", str(2**63)]
    elif case == "unknown_shift":
        extra = ["--shift", "fog"]
    line = user_error_line(_evaluate_args(posterior, predictor, data, out, *extra), capsys)
    assert expected in line
    assert not out.exists()


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("out_is_the_posterior", "is the --posterior file"),
        ("out_is_a_folder", "is a folder"),
        ("out_under_a_file", "cannot write under"),
        ("reliability_is_out", "--reliability: the --out file"),
        ("reliability_is_a_folder", "--reliability: "),
        ("reliability_write_fails", "--reliability: cannot write it: Permission denied"),
        ("device_mps", "device: 'mps' is not one of"),
        ("device_meta", "device: 'meta' is not one of"),
    ],
)
def test_bad_outputs_and_devices_exit_2_leaving_every_file_as_it_was(
    tiny_posteriors: TinyPosteriors,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    expected: str,
) -> None:
    """Output paths are checked before any work (the write failing late too is one line,
    and the other output is not left behind); only cpu and cuda devices run."""
    posterior = tmp_path / "posterior.pt"
    shutil.copyfile(tiny_posteriors.swag, posterior)
    before = posterior.read_bytes()
    out, reliability = tmp_path / "m.json", tmp_path / "bins.csv"
    extra = ["--reliability", str(reliability)]
    if case == "out_is_the_posterior":
        out = posterior
    elif case == "out_is_a_folder":
        out.mkdir()
    elif case == "out_under_a_file":
        (tmp_path / "afile").write_text("x")
        out = tmp_path / "afile" / "m.json"
    elif case == "reliability_is_out":
        extra = ["--reliability", str(out)]
    elif case == "reliability_is_a_folder":
        reliability.mkdir()
    elif case == "reliability_write_fails":

        def refused(*args: Any, **kwargs: Any) -> None:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(bayesavg.runtime.io, "write_csv", refused)
    elif case.startswith("device_"):
        extra += ["--device", case.removeprefix("device_")]
    args = _evaluate_args(posterior, "swa", "mnist5k", out, *extra)
    assert expected in user_error_line(args, capsys)
    assert posterior.read_bytes() == before
    left = {"posterior.pt"} | {p.name for p in (out, reliability) if p.is_dir()}
    if case == "out_under_a_file":
        left.add("afile")
    assert {p.name for p in tmp_path.iterdir()} == left  # no output, no temporary file


_EV = ["evaluate", "--posterior", "p.pt", "--predictor", "map", "--data", "mnist5k"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["evaluate", "--predictor", "map", "--data", "mnist5k", "--out", "m.json"],
            "the following arguments are required: --posterior (see `bayesavg evaluate --help`)",
        ),
        (_EV, "the following arguments are required: --out (see `bayesavg evaluate --help`)"),
        (
            [*_EV, "--out", "m.json", "--samples", "three"],
            "argument --samples: invalid int value: 'three' (see `bayesavg evaluate --help`)",
        ),
        (
            [*_EV, "--out", "m.json", "--bogus"],
            "unrecognized arguments: --bogus (see `bayesavg evaluate --help`)",
        ),
        (
            [*_EV, "--out", "m.json", "--sample", "5"],  # no abbreviations: flags may be added
            "unrecognized arguments: --sample 5 (see `bayesavg evaluate --help`)",
        ),
        (["track"], "the following arguments are required: --sync (see `bayesavg track --help`)"),
        (["train"], "argument command: invalid choice: 'train' (choose from 'track', 'evaluate')"),
        ([], "the following arguments are required: command (see `bayesavg --help`)"),
    ],
)
def test_argparse_errors_are_one_line_and_exit_2(
    argv: list[str],
    said: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {said}"), err
    assert not (tmp_path / "m.json").exists()


def test_track_with_a_root_that_is_no_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["track", "--sync", "--root", str(tmp_path / "nowhere")])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        f"error: --root: {tmp_path / 'nowhere'} is not a folder (the project root, beside "
        "dvc.yaml)\n"
    )


def test_posterior_file_is_plain_data(tiny_posteriors: TinyPosteriors) -> None:
    """Loadable without executing code, and self-describing enough to rebuild the network."""
    raw = torch.load(tiny_posteriors.swag, weights_only=True)
    assert raw["model"] == {"name": "mlp", "kwargs": {"hidden": [32]}}
    assert raw["input"]["shape"] == [1, 28, 28]
    assert len(raw["input"]["mean"]) == len(raw["input"]["std"]) == 1
    assert 0 < raw["input"]["mean"][0] < 1 and 0 < raw["input"]["std"][0] < 1
    assert raw["num_classes"] == 10
    assert raw["data"]["dataset"] == "mnist5k"

    model = build_model(
        raw["model"]["name"],
        tuple(raw["input"]["shape"]),
        raw["num_classes"],
        raw["model"]["kwargs"],
    )
    torch.nn.utils.vector_to_parameters(raw["theta"], model.parameters())
    x = torch.randn(4, *raw["input"]["shape"], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(model(x), tiny_posteriors.model(x))

    swag = SWAG.from_state_dict(raw["collector"])
    assert swag.n_collected == tiny_posteriors.swag_rank + 1
    assert swag.rank == tiny_posteriors.swag_rank
    assert swag.num_params == raw["theta"].numel()
    assert torch.load(tiny_posteriors.plain, weights_only=True)["collector"] is None


def test_bn_update_fraction_is_the_pipelines_subset(
    bn_swag_posterior: Path, mnist5k_prepared: PreparedDir, tmp_path: Path
) -> None:
    """--bn-update-fraction recomputes BatchNorm on the same images the evaluate stage
    uses for that fraction (bn_subset of the training split with the data seed); without
    --seed the samples are the stage's for its predictor swag."""
    from bayesavg.evaluation.evaluate import bn_subset, evaluate
    from bayesavg.seeding import derive_seed

    prepared = mnist5k_prepared.prepared
    posterior = load_posterior(bn_swag_posterior)
    outs = {}
    for fraction in ("0.25", "1.0"):
        out = tmp_path / f"m{fraction}.json"
        args = _evaluate_args(bn_swag_posterior, "swag", "mnist5k", out)
        outs[fraction] = run_ok([*args, "--samples", "3", "--bn-update-fraction", fraction], out)
    part = bn_subset(prepared.train, 0.25, posterior.data["seed"])
    assert len(part) == round(0.25 * len(prepared.train))
    direct = evaluate(
        posterior,
        "swag",
        {"test": (posterior.model_input(prepared.test.x, "cpu"), prepared.test.y)},
        n_samples=3,
        bn_x=posterior.model_input(part.x, "cpu"),
        seed=derive_seed(posterior.data["seed"], "evaluate", "swag"),
    )["test"].metrics
    assert outs["0.25"]["seed"] == derive_seed(posterior.data["seed"], "evaluate", "swag")
    assert outs["0.25"]["nll"] == direct["nll"]
    assert outs["0.25"]["nll"] != outs["1.0"]["nll"]


def test_bn_update_fraction_out_of_range_is_one_line(
    bn_swag_posterior: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.json"
    args = _evaluate_args(bn_swag_posterior, "swag", "mnist5k", out, "--bn-update-fraction", "0")
    assert "--bn-update-fraction" in user_error_line(args, capsys)
    assert not out.exists()


def test_non_finite_predictions_stop_with_the_predictor_named(
    tiny_posteriors: TinyPosteriors, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Weights that are finite but overflow the logits: one line, no NaN metrics written."""
    posterior = load_posterior(tiny_posteriors.plain)
    huge = dataclasses.replace(posterior, theta=posterior.theta * 1e36)
    path = tmp_path / "huge.pt"
    save_posterior(path, huge)
    out = tmp_path / "m.json"
    line = user_error_line(_evaluate_args(path, "map", "mnist5k", out), capsys)
    assert "predictor map: the predictive probabilities are not finite" in line
    assert not out.exists()


def test_shift_and_ood_in_one_pass_match_separate_evaluations(
    tiny_posteriors: TinyPosteriors, mnist5k_prepared: PreparedDir, tmp_path: Path
) -> None:
    """--shift and --ood add forwards to the same samples: a shifted set's metrics equal an
    evaluation of the shifted images on their own, and the OOD scores of the averaged
    prediction equal those computed from two separate evaluations' BMAs."""
    from bayesavg.data.ood_data import load_ood
    from bayesavg.data.shift import parse
    from bayesavg.evaluation.evaluate import evaluate
    from bayesavg.evaluation.ood import detection_metrics, ood_scores_from_log
    from bayesavg.seeding import derive_seed

    out = tmp_path / "m.json"
    args = _evaluate_args(tiny_posteriors.swag, "swag", "mnist5k", out, "--samples", "4")
    got = run_ok([*args, "--shift", "rotate_30", "--shift", "stripe", "--ood", "animal_mnist"], out)
    assert set(got["shift"]) == {"rotate_30", "stripe"}
    assert set(got["shift"]["stripe"]) == {"accuracy", "nll", "ece", "brier", "entropy"}
    assert set(got["ood"]["animal_mnist"]) == {"msp", "entropy", "mutual_info"}
    plain = run_ok(args, out)
    assert {k: got[k] for k in plain if k != "entropy"} == {
        k: v for k, v in plain.items() if k != "entropy"
    }, "the clean test metrics do not change when shifts and OOD sets ride along"

    post = load_posterior(tiny_posteriors.swag)
    test = mnist5k_prepared.prepared.test
    x = post.model_input(test.x, "cpu")
    kw = {
        "n_samples": 4,
        "seed": derive_seed(post.data["seed"], "evaluate", "swag"),
        "device": "cpu",
    }
    shifted = parse("rotate_30").apply(test.x, derive_seed(0, "shift"))
    alone = evaluate(post, "swag", {"test": (post.model_input(shifted, "cpu"), test.y)}, **kw)
    for key, value in got["shift"]["rotate_30"].items():
        assert value == pytest.approx(alone["test"].metrics[key], rel=1e-9, abs=1e-12), key
    animals = post.model_input(load_ood("animal_mnist").x, "cpu")
    fake = torch.zeros(animals.shape[0], dtype=torch.long)
    both = evaluate(post, "swag", {"test": (x, test.y), "animals": (animals, fake)}, **kw)
    h_in = ood_scores_from_log(both["test"].log_probs[None])["entropy"]
    h_out = ood_scores_from_log(both["animals"].log_probs[None])["entropy"]
    expected = detection_metrics(h_in, h_out)
    for metric, value in got["ood"]["animal_mnist"]["entropy"].items():
        assert value == pytest.approx(float(expected[metric]), abs=1e-9), metric


def test_mutual_information_of_a_single_network_detects_nothing(
    tiny_posteriors: TinyPosteriors, tmp_path: Path
) -> None:
    out = tmp_path / "m.json"
    args = _evaluate_args(tiny_posteriors.plain, "map", "mnist5k", out, "--ood", "animal_mnist")
    mi = run_ok(args, out)["ood"]["animal_mnist"]["mutual_info"]
    assert mi["auroc"] == 0.5, "every score is 0: no ranking"


def test_no_deterministic_reaches_the_device_s_kernel_choice(
    tiny_posteriors: TinyPosteriors,
    mnist5k_prepared: PreparedDir,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--no-deterministic`` is the params' ``deterministic: false`` for the CLI: it goes
    to ``resolve_device``, which sets CUDA's kernels (tests/test_seeding.py); the default
    keeps them deterministic."""
    from bayesavg import seeding

    asked: list[bool] = []
    real = seeding.resolve_device

    def resolve(name: str, deterministic: bool = True) -> torch.device:
        asked.append(deterministic)
        return real(name, deterministic)

    monkeypatch.setattr(seeding, "resolve_device", resolve)
    out = tmp_path / "m.json"
    args = _evaluate_args(tiny_posteriors.plain, "map", "mnist5k", out)
    first = run_ok(args, out)
    second = run_ok([*args, "--no-deterministic"], out)
    assert asked == [True, False]
    assert first == second  # on the CPU the kernels are deterministic either way
