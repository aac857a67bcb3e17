"""The stage scripts' resume and tracking, in-process and fast: a training stage resumes
its own checkpoint (keyed by params, inputs and code) into the run it started; a tracked
run's tags, inputs, parent and ledger entry; the reused runs; the execution a stage joins.
Found missing by mutation of stages/ (the end-to-end checks are `make test-slow`)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import yaml
from test_stage_outputs import load_stage

from bayesavg.runtime.checkpoint import Checkpoint
from bayesavg.runtime.io import sha256_file

MANIFEST = Path("data/prepared/manifest.json")


class _Run:
    """A tracked run that records what it is told."""

    def __init__(self, run_id: str, calls: list[tuple[str, str, tuple[Any, ...]]]) -> None:
        self.run_id, self.calls = run_id, calls

    def __getattr__(self, op: str) -> Callable[..., None]:
        return lambda *args, **kwargs: self.calls.append((self.run_id, op, args))


class _Tracked:
    """``_common.tracked``'s stand-in: each run's stage, inputs and resumed run id."""

    def __init__(self) -> None:
        self.opened: list[dict[str, Any]] = []
        self.calls: list[tuple[str, str, tuple[Any, ...]]] = []

    @contextlib.contextmanager
    def __call__(
        self, stage: str, p: Any, logged: Any, inputs: Any = (), **kw: Any
    ) -> Iterator[_Run]:
        self.opened.append({"stage": stage, "logged": logged, "inputs": list(inputs), **kw})
        yield _Run(kw.get("resume") or f"run-{len(self.opened)}", self.calls)


def _edit_params(change: Callable[[dict[str, Any]], None]) -> None:
    raw = yaml.safe_load(Path("params.yaml").read_text())
    change(raw)
    Path("params.yaml").write_text(yaml.safe_dump(raw))


@pytest.fixture
def common(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """stages/_common, its per-process digests emptied (relative paths recur across tests)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "stages"))
    monkeypatch.setenv("RANK", "1")  # no tracking worker at a first import
    import _common

    monkeypatch.delenv("RANK")
    monkeypatch.setattr(_common, "_digests", {})
    return _common


# --- resume: pretrain and finetune ---------------------------------------------------


class _Trainer:
    """The training function: records the state it resumes from and saves a checkpoint
    (as every epoch does), then is interrupted or returns."""

    def __init__(self) -> None:
        self.resumed: list[Any] = []
        self.interrupt = False

    def __call__(self, *args: Any) -> SimpleNamespace:
        ckpt = next(a for a in args if isinstance(a, Checkpoint))
        self.resumed.append(ckpt.state)
        ckpt.save({"epoch": 1})
        if self.interrupt:
            raise KeyboardInterrupt
        row = {"epoch": 1, "lr": 0.1, "loss": 0.5, "seconds": 2.0, "compile_seconds": 1.0}
        return SimpleNamespace(posterior=SimpleNamespace(collector=None, hwa=None), history=[row])


def _training_stage(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> tuple[ModuleType, _Trainer, _Tracked]:
    """stages/<name>.py (finetune: of swag) with its training, data and posterior files
    faked; its inputs (the manifest, the start's posterior) are files of their own bytes."""
    import bayesavg.data.prepared
    import bayesavg.posteriors.file
    import bayesavg.trajectories

    stage = load_stage(name, tmp_path, monkeypatch)
    trainer, tracked = _Trainer(), _Tracked()
    monkeypatch.setattr(stage, "tracked", tracked)
    monkeypatch.setattr(
        sys, "argv", [f"stages/{name}.py", *(["swag"] if name == "finetune" else [])]
    )
    fn = "pretrain_members" if name == "pretrain" else "finetune"
    monkeypatch.setattr(bayesavg.trajectories, fn, trainer)
    monkeypatch.setattr(bayesavg.trajectories, "compute_for", lambda *a: None)
    monkeypatch.setattr(bayesavg.trajectories, "initial_network", lambda *a: "init")
    monkeypatch.setattr(bayesavg.data.prepared, "load_prepared", lambda path: None)
    monkeypatch.setattr(bayesavg.posteriors.file, "load_posterior", lambda path: None)

    def save(path: Path, posterior: object) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{path} {posterior!r}\n")

    monkeypatch.setattr(bayesavg.posteriors.file, "save_posterior", save)
    for file, text in ((MANIFEST, "{}"), (Path("models/pretrain/posterior.pt"), "start")):
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)
    return stage, trainer, tracked


