"""The report's Distributed SWAG part: roles by trajectory, figures, and claims as found.

Synthetic sweep in which most of the paper's claims fail, so the text must say
"does not hold" and "not reached" where the numbers say so, and a W=1 run with
one snapshot (no variance) must never turn into NaN.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from test_report import (
    PNG_MAGIC,
    _HtmlContent,
    _inputs,
    _markdown_content,
    _predictor,
    no_analyses,  # noqa: F401 (autouse: the analyses section pinned to nothing)
)

from bayesavg.evaluation.metrics import accuracy, brier, ece, nll
from bayesavg.report import Predictions, PredictorResult, ReportInputs, SweepPoint, write_report
from bayesavg.report.claims import DSWAG_PAPER as PAPER
from bayesavg.report.claims import Claim, claim_text
from bayesavg.report.intervals import resample_counts
from bayesavg.report.sections.calibration import reliability_layout
from bayesavg.report.sections.distributed import SIGN_NOTE, claims, overview
from bayesavg.report.sections.distributed.figures import (
    dswag_reliability_figure,
    dswag_rounds_figure,
    dswag_sigma_figure,
    dswag_workers_figure,
)
from bayesavg.report.sections.distributed.measures import dswag_roles
from bayesavg.report.sections.distributed.measures import point_curve as sigma_curve
from bayesavg.report.sections.training import run_offset
from bayesavg.report.sigma_curves import flat_range
from bayesavg.report.stats import accuracy_interval
from bayesavg.report.uncertainty import Settings, Uncertainty, compute

DSWAG_FIGURES = ("dswag_rounds", "dswag_reliability", "dswag_sigma_distance", "dswag_workers")
MULTIPLES = (0.0, 1.0, 10.0, 100.0)
# Trajectories with names that are no predictor's: the roles come from kind, start, method.
FINETUNE = {
    "fed": {"kind": "dswag", "start": "init", "clients": 4},
    "after": {"start": "fed", "epochs": 2},  # SWAG after distributed training
    "plain": {"start": "pretrain", "epochs": 2},  # a swag run that is not the baseline
}


def _metrics(accuracy: float, nll: float, ece: float) -> dict[str, float]:
    return {"accuracy": accuracy, "nll": nll, "ece": ece, "ece15": ece, "brier": 2 * nll / 10}


def _history(rounds: int, workers: int) -> list[dict[str, float]]:
    return [
        {
            "epoch": r,
            "lr": 0.05,
            "clients": workers,
            "train_loss": 1.0 / r,
            "train_accuracy": min(0.99, 0.5 + 0.1 * r * 4 / workers),
            "test_loss": 1.1 / r,
            "test_accuracy": min(0.98, 0.48 + 0.1 * r * 4 / workers),
        }
        for r in range(1, rounds + 1)
    ]


def _sigma(acc0: float, drops: dict[float, float], norm: float) -> list[dict[str, float]]:
    """Two draws per multiple; ``drops``: mean accuracy lost at each multiple."""
    return [
        {
            "multiple": m,
            "draw": d,
            "accuracy": acc0 - drops.get(m, 0.0) + (0.002 if d else -0.002) * (m > 0),
            "nll": 0.2 + m,
            "sigma_norm": norm,
        }
        for m in MULTIPLES
        for d in range(2)
    ]


def _point(
    workers: int,
    rounds: int,
    reached: int | None,
    snapshots: int,
    metrics: dict[str, dict[str, float] | None],
    sigma: list[dict[str, float]],
) -> SweepPoint:
    return SweepPoint(
        workers=workers,
        rounds=rounds,
        rounds_to_target=reached,
        target_accuracy=0.9,
        snapshots=snapshots,
        metrics=metrics,
        history=_history(rounds, workers),
        sigma_distance=sigma,
    )


def _sweep() -> list[SweepPoint]:
    """Fewer rounds with more workers; NLL falls with W; W=1 has one snapshot."""
    one = {"fedavg": _metrics(0.90, 0.40, 0.04), "dswa": _metrics(0.90, 0.40, 0.04), "dswag": None}
    flat_zero = [
        {"multiple": m, "draw": d, "accuracy": 0.9, "nll": 0.4, "sigma_norm": 0.0}
        for m in MULTIPLES
        for d in range(2)
    ]
    return [
        _point(1, 6, None, 1, one, flat_zero),
        _point(
            4,
            6,
            3,
            8,
            {
                "fedavg": _metrics(0.92, 0.30, 0.03),
                "dswa": _metrics(0.93, 0.28, 0.03),
                "dswag": _metrics(0.93, 0.27, 0.02),
            },
            _sigma(0.93, {10.0: 0.05, 100.0: 0.8}, 0.5),
        ),
        _point(
            8,
            6,
            2,
            16,
            {
                "fedavg": _metrics(0.94, 0.25, 0.03),
                "dswa": _metrics(0.95, 0.24, 0.02),
                "dswag": _metrics(0.96, 0.20, 0.01),
            },
            _sigma(0.96, {10.0: 0.005, 100.0: 0.008}, 0.2),
        ),
    ]


def _dswag_inputs() -> ReportInputs:
    """A dswag trajectory's predictors under odd names, its baseline, and the sweep.

    On the default trajectory DSWAG is worse than its FedAvg model on NLL and
    accuracy, and better calibrated than the baseline (ECE 0.010 vs 0.030).
    """
    base = _inputs()
    predictors = [
        _predictor("fa", 0.0, _metrics(0.950, 0.15, 0.02), 1, "map", "fed"),
        _predictor("dsw", 0.0, _metrics(0.948, 0.16, 0.02), 1, "swa", "fed"),
        _predictor("dsg", 0.5, _metrics(0.945, 0.17, 0.01), 3, "swag", "fed"),
        _predictor("other", 0.5, _metrics(0.960, 0.12, 0.05), 3, "swag", "plain"),
        _predictor("base", 0.5, _metrics(0.960, 0.12, 0.03), 3, "swag", "after"),
    ]
    params = {
        "finetune": FINETUNE,
        "evaluate": {"dswag_sweep": {"trajectory": "fed", "rounds": 6, "workers": [1, 4, 8]}},
    }
    return dataclasses.replace(
        base, predictors=predictors, params=params, baseline="fa", dswag_sweep=_sweep()
    )


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_report(_dswag_inputs(), tmp_path_factory.mktemp("dswag") / "out")


def _claim(found: list[Claim], tag: str) -> Claim:
    (claim,) = [c for c in found if c.statement.startswith(f"({tag}) ")]
    return claim


def _tags(found: list[Claim]) -> list[str]:
    return [re.match(r"\((\w'*)\) ", c.statement)[1] for c in found]  # type: ignore[index]


def test_roles_come_from_kind_start_and_method() -> None:
    roles = dswag_roles(_dswag_inputs())
    assert roles is not None and roles.trajectory == "fed"
    assert [p.name if p else None for p in roles[1:]] == ["fa", "dsw", "dsg", "base"]
    # Without a trajectory that starts from fed there is no baseline; without kind dswag, no roles.
    finetune = {k: v for k, v in FINETUNE.items() if k != "after"}
    no_base = dataclasses.replace(_dswag_inputs(), params={"finetune": finetune})
    assert dswag_roles(no_base).baseline is None  # type: ignore[union-attr]
    plain = {k: {**v, "kind": "sgd"} for k, v in FINETUNE.items()}
    assert dswag_roles(dataclasses.replace(_dswag_inputs(), params={"finetune": plain})) is None


def test_dswag_figures_appear_with_their_numbers(written: dict[str, Path]) -> None:
    md = written["md"].read_text(encoding="utf-8")
    for name in DSWAG_FIGURES:
        assert written[name].read_bytes().startswith(PNG_MAGIC)
        assert f"## Figure: {name}" in md and f"![{name}](figures/{name}.png)" in md
    rounds = md.split("## Figure: dswag_rounds")[1].split("## Figure:")[0]
    assert "| 1 | 6 | not reached in 6 rounds | " in rounds
    assert "| 4 | 6 | 3 | " in rounds and "| 1 (no variance) |" in rounds
    workers = md.split("## Figure: dswag_workers")[1].split("## Tuning")[0]
    no_variance = "n/a (fewer than 2 snapshots, so no variance)"
    assert f"| 1 | DSWAG | {no_variance} | n/a | n/a | n/a |" in workers
    assert "| 8 | DSWAG | **96.00** | **0.2000** | **0.0100** | **0.0400** |" in workers
    sigma = md.split("## Figure: dswag_sigma_distance")[1].split("## Figure:")[0]
    assert "| 1 | 1 | 0 | 90.00 | every m (sigma = 0: fewer than 2 snapshots" in sigma
    assert "| 4 | 8 | 0.5 | 93.00 | 1 | 13.00 (12.80 to 13.20) |" in sigma
    caption = md.split("## Figure: dswag_reliability")[1].split("## Figure:")[0]
    assert "under-confident" in caption and "backwards" in caption


def test_html_and_markdown_carry_the_same_dswag_content(written: dict[str, Path]) -> None:
    page = _HtmlContent()
    page.feed(written["html"].read_text(encoding="utf-8"))
    md = _markdown_content(written["md"].read_text(encoding="utf-8"))
    assert page.headings == md.headings
    assert "Distributed SWAG" in md.headings and "The paper's claims on this data" in md.headings
    assert page.rows == md.rows and page.bullets == md.bullets and page.captions == md.captions
    text = written["md"].read_text(encoding="utf-8")
    headline = text.split("## Headline")[1].split("\n## ")[0]
    section = text.split("## Distributed SWAG")[1].split("\n## ")[0]
    evidence = headline.split("<details>")[1].split("</details>")[0]
    for claim in claims(_dswag_inputs()):
        # The same line, in full, in the headline's evidence and in its section; a table row.
        assert f"- {claim_text(claim)}\n" in evidence and f"- {claim_text(claim)}\n" in section
        verdict = f"**{claim.verdict}**" if claim.holds else claim.verdict
        row = f"| {PAPER} | {claim.statement} | {verdict} | {claim.number} |"
        assert row in headline.split("<details>")[0]
    assert SIGN_NOTE in text


def test_no_nan_or_inf_anywhere(written: dict[str, Path]) -> None:
    for key in ("md", "html"):
        text = written[key].read_text(encoding="utf-8")
        text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", text)
        assert not re.search(r"\b(nan|inf|infinity)\b", text, re.I), key
    assert "fewer than 2 snapshots, so no variance" in written["md"].read_text(encoding="utf-8")


def test_claims_say_where_they_do_not_hold() -> None:
    found = claims(_dswag_inputs())
    assert all(c.paper == PAPER for c in found)
    assert _tags(found) == ["a", "a'", "b", "b'", "c", "c'", "d", "d'", "d''", "e"]
    a = _claim(found, "a")
    assert a.holds is False and "; does not hold: " in a.evidence
    assert "W=8 (2 rounds) is not more than W=4 (3 rounds)" in a.evidence
    assert "W=1 not reached in 6 rounds" in a.evidence
    # The W=1 run never reached the target, W=4 did: not an increase.
    assert "W=4 (3 rounds) is not more than W=1 (not reached)" in a.evidence
    assert _claim(found, "a'").holds is False  # accuracy rises with W here
    b = _claim(found, "b")
    assert b.holds is False
    assert b.evidence.startswith("Does not hold on trajectory fed (dsg vs fa)")
    assert "NLL 0.1700 vs 0.1500 (+0.0200, no interval" in b.evidence
    assert "unpaired binomial 95% interval" in b.evidence
    assert "includes 0, not shown to differ" in b.evidence
    sweep = _claim(found, "b'")
    # NLL lower at both W, accuracy beyond the interval at W=8 only: partial, undecided.
    assert sweep.holds is None
    assert "lower than FedAvg's at 2 of 2 worker counts" in sweep.evidence
    assert "excluding 0 at 1 (W=8)" in sweep.evidence
    assert "no DSWAG at W=1 (1 snapshot): fewer than 2 snapshots, so no variance" in sweep.evidence
    c = _claim(found, "c")
    # Without predictions, calibration is decided by the values: ECE 0.010 < 0.030.
    assert c.holds is True and "better calibration holds" in c.evidence
    assert "ECE 0.0100 vs 0.0300 (-0.0200, no interval" in c.evidence
    assert "NLL 0.1700 vs 0.1200 (+0.0500, no interval" in c.evidence
    assert "other" not in c.evidence  # a swag run from pretrain is not SWAG after distributed
    confident = _claim(found, "c'")
    assert confident.holds is False and "dsg mean confidence" in confident.evidence
    d = _claim(found, "d")
    assert d.holds is None and d.evidence.startswith("Holds at W=4 only")
    assert "W=8 within 1 pp of 96.00% up to m = 100" in d.evidence
    assert "Left out: W=1 (1 snapshot)" in d.evidence  # no variance: said so, not NaN
    d1 = _claim(found, "d'")
    assert d1.holds is None and d1.evidence.startswith("Holds at W=8 only")
    d2 = _claim(found, "d''")
    assert d2.holds is False and "W=1" not in d2.evidence
    e = _claim(found, "e")
    assert e.holds is False
    assert "DSWAG: does not hold: W=8 (0.2000) is not higher than W=4 (0.2700)" in e.evidence
    assert "FedAvg: does not hold" in e.evidence and "DSWAG has no value at W=1" in e.evidence


def test_sweep_claims_hold_only_where_every_step_does() -> None:
    """NLL rising with W for every predictor, rounds rising too: (a) and (e) hold."""
    sweep = _sweep()
    rising = [
        dataclasses.replace(
            p,
            rounds_to_target=2 + i,
            metrics={
                k: (None if v is None else {**v, "nll": 0.1 + 0.1 * i})
                for k, v in p.metrics.items()
            },
        )
        for i, p in enumerate(sweep)
    ]
    found = claims(dataclasses.replace(_dswag_inputs(), dswag_sweep=rising))
    assert _claim(found, "a").holds is True
    assert _claim(found, "e").holds is True
    assert _claim(found, "e").evidence.startswith("DSWAG: holds at every step")


def test_accuracy_interval_is_the_unpaired_binomial_one() -> None:
    lo, hi = accuracy_interval(0.96, 0.95, 1000)
    se = math.sqrt((0.96 * 0.04 + 0.95 * 0.05) / 1000)
    assert lo == pytest.approx(0.01 - 1.959964 * se) and hi == pytest.approx(0.01 + 1.959964 * se)
    assert lo < 0 < hi
    assert accuracy_interval(0.99, 0.90, 1000)[0] > 0


def test_flat_range_counts_from_m_zero() -> None:
    w4, w8 = (sigma_curve(p) for p in _sweep()[1:])
    assert w4 is not None and w8 is not None
    assert flat_range(w4) == 1.0 and flat_range(w8) == 100.0
    assert w4.mean == pytest.approx([0.93, 0.93, 0.88, 0.13])
    assert w4.low[-1] == pytest.approx(0.128) and w4.high[-1] == pytest.approx(0.132)


def test_report_without_sweep_or_dswag_leaves_the_part_out(tmp_path: Path) -> None:
    full = _dswag_inputs()
    plain = dataclasses.replace(full, params={"finetune": {}}, dswag_sweep=[])
    paths = write_report(plain, tmp_path / "none")
    md = paths["md"].read_text(encoding="utf-8")
    assert "Distributed SWAG" not in md and not any(n in paths for n in DSWAG_FIGURES)
    # The dswag trajectory without a sweep: the reliability figure and (b), (c) only.
    no_sweep = dataclasses.replace(full, dswag_sweep=[])
    paths = write_report(no_sweep, tmp_path / "trajectory")
    assert [n for n in DSWAG_FIGURES if n in paths] == ["dswag_reliability"]
    assert _tags(claims(no_sweep)) == ["b", "c", "c'"]
    # A sweep without dswag predictors: the sweep figures, no reliability comparison.
    no_roles = dataclasses.replace(full, params={"finetune": {}})
    paths = write_report(no_roles, tmp_path / "sweep")
    drawn = [n for n in DSWAG_FIGURES if n in paths]
    assert drawn == [n for n in DSWAG_FIGURES if n != "dswag_reliability"]
    assert _tags(claims(no_roles)) == ["a", "a'", "b", "b'", "d", "d'", "d''", "e"]
    assert _claim(claims(no_roles), "b").holds is None
    md = paths["md"].read_text(encoding="utf-8")
    assert "## Distributed SWAG" in md


def test_figures_are_none_without_data() -> None:
    assert dswag_rounds_figure([]) is None
    assert dswag_sigma_figure([]) is None
    assert dswag_workers_figure([]) is None
    roles = dswag_roles(_dswag_inputs())
    assert roles is not None
    assert dswag_reliability_figure(roles.dswag, None) is None
    empty = dataclasses.replace(roles.dswag, reliability=[])  # type: ignore[arg-type]
    assert dswag_reliability_figure(empty, roles.baseline) is None
    only_one = [dataclasses.replace(_sweep()[0], history=[], sigma_distance=[])]
    assert dswag_rounds_figure(only_one) is None and dswag_sigma_figure(only_one) is None


def test_dswag_report_is_byte_identical(written: dict[str, Path]) -> None:
    before = {name: path.read_bytes() for name, path in written.items()}
    again = write_report(_dswag_inputs(), written["md"].parent)
    assert again == written
    for name, data in before.items():
        assert again[name].read_bytes() == data


def test_training_figure_places_runs_by_their_start() -> None:
    """A fresh-network run (DSWAG, start: init) starts beside pretraining, not after it;
    a run from it continues after its last round."""
    histories = {
        "pretrain": [{"epoch": e} for e in range(1, 6)],
        "fed": [{"epoch": e} for e in range(1, 4)],
        "after": [{"epoch": e} for e in range(1, 3)],
        "plain": [{"epoch": e} for e in range(1, 3)],
    }
    assert run_offset("fed", FINETUNE, histories) == 0
    assert run_offset("after", FINETUNE, histories) == 3
    assert run_offset("plain", FINETUNE, histories) == 5
    assert run_offset("unknown", FINETUNE, histories) == 5  # no params: after pretraining


def test_distributed_predictors_share_one_reliability_panel() -> None:
    """The dswag trajectory and the one that starts from it form the distributed family."""
    inputs = _dswag_inputs()
    fig = reliability_layout(inputs)
    assert fig is not None
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.axison]
    assert "Distributed (DSWAG)" in titles


def test_targets_not_reached_are_not_ordered() -> None:
    """Two neighbouring runs that both missed the target say nothing about the order."""
    sweep = _sweep()
    late = [
        dataclasses.replace(sweep[1], rounds_to_target=5),
        dataclasses.replace(sweep[2], workers=16, rounds_to_target=None),
        dataclasses.replace(sweep[2], workers=32, rounds_to_target=None),
    ]
    a = _claim(claims(dataclasses.replace(_dswag_inputs(), dswag_sweep=late)), "a")
    assert "holds at every step that can be ordered (W=16 and W=32 both not reached)" in a.evidence
    assert a.holds is True
    never = [dataclasses.replace(p, rounds_to_target=None) for p in late]
    a = _claim(claims(dataclasses.replace(_dswag_inputs(), dswag_sweep=never)), "a")
    assert "cannot be checked" in a.evidence and a.holds is None


def _scored(y: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Log-probabilities over 10 classes: 0.9 on the label where ``right``, else on the next."""
    guess = np.where(right, y, (y + 1) % 10)
    probs = np.full((len(y), 10), 0.1 / 9)
    probs[np.arange(len(y)), guess] = 0.9
    return np.log(probs)


