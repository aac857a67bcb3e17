"""An interrupted run resumed from its checkpoint ends with the bytes of an uninterrupted one.

In process, for every trajectory kind (and pretraining with its members):
the run is stopped right after a checkpoint is written and continued from
the file. Then for real, for swag, hwa and ensemble: `dvc repro` runs
`stages/finetune.py`, the test SIGKILLs that process in the middle of an
epoch, and the next `dvc repro` resumes it into the same MLflow run.
"""

from __future__ import annotations

import io
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from pipeline_repo import (
    DVC,
    PYTHON,
    default_params,
    env,
    make_repo,
    prune_landscape,
    sh,
    small_params,
)

from bayesavg.config import parse_params
from bayesavg.posteriors.file import PosteriorFile, save_posterior
from bayesavg.runtime.checkpoint import Checkpoint
from bayesavg.runtime.io import save_torch
from bayesavg.trajectories import RunResult, finetune, pretrain, pretrain_members

CPU = torch.device("cpu")


class Interrupted(Exception):
    """Stands in for a kill right after a checkpoint was written."""


class StopAfterSaves(Checkpoint):
    """A checkpoint whose run is interrupted right after its ``n``-th save."""

    def __init__(self, path: Path, n: int) -> None:
        super().__init__(path, key="k", every=1)
        self.n, self.saves = n, 0

    def save(self, state: dict[str, Any]) -> None:
        super().save(state)
        self.saves += 1
        if self.saves == self.n:
            raise Interrupted


def _bytes(posterior: PosteriorFile, tmp_path: Path) -> bytes:
    save_posterior(tmp_path / "p.pt", posterior)
    return (tmp_path / "p.pt").read_bytes()


def _rows(result: RunResult) -> list[dict[str, float]]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in result.history]


@pytest.fixture(scope="module")
def params() -> Any:
    return parse_params(small_params(epochs=3, pretrain_epochs=2, members=2))


@pytest.fixture(scope="module")
def starts(params: Any, mnist5k_prepared: Any) -> dict[str, PosteriorFile]:
    prepared = mnist5k_prepared.prepared
    pre = pretrain_members(params, prepared, CPU).posterior
    return {
        "pretrain": pre,
        "vi": finetune(params, "vi", prepared, pre, CPU).posterior,
        "fvi": finetune(params, "fvi", prepared, pre, CPU).posterior,
    }


# (trajectory, saves before the interruption): with every=1 a run saves after
# each epoch, and an ensemble also after each finished member (member 0: 3 + 1).
# swag's third save is after its last epoch: a stage killed between the end of training
# and its outputs resumes with nothing left to train.
CASES = [
    ("sgd", 1),
    ("swag", 2),
    ("swag", 3),
    ("fswag", 1),
    ("vi", 2),
    ("hwa", 1),
    ("fhwa", 2),
    ("mc_dropout", 1),
    ("f_mc_dropout", 2),
    ("ensemble", 5),
    ("f_ensemble", 2),
    ("sgld", 2),
    ("f_sgld", 1),
]


@pytest.mark.parametrize(("name", "saves"), CASES)
def test_interrupted_finetune_resumes_bitwise(
    params: Any,
    mnist5k_prepared: Any,
    starts: dict[str, PosteriorFile],
    tmp_path: Path,
    name: str,
    saves: int,
) -> None:
    prepared = mnist5k_prepared.prepared
    start = starts[params.finetune[name].start]
    whole = finetune(params, name, prepared, start, CPU)
    path = tmp_path / "ckpt.pt"
    with pytest.raises(Interrupted):
        finetune(params, name, prepared, start, CPU, resume=StopAfterSaves(path, saves))
    again = Checkpoint(path, key="k", every=1)
    assert again.load() is not None
    resumed = finetune(params, name, prepared, start, CPU, resume=again)
    assert _bytes(resumed.posterior, tmp_path) == _bytes(whole.posterior, tmp_path)
    assert _rows(resumed) == _rows(whole)


def test_interrupted_pretraining_resumes_bitwise(
    params: Any, mnist5k_prepared: Any, tmp_path: Path
) -> None:
    """Pretraining with two members, stopped inside the second member."""
    prepared = mnist5k_prepared.prepared
    whole = pretrain_members(params, prepared, CPU)
    path = tmp_path / "ckpt.pt"
    with pytest.raises(Interrupted):
        pretrain_members(params, prepared, CPU, resume=StopAfterSaves(path, 4))
    again = Checkpoint(path, key="k", every=1)
    again.load()
    resumed = pretrain_members(params, prepared, CPU, resume=again)
    assert _bytes(resumed.posterior, tmp_path) == _bytes(whole.posterior, tmp_path)
    assert pretrain(params, prepared, CPU).history[0]["epoch"] == 1


