"""How to reproduce the run: tuning notes, the parameters, the MLflow runs."""

from __future__ import annotations

import yaml

from ..blocks import (
    Block,
    Cell,
    Heading,
    Paragraph,
    Preformatted,
    Section,
    Table,
    TableBlock,
)
from ..inputs import ReportInputs
from ..uncertainty import Uncertainty

TUNING_NOTE = (
    "How the settings were chosen, as written in params.yaml (report.notes) when they were: "
    "its numbers come from the tuning runs of that time, not from this run, whose "
    "validation metrics are in the metrics files (val) and its MLflow runs."
)


def _notes(notes: str) -> list[Block]:
    """The hand-written tuning notes, said to be such, or that there are none."""
    if not notes:
        return [Paragraph("No tuning notes were given (params.yaml: report.notes).")]
    return [Paragraph(TUNING_NOTE), Preformatted(notes, "text")]


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    """Tuning notes, the parameters and where the MLflow runs are: how to reproduce the run."""
    runs = Table(
        ["MLflow search filter, per run"],
        [[Cell(f"attributes.run_name = '{name}'")] for name in inputs.runs],
    )
    return Section(
        [
            Heading(2, "Tuning"),
            *_notes(inputs.notes),
            Heading(2, "Parameters"),
            Preformatted(yaml.safe_dump(inputs.params, sort_keys=False), "yaml"),
            Heading(2, "MLflow runs"),
            Paragraph(
                "Every stage is an MLflow run named after it, or one per unit where a stage runs "
                "several (evaluate@TRAJECTORY: a run per predictor; dswag_sweep: per W; "
                "landscape: per probe; pretrain: also init), tagged dvc_stage with the stage; each "
                "pipeline execution is one parent run over them. Run ids change with every "
                "execution, so they are not in this report, whose bytes a rerun reproduces: "
                "this workspace's are in runs/RUN.json, and each run's executions are found by "
                "its filter below."
            ),
            TableBlock(runs),
        ]
    )