def _predicted(p: PredictorResult, y: np.ndarray, log_probs: np.ndarray) -> PredictorResult:
    """The predictor with these predictions and the metrics they give."""
    lp, labels = torch.from_numpy(log_probs), torch.from_numpy(y)
    metrics = {
        **p.metrics,
        "accuracy": float(accuracy(lp, labels)),
        "nll": float(nll(lp, labels)),
        "ece": float(ece(lp, labels, 20)),
        "brier": float(brier(lp, labels)),
    }
    return dataclasses.replace(
        p, metrics=metrics, predictions=Predictions(y=y, log_probs=log_probs)
    )


def _paired_inputs() -> ReportInputs:
    """fa and base right on the same 900 of 1,000 points, dsg on those and 12 more.

    +1.2 pp on 1,000 points is within an unpaired interval (about ±2.6 pp), but
    the two differ on 12 points only, all 12 for dsg: the paired one excludes 0.
    """
    y = np.random.default_rng(0).integers(0, 10, 1000)
    points = np.arange(1000)
    found = {
        "fa": _scored(y, points < 900),
        "base": _scored(y, points < 900),
        "dsg": _scored(y, points < 912),
    }
    inputs = _dswag_inputs()
    predictors = [
        _predicted(p, y, found[p.name]) if p.name in found else p for p in inputs.predictors
    ]
    bootstrap = {"report": {"bootstrap": {"resamples": 500, "seed": 0}}}
    return dataclasses.replace(inputs, predictors=predictors, params={**inputs.params, **bootstrap})


