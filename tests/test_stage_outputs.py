"""A stage that writes several units (evaluate's predictors, landscape's probes, the dswag
sweep's W) and fails or is interrupted part-way leaves none of this run's outputs, and an
earlier complete set is back whole (``bayesavg.runtime.outputs.all_or_nothing``)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pipeline_repo import ROOT

from bayesavg.runtime import outputs as outputs_module
from bayesavg.runtime.entry import Terminated, said_of
from bayesavg.runtime.outputs import all_or_nothing

FAILURES = [RuntimeError, KeyboardInterrupt, SystemExit]


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (hidden ones too): a file's bytes, None for a folder."""
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


def write_units(root: Path, units: list[str], fail_at: int | None, error: type) -> None:
    """A fake multi-unit writer: each unit one file in the folder ``out/``, a
    ``<unit>.json`` in a folder of other files and a ``<unit>.csv`` in folders it makes,
    as the stages write theirs; raises ``error`` in unit ``fail_at``, after its first file."""
    for i, unit in enumerate(units):
        (root / "out" / "deep").mkdir(parents=True, exist_ok=True)
        (root / "out" / "deep" / f"{unit}.csv").write_text(f"new {unit}\n")
        if i == fail_at:
            raise error("unit failed")
        (root / "summaries").mkdir(exist_ok=True)
        (root / "summaries" / f"{unit}.json").write_text(f'{{"unit": "{unit}"}}\n')
        (root / "made" / "here").mkdir(parents=True, exist_ok=True)
        (root / "made" / "here" / f"{unit}.csv").write_text(f"new {unit}\n")


def outputs(root: Path, units: list[str]) -> list[Path]:
    listed = [root / "out"]
    listed += [root / "summaries" / f"{u}.json" for u in units]
    return listed + [root / "made" / "here" / f"{u}.csv" for u in units]


def bystanders(root: Path) -> None:
    """Files that are not the writer's: beside its outputs and in their parent folder."""
    (root / "summaries").mkdir(parents=True)
    (root / "summaries" / "other.json").write_text("{}\n")
    (root / "notes.txt").write_text("keep\n")


@pytest.mark.parametrize("error", FAILURES)
def test_a_failing_writer_leaves_none_of_its_outputs(tmp_path: Path, error: type) -> None:
    bystanders(tmp_path)
    before = tree(tmp_path)
    units = ["a", "b", "c"]
    with pytest.raises(error), all_or_nothing(outputs(tmp_path, units)):
        write_units(tmp_path, units, fail_at=1, error=error)
    assert (tmp_path / "made").exists() is False
    assert tree(tmp_path) == before  # no unit's file, no folder it made, nothing moved aside


@pytest.mark.parametrize("error", FAILURES)
def test_an_earlier_complete_set_is_not_half_replaced(tmp_path: Path, error: type) -> None:
    bystanders(tmp_path)
    units = ["a", "b", "c"]
    write_units(tmp_path, units, fail_at=None, error=error)
    for path in tmp_path.rglob("*.*"):  # the earlier run's bytes differ from this one's
        path.write_text(f"old {path.name}\n")
    (tmp_path / "out" / "stale.csv").write_text("an earlier unit's\n")
    before = tree(tmp_path)
    with pytest.raises(error), all_or_nothing(outputs(tmp_path, units)):
        write_units(tmp_path, units, fail_at=2, error=error)
    assert tree(tmp_path) == before


