"""The report is self-contained, honest about comparisons, escaped and deterministic."""

from __future__ import annotations

import base64
import dataclasses
import math
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bayesavg.report import (
    PlaneData,
    Predictions,
    PredictorResult,
    ReportInputs,
    document,
    pair_predictors,
    style,
    write_report,
)
from bayesavg.report.blocks import Cell, Heading, Preformatted, Section, Table, TableBlock
from bayesavg.report.claims import Claim, claim_text
from bayesavg.report.intervals import PER_POINT, Interval, holm, paired_bootstrap
from bayesavg.report.render import to_html, to_markdown
from bayesavg.report.sections import landscape, ood, sharpness, shift
from bayesavg.report.sections.calibration import classic_reliability, reliability_layout
from bayesavg.report.sections.comparisons import baseline_lines, effect
from bayesavg.report.sections.headline import best_table, ranking_table
from bayesavg.report.sections.metrics import metrics_note, metrics_table
from bayesavg.report.sections.plane import colour_scale, plane_grid
from bayesavg.report.sections.samples import samples_layout
from bayesavg.report.sections.training import epoch_offset, finetune_curves_figure, training_layout
from bayesavg.report.sections.variational import sigma_figure
from bayesavg.report.uncertainty import Settings, Uncertainty, compare, compute

PNG_MAGIC = b"\x89PNG"