def _without_predictions(inputs: ReportInputs, *names: str) -> ReportInputs:
    predictors = [
        dataclasses.replace(p, predictions=None) if p.name in names else p
        for p in inputs.predictors
    ]
    return dataclasses.replace(inputs, predictors=predictors)


def test_b_and_c_use_the_paired_interval_where_predictions_exist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs = _paired_inputs()
    low, high = accuracy_interval(0.912, 0.900, 1000)
    assert low < 0 < high  # what the unpaired interval would say
    found = claims(inputs)
    b, c = _claim(found, "b"), _claim(found, "c")
    unc = compute(inputs)
    to_fedavg, to_swag = unc.comparison("fa", "dsg"), unc.comparison("base", "dsg")
    assert to_fedavg is not None and to_swag is not None
    assert to_fedavg.intervals["accuracy"].low > 0 and to_fedavg.intervals["nll"].high < 0
    # (b): lower NLL and higher accuracy, both beyond the paired interval.
    assert b.holds is True and "unpaired" not in b.evidence
    assert "accuracy 91.20% vs 90.00% (+1.20 pp, paired bootstrap 95% interval +" in b.evidence
    assert f"McNemar p = {to_fedavg.mcnemar_p:.2g}: higher)" in b.evidence
    assert re.search(r"NLL [\d.]+ vs [\d.]+ \(-[\d.]+, paired bootstrap .*: lower\)", b.evidence)
    # (c): every metric paired, and the verdict is the paired ECE interval's.
    assert "unpaired" not in c.evidence and c.evidence.count("paired bootstrap") == 4
    verdict = to_swag.intervals["ece"].verdict()
    assert c.holds is {"better": True, "worse": False, "within noise": None}[verdict]
    assert "accuracy 91.20% vs 90.00% (+1.20 pp, paired bootstrap" in c.evidence
    assert "Intervals: the trajectory's predictors are compared by the 95% paired" in (
        overview(inputs) or ""
    )
    # Computed once for the report: asked again, nothing is bootstrapped anew.
    monkeypatch.setattr("bayesavg.report.uncertainty.compare", lambda *a: pytest.fail("again"))
    assert claims(inputs) == found