def test_on_success_the_outputs_are_what_writing_directly_gives(tmp_path: Path) -> None:
    units = ["a", "b", "c"]
    direct, guarded = tmp_path / "direct", tmp_path / "guarded"
    for root in (direct, guarded):
        bystanders(root)
    write_units(direct, units, fail_at=None, error=RuntimeError)
    (guarded / "out").mkdir()  # an earlier set, with a unit this run no longer writes
    (guarded / "out" / "stale.csv").write_text("an earlier unit's\n")
    (guarded / "summaries" / "a.json").write_text("old\n")
    with all_or_nothing(outputs(guarded, units)):
        write_units(guarded, units, fail_at=None, error=RuntimeError)
    assert tree(guarded) == tree(direct)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_as_the_old_set_goes_leaves_the_new_one_and_no_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int
) -> None:
    """The set is whole when the old contents are being removed: a stop then acts once
    they are gone. Cut short, they waited aside (``.out.<random>.old``), and the next run
    took them for a killed set's and put the old set back over the finished one."""
    units = ["a", "b", "c"]
    direct, guarded = tmp_path / "direct", tmp_path / "guarded"
    for root in (direct, guarded):
        bystanders(root)
    write_units(direct, units, fail_at=None, error=RuntimeError)
    write_units(guarded, units, fail_at=None, error=RuntimeError)  # the old set
    for path in guarded.rglob("*.*"):
        if path.name not in ("notes.txt", "other.json"):  # the bystanders stay theirs
            path.write_text(f"old {path.name}\n")
    remove = outputs_module._remove

    def stopped_while_removing(path: Path) -> None:
        os.kill(os.getpid(), signum)
        remove(path)

    monkeypatch.setattr(outputs_module, "_remove", stopped_while_removing)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        with pytest.raises(KeyboardInterrupt), all_or_nothing(outputs(guarded, units)):
            write_units(guarded, units, fail_at=None, error=RuntimeError)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    assert tree(guarded) == tree(direct)  # the new set, nothing aside


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


def test_a_path_inside_another_listed_is_covered_by_it(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x.json").write_text("old\n")
    before = tree(tmp_path)
    with pytest.raises(RuntimeError), all_or_nothing([tmp_path / "out", tmp_path / "out/x.json"]):
        (tmp_path / "out").mkdir()  # the folder was moved aside whole
        (tmp_path / "out" / "x.json").write_text("new\n")
        raise RuntimeError
    assert tree(tmp_path) == before


def _killed_writer(root: Path, units: list[str]) -> None:
    """A writer SIGKILLed part-way (no roll-back runs): a forked child that writes the
    first unit inside ``all_or_nothing`` and kills itself."""
    pid = os.fork()
    if pid == 0:  # the child: file operations only, then gone without a word
        with all_or_nothing(outputs(root, units)):
            write_units(root, units[:1], fail_at=None, error=RuntimeError)
            os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(pid, 0)


@pytest.mark.parametrize("kills", [1, 2])
def test_a_killed_writer_s_set_is_rolled_back_by_the_next(tmp_path: Path, kills: int) -> None:
    """A SIGKILL leaves the old contents aside and the killed body's files in place; the
    next writer puts the old set back first, so failing it leaves the old set, and
    succeeding it leaves its own, with nothing aside either way."""
    bystanders(tmp_path)
    units = ["a", "b", "c"]
    write_units(tmp_path, units, fail_at=None, error=RuntimeError)
    for path in tmp_path.rglob("*.*"):
        path.write_text(f"old {path.name}\n")
    before = tree(tmp_path)
    for _ in range(kills):
        _killed_writer(tmp_path, units)
    assert list(tmp_path.rglob(".*.old")) and tree(tmp_path) != before
    with pytest.raises(RuntimeError), all_or_nothing(outputs(tmp_path, units)):
        write_units(tmp_path, units, fail_at=2, error=RuntimeError)
    assert tree(tmp_path) == before
    _killed_writer(tmp_path, units)
    with all_or_nothing(outputs(tmp_path, units)):
        write_units(tmp_path, units, fail_at=None, error=RuntimeError)
    direct = tmp_path / "direct"
    bystanders(direct)
    write_units(direct, units, fail_at=None, error=RuntimeError)
    got = {k: v for k, v in tree(tmp_path).items() if not k.startswith("direct")}
    bystanders_now = {k: before[k] for k in ("notes.txt", "summaries/other.json")}
    assert got == tree(direct) | bystanders_now
    assert not list(tmp_path.rglob(".*.old"))


# The stages, called in-process in a scratch folder holding params.yaml, with their units
# and inputs replaced by fakes that write where the real ones write.


class _Run:
    """A tracked run that logs nothing."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def _untracked(stage: str, *args: Any, **kwargs: Any) -> Iterator[_Run]:
    """No MLflow run; the runs/ ledger entry written at the end, as ``tracked`` does."""
    yield _Run()
    Path("runs").mkdir(exist_ok=True)
    Path("runs", f"{stage}.json").write_text(f"new run of {stage}\n")


def load_stage(name: str, repo: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """stages/<name>.py as a module (under a name of its own: benchmarks/ has an
    `evaluate` module too), run from ``repo``, with no MLflow run and one process."""
    monkeypatch.syspath_prepend(str(ROOT / "stages"))  # for its `_common`
    monkeypatch.setenv("RANK", "1")  # a first import of `_bootstrap` starts no tracking worker
    spec = importlib.util.spec_from_file_location(f"stage_{name}", ROOT / f"stages/{name}.py")
    assert spec is not None and spec.loader is not None
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("BAYESAVG_NPROC", raising=False)
    monkeypatch.setattr(stage, "tracked", _untracked)
    shutil.copy(ROOT / "params.yaml", repo / "params.yaml")
    monkeypatch.chdir(repo)
    return stage


class Units:
    """A stage's unit function replaced: each call writes ``paths(*args)`` (a name with a
    suffix a file, else a folder holding one), the call numbered ``fail_at`` then raises."""

    def __init__(
        self, paths: Callable[..., list[Path]], fail_at: int | None, error: type = RuntimeError
    ) -> None:
        self.paths, self.fail_at, self.error, self.calls = paths, fail_at, error, 0

    def __call__(self, *args: Any) -> tuple[dict[str, Any], dict[str, float], list[Path]]:
        return self.unit(self.paths(*args), args[1])

    def unit(
        self, paths: list[Path], name: object
    ) -> tuple[dict[str, Any], dict[str, float], list[Path]]:
        written = []
        for path in paths:
            file = path if path.suffix else path / "unit.csv"
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(f"new {name}\n")
            written.append(file)
        self.calls += 1
        if self.calls == self.fail_at:
            raise self.error("unit failed")
        return {}, {}, written


def earlier(repo: Path, folders: list[Path], runs: Sequence[str] = ()) -> dict[str, bytes | None]:
    """An earlier complete set in the stage's output folders with the runs/ ledger entries
    of the units that made it, and files of other stages; the tree they make."""
    for folder in folders:
        (repo / folder).mkdir(parents=True)
        (repo / folder / "earlier.json").write_text(f"old {folder}\n")
    (repo / "metrics" / "pretrain.json").write_text("{}\n")
    (repo / "runs").mkdir()
    for stage in [*runs, "pretrain"]:
        (repo / "runs" / f"{stage}.json").write_text(f"old run of {stage}\n")
    return tree(repo)


EVALUATE = [Path(p) for p in ("metrics/evaluate", "plots/reliability", "plots/samples")]
EVALUATE_OUTS = [*(f / "swag" for f in EVALUATE), Path("predictions/swag")]


def evaluate_stage(
    repo: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], units: Units
) -> ModuleType:
    stage = load_stage("evaluate", repo, monkeypatch)
    monkeypatch.setattr(sys, "argv", ["stages/evaluate.py", *args])
    monkeypatch.setattr(stage, "load_inputs", lambda p, trajectory, device: None)
    monkeypatch.setattr(stage, "_predictor", units)
    return stage


def predictor_paths(p: Any, name: str, *rest: Any) -> list[Path]:
    """What ``_predictor`` writes: the predictor's files and its runs/ ledger entry."""
    from _common import predictor_files

    files = predictor_files(p.evaluate.by_name[name].trajectory, name)
    return [*files, Path(f"runs/evaluate@{name}.json")]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("before", [False, True], ids=["no-earlier-set", "earlier-set"])
