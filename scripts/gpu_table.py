"""The README's GPU table from ``benchmarks/gpu/*.json`` (one file per GPU model, each the
merged ``--out`` of ``scripts/gpu_check.py``): one column per GPU, one row per check, each
number against its goal. ``python scripts/gpu_table.py`` prints it; ``--write`` puts it
between the README's ``<!-- gpu-table -->`` markers (a test keeps the two equal)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "benchmarks" / "gpu"
README = ROOT / "README.md"
BEGIN, END = "<!-- gpu-table -->", "<!-- /gpu-table -->"
NOT_GPU = {"seed_spread.json"}
MODELS = {"preresnet20": "PreResNet-20", "wideresnet28x10": "WideResNet-28x10"}


def results() -> list[dict[str, Any]]:
    """Every GPU's merged gpu-check JSON, by GPU name."""
    files = sorted(p for p in FOLDER.glob("*.json") if p.name not in NOT_GPU)
    found = [json.loads(p.read_text()) for p in files]
    return sorted(found, key=lambda r: r["environment"]["gpu"])


def _verdict(ok: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "no verdict"}[ok]


def _agreement(part: dict[str, Any]) -> str:
    d = part["differences"]
    cells = [f"{m}: {d[m]['accuracy_pp']:.1f} pp, NLL {100 * d[m]['nll_relative']:.1f}%" for m in d]
    return f"{'; '.join(cells)} (within: {_verdict(part['within_tolerance'])})"


def _ratio(part: dict[str, Any], key: str, met_key: str) -> str:
    if key not in part:
        failed = part.get("failed", {}).get("reference_swag_code", {}).get("error", "not run")
        return f"failed: {failed.split(':')[0]}"
    low, high = part[f"{key}_range"]
    return f"{part[key]:.2f}x [{low:.2f}, {high:.2f}] ({_met(part.get(met_key))})"


def _met(ok: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "no goal"}[ok]


def _streamed(part: dict[str, Any] | None) -> str:
    if part is None or "streamed_over_in_memory" not in part:
        return "not run yet (`--speed`)"
    low, high = part["streamed_over_in_memory_range"]
    return f"{part['streamed_over_in_memory']:.2f}x [{low:.2f}, {high:.2f}]"


def _throughput(found: dict[str, Any], model: str, versus: str) -> str:
    runs = [found[f"throughput.{model}"]]
    earlier = found.get("repeats", {}).get(f"throughput.{model}")
    if earlier is not None:
        runs.insert(0, earlier)
    key = "ours_over_bare" if versus == "bare" else "ours_over_reference"
    cells = [_ratio(r, key, f"{key}_goal_met") for r in runs]
    if len(cells) > 1:
        cells = [f"run {i}: {c}" for i, c in enumerate(cells, 1)]
    if versus == "bare":
        rate = runs[-1]["images_per_s"]
        cells.append(f"{rate['ours']:.0f} vs {rate['bare_pytorch']:.0f} img/s")
    elif "reference_swag_code" in runs[-1]["images_per_s"]:
        rate = runs[-1]["images_per_s"]
        cells.append(f"{rate['ours']:.0f} vs {rate['reference_swag_code']:.0f} img/s")
    return "; ".join(cells)


def _pipeline(found: dict[str, Any]) -> str:
    runs = [found["pipeline"], *[r for k, r in found.get("repeats", {}).items() if k == "pipeline"]]
    cells = []
    for run in runs:
        done = run.get("partial", run)
        targets = run.get("targets", done.get("targets", "all"))
        what = "all stages" if targets == "all" else f"targets {', '.join(targets)}"
        if done.get("stages_done_before"):
            what += f" (going on after {done['stages_done_before']} stages done before)"
        lanes = f", {done['jobs']} side by side" if done.get("jobs", 1) > 1 else ""
        if run.get("ok"):
            seconds = done["dvc_seconds"]
            cells.append(f"{what}: {done['stages_run']} stages ok in {seconds:.0f} s{lanes}")
            continue
        cut = "cut at its time box" if "timed out" in run.get("error", "") else "failed"
        # where it stopped: the stages that failed, else those running (one name when
        # stages ran one at a time)
        running = done.get("failed_stages") or done.get("running") or []
        at = ", ".join(f"`{s}`" for s in ([running] if isinstance(running, str) else running))
        seconds = done.get("seconds", done.get("dvc_seconds", 0))
        cells.append(
            f"{what}: {done['stages_run']} stages ok in {seconds:.0f} s{lanes}, {cut}"
            + (f" at {at}" if at else "")
        )
    return "; ".join(cells)


