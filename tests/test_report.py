"""The report is self-contained, honest about comparisons, escaped and deterministic."""

from __future__ import annotations

import base64
import dataclasses
import math
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bayesavg.report import PlaneData, PredictorResult, ReportInputs, pair_predictors, write_report
from bayesavg.report.document import Heading, Preformatted, TableBlock
from bayesavg.report.figures import epoch_offset, finetune_curves_figure, plane_grid, sigma_figure
from bayesavg.report.findings import PAIRS_NOTE, Cell, Table, claim_sections, comparison_lines
from bayesavg.report.render import to_html, to_markdown

PNG_MAGIC = b"\x89PNG"
FIGURES = ("reliability", "samples", "training")
NEW_FIGURES = ("finetune_curves", "sigma", "loss_plane")


def _reliability(shift: float) -> list[dict[str, float]]:
    """20 bins; the lower half is empty, as for a confident classifier."""
    rows = []
    for i in range(20):
        lower, upper = i / 20, (i + 1) / 20
        count = 0 if i < 10 else 5 * (i - 9)
        conf = (lower + upper) / 2 if count else 0.0
        acc = min(1.0, conf + shift) if count else 0.0
        rows.append(
            {
                "bin": i,
                "lower": lower,
                "upper": upper,
                "confidence": conf,
                "accuracy": acc,
                "gap": acc - conf,
                "count": count,
            }
        )
    return rows


def _predictor(
    name: str,
    scale: float,
    metrics: dict[str, float],
    samples: int,
    method: str | None = None,
    trajectory: str = "swag",
) -> PredictorResult:
    by_samples = [
        {
            "samples": s,
            "accuracy": metrics["accuracy"],
            "nll": metrics["nll"] + 0.01 * (samples - s),
            "ece": metrics["ece"] + 0.002 * (samples - s),
            "ece15": metrics["ece15"],
            "brier": metrics["brier"],
        }
        for s in range(1, samples + 1)
    ]
    full = {**metrics, "n": 1000.0, "n_samples": float(samples)}
    shift = 0.01 * len(name)
    return PredictorResult(
        name, method or name, trajectory, scale, full, _reliability(shift), by_samples
    )


def _history(epochs: int, start_loss: float) -> list[dict[str, float]]:
    return [
        {
            "epoch": e,
            "lr": 0.01,
            "train_loss": start_loss / e,
            "train_accuracy": 0.9 + 0.01 * e,
            "val_loss": start_loss / e + 0.05,
            "val_accuracy": 0.88 + 0.01 * e,
            "seconds": 1.5,
        }
        for e in range(1, epochs + 1)
    ]


def _inputs() -> ReportInputs:
    # swag beats map on NLL (0.1234 < 0.1500) but not on accuracy (0.9700 < 0.9750).
    map_m = {"accuracy": 0.975, "nll": 0.15, "ece": 0.025, "ece15": 0.024, "brier": 0.04}
    swa_m = {"accuracy": 0.98, "nll": 0.14, "ece": 0.02, "ece15": 0.021, "brier": 0.038}
    swag_m = {"accuracy": 0.97, "nll": 0.1234, "ece": 0.031, "ece15": 0.03, "brier": 0.041}
    return ReportInputs(
        title="Test <report>",
        predictors=[
            _predictor("map", 0.0, map_m, 1),
            _predictor("swa", 0.0, swa_m, 1),
            _predictor("swag", 0.5, swag_m, 5),
        ],
        histories={"pretrain": _history(3, 1.0), "swag": _history(2, 0.3)},
        params={"seed": 0, "swag": {"lr": 0.01, "rank": 20}, "methods": ["map", "swa", "swag"]},
        run_ids={"pretrain": "abc123", "finetune@swag": "def456", "evaluate@map": "0a1b2c"},
        notes="Tuned the SWAG scale on val <script>alert(1)</script> & kept 0.5.",
        dataset_summary={"dataset": "mnist5k", "train": 3600, "val": 400, "test": 1000},
    )