def test_evaluate_failing_at_its_second_predictor_leaves_no_partial_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: type, before: bool
) -> None:
    """As `dvc repro evaluate@swag` interrupted after swa: no swa files, and a set an
    earlier run wrote (a direct run; DVC removes it first) is back whole."""
    (tmp_path / "metrics").mkdir()
    runs = [f"evaluate@{name}" for name in ("swa", "swa_ts", "swag_diag", "swag")]
    expected = earlier(tmp_path, EVALUATE_OUTS, runs) if before else earlier(tmp_path, [])
    units = Units(predictor_paths, fail_at=2, error=error)
    stage = evaluate_stage(tmp_path, monkeypatch, ["swag"], units)
    with pytest.raises(error):
        stage.run()
    assert units.calls == 2
    assert tree(tmp_path) == {**expected, "params.yaml": (ROOT / "params.yaml").read_bytes()}


def test_evaluate_writes_every_predictor_on_success(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All four predictors' files in place; an earlier run's files in the stage's folders
    gone, as after DVC's own removal; other stages' files untouched."""
    (tmp_path / "metrics").mkdir()
    earlier(tmp_path, EVALUATE_OUTS)
    units = Units(predictor_paths, fail_at=None)
    evaluate_stage(tmp_path, monkeypatch, ["swag"], units).run()
    names = ["swa", "swa_ts", "swag_diag", "swag"]
    written = {
        f"{folder}/{name}{suffix}"
        for folder, suffix in zip(EVALUATE_OUTS, (".json", ".csv", ".csv", ".npz"), strict=True)
        for name in names
    }
    ledger = {f"runs/evaluate@{name}.json": name for name in names}
    files = {k for k, v in tree(tmp_path).items() if v is not None}
    assert files == {
        *written,
        *ledger,
        "params.yaml",
        "metrics/pretrain.json",
        "runs/pretrain.json",
    }
    assert all(Path(f).read_text() == f"new {name}\n" for f, name in ledger.items())
    assert Path("runs/pretrain.json").read_text() == "old run of pretrain\n"


@pytest.mark.parametrize("fail", [True, False])
def test_evaluate_of_one_predictor_touches_only_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: bool
) -> None:
    """`evaluate.py swag swag_diag` fails: every earlier file is back; succeeds: only
    swag_diag's files are new."""
    units = Units(predictor_paths, fail_at=1 if fail else None)
    stage = evaluate_stage(tmp_path, monkeypatch, ["swag", "swag_diag"], units)
    old = [*predictor_paths(stage.params(), "swa"), *predictor_paths(stage.params(), "swag_diag")]
    for path in old:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"old {path}\n")
    expected = tree(tmp_path)
    if fail:
        with pytest.raises(RuntimeError):
            stage.run()
    else:
        stage.run()
        for path in predictor_paths(stage.params(), "swag_diag"):
            expected[str(path)] = path.read_bytes()
            assert path.read_text().startswith("new")
    assert tree(tmp_path) == expected


