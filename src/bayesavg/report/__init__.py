"""Final report of the pipeline: an offline HTML page and a Markdown twin.

``uncertainty`` computes every bootstrap interval once (torch, via
``bayesavg.intervals``) from the per-point predictions, ``findings`` says
what beats what beyond noise, ``headline`` ranks and lists the papers'
claims, ``figures`` draws small multiples by family (``style``),
``document`` lays out every section once as blocks (``blocks``) and
``render`` writes them as HTML and Markdown.
"""

from .findings import pair_predictors
from .inputs import (
    Landscape,
    LineData,
    PlaneData,
    Predictions,
    PredictorResult,
    RayData,
    ReportInputs,
    SwagDirections,
    SweepPoint,
)
from .render import write_report

__all__ = [
    "Landscape",
    "LineData",
    "PlaneData",
    "Predictions",
    "PredictorResult",
    "RayData",
    "ReportInputs",
    "SwagDirections",
    "SweepPoint",
    "pair_predictors",
    "write_report",
]
