"""The report is self-contained, honest about comparisons, escaped and deterministic."""

from __future__ import annotations

import base64
import dataclasses
import re
from pathlib import Path

import pytest

from bayesavg.report import PredictorResult, ReportInputs, comparison_lines, write_report

PNG_MAGIC = b"\x89PNG"
FIGURES = ("reliability", "samples", "training")


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


def _predictor(name: str, scale: float, metrics: dict[str, float], samples: int) -> PredictorResult:
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
    return PredictorResult(name, name, "swag", scale, full, _reliability(shift), by_samples)


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