def _interrupted(stage: ModuleType, trainer: _Trainer, common: ModuleType) -> Path:
    trainer.interrupt = True
    with pytest.raises(KeyboardInterrupt):
        stage.run()
    trainer.interrupt = False
    common._digests.clear()  # a new process: the files are read again
    return (
        Path("checkpoints")
        / f"{'pretrain' if stage.__name__ == 'stage_pretrain' else 'finetune@swag'}.pt"
    )


@pytest.mark.parametrize("name", ["pretrain", "finetune"])
def test_a_training_stage_resumes_its_checkpoint_into_the_run_it_started(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> None:
    """Killed after a checkpoint, the rerun continues from it, logging into the killed
    run (``resume``); once its outputs are written the checkpoint is gone."""
    stage, trainer, tracked = _training_stage(name, tmp_path, monkeypatch, common)
    ckpt = _interrupted(stage, trainer, common)
    assert ckpt.is_file() and tracked.opened[0]["resume"] is None
    stage.run()
    assert trainer.resumed == [None, {"epoch": 1}]
    assert tracked.opened[1]["resume"] == "run-1"
    assert not ckpt.exists(), "a finished stage deletes its checkpoint"
    history = Path("plots/pretrain.csv" if name == "pretrain" else "plots/finetune/swag.csv")
    assert history.read_text() == "epoch,lr,loss\n1,0.1,0.5\n"


@pytest.mark.parametrize("name", ["pretrain", "finetune"])
@pytest.mark.parametrize("change", ["input", "params"])
def test_a_checkpoint_of_other_inputs_or_params_is_not_resumed(
    name: str, change: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> None:
    """The bytes of the stage's inputs (pretrain: the manifest; finetune: also its start's
    posterior) and its own params section are in the checkpoint's key."""
    stage, trainer, tracked = _training_stage(name, tmp_path, monkeypatch, common)
    ckpt = _interrupted(stage, trainer, common)
    if change == "input":
        changed = MANIFEST if name == "pretrain" else Path("models/pretrain/posterior.pt")
        changed.write_text("other bytes")
    elif name == "pretrain":
        _edit_params(lambda raw: raw["pretrain"].update(epochs=raw["pretrain"]["epochs"] + 1))
    else:
        _edit_params(lambda raw: raw["finetune"]["swag"].update(epochs=3))
    stage.run()
    assert trainer.resumed == [None, None]
    assert tracked.opened[1]["resume"] is None and not ckpt.exists()


def test_pretrain_writes_checkable_digests_and_no_wall_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> None:
    """`sha256sum -c` reads each .sha256 (two spaces); the history and metrics hold no
    timing column, whose bytes would differ on every rerun."""
    stage, _, tracked = _training_stage("pretrain", tmp_path, monkeypatch, common)
    stage.run()
    for folder in ("pretrain", "init"):
        out = Path("models") / folder / "posterior.pt"
        digest = (out.parent / "posterior.sha256").read_text()
        assert digest == f"{sha256_file(out)}  posterior.pt\n"
    assert Path("plots/pretrain.csv").read_text().splitlines()[0] == "epoch,lr,loss"
    assert json.loads(Path("metrics/pretrain.json").read_text()) == {"loss": 0.5}
    assert [(o["stage"], o["inputs"]) for o in tracked.opened] == [
        ("pretrain", [MANIFEST]),
        ("init", [MANIFEST]),
    ]


# --- the checkpoint's key --------------------------------------------------------------


def test_the_checkpoint_key_follows_everything_that_changes_the_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> None:
    """Each of the stage, seed, its params, the compute settings, the processes, the
    numerics, the device, and the code of bayesavg and of stages/ gives another key;
    the same ones give the same key, and the file is the stage's own."""
    import _checkpoint

    from bayesavg.runtime import launch, numerics

    load_stage("evaluate", tmp_path, monkeypatch)  # a scratch folder with params.yaml
    MANIFEST.parent.mkdir(parents=True)
    MANIFEST.write_text("{}")
    p = common.params()
    code = tmp_path / "code"
    code.mkdir()
    for file, text in (("a.py", "a = 1\n"), ("b.py", "b = 2\n")):
        (code / file).write_text(text)
    monkeypatch.setattr(_checkpoint, "STAGES", code)
    module = ModuleType("bayesavg._probe")
    monkeypatch.setitem(sys.modules, "bayesavg._probe", module)
    module.__file__ = str(code / "a.py")

    def key(stage: str = "finetune@x", q: Any = p, params: Any = None, device: str = "cpu") -> str:
        ckpt = _checkpoint.stage_checkpoint(stage, q, params or {"lr": 0.1}, [MANIFEST], device)
        assert ckpt.path == Path("checkpoints") / f"{stage}.pt"
        return ckpt.key

    base = key()
    assert key() == base
    flipped = p.data.augment.model_copy(update={"flip": not p.data.augment.flip})
    others = [
        key("finetune@y"),
        key(q=p.model_copy(update={"seed": p.seed + 1})),
        key(params={"lr": 0.2}),
        key(device="NVIDIA H100 80GB HBM3"),
        *(
            key(q=p.model_copy(update={field: value}))
            for field, value in (
                ("precision", "bf16"),
                ("channels_last", not p.channels_last),
                ("compile", not p.compile),
                ("cuda_graphs", not p.cuda_graphs),
                ("deterministic", not p.deterministic),
            )
        ),
        key(q=p.model_copy(update={"data": p.data.model_copy(update={"augment": flipped})})),
    ]
    with monkeypatch.context() as m:
        m.setattr(launch, "nproc", lambda: 2)
        others.append(key())
    with monkeypatch.context() as m:
        m.setattr(numerics, "describe", lambda: {"isa": "other"})
        others.append(key())
    module.__file__ = str(code / "b.py")  # other bayesavg code
    others.append(key())
    module.__file__ = str(code / "a.py")
    assert key() == base
    stage_module = ModuleType("stage_probe")
    stage_module.__file__ = str(code / "a.py")  # a module of stages/
    monkeypatch.setitem(sys.modules, "stage_probe", stage_module)
    others.append(key())
    assert len({base, *others}) == 1 + len(others), "a change left the key as it was"


# --- the tracked run, its ledger entry, the reused runs, the execution ----------------


class _Tracker:
    """The tracking worker's stand-in: the keyword arguments of each run it opens."""

    tracking_uri = "sqlite:///unused.db"

    def __init__(self) -> None:
        self.opened: list[dict[str, Any]] = []
        self.calls: list[tuple[str, str, tuple[Any, ...]]] = []

    @contextlib.contextmanager
    def run(self, name: str, **kwargs: Any) -> Iterator[_Run]:
        self.opened.append({"name": name, **kwargs})
        yield _Run(f"run-{len(self.opened)}", self.calls)


SPLITS = {"train": {"file": "train.pt", "sha256": "ab12", "n": 3, "per_class": [1, 2]}}


@pytest.fixture
def tracker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType) -> _Tracker:
    """A scratch folder with params.yaml and a manifest, runs sent to a ``_Tracker``, in
    an execution (its parent run), under `dvc repro` of stage evaluate@swag."""
    import _bootstrap

    load_stage("evaluate", tmp_path, monkeypatch)
    found = _Tracker()
    monkeypatch.setattr(_bootstrap, "tracker", found)
    monkeypatch.setattr(common, "execution", lambda: {"key": "h:1:2:", "name": "dvc repro"})
    monkeypatch.setenv("DVC_STAGE", "evaluate@swag")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", "")
    MANIFEST.parent.mkdir(parents=True)
    MANIFEST.write_text(json.dumps({"dataset": "m", "splits": SPLITS}))
    return found


def test_a_tracked_run_carries_its_tags_inputs_and_parent_and_leaves_its_ledger_entry(
    tracker: _Tracker, common: ModuleType
) -> None:
    p = common.params()
    with common.tracked("evaluate@swa", p, {"x": 1}, [MANIFEST], resume="r0", tags={"t": "v"}):
        pass
    [opened] = tracker.opened
    tags = opened["tags"]
    assert (tags["dvc_stage"], tags["seed"], tags["t"]) == ("evaluate@swag", str(p.seed), "v")
    assert "dvc_exp_name" not in tags and "dvc_exp_baseline_rev" not in tags, "no empty tags"
    assert opened["inputs"] == {str(MANIFEST): sha256_file(MANIFEST)}
    assert opened["resume"] == "r0" and opened["parent"] == common.execution()
    calls = {op: args for _, op, args in tracker.calls}
    assert calls["log_params"] == ({"seed": p.seed, "device": p.device, "x": 1},)
    source = str((MANIFEST.parent / "train.pt").resolve())
    profile = json.dumps({"num_rows": 3, "per_class": [1, 2]})
    dataset = {"name": "m-train", "digest": "ab12", "source": source, "context": "train"}
    assert calls["log_datasets"] == ([{**dataset, "profile": profile}],)
    assert calls["record_in_parent"] == ("evaluate@swa", {}, "FINISHED", {})
    record = json.loads(Path("runs/evaluate@swa.json").read_text())
    assert {k: record[k] for k in ("run_id", "stage", "dvc_stage", "experiment")} == {
        "run_id": "run-1",
        "stage": "evaluate@swa",
        "dvc_stage": "evaluate@swag",
        "experiment": p.tracking.experiment,
    }


@pytest.mark.parametrize(("error", "status"), [(KeyboardInterrupt, "KILLED"), (OSError, "FAILED")])
def test_a_run_that_did_not_finish_tells_its_parent_how_and_leaves_no_ledger_entry(
    tracker: _Tracker, common: ModuleType, error: type, status: str
) -> None:
    """Ctrl-C or SIGTERM is KILLED, anything else FAILED; its id file is not written
    (it names the runs that made the workspace's outputs)."""
    Path("runs").mkdir()
    Path("runs/pretrain.json").write_text(json.dumps({"stage": "pretrain", "run_id": "pre"}))
    with pytest.raises(error), common.tracked("evaluate@swa", common.params(), {}):
        raise error("stopped")
    [(stage, reused, ended, rolled_back, _)] = [
        args for _, op, args in tracker.calls if op == "record_in_parent"
    ]
    assert (stage, reused, ended, rolled_back) == ("evaluate@swa", {"pretrain": "pre"}, status, {})
    assert sorted(p.name for p in Path("runs").iterdir()) == ["pretrain.json"]


def test_reused_runs_are_this_workspace_s_else_the_project_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> None:
    """A temporary experiment's workspace records the stages it ran; the others' runs are
    the project's (DVC_ROOT), as is the spool. Not the asking stage's own, nor files no
    stage wrote."""
    project, here = tmp_path / "project", tmp_path / "exp"
    for root, entries in (
        (project, {"data": "project-data", "pretrain": "project-pretrain", "report": "r"}),
        (here, {"data": "exp-data", "report": "r2"}),
    ):
        (root / "runs").mkdir(parents=True)
        for stage, run in entries.items():
            (root / "runs" / f"{stage}.json").write_text(
                json.dumps({"stage": stage, "run_id": run})
            )
    (here / "runs" / "validate.json").write_text('{"params": "valid"}')
    (here / "runs" / "broken.json").write_text("{not json")
    monkeypatch.chdir(here)
    monkeypatch.setenv("DVC_ROOT", str(project))
    assert common.reused_runs("report") == {"data": "exp-data", "pretrain": "project-pretrain"}
    assert common.spool_dir() == project / "runs" / "spool", "in runs/, which git ignores"


def test_a_stage_joins_its_nearest_dvc_ancestor_s_execution(
    monkeypatch: pytest.MonkeyPatch, common: ModuleType
) -> None:
    """A queue worker (`python .../bin/dvc exp exec-run`) under another dvc process: its
    own key (host, pid, start in ms, experiment), the experiment's name, its command."""
    import socket

    import _execution
    import psutil

    def proc(cmdline: list[str], pid: int = 0, started: float = 0.0) -> SimpleNamespace:
        return SimpleNamespace(pid=pid, cmdline=lambda: cmdline, create_time=lambda: started)

    parents = [
        proc(["/bin/sh", "-c", "python stages/evaluate.py swag"]),
        proc(["/v/bin/python", "/v/bin/dvc", "exp", "exec-run", "--infofile", "i"], 42, 1000.5),
        proc(["dvc", "repro"], 1, 1.0),
    ]
    monkeypatch.setattr(psutil, "Process", lambda: SimpleNamespace(parents=lambda: parents))
    monkeypatch.delenv(_execution.EXECUTION_ENV, raising=False)
    monkeypatch.setenv("DVC_EXP_NAME", "wide")
    assert _execution.execution() == {
        "key": f"{socket.gethostname()}:42:1000500:wide",
        "name": "wide",
        "dvc_exp_name": "wide",
        "mlflow.source.name": "dvc exp exec-run",
    }
    assert _execution._dvc_args(["python3", "-m", "dvc", "repro", "x"]) == ["repro", "x"]
    assert _execution._dvc_args(["python3", "stages/data.py"]) is None
    monkeypatch.setattr(psutil, "Process", lambda: SimpleNamespace(parents=lambda: parents[:1]))
    assert _execution.execution() is None