LANDSCAPE = [Path("plots/plane"), Path("plots/landscape"), Path("metrics/landscape")]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("before", [False, True], ids=["no-earlier-set", "earlier-set"])
def test_landscape_failing_at_its_second_probe_leaves_no_partial_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: type, before: bool
) -> None:
    """As `dvc repro landscape` with a truncated posterior after plane@hwa: no plane files."""
    (tmp_path / "metrics").mkdir()
    stage = load_stage("landscape", tmp_path, monkeypatch)
    monkeypatch.setattr(sys, "argv", ["stages/landscape.py"])
    runs = [f"{kind}@{name}" for kind, name in stage._units(stage.params())]
    expected = earlier(tmp_path, LANDSCAPE, runs) if before else earlier(tmp_path, [])
    units = Units(lambda *args: [], fail_at=2, error=error)
    probes(stage, units, monkeypatch)
    with pytest.raises(error):
        stage.run()
    assert units.calls == 2
    assert tree(tmp_path) == {**expected, "params.yaml": (ROOT / "params.yaml").read_bytes()}


def probes(stage: ModuleType, units: Units, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kind of probe replaced by ``units`` writing what the probe writes."""

    def runner(kind: str) -> Callable[[Any, str], Any]:
        return lambda p, name: units.unit(stage._unit_outputs(kind, name), name)

    for kind in stage.KINDS:
        monkeypatch.setitem(stage.RUNNERS, kind, runner(kind))


def test_landscape_writes_every_probe_on_success(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = load_stage("landscape", tmp_path, monkeypatch)
    monkeypatch.setattr(sys, "argv", ["stages/landscape.py"])
    units = Units(lambda *args: [], fail_at=None)
    probes(stage, units, monkeypatch)
    stage.run()
    listed = stage._units(stage.params())
    assert units.calls == len(listed) > 2
    for kind, name in listed:
        for path in stage._unit_outputs(kind, name):
            assert (path if path.suffix else path / "unit.csv").read_text() == f"new {name}\n"


def test_landscape_of_one_probe_touches_only_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`landscape.py plane fhwa` fails: plane@hwa's earlier files and its own are back."""
    stage = load_stage("landscape", tmp_path, monkeypatch)
    for name in ("hwa", "fhwa"):
        (tmp_path / "plots/plane" / name).mkdir(parents=True)
        (tmp_path / "plots/plane" / name / "grid.csv").write_text(f"old {name}\n")
    expected = tree(tmp_path)
    monkeypatch.setattr(sys, "argv", ["stages/landscape.py", "plane", "fhwa"])
    units = Units(lambda *args: [], fail_at=1)
    probes(stage, units, monkeypatch)
    with pytest.raises(RuntimeError):
        stage.run()
    assert units.calls == 1
    assert tree(tmp_path) == expected


SWEEP = [
    Path(p)
    for p in (
        "models/dswag_sweep",
        "plots/dswag_sweep/rounds",
        "plots/dswag_sweep/sigma_distance",
        "metrics/dswag_sweep",
    )
]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("before", [False, True], ids=["no-earlier-set", "earlier-set"])
def test_dswag_sweep_failing_at_its_second_w_leaves_no_partial_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: type, before: bool
) -> None:
    import bayesavg.data.prepared
    import bayesavg.posteriors.file

    (tmp_path / "metrics").mkdir()
    stage = load_stage("dswag_sweep", tmp_path, monkeypatch)
    runs = [f"dswag_sweep@{w}" for w in stage.params().evaluate.dswag_sweep.workers]
    expected = earlier(tmp_path, SWEEP, runs) if before else earlier(tmp_path, [])
    monkeypatch.setattr(sys, "argv", ["stages/dswag_sweep.py"])
    monkeypatch.setattr(bayesavg.posteriors.file, "load_posterior", lambda path: None)
    monkeypatch.setattr(bayesavg.data.prepared, "load_prepared", lambda path: None)
    units = Units(  # what _point writes, its runs/ ledger entry included
        lambda p, w, *rest: [*stage.point_outputs("dswag", w), Path(f"runs/dswag_sweep@{w}.json")],
        fail_at=2,
        error=error,
    )
    monkeypatch.setattr(stage, "_point", units)
    with pytest.raises(error):
        stage.run()
    assert units.calls == 2
    assert tree(tmp_path) == {**expected, "params.yaml": (ROOT / "params.yaml").read_bytes()}