def test_b_and_c_fall_back_to_the_unpaired_interval_without_predictions() -> None:
    inputs = _paired_inputs()
    # base has no predictions: (b) stays paired, (c) falls back and says so.
    found = claims(_without_predictions(inputs, "base"))
    assert _claim(found, "b").holds is True
    c = _claim(found, "c")
    assert "paired bootstrap" not in c.evidence
    assert "accuracy 91.20% vs 90.00% (+1.20 pp, unpaired binomial 95% interval" in c.evidence
    assert "no paired per-point predictions: includes 0, not shown to differ)" in c.evidence
    assert "ECE" in c.evidence and "no interval: no paired per-point predictions" in c.evidence
    # By value, as without an interval: dsg's ECE (0.012) is above base's (0), so it fails.
    assert c.holds is False
    # No predictions at all: the same +1.2 pp is no longer shown; (b) holds for NLL only.
    b = _claim(claims(_without_predictions(inputs, "fa", "dsg", "base")), "b")
    assert b.holds is None and b.evidence.startswith("Holds for NLL only on trajectory fed")
    assert "+1.20 pp, unpaired binomial 95% interval" in b.evidence
    assert "includes 0, not shown to differ" in b.evidence


def _confident_pair(sharper: float) -> tuple[PredictorResult, PredictorResult, Uncertainty]:
    """DSWAG and SWAG predictors on the same 1,000 labels: DSWAG's logits are SWAG's times
    ``sharper`` (2: far more confident; 0.5: far less); at 1 they get independent noise
    instead (some points more confident, some less: no difference beyond noise)."""
    rng = np.random.default_rng(3)
    y = rng.integers(0, 4, 1000)
    logits = rng.normal(size=(1000, 4))
    logits[np.arange(1000), y] += 2.0
    dswag = logits * sharper if sharper != 1 else logits + rng.normal(size=(1000, 4)) * 0.3

    def result(name: str, found: np.ndarray) -> PredictorResult:
        lp = torch.log_softmax(torch.as_tensor(found), 1).numpy()
        conf = np.exp(lp).max(1)
        correct = (lp.argmax(1) == y).astype(float)
        bins = [{"confidence": float(conf.mean()), "accuracy": correct.mean(), "count": 1000}]
        return PredictorResult(
            name, "swag", name, 0.5, {}, bins, [], Predictions(y=y, log_probs=lp)
        )

    d, b = result("dswag", dswag), result("swag", logits)
    unc = Uncertainty(Settings(resamples=500, seed=1), predictors={"dswag": d, "swag": b})
    return d, b, unc


