"""Final report of the pipeline: an offline HTML page and a Markdown twin.

``uncertainty`` computes every bootstrap interval once (torch, via
``intervals``, the paired-comparison statistics) from the per-point predictions; each module of
``sections`` builds one part the reader sees (its numbers, claims and
figures, in the look of ``style``); ``document`` lists the sections in order
and ``render`` writes their blocks as HTML and Markdown.
"""

from .inputs import (
    Landscape,
    LineData,
    PlaneData,
    Predictions,
    PredictorResult,
    RayData,
    ReportInputs,
    SeedRun,
    SwagDirections,
    SweepPoint,
)
from .render import write_report
from .sections.comparisons import pair_predictors

__all__ = [
    "Landscape",
    "LineData",
    "PlaneData",
    "Predictions",
    "PredictorResult",
    "RayData",
    "ReportInputs",
    "SeedRun",
    "SwagDirections",
    "SweepPoint",
    "pair_predictors",
    "write_report",
]
