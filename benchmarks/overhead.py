"""What a pipeline run spends outside the stages' compute, before and after three changes.

(a) Tracking workers: ``STAGES`` stage-sized tracked runs one after another (a
    worker each: start, params, a metric history, end), with workers spawned (each
    imports mlflow) against forked from one warm server (``scripts/tracking_forks.py``,
    started and stopped inside the variant, its own imports counted). CPU seconds of
    every process involved (``RUSAGE_CHILDREN`` once all are reaped) and wall seconds,
    per stage. On a busy machine, as under ``make run``, the CPU is what a stage costs
    the stages beside it; the wall time is the same on an idle one.
(b) The report: ``write_report`` on the tests' full inputs (analyses, DSWAG, seeds)
    with one process against every usable core (``report/parallel.py``); the files
    must be byte-identical.
(c) The ``dvc.lock`` write after each stage: one stage's entry replaced in the
    committed lock (its 45 entries) as ``dvc.dvcfile`` does it, through DVC's
    ``modify_yaml`` (the whole file parsed round-trip and dumped) against
    ``scripts/dvc_lock.py``'s ``modify_lock`` (the entry alone dumped, read back);
    the files must be byte-identical.

Rounds rotate the variants' order (``timing.rotation``). Run ``python
benchmarks/overhead.py`` (about a minute on 2 cores); results go to
``benchmarks/overhead.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bayesavg.runtime import numerics

numerics.pin()  # as every stage: threads and instruction set, before torch loads

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "scripts"))

import dvc_lock  # noqa: E402
import timing  # noqa: E402
import tracking_forks  # noqa: E402
from test_report_analyses import _inputs  # noqa: E402

from bayesavg.report import parallel, write_report  # noqa: E402
from bayesavg.tracking import forks  # noqa: E402
from bayesavg.tracking.worker import Tracker  # noqa: E402

STAGES = 6


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _stages(store: tuple[str, str]) -> None:
    for i in range(STAGES):
        tracker = Tracker.spawn(*store)
        with tracker.run(f"stage{i}", experiment="e", tags={}, inputs={}) as run:
            run.log_params({"lr": 0.1, "epochs": 10})
            run.log_history([{"epoch": e, "loss": 1 / (e + 1)} for e in range(10)])


def _tracking_variant(store: tuple[str, str], forked: bool) -> Callable[[], dict[str, float]]:
    def variant() -> dict[str, float]:
        cpu, wall = _children_cpu(), time.perf_counter()
        if forked:
            with tracking_forks.serving() as env:
                os.environ.update(env)
                try:
                    _stages(store)
                finally:
                    os.environ.pop(forks.FORKS_ENV, None)
        else:
            _stages(store)
        return {
            "cpu_per_stage": (_children_cpu() - cpu) / STAGES,
            "wall_per_stage": (time.perf_counter() - wall) / STAGES,
        }

    return variant


def tracking(rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        store = f"sqlite:///{tmp}/mlflow.db", (Path(tmp) / "artifacts").as_uri()
        Tracker.spawn(*store).close()  # the store's tables, outside the timing
        variants = {
            "spawned": _tracking_variant(store, forked=False),
            "forked": _tracking_variant(store, forked=True),
        }
        found: dict[str, dict[str, list[float]]] = {
            n: {"cpu_per_stage": [], "wall_per_stage": []} for n in variants
        }
        for r in range(rounds):
            for name in timing.rotation(list(variants), r):
                for key, value in variants[name]().items():
                    found[name][key].append(value)
    out: dict[str, Any] = {"stages_per_round": STAGES, "seconds": {}}
    for name, series in found.items():
        out["seconds"][name] = timing.rounded(series, 3)
    for key in ("cpu_per_stage", "wall_per_stage"):
        r = timing.ratio(found["forked"][key], found["spawned"][key])
        out.update(timing.ratio_fields(f"forked_over_spawned_{key}", r, 3, best=False))
        saved = [s - f for s, f in zip(found["spawned"][key], found["forked"][key], strict=True)]
        out[f"saved_{key}_median"] = round(timing.median_range(saved)[0], 3)
    return out


def report(rounds: int) -> dict[str, Any]:
    usable = parallel.processes
    many = usable()
    seconds: dict[str, list[float]] = {"one": [], "many": []}
    written: dict[str, dict[str, bytes]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for r in range(rounds):
                for name in timing.rotation(["one", "many"], r):
                    n = 1 if name == "one" else many
                    parallel.processes = lambda n=n: n  # type: ignore[method-assign]
                    inputs = _inputs()  # fresh: nothing cached from a previous round
                    with timing.Stopwatch() as watch:
                        paths = write_report(inputs, Path(tmp) / f"{name}{r}")
                    seconds[name].append(watch.seconds)
                    written[name] = {k: p.read_bytes() for k, p in paths.items()}
        finally:
            parallel.processes = usable  # type: ignore[method-assign]
    out: dict[str, Any] = {"processes": many, "seconds": timing.rounded(seconds, 3)}
    out.update(
        timing.ratio_fields("many_over_one", timing.ratio(seconds["many"], seconds["one"]), 3)
    )
    out["byte_identical"] = written["one"] == written["many"]
    return out


def lock_writes(rounds: int) -> dict[str, Any]:
    from dvc.utils.serialize import modify_yaml

    committed = (HERE.parent / "dvc.lock").read_text()
    names = list(dvc_lock._load(committed)["stages"])
    picked = [names[len(names) * k // 4] for k in (1, 2, 3)]  # a stage per round, in turn
    writers = {"dvc": modify_yaml, "entries": dvc_lock.modify_lock}
    seconds: dict[str, list[float]] = {name: [] for name in writers}
    written: dict[str, list[str]] = {name: [] for name in writers}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dvc.lock"
        for r in range(rounds):
            stage = picked[r % len(picked)]
            for name in timing.rotation(list(writers), r):
                path.write_text(committed)
                with timing.Stopwatch() as watch, writers[name](path) as data:
                    entry = dict(data["stages"][stage], cmd=f"python rerun.py {r}")
                    data["stages"].update({stage: entry})  # as dvc.dvcfile does
                seconds[name].append(watch.seconds)
                written[name].append(path.read_text())
    out: dict[str, Any] = {"stages": len(names), "bytes": len(committed)}
    out["seconds"] = timing.rounded(seconds, 3)
    ratio = timing.ratio(seconds["entries"], seconds["dvc"])
    out.update(timing.ratio_fields("entries_over_dvc", ratio, 3))
    out["byte_identical"] = written["entries"] == written["dvc"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "overhead.json")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "machine": {
            "cpu_count": numerics.usable_cores(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_start": timing.load_average(),
        }
    }
    results["tracking"] = tracking(args.rounds)
    print(f"tracking: {results['tracking']}", flush=True)
    results["report"] = report(args.rounds)
    print(f"report: {results['report']}", flush=True)
    results["lock_writes"] = lock_writes(args.rounds)
    print(f"lock_writes: {results['lock_writes']}", flush=True)
    timing.finish(results, started)
    timing.write_results(args.out, results)
    identical = results["report"]["byte_identical"] and results["lock_writes"]["byte_identical"]
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