class _Recorder:
    """A tracking worker's stand-in: the calls of each run it opens, in order."""

    tracking_uri = "sqlite:///unused.db"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, tuple[Any, ...]]] = []
        self.opened = 0
        self.stop_at: tuple[str, str] | None = None  # (run, op): Ctrl-C during that call
        self.closed_with: dict[str, bytes | None] | None = None  # ``out/`` when closed

    def close(self) -> None:
        self.closed_with = tree(Path("out"))

    @contextlib.contextmanager
    def run(self, name: str, **kwargs: Any) -> Iterator[Any]:
        self.opened += 1
        yield _RecordedRun(self, f"run-{self.opened}")


class _RecordedRun:
    def __init__(self, recorder: _Recorder, run_id: str) -> None:
        self.recorder, self.run_id = recorder, run_id

    def __getattr__(self, op: str) -> Callable[..., None]:
        """A call: its positional arguments, then its keywords if any."""

        def call(*args: Any, **kwargs: Any) -> None:
            self.recorder.calls.append((self.run_id, op, (*args, *([kwargs] if kwargs else []))))
            if (self.run_id, op) == self.recorder.stop_at:
                signal.raise_signal(signal.SIGINT)

        return call


@pytest.mark.parametrize("in_a_set", [True, False])
def test_a_failing_unit_marks_its_set_s_finished_units_rolled_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_a_set: bool
) -> None:
    """In ``one_set`` the failing unit's run names the units that had finished (their
    runs say FINISHED of outputs now gone), even outside a pipeline execution; their
    files and runs/ ledger entries are gone. Outside a set there is nothing to name."""
    load_stage("evaluate", tmp_path, monkeypatch)
    import _bootstrap
    import _common
    import _sets

    recorder = _Recorder()
    monkeypatch.setattr(_bootstrap, "tracker", recorder)
    monkeypatch.setattr(_common, "execution", lambda: None)  # a stage run by hand
    p = _common.params()
    units = ["probe@a", "probe@b", "probe@c"]
    scope = _sets.one_set([Path("out")], units) if in_a_set else contextlib.nullcontext()
    with pytest.raises(RuntimeError), scope:
        for unit in units:
            with _common.tracked(unit, p, {}):
                if unit == "probe@c":
                    raise RuntimeError("unit failed")
                Path("out").mkdir(exist_ok=True)
                Path("out", unit).write_text("new\n")
    recorded = [args for run_id, op, args in recorder.calls if op == "record_in_parent"]
    if in_a_set:
        [(stage, _, status, rolled_back, why)] = recorded
        assert (stage, status, why) == ("probe@c", "FAILED", "RuntimeError: unit failed")
        assert rolled_back == {"probe@a": "run-1", "probe@b": "run-2"}
        assert not Path("out").exists() and not Path("runs").exists()
    else:
        assert recorded == []
        assert sorted(p.name for p in Path("runs").iterdir()) == ["probe@a.json", "probe@b.json"]
    assert _sets._Ledger.units is None


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("after", [1, 3])
def test_a_set_failing_between_units_marks_its_finished_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: type, after: int
) -> None:
    """A failure or a stop outside the units' runs (after the first, or after the last
    before the set closes) has no unit's run to say so: the last finished unit's run
    records the DVC stage's end in the execution, not as a stage it ran, and names the
    finished units rolled back, once. The worker is closed (it has finished logging
    their files) before the roll-back removes those files."""
    load_stage("evaluate", tmp_path, monkeypatch)
    import _bootstrap
    import _common
    import _sets

    recorder = _Recorder()
    monkeypatch.setattr(_bootstrap, "tracker", recorder)
    monkeypatch.setattr(_common, "execution", lambda: None)
    monkeypatch.setenv("DVC_STAGE", "evaluate@t")
    p = _common.params()
    units = ["probe@a", "probe@b", "probe@c"]
    with pytest.raises(error), _sets.one_set([Path("out")], units):
        for unit in units[:after]:
            with _common.tracked(unit, p, {}):
                Path("out").mkdir(exist_ok=True)
                Path("out", unit).write_text("new\n")
        raise error("between units")
    recorded = [(r, args) for r, op, args in recorder.calls if op == "record_in_parent"]
    finished = {unit: f"run-{i + 1}" for i, unit in enumerate(units[:after])}
    status = "KILLED" if error is KeyboardInterrupt else "FAILED"
    said = said_of(error("between units"))
    [(run, (stage, _, ended, rolled_back, why, keywords))] = recorded
    assert (run, stage, ended, why) == (f"run-{after}", "evaluate@t", status, said)
    assert rolled_back == finished and keywords == {"between_units": True}
    assert recorder.closed_with == {u: b"new\n" for u in units[:after]}, "closed, then rolled back"
    assert _bootstrap.tracker is None
    assert not Path("out").exists() and not Path("runs").exists()
    assert _sets._Ledger.units is None and _sets._Ledger.unit_run is None


