"""Speed of bayesavg's two hot paths, as ratios to a baseline measured in the same run.

Absolute seconds depend on the machine and on whatever else it runs, so
every number that matters here is a ratio between variants timed side by
side: each round runs every variant once, in a rotated order, after a
warm-up, and the median and range over rounds are reported (``timing.py``).
Nothing is asserted; the targets are printed next to the measurements.

(a) Fine-tuning throughput of LeNet-5 with and without SWAG collection,
    against a bare PyTorch loop (``finetune.py``).
(b) 30-sample SWAG evaluation against the lower bound of S forward passes
    and against a straightforward per-sample loop (``evaluate.py``).
(c) Step costs of SAM, SGLD, SVI and SVI with HWA against SGD (``steps.py``).
(d) The same evaluation with the pipeline's default shifts and OOD images in
    the same pass, against S forward passes over all of them
    (``evaluate_extra.py``).

Run ``python benchmarks/run.py [--quick] [--device auto|cpu|cuda]``; the
results go to ``benchmarks/results.json``. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import evaluate
import evaluate_extra
import finetune
import steps
import torch
from common import FULL, QUICK, SEED, load_data
from timing import busy, finish, machine_info, write_results

from bayesavg.seeding import resolve_device, seed_everything

RESULTS = Path(__file__).resolve().parent / "results.json"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="smoke run (~20 s)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results JSON path")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: untouched)"
    )
    return parser.parse_args()


def show_machine(results: dict[str, Any], wall: float) -> None:
    """The table's head: what ran where, and a warning when the machine was busy."""
    m = results["machine"]
    print(
        f"\nbayesavg benchmark ({results['mode']}): torch {m['torch']}, device {m['device']}, "
        f"{m['threads']} threads, load {m['load_average_start'][0]} -> "
        f"{m['load_average_end'][0]}, {wall:.0f} s"
    )
    if busy(m):
        print(
            "  note: load average >= CPU count: other processes compete for the cores; "
            "absolute numbers (and the cost of small ops) are inflated, compare ratios only"
        )


def main() -> None:
    args = parse_args()
    settings = QUICK if args.quick else FULL
    device = resolve_device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    seed_everything(SEED)
    started = time.perf_counter()
    machine = machine_info(device, args.threads is not None)
    train_data, test = load_data(device)
    results: dict[str, Any] = {
        "machine": machine,
        "mode": "quick" if args.quick else "full",
        "finetune": finetune.bench_finetune(train_data, settings),
        "evaluate": evaluate.bench_evaluate(train_data, test, settings),
        "steps": steps.bench_steps(train_data, settings),
        "evaluate_extra": evaluate_extra.bench_evaluate_extra(train_data, test, settings),
    }
    wall = finish(results, started)
    write_results(args.out, results)
    show_machine(results, wall)
    finetune.show(results["finetune"])
    evaluate.show(results["evaluate"])
    steps.show(results["steps"])
    evaluate_extra.show(results["evaluate_extra"])
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
