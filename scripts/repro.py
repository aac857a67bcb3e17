"""``dvc repro`` on every core: the pipeline's independent stages side by side.

DVC runs one stage at a time, and each stage computes on ``BAYESAVG_THREADS``
intra-op threads (default 1), so on a machine with more cores most of them wait.
This runs up to ``--jobs`` stages at once, each through ``dvc repro --single-item
<stage>``: DVC still decides whether the stage is stale, runs it, caches its outputs
and writes its entry in ``dvc.lock`` (through ``dvc_lock.py``: that entry alone, not
the whole file again). DVC allows that (it releases the repository
lock while a stage's command runs, and ``--wait-for-lock`` makes each wait for the
others' ``dvc.lock`` writes); this script only orders the stages, starting one when
all its upstream stages have finished, longest remaining path first (stage seconds
from the previous run's ``runs/*.json``, else dvc.yaml's ``meta.seconds``), and
says when each ends (``<stage> | finished in 12.3 s (7 of 44)``). The
default ``--jobs``: the usable cores over the threads, so threads never exceed cores;
one where the stages compute on a GPU. The bytes are those of a plain ``dvc repro``:
a stage's result depends on its thread count, not on what runs beside it.

The stages' MLflow runs form one execution (``BAYESAVG_EXECUTION``, which
``stages/_execution.py`` reads), as under one ``dvc repro``. Their tracking workers are
forked from one warm process (``tracking_forks``) instead of each importing
mlflow anew: 2 s of CPU less per stage.

Each stage runs in a session of its own: a signal to this script (a terminal's Ctrl-C,
or SIGINT, SIGTERM, SIGHUP to its pid alone) is passed on once to each running stage's
process group, which gets ``STOP_SECONDS`` to stop before it is killed.

Usage: ``python scripts/repro.py [--jobs N] [--force] [STAGE ...]``: the stages named
and their upstream (default: all). Exit code: the first failed stage's own (2 for bad
input; DVC's 255 where the stage's is unknown), else 0; 128 + the signal's number when
interrupted (130 for Ctrl-C, 143 for SIGTERM). A failed stage's one-line error is
repeated on stderr, after its name.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import stage_ledger
import tracking_forks
from stage_processes import INTERRUPTED, Children, Interrupted, Signals

from bayesavg.runtime import launch, numerics

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stages"))
from _execution import EXECUTION_ENV, described

# ``dvc`` writing only each finished stage's entry of dvc.lock (the same bytes)
DVC_LOCK = str(Path(__file__).resolve().with_name("dvc_lock.py"))

if TYPE_CHECKING:
    from dvc.repo import Repo


class UnknownStage(Exception):
    """A stage named on the command line that dvc.yaml does not define."""


class Pipeline(NamedTuple):
    upstream: dict[str, set[str]]  # stage -> the stages it depends on
    hinted: dict[str, float]  # stage -> dvc.yaml's ``meta.seconds``, where it gives one


def load_graph(repo: Repo, targets: Iterable[str]) -> Pipeline:
    """The stages of ``targets`` and their upstream (all stages when none is named),
    from DVC's own pipeline graph."""
    import networkx as nx

    graph = repo.index.graph  # edges point from a stage to its upstream stages
    by_name = {stage.addressing: stage for stage in graph.nodes}
    wanted = list(targets) or list(by_name)
    unknown = [name for name in wanted if name not in by_name]
    if unknown:
        raise UnknownStage(f"no stage {', '.join(unknown)} in dvc.yaml")
    keep = set(wanted)
    for name in wanted:
        keep |= {s.addressing for s in nx.descendants(graph, by_name[name])}
    upstream = {
        name: {s.addressing for s in graph.successors(by_name[name])} & keep
        for name in by_name
        if name in keep
    }
    hinted = {}
    for name in upstream:
        meta = by_name[name].meta
        if isinstance(meta, dict) and isinstance(meta.get("seconds"), int | float):
            hinted[name] = float(meta["seconds"])
    return Pipeline(upstream, hinted)


def stale(repo: Repo, upstream: Mapping[str, set[str]], force: bool) -> set[str]:
    """The stages to hand to DVC: those ``dvc status`` reports and everything
    downstream of them (their inputs may change when those rerun; DVC skips any whose
    inputs did not), or all with ``force``."""
    if force:
        return set(upstream)
    todo = set(repo.status()) & set(upstream)
    grew = True
    while grew:
        more = {s for s, deps in upstream.items() if s not in todo and deps & todo}
        todo |= more
        grew = bool(more)
    return todo