def test_checkpoint_of_other_key_or_bytes_is_deleted_not_resumed(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    Checkpoint(path, key="old", every=1).save({"x": torch.ones(2)})
    assert Checkpoint(path, key="old").load() is not None
    assert Checkpoint(path, key="new").load() is None
    assert not path.exists()
    path.write_bytes(b"not a checkpoint")
    assert Checkpoint(path, key="new").load() is None
    assert not path.exists()
    save_torch(path, {"format": "something else"})
    assert Checkpoint(path, key="new").load() is None
    assert not path.exists()


def test_checkpoint_off_writes_nothing(tmp_path: Path) -> None:
    ckpt = Checkpoint(tmp_path / "ckpt.pt", key="k", every=0)
    ckpt.save({"x": 1})
    assert not ckpt.due(1) and not ckpt.path.exists()
    every2 = Checkpoint(tmp_path / "ckpt.pt", key="k", every=2)
    assert [every2.due(e) for e in (1, 2, 3, 4)] == [False, True, False, True]


def test_checkpoint_loads_with_weights_only(tmp_path: Path) -> None:
    """A checkpoint is tensors and plain values: torch's safe loader reads it."""
    ckpt = Checkpoint(tmp_path / "ckpt.pt", key="k", every=1)
    ckpt.meta["run_id"] = "abc"
    ckpt.save({"t": torch.arange(3), "rows": [{"epoch": 1}]})
    raw = torch.load(io.BytesIO(ckpt.path.read_bytes()), weights_only=True)
    assert raw["key"] == "k" and raw["meta"] == {"run_id": "abc"}
    again = Checkpoint(ckpt.path, key="k")
    assert again.load() is not None and again.meta == {"run_id": "abc"}


# --- a real kill under dvc repro ------------------------------------------------------


def kill_params() -> dict[str, Any]:
    """LeNet-5 epochs long enough (~0.5 s) to land a kill inside one."""
    raw = default_params()
    raw["device"] = "cpu"
    raw["pretrain"].update(epochs=1, members=2)
    keep = {"swag", "vi", "hwa", "ensemble"}
    raw["finetune"] = {k: v for k, v in raw["finetune"].items() if k in keep}
    for traj in raw["finetune"].values():
        traj["epochs"] = 3
        if "members" in traj:
            traj["members"] = 2
    raw["evaluate"]["predictors"] = {"swag": {"swa": {"method": "swa"}}}
    raw["evaluate"]["plane"]["trajectories"] = ["hwa"]
    raw["evaluate"]["dswag_sweep"]["workers"] = []
    prune_landscape(raw)
    return raw


@pytest.fixture(scope="module")
def kill_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = make_repo(tmp_path_factory.mktemp("resume"), kill_params())
    sh(repo, DVC, "repro", "finetune@vi")
    return repo


def _wait_for_state(path: Path, ready: Callable[[dict[str, Any]], bool], proc: Any) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the stage ended before it could be interrupted"
        if path.exists():
            try:
                state = torch.load(path, weights_only=True)["state"]
            except (OSError, RuntimeError, EOFError):  # replaced while being read
                state = None
            if state is not None and ready(state):
                return
        time.sleep(0.02)
    raise AssertionError(f"{path} never reached the state to interrupt")


def _finetune_child(dvc: psutil.Process, name: str) -> psutil.Process:
    """The Python process of the stage, not the shell DVC runs it in: dash (`/bin/sh`)
    forks the command instead of exec'ing it, and killing the shell would leave the
    stage running to the end."""
    for child in dvc.children(recursive=True):
        try:
            argv = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if Path(argv[0]).name.startswith("python") and f"stages/finetune.py {name}" in " ".join(
            argv
        ):
            return child
    raise AssertionError(f"no stages/finetune.py {name} process under dvc repro")


def _runs_named(repo: Path, name: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bayesavg")
    return [r for r in client.search_runs([exp.experiment_id]) if r.info.run_name == name]


def _killed_run(repo: Path, stage: str) -> Any:
    """The run of the killed stage: its tracking worker outlives it and, when the
    stage's pipe closes, marks the run KILLED."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        unfinished = [r for r in _runs_named(repo, stage) if r.info.status != "FINISHED"]
        if len(unfinished) == 1 and unfinished[0].info.status == "KILLED":
            return unfinished[0]
        time.sleep(0.2)
    raise AssertionError(f"no KILLED run of {stage}: {_runs_named(repo, stage)}")


def _epoch(state: dict[str, Any]) -> int:
    return int(state["progress"]["epoch"])


KILLS = {
    # trajectory: when to kill (checkpoint state), and the last state that may be saved
    "swag": lambda s: _epoch(s) >= 1,
    "hwa": lambda s: _epoch(s) >= 1,
    "ensemble": lambda s: s["member"] == 1 and s["run"] is not None and _epoch(s["run"]) >= 1,
}


# `make test-slow` (35-55 s each on 2 cores, with the pipeline up to finetune@vi they share):
# in `make test`, the same resume is checked bitwise in-process
# (test_interrupted_finetune_resumes_bitwise) and the killed run's reopening by the worker
# (test_tracking_worker.py)
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KILLS))
def test_dvc_repro_resumes_a_killed_finetune_bitwise(kill_repo: Path, name: str) -> None:
    repo, stage = kill_repo, f"finetune@{name}"
    out = repo / "models" / name / "posterior.pt"
    ckpt = repo / "checkpoints" / f"{stage}.pt"
    # The reference: the stage run straight through, outside DVC (no run cache).
    sh(repo, PYTHON, "stages/finetune.py", name)
    reference = out.read_bytes()
    out.unlink()
    assert not ckpt.exists(), "a finished stage deletes its checkpoint"

    dvc = psutil.Popen([DVC, "repro", stage], cwd=repo, env={**env(), "SHELL": "/bin/sh"})
    _wait_for_state(ckpt, KILLS[name], dvc)
    child = _finetune_child(dvc, name)
    time.sleep(0.1)  # into the next epoch
    child.send_signal(signal.SIGKILL)
    assert dvc.wait(timeout=120) != 0
    assert not out.exists(), "the stage was killed after it finished"
    killed = _killed_run(repo, stage)

    proc = sh(repo, DVC, "repro", stage)
    assert "resuming from the checkpoint after epoch" in proc.stdout + proc.stderr
    assert out.read_bytes() == reference
    assert not ckpt.exists()
    runs = _runs_named(repo, stage)
    assert len(runs) == 2, "the resumed stage logs into the run it started"
    resumed = next(r for r in runs if r.info.run_id == killed.info.run_id)
    assert resumed.info.status == "FINISHED"
    assert "train/loss" in resumed.data.metrics


@pytest.mark.slow  # it shares the pipeline above; in `make test`, the same rule in-process:
# test_checkpoint_of_other_key_or_bytes_is_deleted_not_resumed
def test_changed_params_discard_the_checkpoint(kill_repo: Path) -> None:
    """A checkpoint from other params is not resumed: the stage starts afresh and deletes it."""
    repo = kill_repo
    ckpt = repo / "checkpoints" / "finetune@swag.pt"
    ckpt.parent.mkdir(exist_ok=True)
    save_torch(ckpt, {"format": "bayesavg.checkpoint/1", "key": "stale", "meta": {}, "state": {}})
    proc = sh(repo, PYTHON, "stages/finetune.py", "swag")
    assert "from other params, inputs or code; not resumed" in proc.stderr
    assert "resuming" not in proc.stderr
    assert not ckpt.exists()


@pytest.mark.slow  # ~30 s on 2 cores: a stage process per key
def test_checkpoint_key_follows_params_inputs_and_code(kill_repo: Path) -> None:
    """The key that decides whether a checkpoint may be resumed changes with the
    stage's params, with the bytes of its input files, and with its code."""
    repo = kill_repo
    code = (
        "import sys; sys.argv = ['stages/validate.py']; sys.path.insert(0, 'stages')\n"
        "import _checkpoint, _common\n"
        "from pathlib import Path\n"
        "print(_checkpoint.stage_checkpoint('finetune@x', _common.params(), {'lr': LR}, "
        "[Path('data/prepared/manifest.json')], DEVICE).key)\n"
    )

    def key(lr: float, device: str = "cpu") -> str:
        script = code.replace("LR", repr(lr)).replace("DEVICE", repr(device))
        return sh(repo, PYTHON, "-c", script).stdout.split()[-1]

    base = key(0.1)
    assert key(0.1) == base
    assert key(0.2) != base
    assert key(0.1, "NVIDIA H100 80GB HBM3") != base  # no resume across devices
    manifest = repo / "data/prepared/manifest.json"
    original = manifest.read_text()
    try:
        manifest.write_text(original + " ")
        assert key(0.1) != base
    finally:
        manifest.write_text(original)
    params = repo / "params.yaml"
    original = params.read_text()
    try:  # compiled and eager steps, CUDA's kernels: other bytes, no resume across them
        changes = {
            "compile: false": "compile: true",
            "cuda_graphs: false": "cuda_graphs: true",
            "deterministic: true": "deterministic: false",
        }
        for line, other in changes.items():
            assert line in original
            params.write_text(original.replace(line, other))
            assert key(0.1) != base
    finally:
        params.write_text(original)
    common = repo / "stages/_common.py"
    source = common.read_text()
    try:
        common.write_text(source + "\n# a change to the stage's code\n")
        assert key(0.1) != base
    finally:
        common.write_text(source)
    assert key(0.1) == base