def test_a_failing_unit_is_recorded_once_not_again_by_its_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit's own failure is its run's to record (``tracked``); the set adds nothing."""
    load_stage("evaluate", tmp_path, monkeypatch)
    import _bootstrap
    import _common
    import _sets

    recorder = _Recorder()
    monkeypatch.setattr(_bootstrap, "tracker", recorder)
    monkeypatch.setattr(_common, "execution", lambda: None)
    p = _common.params()
    with pytest.raises(RuntimeError), _sets.one_set([Path("out")], ["probe@a", "probe@b"]):
        with _common.tracked("probe@a", p, {}):
            Path("out").mkdir()
        with _common.tracked("probe@b", p, {}):
            raise RuntimeError("unit failed")
    recorded = [args for _, op, args in recorder.calls if op == "record_in_parent"]
    [(stage, _, status, rolled_back, why)] = recorded  # no keywords: not between units
    assert (stage, status, rolled_back) == ("probe@b", "FAILED", {"probe@a": "run-1"})
    assert why == "RuntimeError: unit failed"


@pytest.mark.parametrize("op", ["log_metrics", "record_in_parent"])
def test_a_stop_as_a_unit_s_run_ends_waits_for_its_ledger_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    """Ctrl-C while a finished unit's run is being ended: the run ends FINISHED, its ledger
    entry is written, and the stop then counts it among the units rolled back (it did
    not: the unit's run said FINISHED of removed outputs, unmarked)."""
    load_stage("evaluate", tmp_path, monkeypatch)
    import _bootstrap
    import _common
    import _sets

    recorder = _Recorder()
    recorder.stop_at = ("run-2", op)
    monkeypatch.setattr(_bootstrap, "tracker", recorder)
    monkeypatch.setattr(_common, "execution", lambda: {"key": "k", "name": "dvc repro"})
    monkeypatch.setenv("DVC_STAGE", "evaluate@t")
    p = _common.params()
    units = ["probe@a", "probe@b", "probe@c"]
    reached = []
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in ``run_entry``
    try:
        with pytest.raises(KeyboardInterrupt), _sets.one_set([Path("out")], units):
            for unit in units:
                with _common.tracked(unit, p, {}):
                    Path("out").mkdir(exist_ok=True)
                    Path("out", unit).write_text("new\n")
                reached.append(unit)
    finally:
        signal.signal(signal.SIGINT, before)
    assert reached == ["probe@a"]  # the stop acted once probe@b's tracked block had ended
    last = [args for _, op_, args in recorder.calls if op_ == "record_in_parent"][-1]
    assert last[0] == "evaluate@t" and last[2] == "KILLED"
    assert last[3] == {"probe@a": "run-1", "probe@b": "run-2"}
    assert not Path("out").exists() and not Path("runs").exists()


def test_a_killed_set_s_finished_units_are_marked_by_the_next_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A SIGKILL leaves nothing running to mark the killed set's finished units; the next
    set over the same units finishes that roll-back (their ledger entries name the earlier
    runs again) and its first run marks the runs the killed set's entries named: those
    alone, once."""
    load_stage("evaluate", tmp_path, monkeypatch)
    import _bootstrap
    import _common
    import _sets

    recorder = _Recorder()
    monkeypatch.setattr(_bootstrap, "tracker", recorder)
    monkeypatch.setattr(_common, "execution", lambda: None)
    p = _common.params()
    units = ["probe@a", "probe@b", "probe@c"]
    ledger = [Path("runs", f"{unit}.json") for unit in units]
    Path("runs").mkdir()
    Path("out").mkdir()
    for unit, entry in zip(units, ledger, strict=True):  # an earlier complete set
        entry.write_text(json.dumps({"run_id": f"old-{unit}"}))
        Path("out", unit).write_text("old\n")
    Path("runs", "other.json").write_text(json.dumps({"run_id": "not-in-the-set"}))
    pid = os.fork()
    if pid == 0:  # two units finish, then the whole process is gone
        try:
            with all_or_nothing([Path("out"), *ledger]):
                Path("out").mkdir()
                for unit, entry in zip(units[:2], ledger[:2], strict=True):
                    Path("out", unit).write_text("killed\n")
                    entry.write_text(json.dumps({"run_id": f"killed-{unit}"}))
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)  # never back into pytest
    assert os.waitpid(pid, 0)[1] == signal.SIGKILL  # killed, not failed

    def one_set() -> list[tuple[str, tuple[Any, ...]]]:
        recorder.calls.clear()
        with _sets.one_set([Path("out")], units):
            for unit in units:
                with _common.tracked(unit, p, {}):
                    Path("out").mkdir(exist_ok=True)
                    Path("out", unit).write_text("new\n")
        return [(run_id, args) for run_id, op, args in recorder.calls if op == "mark_rolled_back"]

    [(marking, (runs, why))] = one_set()
    assert capsys.readouterr().err == (
        "marked MLflow run(s) of a killed set rolled back: probe@a (killed-probe@a), "
        "probe@b (killed-probe@b)\n"
    )
    assert marking == f"run-{recorder.opened - 2}"  # the set's first run
    assert runs == {"probe@a": "killed-probe@a", "probe@b": "killed-probe@b"}
    assert why.startswith("its outputs were removed when probe@a ran again after the execution")
    assert [json.loads(e.read_text())["run_id"] for e in ledger] == ["run-1", "run-2", "run-3"]
    assert one_set() == []  # nothing killed before this one
    assert not list(Path().rglob(".*.old")) and _sets._Ledger.killed == {}


def test_rolled_back_runs_are_tagged_and_named_in_the_parent(
    tmp_path: Path,
    mlflow_db: str,
) -> None:
    """The failing unit's record: each rolled-back run gets ``ROLLED_BACK_TAG`` saying
    why, and the execution's note and summary name them."""
    from mlflow.tracking import MlflowClient

    from bayesavg.tracking.mlflow_run import PIPELINE_TAG, ROLLED_BACK_TAG
    from bayesavg.tracking.store import open_run

    uri, artifacts = mlflow_db, (tmp_path / "art").as_uri()
    parent = {"key": "host:1:2:", "name": "dvc repro now"}

    def unit(name: str) -> Any:
        return open_run(
            name, tracking_uri=uri, artifact_location=artifacts, experiment="e", parent=parent
        )

    done = {}
    for name in ("evaluate@map", "evaluate@swa"):
        run = unit(name)
        run.record_in_parent(name, {}, "FINISHED")
        run.terminate()
        done[name] = run.run_id
    failing = unit("evaluate@swag")
    client = MlflowClient(tracking_uri=uri)
    client.set_tag(done["evaluate@swa"], "mlflow.note.content", "a user's own words")
    said = "no space left on the device writing predictions/swag/probs.npz"
    failing.record_in_parent("evaluate@swag", {"pretrain": "a-run-id"}, "FAILED", done, said)
    failing.terminate("FAILED", said)
    for run_id in done.values():
        tags = client.get_run(run_id).data.tags
        assert tags[ROLLED_BACK_TAG].startswith(
            "its outputs were removed when evaluate@swag, of the same stage, ended FAILED"
        )
        assert client.get_run(run_id).info.status == "FINISHED"
        # the run page's description says so first, above what it said before
        assert tags["mlflow.note.content"].startswith(f"Rolled back: {tags[ROLLED_BACK_TAG]}.")
    swa_note = client.get_run(done["evaluate@swa"]).data.tags["mlflow.note.content"]
    assert swa_note.endswith("\n\na user's own words")
    assert ROLLED_BACK_TAG not in client.get_run(failing.run_id).data.tags
    parent_run = client.get_run(client.get_run(failing.run_id).data.tags["mlflow.parentRunId"])
    assert parent_run.info.status == "FAILED"
    note = parent_run.data.tags["mlflow.note.content"]
    assert f"Did not finish: evaluate@swag (FAILED: {said})." in note, "why, not one click away"
    assert "Rolled back: evaluate@map, evaluate@swa (finished, but their outputs" in note
    # what went wrong first, before the reused stages' list the UI folds away
    assert note.index("Did not finish") < note.index("Rolled back") < note.index("Reused")
    assert "when their stage did not finish" in note
    summary = json.loads(parent_run.data.tags[PIPELINE_TAG])
    assert summary["rolled_back"] == ["evaluate@map", "evaluate@swa"]
    assert summary["failed"] == {"evaluate@swag": "FAILED"}
    assert summary["why"] == {"evaluate@swag": said}


def test_a_stage_failing_between_units_is_recorded_as_itself(
    tmp_path: Path, mlflow_db: str
) -> None:
    """Recorded from its last finished unit's run: the execution names the DVC stage among
    those that did not finish (not among those it ran: no run of its own), with why, and
    the finished units as rolled back, each tagged with its stage's end."""
    from mlflow.tracking import MlflowClient

    from bayesavg.tracking.mlflow_run import PIPELINE_TAG, ROLLED_BACK_TAG
    from bayesavg.tracking.store import open_run

    uri, artifacts = mlflow_db, (tmp_path / "art").as_uri()
    parent = {"key": "host:1:2:", "name": "dvc repro now"}
    done, run = {}, None
    for name in ("probe@a", "probe@b"):
        run = open_run(
            name, tracking_uri=uri, artifact_location=artifacts, experiment="e", parent=parent
        )
        run.record_in_parent(name, {}, "FINISHED")
        run.terminate()
        done[name] = run.run_id
    assert run is not None
    said = "interrupted by Ctrl-C (SIGINT): stopped"
    run.record_in_parent("landscape", {}, "KILLED", done, said, between_units=True)
    client = MlflowClient(tracking_uri=uri)
    for run_id in done.values():
        assert client.get_run(run_id).info.status == "FINISHED"
        assert client.get_run(run_id).data.tags[ROLLED_BACK_TAG] == (
            "its outputs were removed when its stage, landscape, ended KILLED: "
            "the stage writes all or none"
        )
    parent_run = client.get_run(client.get_run(run.run_id).data.tags["mlflow.parentRunId"])
    assert parent_run.info.status == "KILLED"
    summary = json.loads(parent_run.data.tags[PIPELINE_TAG])
    assert summary["ran"] == done
    assert summary["failed"] == {"landscape": "KILLED"} and summary["why"] == {"landscape": said}
    assert summary["rolled_back"] == ["probe@a", "probe@b"]
    note = parent_run.data.tags["mlflow.note.content"]
    assert note.startswith(
        f"Ran 2 stage(s): probe@a, probe@b. Did not finish: landscape (KILLED: {said})."
    )
