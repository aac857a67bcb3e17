"""Distributed SWAG (the DSWAG paper, ALGORITHMS §8): what was run, the paper's claims as
found, and its figures with their numbers. Two sections of the report: the text after the
comparisons and the figures after the other figures."""

from __future__ import annotations

from ...blocks import Heading, Paragraph, Section, bullets_or, figure_section
from ...claims import claim_text
from ...formats import pct
from ...inputs import ReportInputs, trajectory_params
from ...uncertainty import Uncertainty, settings
from . import figures
from .claims import claims
from .measures import dswag_roles, rounds_table, sigma_table, sweep_table

SIGN_NOTE = (
    "Accuracy - confidence > 0 means under-confident (right more often than claimed), "
    "< 0 over-confident. The paper's text states the opposite; that sign is backwards."
)


def _setting(inputs: ReportInputs, trajectory: str) -> str:
    """' (10 clients, 20 FedAvg rounds in phase 1)' from the trajectory's params: the
    numbers to hold the sweep's rows against, which stop phase 1 at a target instead."""
    found = trajectory_params(inputs.params).get(trajectory, {})
    clients = found.get("clients")
    phase1 = found.get("phase1")
    phase1 = phase1 if isinstance(phase1, dict) else {}
    rounds, target = phase1.get("rounds"), phase1.get("target_accuracy")
    parts = [f"{clients} clients"] if clients is not None else []
    if rounds is not None and target:
        parts.append(f"phase 1 until {pct(target)} train accuracy, at most {rounds} rounds")
    elif rounds is not None:
        parts.append(f"{rounds} FedAvg rounds in phase 1")
    return f" ({', '.join(parts)})" if parts else ""


def overview(inputs: ReportInputs) -> str | None:
    """What was run and how it is compared; None when there is no DSWAG data at all."""
    roles = dswag_roles(inputs)
    if roles is None and not inputs.dswag_sweep:
        return None
    text = "Distributed SWAG (Kiriti, Tsai and Duncan; ALGORITHMS §8). "
    if roles is not None:
        names = {
            "the FedAvg model that phase 1 ends with": roles.fedavg,
            "the SWA mean of the clients' phase-2 snapshots": roles.dswa,
            "the SWAG posterior of those snapshots (DSWAG)": roles.dswag,
        }
        said = [f"{p.name} is {what}" for what, p in names.items() if p is not None]
        text += f"On trajectory {roles.trajectory}{_setting(inputs, roles.trajectory)}: "
        text += f"{', '.join(said)}. "
        if roles.baseline is not None:
            text += (
                f"The paper's baseline, SWAG after distributed training, is {roles.baseline.name} "
                f"(trajectory {roles.baseline.trajectory}, one machine, starting from "
                f"{roles.trajectory}'s FedAvg model). "
            )
    if inputs.dswag_sweep:
        sweep = inputs.params.get("evaluate", {}).get("dswag_sweep", {})
        traj = sweep.get("trajectory") if isinstance(sweep, dict) else None
        which = f"trajectory {traj}" if traj else "the dswag trajectory"
        ws = ", ".join(str(p.workers) for p in inputs.dswag_sweep)
        target = pct(inputs.dswag_sweep[0].target_accuracy)
        cap = max(p.rounds for p in inputs.dswag_sweep)
        cap = sweep.get("rounds", cap) if isinstance(sweep, dict) else cap
        text += (
            f"The worker sweep runs {which} again for W = {ws} clients from the same "
            f"initial network, stopping phase 1 once the global model's train accuracy reaches "
            f"{target} or after {cap} rounds; its FedAvg, DSWA and DSWAG metrics are on the "
            "test split. "
        )
    s = settings(inputs.params)
    text += "Intervals: "
    if roles is not None:
        text += (
            f"the trajectory's predictors are compared by the {100 * s.level:g}% paired "
            f"bootstrap interval over the test points ({s.resamples} resamples, seed {s.seed}) "
            "where both have per-point predictions; where one has none, an accuracy "
            "difference carries an unpaired binomial 95% interval (wider, so conservative) "
            "and NLL, ECE and Brier differences none, and the claim says so. "
        )
    if inputs.dswag_sweep:
        text += (
            "The sweep keeps metrics only: its accuracy differences carry the unpaired "
            "binomial 95% interval, its NLL, ECE and Brier differences none, so a sign is "
            "trusted only when it holds across W."
        )
    return text.rstrip()


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    """The text after the comparisons: what was run, the sign convention, the claims."""
    found = claims(inputs, unc)
    text = overview(inputs)
    if text is None:
        return Section([], found)
    names = list(figures.drawn(inputs))
    where = f" The figures {', '.join(names)} below show the numbers." if names else ""
    blocks = [
        Heading(2, "Distributed SWAG"),
        Paragraph(text + where),
        Paragraph(SIGN_NOTE),
        Heading(3, "The paper's claims on this data"),
        bullets_or([claim_text(c) for c in found], "No claim can be checked without the sweep."),
    ]
    return Section(blocks, found)


def build_figures(inputs: ReportInputs, unc: Uncertainty) -> Section:
    """The figures after the other figures, each with the table of its numbers."""
    sweep = inputs.dswag_sweep
    tables = {
        "dswag_rounds": rounds_table(sweep),
        "dswag_sigma_distance": sigma_table(sweep),
        "dswag_workers": sweep_table(sweep),
    }
    return Section(
        [
            block
            for name, png in figures.drawn(inputs).items()
            for block in figure_section(name, png, figures.CAPTIONS[name], tables.get(name))
        ]
    )