@pytest.fixture
def inputs() -> ReportInputs:
    return _inputs()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One report shared by the read-only tests: drawing figures is the slow part."""
    return write_report(_inputs(), tmp_path_factory.mktemp("report") / "out")


def test_html_is_self_contained_with_valid_pngs(written: dict[str, Path]) -> None:
    assert set(written) == {"html", "md", *FIGURES}
    assert written["html"].name == "report.html" and written["html"].parent.name == "out"
    page = written["html"].read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page)
    assert "<script" not in page
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == len(FIGURES)
    for b64 in images:
        assert base64.b64decode(b64, validate=True).startswith(PNG_MAGIC)
    for name in FIGURES:
        assert written[name] == written["html"].parent / "figures" / f"{name}.png"
        assert written[name].read_bytes().startswith(PNG_MAGIC)


def test_markdown_links_existing_figures(written: dict[str, Path]) -> None:
    md = written["md"].read_text(encoding="utf-8")
    links = re.findall(r"\]\((figures/[^)]+\.png)\)", md)
    assert sorted(links) == sorted(f"figures/{n}.png" for n in FIGURES)
    for link in links:
        assert (written["md"].parent / link).read_bytes().startswith(PNG_MAGIC)


def test_tables_list_every_predictor_with_percent_accuracy(
    inputs: ReportInputs, written: dict[str, Path]
) -> None:
    md = written["md"].read_text(encoding="utf-8")
    page = written["html"].read_text(encoding="utf-8")
    for p in inputs.predictors:
        assert re.search(rf"^\| {p.name} \| ", md, re.M)
        assert f"<td>{p.name}</td>" in page
    assert "| 97.50 |" in md and "<td>97.50</td>" in page
    # swa has the best accuracy, swag the best NLL: those cells are bold.
    assert "**98.00**" in md and "<strong>98.00</strong>" in page
    assert "**0.1234**" in md and "<strong>0.1234</strong>" in page
    assert "**97.50**" not in md
    for stage, run_id in inputs.run_ids.items():
        assert f"| {stage} | {run_id} |" in md
        assert f"<td>{run_id}</td>" in page


def test_comparison_lines_are_honest(inputs: ReportInputs) -> None:
    lines = comparison_lines(inputs)
    assert len(lines) == 2 * 4
    assert "swag improves NLL over map: 0.1234 vs 0.1500 (-0.0266)" in lines
    assert any(line.startswith("swag does not improve accuracy over map") for line in lines)
    assert any(line.startswith("swag does not improve ECE over map") for line in lines)
    assert any(line.startswith("swa improves accuracy over map") for line in lines)
    assert not any(line.startswith("map ") for line in lines)


def test_comparison_lines_include_pairs(inputs: ReportInputs) -> None:
    """swag beside swa (a pair), as well as both beside the map baseline."""
    lines = comparison_lines(dataclasses.replace(inputs, pairs=[("swa", "swag"), ("map", "swa")]))
    assert len(lines) == 3 * 4
    assert "swag improves NLL over swa: 0.1234 vs 0.1400 (-0.0166)" in lines
    assert "swag does not improve accuracy over swa: 97.00% vs 98.00% (-1.00 pp)" in lines


def test_tempered_vi_is_labelled(
    inputs: ReportInputs, written: dict[str, Path], tmp_path: Path
) -> None:
    params = {"finetune": {"swag": {"vi": {"kl_weight": 0.1}}}}
    paths = write_report(dataclasses.replace(inputs, params=params), tmp_path)
    assert "tempered: KL weight 0.1" in paths["md"].read_text()
    assert "tempered" not in written["md"].read_text()


def test_comparison_lines_without_baseline(inputs: ReportInputs) -> None:
    lines = comparison_lines(dataclasses.replace(inputs, baseline="nope"))
    assert len(lines) == 1 and "nope" in lines[0] and "not among" in lines[0]


def test_findings_section_lists_comparison_lines(
    inputs: ReportInputs, written: dict[str, Path]
) -> None:
    md = written["md"].read_text(encoding="utf-8")
    page = written["html"].read_text(encoding="utf-8")
    for line in comparison_lines(inputs):
        assert f"- {line}" in md
        assert f"<li>{line}</li>" in page


def test_user_strings_are_escaped_in_html(inputs: ReportInputs, written: dict[str, Path]) -> None:
    page = written["html"].read_text(encoding="utf-8")
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; kept 0.5." in page
    assert "Test &lt;report&gt;" in page
    assert inputs.notes in written["md"].read_text(encoding="utf-8")


def test_writing_twice_is_byte_identical(inputs: ReportInputs, written: dict[str, Path]) -> None:
    before = {name: path.read_bytes() for name, path in written.items()}
    again = write_report(inputs, written["md"].parent)
    assert again == written
    for name, data in before.items():
        assert again[name].read_bytes() == data
    assert not [p for p in written["md"].parent.rglob("*") if p.name.endswith(".tmp")]


def test_pair_predictors_by_name_and_hwa_to_the_vi_it_starts_from() -> None:
    predictors = {
        "map": ("map", "sgd"),
        "swa": ("swa", "swag"),
        "swag_diag": ("swag_diag", "swag"),
        "swag": ("swag", "swag"),
        "fswa": ("swa", "fswag"),
        "fswag_diag": ("swag_diag", "fswag"),
        "fswag": ("swag", "fswag"),
        "vi": ("vi", "vi"),
        "fvi": ("vi", "fvi"),
        "hwa": ("hwa", "hwa"),
        "hwa_mf": ("hwa_mf", "hwa"),
        "hwa_rho": ("hwa_rho", "hwa"),
        "fhwa": ("hwa", "fhwa"),
        "mc_dropout": ("mc_dropout", "dropout"),
        "f_mc_dropout": ("mc_dropout", "fdropout"),
        "ensemble": ("ensemble", "ens"),
        "f_ensemble": ("ensemble", "fens"),
        "sgld": ("sgld", "sgld"),
        "f_sgld": ("sgld", "fsgld"),
        "full": ("map", "sgd"),  # starts with f, but "ull" is no predictor
    }
    starts = {"hwa": "vi", "fhwa": "fvi", "vi": "pretrain", "fvi": "pretrain", "sgd": "pretrain"}
    assert pair_predictors(predictors, starts) == [
        ("swa", "fswa"),
        ("swag_diag", "fswag_diag"),
        ("swag", "fswag"),
        ("vi", "fvi"),
        ("vi", "hwa"),
        ("vi", "hwa_mf"),
        ("vi", "hwa_rho"),
        ("hwa", "fhwa"),
        ("fvi", "fhwa"),
        ("mc_dropout", "f_mc_dropout"),
        ("ensemble", "f_ensemble"),
        ("sgld", "f_sgld"),
    ]
    # An hwa predictor on a trajectory that starts from pretrain has no vi to face.
    assert pair_predictors({"hwa": ("hwa", "hwa"), "vi": ("vi", "vi")}, {"hwa": "pretrain"}) == []


def _pair_inputs() -> ReportInputs:
    """swag vs fswag and vi vs hwa with known wins, losses and a tie."""
    base = {"ece15": 0.02, "hessian_trace": 100.0}
    swag = {"accuracy": 0.97, "nll": 0.12, "ece": 0.02, "brier": 0.04, "sharpness": 0.30}
    # fswag: worse accuracy, better NLL, worse ECE, tied Brier, better sharpness and tr(H).
    fswag = {"accuracy": 0.965, "nll": 0.10, "ece": 0.025, "brier": 0.04, "sharpness": 0.20}
    vi = {"accuracy": 0.95, "nll": 0.20, "ece": 0.010, "brier": 0.08, "sharpness": 0.5}
    # hwa: better accuracy and NLL, worse ECE; its sharpness is missing.
    hwa = {"accuracy": 0.96, "nll": 0.15, "ece": 0.015, "brier": 0.06}
    return dataclasses.replace(
        _inputs(),
        predictors=[
            _predictor("swag", 0.5, {**base, **swag}, 3),
            _predictor("fswag", 0.5, {**base, **fswag, "hessian_trace": 50.0}, 3, "swag", "fswag"),
            _predictor("vi", 0.0, {**base, **vi}, 3, "vi", "vi"),
            _predictor("hwa", 0.5, {**base, **hwa, "hessian_trace": math.nan}, 3, "hwa", "hwa"),
        ],
        baseline="swag",
        pairs=[("swag", "fswag"), ("vi", "hwa")],
    )


def _row(md: str, first: str, second: str) -> list[str]:
    match = re.search(rf"^\| {first} \| {second} \| (.*) \|$", md, re.M)
    assert match, (first, second)
    return match[1].split(" | ")


def test_claims_count_wins_and_not_ties() -> None:
    sections = dict(claim_sections(_pair_inputs()))
    assert list(sections) == ["HWA vs VI", "Flat-seeking variants vs their baselines"]
    (flat,) = sections["Flat-seeking variants vs their baselines"]
    assert flat.startswith(
        "fswag beats swag on 2 of 5 (NLL, sharpness); not on accuracy, ECE, Brier (tied): "
    )
    assert "accuracy 96.50% vs 97.00% (-0.50 pp)" in flat
    assert "NLL 0.1000 vs 0.1200 (-0.0200)" in flat and "sharpness 0.2000 vs 0.3000" in flat
    assert "tr(H)" not in flat  # not one of the claimed metrics
    (hwa,) = sections["HWA vs VI"]
    assert hwa.startswith("hwa beats vi on 2 of 3 (accuracy, NLL); not on ECE: ")
    assert "accuracy 96.00% vs 95.00% (+1.00 pp)" in hwa and "Brier" not in hwa
    # The same pair judged on the F-variant metric set: sharpness is missing, not a loss.
    (other,) = dict(claim_sections(dataclasses.replace(_pair_inputs(), pairs=[("hwa", "vi")])))[
        "Other pairs"
    ]
    assert other.startswith("vi beats hwa on 1 of 4 (ECE); not on accuracy, NLL, Brier; ")
    assert "not compared on sharpness (missing)" in other


def test_grouped_table_has_deltas_signs_and_bold_improvements(tmp_path: Path) -> None:
    paths = write_report(_pair_inputs(), tmp_path)
    md = paths["md"].read_text(encoding="utf-8")
    page = paths["html"].read_text(encoding="utf-8")
    section = md.split("## Baselines and their counterparts")[1].split("## Findings")[0]
    assert PAIRS_NOTE in section
    assert _row(section, "swag", "reference") == [
        "97.00",
        "0.1200",
        "0.0200",
        "0.0400",
        "0.3000",
        "100",
    ]
    assert _row(section, "fswag", "vs swag") == [
        "96.50 (-0.50)",
        "**0.1000 (-0.0200)**",
        "0.0250 (+0.0050)",
        "0.0400 (+0.0000)",
        "**0.2000 (-0.1000)**",
        "**50 (-50)**",
    ]
    assert _row(section, "hwa", "vs vi") == [
        "**96.00 (+1.00)**",
        "**0.1500 (-0.0500)**",
        "0.0150 (+0.0050)",
        "**0.0600 (-0.0200)**",
        "n/a",
        "n/a",
    ]
    # Each reference is directly followed by its counterpart.
    rows = re.findall(r"^\| (\w+) \| (reference|vs \w+) \|", section, re.M)
    expected = [("swag", "reference"), ("fswag", "vs swag"), ("vi", "reference"), ("hwa", "vs vi")]
    assert rows == expected
    assert "<td><strong>0.1000 (-0.0200)</strong></td>" in page
    assert "<td>96.50 (-0.50)</td>" in page
    claims = md.split("## Claims as found")[1].split("## Figure")[0]
    for _, lines in claim_sections(_pair_inputs()):
        for line in lines:
            assert f"- {line}" in claims
            assert f"<li>{line}</li>" in page


def test_no_pairs_says_so(written: dict[str, Path]) -> None:
    md = written["md"].read_text(encoding="utf-8")
    section = md.split("## Baselines and their counterparts")[1].split("## Findings")[0]
    assert "No baseline/counterpart pairs" in section and "|" not in section
    assert "No baseline/counterpart pairs" in md.split("## Claims as found")[1]


def _vi_history(epochs: int, start_acc: float) -> list[dict[str, float]]:
    rows = []
    for e in range(1, epochs + 1):
        row = {**_history(epochs, 1.0)[e - 1], "test_loss": 0.2 / e}
        row["test_accuracy"] = start_acc + 0.002 * e
        row["avg_test_loss"] = math.nan if e == 1 else 0.18 / e
        row["avg_test_accuracy"] = math.nan if e == 1 else start_acc + 0.004 * e
        rows.append(row)
    return rows


def _plane(scale: float, start: str) -> PlaneData:
    axis = [scale * (i - 2) for i in range(7)]
    grid = [
        {"a": a, "b": b, "loss": 0.01 + 30 * (a * a + b * b), "accuracy": 0.9}
        for a in axis
        for b in axis
    ]
    path = [
        {"kind": "start", "index": 0.0, "a": -1.5 * scale, "b": 0.5 * scale, "distance": 2.5},
        *(
            {"kind": "snapshot", "index": float(i), "a": scale * (i - 4) / 2, "b": scale * i / 10}
            for i in range(3, 7)
        ),
        {"kind": "average", "index": 0.0, "a": 0.0, "b": 0.0, "distance": 0.0},
    ]
    for row in path:
        row.setdefault("distance", 0.3)
        row["loss"], row["accuracy"] = 0.01 + row["a"] ** 2, 0.9
    summary = {"start": start, "n_points": 1000, "n_collected": 6, "n_snapshots": 4}
    return PlaneData(grid, path, {**summary, "explained_variance_ratio": [0.6, 0.25]})


def _sigma_ratio(median: float) -> dict[str, float]:
    """Quantiles of sigma / sigma_0 spread around ``median``, as evaluate reports them."""
    factors = {"min": 0.1, "p01": 0.2, "p10": 0.5, "p25": 0.8, "median": 1.0}
    factors.update({"p75": 1.2, "p90": 1.5, "p99": 2.0, "max": 3.0, "mean": 1.05})
    return {k: median * f for k, f in factors.items()}


def _with_sigma(p: PredictorResult, median: float) -> PredictorResult:
    return dataclasses.replace(p, metrics={**p.metrics, "sigma_ratio": _sigma_ratio(median)})


def _full_inputs() -> ReportInputs:
    """The pair case plus VI-family histories with test columns, sigma ratios, two planes."""
    finetune = {
        "vi": {"kind": "vi", "start": "pretrain", "epochs": 3},
        "hwa": {"kind": "hwa", "start": "vi", "epochs": 2},
        "swag": {"kind": "sgd", "start": "pretrain", "epochs": 2},
    }
    histories = {
        "pretrain": _history(3, 1.0),
        "swag": _history(2, 0.3),
        "vi": _vi_history(3, 0.95),
        "hwa": _vi_history(2, 0.96),
    }
    pair = _pair_inputs()
    predictors = [
        _with_sigma(p, {"vi": 0.4, "hwa": 0.9}[p.name]) if p.name in ("vi", "hwa") else p
        for p in pair.predictors
    ]
    return dataclasses.replace(
        pair,
        predictors=predictors,
        params={"finetune": finetune},
        histories=histories,
        planes={"hwa": _plane(1.0, "vi"), "swag": _plane(0.001, "pretrain")},
    )


@pytest.fixture(scope="module")
def written_full(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_report(_full_inputs(), tmp_path_factory.mktemp("report_full") / "out")


def test_new_figures_appear_with_their_data(written_full: dict[str, Path]) -> None:
    assert set(written_full) == {"html", "md", *FIGURES, *NEW_FIGURES}
    md = written_full["md"].read_text(encoding="utf-8")
    page = written_full["html"].read_text(encoding="utf-8")
    assert len(re.findall(r'src="data:image/png;base64,', page)) == len(FIGURES + NEW_FIGURES)
    for name in NEW_FIGURES:
        assert f"![{name}](figures/{name}.png)" in md
        assert written_full[name].read_bytes().startswith(PNG_MAGIC)
    assert "not used for any choice" in md


def test_new_figures_absent_without_their_data(written: dict[str, Path]) -> None:
    md = written["md"].read_text(encoding="utf-8")
    for name in NEW_FIGURES:
        assert name not in written and f"figures/{name}.png" not in md
        assert not (written["md"].parent / "figures" / f"{name}.png").exists()
    full = _full_inputs()
    # Old histories (no per-epoch test columns) give no figure rather than an empty one.
    old = {
        name: [{k: v for k, v in r.items() if "test" not in k} for r in rows]
        for name, rows in full.histories.items()
    }
    assert finetune_curves_figure(dataclasses.replace(full, histories=old)) is None
    # Test columns on a non-VI trajectory only: not a VI-family curve.
    params = {"finetune": {"vi": {"kind": "sgd", "start": "pretrain"}, "hwa": {"kind": "sgd"}}}
    assert finetune_curves_figure(dataclasses.replace(full, params=params)) is None
    assert finetune_curves_figure(full) is not None


def test_continuing_trajectories_start_after_their_origin() -> None:
    full = _full_inputs()
    finetune = full.params["finetune"]
    assert epoch_offset("vi", finetune, full.histories) == 0
    assert epoch_offset("hwa", finetune, full.histories) == 3  # vi's last epoch
    without = {k: v for k, v in full.histories.items() if k != "vi"}
    finetune = {**finetune, "vi": {**finetune["vi"], "epochs": 7}}
    assert epoch_offset("hwa", finetune, without) == 7  # falls back on vi's epochs


def test_plane_grid_is_placed_by_coordinates_not_row_order() -> None:
    plane = _plane(1.0, "vi")
    a_values, b_values, z = plane_grid(list(reversed(plane.grid)))
    assert a_values == b_values == [float(i - 2) for i in range(7)]
    for row in plane.grid:
        assert z[b_values.index(row["b"]), a_values.index(row["a"])] == row["loss"]


def test_full_report_is_byte_identical(written_full: dict[str, Path]) -> None:
    before = {name: path.read_bytes() for name, path in written_full.items()}
    again = write_report(_full_inputs(), written_full["md"].parent)
    assert again == written_full
    for name, data in before.items():
        assert again[name].read_bytes() == data


def test_sigma_figure_only_with_sigma_ratios(written_full: dict[str, Path]) -> None:
    md = written_full["md"].read_text(encoding="utf-8")
    page = written_full["html"].read_text(encoding="utf-8")
    # After the fine-tuning curves, before the loss plane.
    order = [md.index(f"## Figure: {name}") for name in NEW_FIGURES]
    assert order == sorted(order)
    section = md.split("## Figure: sigma")[1].split("## Figure: loss_plane")[0]
    assert "near 1 mean the variance barely moved" in section
    # The medians are readable without the figure: vi 0.4, hwa 0.9; swag has no ratio.
    assert "| vi | 0.4 | 0.2 to 0.6 |" in section and "| hwa | 0.9 |" in section
    assert "| swag |" not in section and "| fswag |" not in section
    assert "<td>0.4</td>" in page
    full = _full_inputs()
    assert sigma_figure(full.predictors) is not None
    assert sigma_figure(_pair_inputs().predictors) is None
    # A ratio that cannot sit on a log axis (zero) or lacks a quantile is left out.
    broken = [
        _with_sigma(full.predictors[2], 0.0),
        dataclasses.replace(full.predictors[3], metrics={"sigma_ratio": {"median": 1.0}}),
    ]
    assert sigma_figure(broken) is None


class _HtmlContent(HTMLParser):
    """Headings, table rows (text, bold), list items, pre blocks and captions of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[str] = []
        self.rows: list[list[tuple[str, bool]]] = []
        self.bullets: list[str] = []
        self.pre: list[str] = []
        self.captions: list[str] = []
        self._text: list[str] | None = None
        self._bold = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag == "strong":
            self._bold = True
        elif tag in ("h1", "h2", "h3", "td", "th", "li", "pre", "figcaption"):
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if self._text is None or tag == "strong":
            return
        text = "".join(self._text)
        if tag in ("h1", "h2", "h3"):
            self.headings.append(text)
        elif tag in ("td", "th"):
            self.rows[-1].append((text, self._bold))
            self._bold = False
        elif tag == "li":
            self.bullets.append(text)
        elif tag == "pre":
            self.pre.append(text.rstrip())
        elif tag == "figcaption":
            self.captions.append(text)
        self._text = None