@pytest.mark.parametrize(("sharper", "holds"), [(1.0, None), (2.0, True), (0.5, False)])
def test_more_confident_is_decided_by_its_paired_interval(
    sharper: float, holds: bool | None
) -> None:
    """(c') A difference in mean confidence within its paired interval is undecided, not
    'holds' or 'does not hold'; a clear one decides it. Without per-point predictions the
    values decide, and the evidence says so."""
    from bayesavg.report.sections.distributed.claims import _claim_confident

    d, b, unc = _confident_pair(sharper)
    claim = _claim_confident(d, b, unc)
    assert claim is not None and claim.holds is holds
    assert re.fullmatch(
        r"mean confidence [\d.]+% vs [\d.]+% \(diff [+-][\d.]+ \[[+-][\d.]+, [+-][\d.]+\] pp\)",
        claim.number,
    )
    assert ("not shown to differ" in claim.evidence) is (holds is None)
    no_predictions = dataclasses.replace(d, predictions=None)
    unc.predictors["dswag"] = no_predictions
    by_values = _claim_confident(no_predictions, b, dataclasses.replace(unc, extra={}))
    assert by_values is not None
    assert by_values.holds is (d.reliability[0]["confidence"] > b.reliability[0]["confidence"])
    assert "decided by the values" in by_values.evidence


