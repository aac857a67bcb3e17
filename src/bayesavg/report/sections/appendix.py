"""How to reproduce the run: tuning notes, the parameters, the MLflow runs."""

from __future__ import annotations

import yaml

from ..blocks import (
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


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    """Tuning notes, the parameters and where the MLflow runs are: how to reproduce the run."""
    runs = Table(
        ["MLflow search filter, per run"],
        [[Cell(f"attributes.run_name = '{name}'")] for name in inputs.runs],
    )
    return Section(
        [
            Heading(2, "Tuning"),
            Preformatted(inputs.notes or "No tuning notes were given.", "text"),
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
