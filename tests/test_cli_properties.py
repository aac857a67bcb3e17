"""``bayesavg evaluate``: properties the other CLI tests left unchecked, found by hand-made
mutation testing. Each test fails for a plausible slip in ``bayesavg.cli`` (named in its
docstring) and holds for the contract in DESIGN.md and the README: the documented
defaults, the bounds of each option (inclusive where the README says so), the reliability
CSV, and exact one-line errors with exit code 2."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from cli_runs import run_ok, user_error_line

import bayesavg.runtime.io
from bayesavg.cli import _parser
from bayesavg.config.base import SEED_MAX
from bayesavg.models import build_model
from bayesavg.posteriors.file import PosteriorFile, load_posterior, save_posterior

if TYPE_CHECKING:
    from conftest import ImageFolderFactory, TinyPosteriors


def _args(posterior: Path, predictor: str, data: str, out: Path, *extra: str) -> list[str]:
    return [
        *["evaluate", "--posterior", str(posterior), "--predictor", predictor],
        *["--data", data, "--out", str(out), "--device", "cpu", *extra],
    ]


def test_documented_defaults() -> None:
    """DESIGN.md's ``[--samples 30]`` and the README's defaults: a changed default would
    silently change every number a user gets without the flag."""
    given = ["--posterior", "p.pt", "--predictor", "swag", "--data", "mnist5k", "--out", "m.json"]
    args = _parser().parse_args(["evaluate", *given])
    assert args.samples == 30 and args.seed is None and args.scale is None
    assert args.device == "auto" and args.deterministic is True
    assert args.bn_update_fraction == 1.0 and args.batch_size == 1000
    assert args.raw_dir == Path("data/raw")
    assert args.temperature is None and args.val is None and args.reliability is None


def test_without_samples_the_bma_has_thirty_networks(
    tiny_posteriors: TinyPosteriors, imagefolder: Path, tmp_path: Path
) -> None:
    """The default S reaches the evaluation (n_samples in the JSON), not only the parser."""
    out = tmp_path / "m.json"
    got = run_ok(_args(tiny_posteriors.swag, "swag", f"imagefolder:{imagefolder}", out), out)
    assert got["n_samples"] == 30


def test_reliability_csv_is_the_bins_behind_the_ece(
    tiny_posteriors: TinyPosteriors, imagefolder_factory: ImageFolderFactory, tmp_path: Path
) -> None:
    """``--reliability`` writes the 20 equal-width bins (ALGORITHMS §7) whose counts sum
    to n and whose weighted |accuracy - confidence| is the JSON's ``ece``. Catches the CSV
    not being written, or binned with other than the ECE's 20 bins."""
    images = imagefolder_factory(num_classes=10, per_class=3)
    out, bins = tmp_path / "m.json", tmp_path / "bins.csv"
    args = _args(tiny_posteriors.swag, "swag", f"imagefolder:{images}", out, "--samples", "3")
    got = run_ok([*args, "--reliability", str(bins)], out)
    with bins.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["bin"]) for r in rows] == list(range(20))
    assert [float(r["lower"]) for r in rows] == pytest.approx([i / 20 for i in range(20)])
    assert [float(r["upper"]) for r in rows] == pytest.approx([(i + 1) / 20 for i in range(20)])
    counts = [int(r["count"]) for r in rows]
    assert sum(counts) == got["n"] == 30
    ece = sum(
        c / 30 * abs(float(r["accuracy"]) - float(r["confidence"]))
        for c, r in zip(counts, rows, strict=True)
        if c
    )
    assert ece == pytest.approx(got["ece"], abs=1e-9)


def test_the_bounds_of_seed_and_scale_are_accepted(
    tiny_posteriors: TinyPosteriors, imagefolder: Path, tmp_path: Path
) -> None:
    """``--seed`` 0 and 2**63 - 1 are both in [0, 2**63 - 1] (the pipeline's range), and
    ``--scale 0`` is a covariance scale >= 0: SWAG at scale 0 is SWA (ALGORITHMS §2), so
    its metrics are swa's. Catches strict bounds and a zero scale read as 'default'."""
    data = f"imagefolder:{imagefolder}"
    for seed in (0, SEED_MAX):
        out = tmp_path / f"s{seed}.json"
        got = run_ok(_args(tiny_posteriors.swag, "map", data, out, "--seed", str(seed)), out)
        assert got["seed"] == seed
    out = tmp_path / "m.json"
    zero = run_ok(
        _args(tiny_posteriors.swag, "swag", data, out, "--scale", "0", "--samples", "2"), out
    )
    swa = run_ok(_args(tiny_posteriors.swag, "swa", data, out), out)
    for key in ("accuracy", "nll", "ece", "brier"):
        assert zero[key] == pytest.approx(swa[key], rel=1e-9, abs=1e-12), key


