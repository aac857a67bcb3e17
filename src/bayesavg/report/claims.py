"""A paper's claim checked on this run: what the headline lists and each section states."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    """``holds``: True, False, or None when this run cannot decide it (within noise,
    missing data); ``evidence``: the numbers, with intervals, in one or two sentences."""

    paper: str
    statement: str
    holds: bool | None
    evidence: str

    @property
    def verdict(self) -> str:
        return {True: "holds", False: "does not hold", None: "undecided"}[self.holds]