def last_seconds(root: Path) -> dict[str, float]:
    """Each stage's seconds in the previous run (``runs/*.json``), for ordering only."""
    return {stage: sum(keys.values()) for stage, keys in stage_ledger.by_stage(root).items()}


def priorities(upstream: Mapping[str, set[str]], seconds: Mapping[str, float]) -> dict[str, float]:
    """A stage's own estimated seconds plus the longest chain of stages after it: the
    stages that hold up the end of the run start first. Unknown stages count as 3 s
    (one stage's start-up and DVC's work)."""
    downstream: dict[str, set[str]] = {s: set() for s in upstream}
    for stage, deps in upstream.items():
        for dep in deps:
            downstream[dep].add(stage)
    memo: dict[str, float] = {}

    def longest(stage: str) -> float:
        if stage not in memo:
            after = max((longest(s) for s in downstream[stage]), default=0.0)
            memo[stage] = seconds.get(stage, 3.0) + after
        return memo[stage]

    return {stage: longest(stage) for stage in upstream}


def execution_env(jobs: int) -> dict[str, str]:
    """The environment that makes every stage's MLflow run part of this one execution
    (named as a plain ``dvc repro``'s, with a tag saying how it ran)."""
    parent = described(os.getpid(), time.time(), "", "dvc repro")
    parent["bayesavg.runner"] = f"scripts/repro.py --jobs {jobs}"
    return {**os.environ, EXECUTION_ENV: json.dumps(parent)}


# DVC's closing hints, which every stage's `dvc repro` would repeat: said once, at the end.
HINTS = re.compile(
    r"^(\s*|To track the changes with git, run:|To enable auto staging, run:"
    r"|\tdvc config core\.autostage true|Use `dvc push` to send your updates.*)$"
)
GIT_ADD = re.compile(r"^\tgit add (.+)$")
# A failed stage's reason (its own one-line error) and exit code (DVC's exits 255 for all)
REASON = re.compile(r"^error: (.+)$")
EXITED = re.compile(r"^ERROR: failed to reproduce .*, exited with (-?\d+)$")


class Failure(NamedTuple):
    reason: str | None  # the stage's last ``error:`` line
    code: int | None  # the stage's own exit code, as DVC reports it


def _pump(
    stage: str, proc: subprocess.Popen[str], width: int, lock: threading.Lock, added: set[str]
) -> Failure:
    """Copy a stage's output to ours line by line, each line led by the stage's name;
    DVC's hints are left out and the files it asks to ``git add`` collected. Returns
    why the stage failed, as it and DVC said."""
    assert proc.stdout is not None
    reason, code = None, None
    for line in proc.stdout:
        text = line.rstrip("\n")
        if found := REASON.match(text):
            reason = found.group(1)
        elif found := EXITED.match(text):
            code = int(found.group(1))
        found = GIT_ADD.match(text)
        if found:
            added.update(found.group(1).split())
            continue
        if HINTS.match(text):
            continue
        with lock:
            sys.stdout.write(f"{stage:<{width}} | {text}\n")
            sys.stdout.flush()
    return Failure(reason, code)


