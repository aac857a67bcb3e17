"""The papers' analyses in the report: dataset shift, OOD detection, loss landscape,
sharpness against calibration. Each section: figure(s), a sentence on what it
shows on this run, and the paper claims it checks (``Claim``)."""

from __future__ import annotations

from .claims import Claim
from .inputs import ReportInputs


def draw(inputs: ReportInputs) -> dict[str, bytes]:
    """PNG bytes by figure name for every analysis that has data."""
    raise NotImplementedError


def sections(inputs: ReportInputs, pngs: dict[str, bytes]) -> list[object]:
    """The analyses' report blocks (``document`` block types), in report order."""
    raise NotImplementedError


def claims(inputs: ReportInputs) -> list[Claim]:
    """The analyses' paper claims, each checked on this run."""
    raise NotImplementedError
