"""A paper's claim checked on this run: what the headline lists and each section states."""

from __future__ import annotations

from dataclasses import dataclass

SWA_PAPER = "SWA (Izmailov et al. 2018)"
BMA_PAPER = "Bayesian model averaging (SWAG, Maddox et al. 2019)"
FLAT_PAPER = "Flat-seeking posteriors (Nguyen et al. 2023)"
HWA_PAPER = "HWA (Karimi & Li)"
DSWAG_PAPER = "DSWAG (Kiriti, Tsai, Duncan)"
MULTISWAG_PAPER = "MultiSWAG (Wilson & Izmailov 2020)"


@dataclass(frozen=True)
class Claim:
    """``holds``: True, False, or None when this run cannot decide it (within noise,
    missing data); ``evidence``: the numbers, with intervals, in one or two sentences;
    ``number``: the one number (with its interval where there is one) that decides the
    verdict, short enough for a table cell, e.g. "NLL diff -0.0123 [-0.0200, -0.0040]",
    or "n/a (why)" when the claim cannot be checked."""

    paper: str
    statement: str
    holds: bool | None
    evidence: str
    number: str

    @property
    def verdict(self) -> str:
        return {True: "holds", False: "does not hold", None: "undecided"}[self.holds]


def claim_text(claim: Claim) -> str:
    """The full form (the headline's evidence list, the DSWAG section): verdict first, then
    the paper, the statement and the evidence."""
    return f"[{claim.verdict}] {claim.paper}: {claim.statement}. {claim.evidence}"


def finding_text(claim: Claim) -> str:
    """An analysis section's form: the statement, its paper, the verdict, the evidence."""
    return f"{claim.statement} ({claim.paper}): {claim.verdict}. {claim.evidence}"