def run(
    upstream: Mapping[str, set[str]],
    todo: set[str],
    jobs: int,
    force: bool,
    seconds: Mapping[str, float],
    extra_env: Mapping[str, str] | None = None,
) -> int:
    """Run ``todo`` in dependency order, ``jobs`` at a time; return the exit code.
    ``extra_env``: for the stages' environment (the tracking fork server's socket).
    Interrupted, it stops the running stages' trees before it raises."""
    rank = priorities(upstream, seconds)
    order = {stage: i for i, stage in enumerate(upstream)}
    env = {**execution_env(jobs), **(extra_env or {})}
    width = max((len(s) for s in todo), default=0)
    lock = threading.Lock()
    done: queue.Queue[tuple[str, int, float, Failure]] = queue.Queue()
    finished = set(upstream) - todo
    waiting = set(todo)
    running = 0
    failed: tuple[str, int, Failure] | None = None
    added: set[str] = set()
    children = Children()
    pumps: list[threading.Thread] = []

    def launch_stage(stage: str) -> None:
        started = time.monotonic()
        cmd = [sys.executable, DVC_LOCK, "--wait-for-lock", "repro", "--single-item"]
        proc = children.start(
            [*cmd, *(["--force"] if force else []), stage],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        if proc is not None:
            said = _pump(stage, proc, width, lock, added)
            done.put((stage, proc.wait(), time.monotonic() - started, said))

    try:
        while waiting or running:
            ready = [s for s in waiting if upstream[s] <= finished] if failed is None else []
            ready.sort(key=lambda s: (-rank[s], order[s]))
            for stage in ready[: jobs - running]:
                waiting.discard(stage)
                running += 1
                pump = threading.Thread(target=launch_stage, args=(stage,), daemon=True)
                pump.start()
                pumps.append(pump)
            if not running:
                break
            stage, code, seconds, said = done.get()
            if code != 0 and said.code is not None and 0 < said.code < 256:
                code = said.code  # the stage's own, not DVC's 255
            running -= 1
            ended = "finished" if code == 0 else f"failed (exit code {code})"
            count = f"{len(todo) - len(waiting) - running} of {len(todo)}"
            with lock:
                print(f"{stage:<{width}} | {ended} in {seconds:.1f} s ({count})", flush=True)
            if code == 0:
                finished.add(stage)
            elif failed is None:
                failed = (stage, code, said)
    except Interrupted as err:
        children.stop(err.args[0])
        for pump in pumps:  # the stages' last lines: what they said on stopping
            pump.join(timeout=1)
        lock.acquire(timeout=5)  # and nothing after: the stages have stopped
        raise
    if added:
        print(f"\nTo track the changes with git, run:\n\n\tgit add {' '.join(sorted(added))}")
    if failed is not None:
        stage, code, said = failed
        left = sorted(waiting, key=order.__getitem__)
        print(
            f"error: stage {stage} failed"
            + (f": {said.reason}" if said.reason else "")
            + f" (exit code {code})"
            + (f"; not run: {len(left)} stage(s): {', '.join(left)}" if left else ""),
            file=sys.stderr,
        )
        return code
    return 0


def on_cuda(params: Path = Path("params.yaml")) -> bool:
    """Whether the stages will compute on a GPU: params' ``device`` names CUDA, or is
    ``auto`` on a machine where torch sees one."""
    import yaml

    try:
        device = str((yaml.safe_load(params.read_text()) or {}).get("device", "auto"))
    except (OSError, yaml.YAMLError, AttributeError):
        return False  # the validate stage says what is wrong with params.yaml
    if device != "auto":
        return device.startswith("cuda")
    import torch

    return torch.cuda.is_available()


def default_jobs(cuda: bool = False) -> int:
    """On the CPU, as many stages as the usable cores hold at this thread count (and
    process count of distributed stages); on a GPU, one: every stage computes on the
    same device, where a second would compete for its memory."""
    if cuda:
        return 1
    each = numerics.threads() * launch.nproc()
    return max(1, numerics.usable_cores() // each)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stages", nargs="*", help="stages to reproduce (default: all)")
    parser.add_argument("-j", "--jobs", type=int, default=None, help="stages at once")
    parser.add_argument("-f", "--force", action="store_true", help="rerun even if unchanged")
    args = parser.parse_args(argv)
    jobs = args.jobs if args.jobs is not None else default_jobs(on_cuda())
    if jobs < 1:
        parser.error("--jobs must be at least 1")
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    with Signals() as signals:
        try:
            try:
                with Repo() as repo:
                    upstream, hinted = load_graph(repo, args.stages)
                    todo = stale(repo, upstream, args.force)
            except (UnknownStage, DvcException) as err:  # what `dvc repro` would stop at too
                print(f"error: {' '.join(str(err).split())}", file=sys.stderr)  # who holds a lock
                return 2
            if not todo:
                print("Data and pipelines are up to date.")
                return 0
            print(f"{len(todo)} of {len(upstream)} stages to check, {jobs} at a time", flush=True)
            seconds = {**hinted, **last_seconds(Path.cwd())}
            with tracking_forks.serving() as forked_workers:
                code = run(upstream, todo, jobs, args.force, seconds, forked_workers)
                signals.armed = False  # the fork server's clean-up runs whole
            return code
        except Interrupted as err:
            print(INTERRUPTED.format(signal.Signals(err.args[0]).name), file=sys.stderr)
            return 128 + err.args[0]


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C before the handlers, while no stage runs yet
        print(INTERRUPTED.format("SIGINT"), file=sys.stderr)
        sys.exit(130)