@pytest.fixture(autouse=True, scope="module")
def no_analyses() -> Iterator[None]:
    """The analysis sections are tested in test_report_analyses; these tests leave them out."""
    analyses = {m.build for m in (shift, ood, landscape, sharpness)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(document, "BODY", tuple(b for b in document.BODY if b not in analyses))
        yield


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
        runs=["pretrain", "finetune@swag", "evaluate@map"],
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
    for name in inputs.runs:
        assert f"| attributes.run_name = '{name}' |" in md
        assert f"<td>attributes.run_name = &#39;{name}&#39;</td>" in page


def test_tempered_vi_is_labelled(
    inputs: ReportInputs, written: dict[str, Path], tmp_path: Path
) -> None:
    params = {"finetune": {"swag": {"vi": {"kl_weight": 0.1}}}}
    paths = write_report(dataclasses.replace(inputs, params=params), tmp_path)
    assert "tempered: KL weight 0.1" in paths["md"].read_text()
    assert "tempered" not in written["md"].read_text()


def test_user_strings_are_escaped_in_html(inputs: ReportInputs, written: dict[str, Path]) -> None:
    page = written["html"].read_text(encoding="utf-8")
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; kept 0.5." in page
    assert "Test &lt;report&gt;" in page
    assert inputs.notes in written["md"].read_text(encoding="utf-8")


def test_tuning_notes_are_said_to_be_hand_written_not_this_runs_numbers(
    inputs: ReportInputs, written: dict[str, Path]
) -> None:
    from bayesavg.report.sections import appendix
    from bayesavg.report.sections.appendix import TUNING_NOTE

    md = written["md"].read_text(encoding="utf-8")
    tuning = md.split("## Tuning")[1].split("## Parameters")[0]
    assert tuning.index(TUNING_NOTE) < tuning.index(inputs.notes)
    bare = to_markdown(
        appendix.build(dataclasses.replace(inputs, notes=""), compute(inputs)).blocks
    )
    assert "No tuning notes were given (params.yaml: report.notes)." in bare
    assert TUNING_NOTE not in bare


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
    # A temperature-scaled predictor faces the one it scales; a flat one's too.
    scaled = {
        "map": ("map", "sgd"),
        "map_ts": ("map", "sgd"),
        "fswa": ("swa", "fswag"),
        "fswa_ts": ("swa", "fswag"),
        "lone_ts": ("map", "sgd"),
    }
    assert pair_predictors(scaled, {}) == [("map", "map_ts"), ("fswa", "fswa_ts")]


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


def test_loss_planes_share_one_colour_scale() -> None:
    """A colour is the same loss in every panel: the range is all panels' together, log
    when that range spans more than a factor 10 though one panel alone would not."""
    wide, narrow = _plane(1.0, "vi"), _plane(1.0, "swag")
    narrow = dataclasses.replace(
        narrow, grid=[{**r, "loss": 0.5 + r["loss"] / 1e4} for r in narrow.grid]
    )
    assert colour_scale({"swag": narrow})[2] is False
    lo, hi, log = colour_scale({"vi": wide, "swag": narrow})
    losses = [r["loss"] for r in [*wide.grid, *narrow.grid]]
    assert (lo, hi, log) == (min(losses), max(losses), True)


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
    assert "<td><strong>x|y</strong></td>" in page and f'<pre class="text">{notes}</pre>' in page


def _log_probs(y: np.ndarray, strength: float, seed: int) -> np.ndarray:
    """Log-probabilities over 4 classes that favour the label by ``strength``."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(len(y), 4))
    logits[np.arange(len(y)), y] += strength
    return logits - np.log(np.exp(logits).sum(1, keepdims=True))


def _with_predictions(inputs: ReportInputs) -> ReportInputs:
    """map; swa = map with one test image flipped to right (noise); swag much sharper."""
    y = np.random.default_rng(0).integers(0, 4, 1000)
    base = _log_probs(y, 1.5, 1)
    flipped = base.copy()
    wrong = int(np.flatnonzero(base.argmax(1) != y)[0])
    flipped[wrong] = np.log(np.full(4, 0.01 / 3))
    flipped[wrong, y[wrong]] = np.log(0.99)
    found = {"map": base, "swa": flipped, "swag": _log_probs(y, 4.0, 1)}
    predictors = [
        dataclasses.replace(p, predictions=Predictions(y=y, log_probs=found[p.name]))
        for p in inputs.predictors
    ]
    bootstrap = {"report": {"bootstrap": {"resamples": 500, "seed": 1}}}
    return dataclasses.replace(inputs, predictors=predictors, params={**inputs.params, **bootstrap})


@pytest.fixture(scope="module")
def predicted() -> ReportInputs:
    return _with_predictions(_inputs())


def test_effect_calls_a_difference_within_its_interval_noise() -> None:
    noise = Interval("nll", 0.003, -0.009, 0.015, 0.95, 2000)
    assert effect(noise) == "NLL within noise (+0.0030, 95% CI -0.0090 to +0.0150)"
    edge = Interval("accuracy", 0.007, 0.0, 0.014, 0.95, 2000)  # a bound on 0 holds 0
    assert effect(edge) == "accuracy within noise (+0.70 pp, 95% CI +0.00 to +1.40 pp)"
    better = Interval("nll", -0.059, -0.078, -0.041, 0.95, 2000)
    assert effect(better) == "improves NLL by 0.0590 (95% CI 0.0410-0.0780)"
    worse = Interval("accuracy", -0.012, -0.02, -0.004, 0.95, 2000)
    assert effect(worse, "McNemar p = 0.01") == (
        "worsens accuracy by 1.20 pp (95% CI 0.40-2.00 pp; McNemar p = 0.01)"
    )
    # a tempered network is right and wrong where it was: no interval to give
    (tempered, y), (plain, _) = _point_tensors_of(2.0), _point_tensors_of(1.0)
    same = paired_bootstrap("accuracy", plain, tempered, y)
    assert effect(same) == "accuracy the same (no difference in any resample)"


def _point_tensors_of(temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(200, 4, generator=g), torch.randint(0, 4, (200,), generator=g)
    return torch.log_softmax(logits / temperature, 1), y


def test_comparisons_use_paired_intervals(predicted: ReportInputs) -> None:
    unc = compute(predicted)
    assert unc.settings == Settings(resamples=500, seed=1)
    swa, swag = baseline_lines(predicted, unc)
    # One more right image of 1,000 (+0.10 pp) is noise, never an improvement.
    assert swa.startswith("swa vs map: ") and "improves" not in swa
    assert "accuracy within noise (+0.10 pp, 95% CI " in swa and "McNemar p = 1" in swa
    assert "improves NLL by" in swag and "improves accuracy by" in swag
    assert swag.index("improves") < swag.index("McNemar")
    # how many images the NLL gain rests on: removing them, it is gone
    comp = unc.comparison("map", "swag")
    assert comp is not None and comp.nll_carried_by is not None
    a, y = _point_tensors(predicted, "map")
    gain = PER_POINT["nll"](_point_tensors(predicted, "swag")[0], y) - PER_POINT["nll"](a, y)
    k = comp.nll_carried_by
    assert float(gain.sum()) < 0 and float(torch.sort(gain).values[k:].sum()) >= 0
    assert float(torch.sort(gain).values[k - 1 :].sum()) < 0
    assert f"{k} test images carry it: without them it is gone" in swag
    lines = baseline_lines(_inputs(), compute(_inputs()))
    assert all("no per-point predictions, so no interval and no verdict" in x for x in lines)


def test_any_pair_is_compared_once_on_request(predicted: ReportInputs) -> None:
    """Pairs beyond the baseline's and the counterparts' (the DSWAG roles) are bootstrapped
    when first asked for, then kept, as the whole Uncertainty is per inputs object."""
    unc = compute(predicted)
    assert compute(predicted) is unc
    assert ("swa", "swag") not in unc.comparisons
    comp = unc.comparison("swa", "swag")
    by_name = {p.name: p for p in predicted.predictors}
    assert comp is not None and comp == compare(by_name["swa"], by_name["swag"], unc.settings)
    assert unc.comparison("swa", "swag") is comp
    assert unc.comparison("swa", "swa") is None and unc.comparison("swa", "nope") is None
    assert unc.comparison("swa", "swag") is unc.requested[("swa", "swag")]
    # An equal but new inputs object is computed afresh, to the same numbers.
    fresh = compute(dataclasses.replace(predicted))
    assert fresh is not unc and fresh.comparisons == unc.comparisons


def test_every_metric_cell_carries_its_interval(predicted: ReportInputs) -> None:
    unc = compute(predicted)
    table = metrics_table(predicted.predictors, unc)
    cells = [row[3:7] for row in table.rows]
    interval = re.compile(r"^-?[\d.]+ \[-?[\d.]+, -?[\d.]+\]$")
    assert all(interval.match(c.text) for row in cells for c in row)
    for p, row in zip(predicted.predictors, table.rows, strict=True):
        nll = unc.estimate(p.name, "nll")
        assert nll is not None and nll.low <= nll.value <= nll.high
        assert row[4].text.startswith(f"{nll.value:.4f} [")
    plain = metrics_table(_inputs().predictors, compute(_inputs()))
    assert not any("[" in c.text for row in plain.rows for c in row)
    # a scale only where the method has one: map and swa's 0 would read as 'no variance'
    assert {row[0].text: row[2].text for row in plain.rows} == {
        "map": "-",
        "swa": "-",
        "swag": "0.5",
    }
    assert "No interval for map, swa, swag" in metrics_note(
        _inputs().predictors, compute(_inputs())
    )


def test_headline_comes_first_ranked_by_nll(predicted: ReportInputs, tmp_path: Path) -> None:
    unc = compute(predicted)
    table = ranking_table(predicted, unc)
    names = [row[1].text for row in table.rows]
    values = [float(row[2].text.split()[0]) for row in table.rows]
    assert values == sorted(values) and names[0] == "swag"
    assert table.rows[names.index("map")][4].text == "baseline"
    assert table.rows[0][4] == Cell("better", True)
    md = write_report(predicted, tmp_path)["md"].read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", md, re.M)
    assert headings[0] == "Headline" and headings[-3:] == ["Tuning", "Parameters", "MLflow runs"]


def test_headline_lists_every_claim(
    predicted: ReportInputs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new section is one entry in the list: its blocks appear where it is listed and
    its claims in the headline: a row of the claims table, the evidence collapsed below."""
    claim = Claim(
        "Some paper",
        "Averaging helps under shift",
        False,
        "Gap +0.01 at 90°.",
        "gap +0.01 [-0.02, 0.04]",
    )

    def planted(inputs: ReportInputs, unc: Uncertainty) -> Section:
        return Section([Heading(2, "Dataset shift")], [claim])

    body = list(document.BODY)
    body.insert(len(body) - 1, planted)
    monkeypatch.setattr(document, "BODY", tuple(body))
    pairs = dataclasses.replace(predicted, pairs=[("swa", "swag")])
    md = write_report(pairs, tmp_path)["md"].read_text(encoding="utf-8")
    headline = md.split("## Headline")[1].split("\n## ")[0]
    table, details = headline.split("<details>")
    assert (
        "| Some paper | Averaging helps under shift | does not hold | gap +0.01 [-0.02, 0.04] |"
        in table
    )
    assert f"- {claim_text(claim)}" in details.split("</details>")[0]
    assert claim_text(claim).startswith("[does not hold] Some paper: ")
    order = re.findall(r"^## (.+)$", md, re.M)
    assert order.index("Comparisons") < order.index("Dataset shift") < order.index("Tuning")
    assert "swag vs swa: " in md.split("### Counterparts against their references")[1]


def _legends_inside(fig: Figure) -> bool:
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    box = fig.bbox
    renderer = canvas.get_renderer()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    extents = [legend.get_window_extent(renderer) for legend in legends]
    return bool(legends) and all(
        e.x0 >= box.x0 - 1 and e.x1 <= box.x1 + 1 and e.y0 >= box.y0 - 1 and e.y1 <= box.y1 + 1
        for e in extents
    )


def _family_inputs() -> ReportInputs:
    """Three families, each F-variant beside its reference; the baseline in none."""
    m = {"accuracy": 0.97, "nll": 0.12, "ece": 0.02, "ece15": 0.02, "brier": 0.04}
    spec = [
        ("map", "map", "sgd"),
        ("swag", "swag", "swag"),
        ("fswag", "swag", "fswag"),
        ("vi", "vi", "vi"),
        ("hwa", "hwa", "hwa"),
        ("sgld", "sgld", "sgld"),
        ("f_sgld", "sgld", "f_sgld"),
    ]
    finetune = {t: {"sam_rho": 0.05 if t.startswith("f") else 0.0} for _, _, t in spec}
    finetune["vi"]["kind"] = finetune["hwa"]["kind"] = "vi"
    return dataclasses.replace(
        _inputs(),
        predictors=[_predictor(n, 0.5, m, 4, meth, t) for n, meth, t in spec],
        pairs=[("swag", "fswag"), ("sgld", "f_sgld"), ("vi", "hwa")],
        params={"finetune": finetune},
        histories={
            "pretrain": _history(3, 1.0),
            "swag": _history(2, 0.3),
            "vi": [{**r, "train_loss": 50.0 + r["train_loss"]} for r in _history(2, 1.0)],
        },
    )


def test_figures_are_small_multiples_with_legends_on_the_canvas() -> None:
    inputs = _family_inputs()
    families = style.families(inputs)
    assert list(families) == ["SWA / SWAG", "VI / HWA", "SGLD"]
    reliability = reliability_layout(inputs)
    panels = [ax for ax in reliability.axes if ax.axison]
    assert [ax.get_title() for ax in panels] == list(families)
    for ax, members in zip(panels, families.values(), strict=True):
        labels = [text.get_text().split(" (")[0] for text in ax.get_legend().get_texts()]
        assert labels == ["map", *(p.name for p in members)]
    samples = samples_layout(inputs)
    assert len([ax for ax in samples.axes if ax.axison]) == 3 * len(families)
    colours = style.colours(inputs)
    swag_ax = panels[0]
    lines = {line.get_label(): line for line in swag_ax.lines}
    assert lines["fswag (ECE 0.020)"].get_color() == lines["swag (ECE 0.020)"].get_color()
    assert lines["fswag (ECE 0.020)"].get_linestyle() == "--"
    assert colours["map"] == style.BASELINE_COLOUR
    for fig in (reliability, samples, training_layout(inputs)):
        assert _legends_inside(fig)


def test_a_family_of_single_networks_has_no_samples_row() -> None:
    """map_ts alone in its family: a row of flat lines says nothing about samples; its
    calibration still has a reliability panel."""
    inputs = _family_inputs()
    m = {"accuracy": 0.97, "nll": 0.12, "ece": 0.02, "ece15": 0.02, "brier": 0.04}
    single = _predictor("map_ts", 0.0, m, 1, "map", "sgd")
    inputs = dataclasses.replace(inputs, predictors=[*inputs.predictors, single])
    assert list(style.families(inputs))[-1] == "Other"
    rows = [ax.get_title() for ax in samples_layout(inputs).axes if ax.axison]
    assert len(rows) == 3 * 3 and not any(t.startswith("Other") for t in rows)
    panels = [ax.get_title() for ax in reliability_layout(inputs).axes if ax.axison]
    assert panels[-1] == "Other"


def test_classic_reliability_bars_are_accuracy_and_the_gap_to_confidence(
    predicted: ReportInputs,
) -> None:
    """ALGORITHMS §7's classic diagram: a panel per main predictor, per non-empty bin a bar
    of its accuracy over the bin and a bar from there to its mean confidence."""
    fig = classic_reliability(predicted)
    chosen = style.main_predictors(predicted)
    assert [p.name for p in chosen] == ["map", "swa", "swag"]
    panels = [ax for ax in fig.axes if ax.axison]
    assert [ax.get_title().split("  ")[0] for ax in panels] == ["map", "swa", "swag"]
    for ax, p in zip(panels, chosen, strict=True):
        bins = [r for r in p.reliability if r["count"] > 0]
        acc, gap = ax.patches[: len(bins)], ax.patches[len(bins) :]
        assert len(bins) == 10 and len(gap) == len(bins)
        for r, a, g in zip(bins, acc, gap, strict=True):
            width = r["upper"] - r["lower"]
            assert (a.get_x(), a.get_width(), a.get_y()) == pytest.approx((r["lower"], width, 0))
            assert a.get_height() == pytest.approx(r["accuracy"])
            assert g.get_x() == pytest.approx(r["lower"])
            assert g.get_y() == pytest.approx(r["accuracy"])
            assert g.get_y() + g.get_height() == pytest.approx(r["confidence"])
    assert classic_reliability(_inputs()) is None  # no per-point predictions: no panel


def test_training_keeps_an_elbo_off_the_cross_entropy_axis() -> None:
    fig = training_layout(_family_inputs())
    loss_axes = [ax for ax in fig.axes if ax.get_title().endswith(": train loss")]
    elbo = [ax for ax in loss_axes if "ELBO" in ax.get_title()]
    assert len(elbo) == 1 and len(loss_axes) == 2
    for ax in loss_axes:
        runs = [line for line in ax.lines if line.get_marker() == "."]  # not the epoch marker
        values = [y for line in runs for y in line.get_ydata()]
        assert (min(values) > 40) == (ax in elbo), ax.get_title()


def test_a_run_that_trains_nothing_is_a_named_point_where_its_start_ends() -> None:
    """laplace's history is one validation row: drawn after its start (swag, which ran
    after pretraining), named in the legend, on the row's one epoch axis."""
    inputs = _family_inputs()
    m = {"accuracy": 0.97, "nll": 0.12, "ece": 0.02, "ece15": 0.02, "brier": 0.04}
    finetune = {**inputs.params["finetune"], "la": {"kind": "laplace", "start": "swag"}}
    inputs = dataclasses.replace(
        inputs,
        predictors=[*inputs.predictors, _predictor("la", 0.5, m, 4, "laplace", "la")],
        params={"finetune": finetune},
        histories={
            **inputs.histories,
            "la": [{"epoch": 0.0, "val_loss": 0.1, "val_accuracy": 0.9}],
        },
    )
    fig = training_layout(inputs)
    row = [ax for ax in fig.axes if ax.get_title().startswith("Laplace: ")]
    assert len(row) == 3
    ((x, y),) = [line.get_xydata()[0] for line in row[1].lines if line.get_marker() == "o"]
    assert (x, y) == (3 + 2, 0.1)  # pretraining's 3 epochs, swag's 2
    labels = [t.get_text() for t in row[2].get_legend().get_texts()]
    assert labels == ["pretrain", "la (no training)"]
    assert len({ax.get_xlim() for ax in row}) == 1 and row[0].get_xlim()[1] > 5


def test_html_wraps_long_text_and_scrolls_wide_tables(written: dict[str, Path]) -> None:
    page = written["html"].read_text(encoding="utf-8")
    assert "white-space:pre-wrap" in page and "img{max-width:100%" in page
    assert page.count('<div class="scroll"><table>') == page.count("<table>")


def test_best_table_names_the_best_and_counts_beyond_noise(predicted: ReportInputs) -> None:
    """Each metric's best predictor is the brute-force best, and the counts are the paired
    verdicts against the baseline, counted one by one."""
    unc = compute(predicted)
    rows = {r[0].text: r for r in best_table(predicted, unc).rows}
    for key, label, lower in (("nll", "NLL", True), ("accuracy", "accuracy", False)):
        values = {p.name: p.metric(key) for p in predicted.predictors}
        best = (min if lower else max)(values, key=values.get)
        assert rows[label][1].text == best
        verdicts = [
            unc.comparison(predicted.baseline, p.name).intervals[key].verdict()
            for p in predicted.predictors
            if p.name != predicted.baseline
        ]
        better, worse = verdicts.count("better"), verdicts.count("worse")
        assert rows[label][4].text == f"{better} / {worse} of {len(verdicts)}"
        s = unc.settings
        a, y = _point_tensors(predicted, best)
        tied = [
            paired_bootstrap(key, a, _point_tensors(predicted, n)[0], y, s.resamples, s.seed)
            for n in values
            if n != best
        ]
        n_tied = sum(i.low <= 0 <= i.high for i in tied)
        assert rows[label][3].text == f"{n_tied} of {len(values) - 1}"
        held = rows[label][5].text.split(" of ")[0].split(" / ")
        assert int(held[0]) <= better and int(held[1]) <= worse


def _point_tensors(inputs: ReportInputs, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    (p,) = [p for p in inputs.predictors if p.name == name]
    assert p.predictions is not None
    return torch.as_tensor(p.predictions.log_probs), torch.as_tensor(p.predictions.y)


def test_the_setup_line_says_which_intervals_the_report_gives(predicted: ReportInputs) -> None:
    """ALGORITHMS §10: the bias-corrected interval (ECE's own) is named in the setup line,
    with the resamples and seed every interval rests on."""
    from bayesavg.report.sections import setup

    unc = compute(predicted)
    (_, paragraph) = setup.build(predicted, unc).blocks
    s = unc.settings
    assert f"({s.resamples} resamples, seed {s.seed})" in paragraph.text
    assert "own ECE, whose percentile interval is shifted by the resamples' median" in (
        paragraph.text
    )
    assert "Differences between two predictors are paired" in paragraph.text


def test_holm_rejects_as_the_step_down_rule_says() -> None:
    """Against the rule written out: sorted p_(k) <= alpha / (m - k + 1) for all k up to
    the one rejected, and nothing after the first that is not."""
    assert holm([0.001, 0.04, 0.03, 0.5], 0.05) == [True, False, False, False]
    assert holm([0.01, 0.02, 0.012], 0.05) == [True, True, True]
    assert holm([0.2, 0.001], 0.05) == [False, True]
    assert holm([], 0.05) == []
    assert holm([0.025, 0.05], 0.05) == [True, True], "a p on the bound is rejected"
    assert holm([0.05], 0.05) == [True] and holm([0.0501], 0.05) == [False]
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        ps = torch.rand(6, generator=g).pow(3).tolist()
        order = sorted(range(6), key=lambda i: ps[i])
        k = 0
        while k < 6 and ps[order[k]] <= 0.05 / (6 - k):
            k += 1
        assert holm(ps, 0.05) == [i in order[:k] for i in range(6)]


def test_the_calibration_table_gives_the_15_bin_ece_beside_the_20_bin() -> None:
    """ALGORITHMS §7: 15-bin ECE too, for comparison with libraries (torchmetrics)."""
    from bayesavg.report.sections.calibration import calibrated_table

    inputs = _inputs()
    with_15 = [
        dataclasses.replace(p, metrics={**p.metrics, "ece15": 0.0123 + i})
        for i, p in enumerate(inputs.predictors)
    ]
    inputs = dataclasses.replace(inputs, predictors=with_15)
    table = calibrated_table(inputs, compute(inputs))
    column = table.header.index("ECE (15 bins)")
    assert table.header[column - 1] == "ECE [95% CI]"
    assert [row[column].text for row in table.rows] == ["0.0123", "1.0123", "2.0123"]