@pytest.mark.parametrize("sharper", [0.5, 1.0, 2.0])
def test_a_confidence_gap_has_a_side_only_beyond_its_interval(sharper: float) -> None:
    """accuracy - confidence with the percentile interval of its resampled means (brute
    force below); over- or under-confident only where that interval excludes 0."""
    from bayesavg.report.sections.distributed.measures import confidence_gap, confidence_text

    d, _, unc = _confident_pair(sharper)
    assert d.predictions is not None
    lp, y = torch.as_tensor(d.predictions.log_probs), torch.as_tensor(d.predictions.y)
    gaps = (lp.argmax(1) == y).double() - lp.exp().max(1).values
    brute = []
    for row in resample_counts(len(y), 500, 1):
        idx = torch.repeat_interleave(torch.arange(len(y)), row.long())
        brute.append(float(gaps[idx].mean()))
    low, high = np.quantile(brute, [0.025, 0.975])
    point, got_low, got_high = confidence_gap(d, unc) or (math.nan,) * 3
    assert point == pytest.approx(float(gaps.mean()), abs=1e-12)
    assert (got_low, got_high) == pytest.approx((low, high), abs=1e-12)
    side = "under-confident" if low > 0 else "over-confident" if high < 0 else "within noise"
    assert f"({side}" in confidence_text(d, unc)
    bare = dataclasses.replace(d, predictions=None)
    assert confidence_text(bare, unc).endswith("on average; no interval)")


def test_the_overview_gives_the_main_runs_clients_and_rounds() -> None:
    """The sweep's rows stop phase 1 at a target; the main run's setting is said beside
    its predictors, so no reader holds one against the other's W = 10 row."""
    inputs = _dswag_inputs()
    fed = inputs.params["finetune"]["fed"]
    setting = {**fed, "clients": 10, "phase1": {"rounds": 20}}
    params = {**inputs.params, "finetune": {**inputs.params["finetune"], "fed": setting}}
    text = overview(dataclasses.replace(inputs, params=params))
    assert text is not None
    assert "On trajectory fed (10 clients, 20 FedAvg rounds in phase 1): " in text
    setting["phase1"] = {"rounds": 20, "target_accuracy": 0.9}
    text = overview(dataclasses.replace(inputs, params=params))
    assert (
        text is not None and "(10 clients, phase 1 until 90.00% train accuracy, at most 20 " in text
    )