def test_a_label_equal_to_the_class_count_is_refused(
    tiny_posteriors: TinyPosteriors,
    imagefolder_factory: ImageFolderFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Labels 0..10 for a 10-class posterior: label 10 has no output (an off-by-one
    ``>`` would let it through to a gather)."""
    images = imagefolder_factory(num_classes=11, per_class=1, name="eleven")
    out = tmp_path / "m.json"
    line = user_error_line(
        _args(tiny_posteriors.plain, "map", f"imagefolder:{images}", out), capsys
    )
    assert line == f"error: imagefolder:{images} has labels up to 10, the posterior has 10 classes"
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--samples", "0"], "error: --samples: must be >= 1 (got 0)"),
        (["--batch-size", "0"], "error: --batch-size: must be >= 1 (got 0)"),
        (
            ["--bn-update-fraction", "1.5"],
            "error: --bn-update-fraction: must be in (0, 1] (got 1.5)",
        ),
        (["--device", "mps"], "error: --device: 'mps' is not one of auto, cpu, cuda, cuda:N"),
        (["--predictor", "x"], "error: --predictor: unknown 'x'; choose one of "),
    ],
    ids=["samples", "batch_size", "bn_fraction", "device", "predictor"],
)
def test_bad_options_are_one_exact_line(
    tiny_posteriors: TinyPosteriors,
    imagefolder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    expected: str,
) -> None:
    """Each line names the flag as the user typed it and the value given (DESIGN: one
    clear line, exit code 2); nothing is written."""
    out = tmp_path / "m.json"
    line = user_error_line(
        _args(tiny_posteriors.plain, "map", f"imagefolder:{imagefolder}", out, *extra), capsys
    )
    assert line.startswith(expected) if expected.endswith(" ") else line == expected
    assert not out.exists()


def test_a_degenerate_fit_names_the_val_set_and_the_bracket(
    tiny_posteriors: TinyPosteriors,
    imagefolder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A uniform predictive (all weights zero) has an NLL flat in T: the line says which
    ``--val`` the fit failed on and the README's bracket [0.05, 20]."""
    post = load_posterior(tiny_posteriors.plain)
    zero = tmp_path / "zero.pt"
    save_posterior(zero, dataclasses.replace(post, theta=torch.zeros_like(post.theta)))
    out, val = tmp_path / "m.json", f"imagefolder:{imagefolder}"
    args = _args(zero, "map", val, out, "--temperature", "fit", "--val", val)
    line = user_error_line(args, capsys)
    assert line.startswith(f"error: --temperature fit on {val}: the fitted temperature ")
    assert line.endswith(" is at the edge of [0.05, 20]: the predictive is degenerate")
    assert not out.exists()


def test_a_failed_reliability_write_is_the_os_reason(
    tiny_posteriors: TinyPosteriors,
    imagefolder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reason is the OS's words, without Python's ``[Errno 13]`` prefix."""

    def refused(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(bayesavg.runtime.io, "write_csv", refused)
    out, bins = tmp_path / "m.json", tmp_path / "bins.csv"
    args = _args(tiny_posteriors.plain, "map", f"imagefolder:{imagefolder}", out)
    line = user_error_line([*args, "--reliability", str(bins)], capsys)
    assert line == "error: --reliability: cannot write it: Permission denied"
    assert not out.exists() and not bins.exists()


def test_a_cifar_c_shift_says_which_images_were_official(
    tiny_posteriors: TinyPosteriors, imagefolder: Path, tmp_path: Path
) -> None:
    """README: with a CIFAR-10-C shift the JSON lists the shifts served from the official
    arrays (``cifar_c_official``); for data with no official arrays that list is empty:
    every image was generated, and the JSON says so rather than saying nothing."""
    model = build_model("mlp", (3, 8, 8), 3, {"hidden": [4]})
    rgb = PosteriorFile.from_model(
        model,
        trajectory="pretrain",
        model_name="mlp",
        model_kwargs={"hidden": [4]},
        input_shape=(3, 8, 8),
        mean=[0.5, 0.5, 0.5],
        std=[0.25, 0.25, 0.25],
        num_classes=3,
        data=dict(load_posterior(tiny_posteriors.plain).data),
    )
    path, out = tmp_path / "rgb.pt", tmp_path / "m.json"
    save_posterior(path, rgb)
    args = _args(path, "map", f"imagefolder:{imagefolder}", out)
    got = run_ok([*args, "--shift", "c_gaussian_noise_1"], out)
    assert got["cifar_c_official"] == []
    assert set(got["shift"]) == {"c_gaussian_noise_1"}


def test_map_of_a_batchnorm_network_reads_no_training_data(
    bn_swag_posterior: Path, imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``map`` predicts with the network's own BatchNorm statistics (ALGORITHMS §6 is for
    sampled weights): it must not need the training split, which may not be on disk."""
    import bayesavg.data.prepared

    real = bayesavg.data.prepared.load_eval_split

    def no_train(spec: str, raw_dir: Path, shape: Any, split: str, *rest: Any) -> Any:
        assert split != "train", "map read the training split"
        return real(spec, raw_dir, shape, split, *rest)

    monkeypatch.setattr(bayesavg.data.prepared, "load_eval_split", no_train)
    out = tmp_path / "m.json"
    got = run_ok(_args(bn_swag_posterior, "map", f"imagefolder:{imagefolder}", out), out)
    assert got["n"] == 6
