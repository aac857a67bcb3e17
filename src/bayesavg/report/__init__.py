"""Final report of the pipeline: an offline HTML page and a Markdown twin.

``findings`` says what beats what, ``figures`` draws, ``document`` lays out
every section once as blocks and ``render`` writes them as HTML and
Markdown. No module here imports torch: the report stage only reads JSON
and CSV.
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