def _markdown_content(md: str) -> _HtmlContent:
    """The same parts read back from the Markdown; fenced text is verbatim."""
    found = _HtmlContent()
    fence, code = "", []
    for line in md.splitlines():
        if fence:
            if line == fence:
                found.pre.append("\n".join(code).rstrip())
                fence, code = "", []
            else:
                code.append(line)
        elif m := re.match(r"(`{3,})\w*$", line):
            fence = m[1]
        elif m := re.match(r"#+ (.*)$", line):
            found.headings.append(m[1])
        elif line.startswith("- "):
            found.bullets.append(line[2:])
        elif line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            found.rows.append(
                [
                    ((c[2:-2] if bold else c).replace("\\|", "|"), bold)
                    for c in cells
                    for bold in [c.startswith("**") and c.endswith("**")]
                ]
            )
        elif re.fullmatch(r"\*[^*].*\*", line):
            found.captions.append(line[1:-1])
    return found


def test_html_and_markdown_carry_the_same_content(written_full: dict[str, Path]) -> None:
    page = _HtmlContent()
    page.feed(written_full["html"].read_text(encoding="utf-8"))
    md = _markdown_content(written_full["md"].read_text(encoding="utf-8"))
    assert page.headings == md.headings and "Figure: sigma" in md.headings
    assert page.rows == md.rows and ("**" not in str(md.rows))
    assert page.bullets == md.bullets and page.pre == md.pre and page.captions == md.captions
    assert len(md.captions) == len(FIGURES + NEW_FIGURES)
    assert any(bold for row in md.rows for _, bold in row)


def test_markdown_escapes_table_pipes_and_fences_verbatim_text() -> None:
    notes = "a ```` run, a | pipe"
    blocks = [
        Heading(1, "t"),
        TableBlock(Table(["a|b", "c"], [[Cell("x|y", True), Cell("z")]])),
        Preformatted(notes, "text"),
    ]
    md = to_markdown(blocks)
    assert "| a\\|b | c |" in md and "| **x\\|y** | z |" in md
    assert f"`````text\n{notes}\n`````" in md
    content = _markdown_content(md)
    assert content.rows == [[("a|b", False), ("c", False)], [("x|y", True), ("z", False)]]
    assert content.pre == [notes]
    page = to_html(blocks)
    assert "<td><strong>x|y</strong></td>" in page and f"<pre>{notes}</pre>" in page


def test_report_package_imports_without_torch() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    code = "import bayesavg.report, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