SPEED = {
    "preresnet20": (">= 2x", "PreResNet-20"),
    "wideresnet28x10": (">= 1.2x", "WideResNet-28x10"),
}
SPEED["preresnet164"] = ("", "PreResNet-164")


def _timed(part: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The numbers of a speed part: its result, or what a part cut at its time box (or
    dead) had reported (``partial``), with a note saying so."""
    if "partial" not in part:
        return part, ""
    rounds = max(part["partial"].get("rounds_done", {}).values(), default=0)
    why = "cut at its time box" if "timed out" in part.get("error", "") else "stopped"
    return part["partial"], f" ({why} after {rounds} round{'s' * (rounds != 1)})"


def _speed(found: dict[str, Any], model: str) -> str:
    part = found.get(f"speed.{model}")
    if part is None:
        return "not run yet (`--speed`)"
    done, cut = _timed(part)
    ups = done.get("over_eager", {})
    if not ups:
        timed = done.get("images_per_s", {})
        if "eager" in timed:
            return f"eager {timed['eager']:.0f} img/s, no other variant timed{cut}"
        return f"failed: {part.get('error', 'no variant timed').split(':')[0]}"
    cells = [f"{name} {up:.2f}x" for name, up in sorted(ups.items(), key=lambda kv: -kv[1])]
    met = f" ({_met(done['goal_met'])})" if "goal_met" in done else ""
    unpinned = done.get("unpinned_kernels_over_graphs")
    what = (
        "" if unpinned is None else f"; graphs with `deterministic: false` {unpinned:.2f}x graphs"
    )
    if "eager_over_bare" in done:
        what = f"; eager / bare PyTorch {done['eager_over_bare']:.2f}x" + what
    eager = done["images_per_s"]["eager"]
    return f"{'; '.join(cells)}{met}; eager {eager:.0f} img/s{what}{cut}"


def _protocol(found: dict[str, Any]) -> str:
    part = found.get("speed.preresnet164")
    if part is None:
        return "not run yet (`--speed`)"
    done, cut = _timed(part)
    if "protocol_hours" not in done:
        return f"not measured{cut or ': ' + part.get('error', 'no reference').split(':')[0]}"
    hours = done["protocol_hours"]
    bare = done.get("protocol_unmonitored_reference_over_ours")
    without = "" if bare is None else f" ({bare:.1f}x without the reference's monitoring)"
    fast = done.get("protocol_reference_over_ours_deterministic_false")
    if fast is not None:
        without += f"; {fast:.1f}x with `deterministic: false`"
    if done.get("protocol_forward") != "measured":
        without += "; forward images assumed at a third of a training image's cost"
    return (
        f"{done['protocol_reference_over_ours']:.1f}x ({_met(done['protocol_goal_met'])}): "
        f"{hours['ours']:.2f} h vs {hours['reference_swag_code']:.2f} h{without}{cut}"
    )


def _networks(found: dict[str, Any]) -> str:
    part = found.get("networks")
    if part is None:
        return "not run yet"
    nets = part.get("networks") or part.get("partial", {}).get("networks", {})
    failed = sorted(n for n, r in nets.items() if "error" in r)
    cell = f"{len(nets) - len(failed)} of {len(nets)} ran"
    if "error" in part:  # cut at its box or dead: the networks it had reached
        cell += f", then stopped: {str(part['error']).split(':')[0]}"
    return cell + (f"; **failed**: {', '.join(failed)}" if failed else "")


def _variants(found: dict[str, Any]) -> str:
    part = found["step_variants"]
    done = part.get("partial", part)
    runs, gap = done["variants"], done["bf16_vs_fp32"].get("max_abs_diff")
    cells = []
    for name, run in runs.items():
        if name == "eager" or "skipped" in run:
            continue
        same = run["bitwise_equal_to_eager"]
        cell = f"{name} " + ("eager's bytes" if same else f"max diff {run['max_abs_diff']:.1e}")
        if "bitwise_equal_to_compiled" in run:
            same = run["bitwise_equal_to_compiled"]
            cell += ", compiled's bytes" if same else ", **not compiled's bytes**"
        cells.append(cell)
    verdict = f" ({_met(part['ok'])})" if "ok" in part else ""
    cut = "" if "error" not in part else f", then stopped: {str(part['error']).split(':')[0]}"
    yardstick = "" if gap is None else f"; bf16 vs fp32 {gap:.1e}"
    return f"{'; '.join(cells)}{yardstick}{verdict}{cut}"


def _peaks(found: dict[str, Any]) -> str:
    peaks = found["peak_memory_mib"]
    cells = []
    for model, name in MODELS.items():
        ours, bare = (peaks.get(f"throughput.{model}.{k}") for k in ("ours", "bare_pytorch"))
        if ours is not None:
            cells.append(f"{name} {ours:.0f} (bare PyTorch {bare:.0f})")
    return ", ".join(cells)


ROWS = (
    (
        "CUDA vs CPU test metrics, fp32",
        "within 12 CPU seeds' spread",
        lambda f: _agreement(f["cpu_vs_cuda"]),
        "cpu_vs_cuda",
    ),
    (
        "bf16 vs fp32 test metrics",
        "within 12 CPU seeds' spread",
        lambda f: _agreement(f["bf16_vs_fp32"]),
        "bf16_vs_fp32",
    ),
    (
        "built-in networks and a torchvision classifier per family, two training steps each "
        "with deterministic algorithms",
        "all 27",
        _networks,
        None,
    ),
    (
        "two CUDA runs, weights' bytes",
        "equal",
        lambda f: "equal" if f["determinism"]["bitwise_equal"] else "**differ**",
        "determinism",
    ),
    *(
        (
            f"SWAG fine-tuning {name}, ours / bare PyTorch",
            ">= 0.95x",
            lambda f, m=m: _throughput(f, m, "bare"),
            f"throughput.{m}",
        )
        for m, name in MODELS.items()
    ),
    *(
        (
            f"SWAG fine-tuning {name}, ours / SWAG reference code",
            ">= 3x",
            lambda f, m=m: _throughput(f, m, "reference"),
            f"throughput.{m}",
        )
        for m, name in MODELS.items()
    ),
    (
        "PreResNet-20 SWAG, bf16: captured and compiled steps against eager",
        "graphs: eager's bytes; compiled: within bf16 vs fp32",
        _variants,
        "step_variants",
    ),
    *(
        (
            f"SWAG fine-tuning {name}, step variants / eager, bf16",
            goal,
            lambda f, m=m: _speed(f, m),
            None,
        )
        for m, (goal, name) in SPEED.items()
    ),
    ("CIFAR-10 preset's SWAG protocol (PreResNet-164), reference / ours", ">= 5x", _protocol, None),
    (
        "SWAG fine-tuning ResNet-50 at 224 x 224 (random resized crop), ours / bare PyTorch",
        ">= 0.95x",
        lambda f: (
            _throughput(f, "resnet50", "bare")
            if "throughput.resnet50" in f
            else "not run yet (`--speed`)"
        ),
        None,
    ),
    (
        "the same, images streamed from the host (`data.storage: stream`) / on the device",
        ">= 0.95x",
        lambda f: _streamed(f.get("throughput.resnet50")),
        None,
    ),
    (
        "30-sample SWAG evaluation / 30 x (BN pass + forward)",
        "<= 1.10x",
        lambda f: _ratio(f["evaluation"], "ours_over_bound", "goal_met"),
        "evaluation",
    ),
    ("default pipeline, toy sizes, `dvc repro` on CUDA", "every stage", _pipeline, "pipeline"),
    ("peak GPU memory, SWAG fine-tuning (MiB)", "", _peaks, "peak_memory_mib"),
)


def _cell(cell: Callable[[dict[str, Any]], str], needs: str | None, found: dict[str, Any]) -> str:
    """One GPU's cell of a row that reads part ``needs`` (None: the row says itself what
    is missing): a GPU whose calls ran out of device time lacks parts, and a part that
    failed or was skipped holds only why (and what it had measured, ``partial``)."""
    part = found.get(needs) if needs is not None else {}
    if part is None:
        return "not run yet"
    if isinstance(part.get("skipped"), str):
        return f"skipped: {part['skipped']}"
    try:
        return cell(found)  # a failed part's row may show what it had measured
    except (KeyError, TypeError):
        if "error" not in part:
            raise
        return f"failed: {str(part['error']).split(':')[0]}"


def table(found: list[dict[str, Any]]) -> str:
    head = ["check", "goal", *(f["environment"]["gpu"] for f in found)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, goal, cell, needs in ROWS:
        cells = [_cell(cell, needs, f) for f in found]
        lines.append("| " + " | ".join([name, goal, *cells]) + " |")
    return "\n".join(lines)


def spliced(readme: str, body: str) -> str:
    """``readme`` with ``body`` between the markers."""
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:start] + "\n" + body + "\n" + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="into README.md")
    args = parser.parse_args(argv)
    body = table(results())
    if args.write:
        README.write_text(spliced(README.read_text(), body))
    else:
        print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
