"""``compile: true``: the training step through torch.compile (inductor's C++ backend here).

Compiled and eager runs differ by the order of float sums only (dropout masks
included: inductor draws from torch's generator, ``fallback_random``), so a
short run of each kind ends within a stated tolerance of the eager one; a
compiled run is bitwise itself on rerun and on resume, since compilation
happens in a warm-up that puts every tensor and RNG stream back.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from pipeline_repo import small_params
from test_resume import Interrupted, StopAfterSaves

from bayesavg.config import parse_params
from bayesavg.posteriors.file import PosteriorFile, save_posterior
from bayesavg.runtime.checkpoint import Checkpoint
from bayesavg.trajectories import RunResult, finetune, pretrain

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="inductor's CPU backend")

CPU = torch.device("cpu")
# After two epochs at batch 256 (a 16-unit BatchNorm MLP): the weights within THETA
# (absolute; measured: 1.2e-7 for the gradient kinds, 2.4e-4 for VI's mu), the final
# training loss within LOSS (relative; measured: below 1e-7).
THETA, LOSS = 1e-3, 1e-5
# Every kind's step (plain, SAM, SVI, F-VI, SGLD, dropout, members); the first two in
# `make test`, all in `make test-slow` (each first compilation of a step is 10-40 s).
KINDS = ["swag", "vi", "sgd", "fswag", "hwa", "fhwa", "sgld", "mc_dropout", "ensemble"]


def _params(compile: bool) -> Any:
    raw = small_params(epochs=2, pretrain_epochs=1, members=2)
    raw["compile"] = compile
    return parse_params(raw)


def _bytes(result: RunResult, tmp_path: Path) -> bytes:
    save_posterior(tmp_path / "p.pt", result.posterior)
    return (tmp_path / "p.pt").read_bytes()


def _run(name: str, compile: bool, starts: dict[str, PosteriorFile], prepared: Any, **kw: Any):
    params = _params(compile)
    start = starts[params.finetune[name].start]
    return finetune(params, name, prepared, start, CPU, **kw)


@pytest.mark.parametrize(
    "name", [k if i < 2 else pytest.param(k, marks=pytest.mark.slow) for i, k in enumerate(KINDS)]
)
def test_compiled_and_eager_agree_on_a_short_run(
    name: str, short_starts: dict[str, PosteriorFile], mnist5k_prepared: Any
) -> None:
    prepared = mnist5k_prepared.prepared
    eager = _run(name, False, short_starts, prepared)
    compiled = _run(name, True, short_starts, prepared)
    gap = (compiled.posterior.theta - eager.posterior.theta).abs().max().item()
    assert gap <= THETA, f"{name}: weights {gap:.3g} apart"
    e, c = eager.history[-1]["train_loss"], compiled.history[-1]["train_loss"]
    assert abs(c - e) <= LOSS * abs(e), f"{name}: training loss {c} vs {e}"
    assert "compile_seconds" not in eager.history[0]
    assert compiled.history[0]["compile_seconds"] >= 0
    assert all("compile_seconds" not in row for row in compiled.history[1:])


@pytest.mark.parametrize("name", ["swag", "vi"])
def test_a_compiled_run_is_bitwise_itself_on_rerun_and_on_resume(
    name: str, short_starts: dict[str, PosteriorFile], mnist5k_prepared: Any, tmp_path: Path
) -> None:
    prepared = mnist5k_prepared.prepared
    whole = _bytes(_run(name, True, short_starts, prepared), tmp_path)
    assert _bytes(_run(name, True, short_starts, prepared), tmp_path) == whole
    path = tmp_path / "ckpt.pt"
    with pytest.raises(Interrupted):
        _run(name, True, short_starts, prepared, resume=StopAfterSaves(path, 1))
    again = Checkpoint(path, key="k", every=1)
    assert again.load() is not None
    assert _bytes(_run(name, True, short_starts, prepared, resume=again), tmp_path) == whole


def test_a_trajectory_can_compile_alone(mnist5k_prepared: Any) -> None:
    """A trajectory's ``compile`` overrides the global one, both ways."""
    raw = small_params(epochs=1, pretrain_epochs=1, members=1)
    raw["pretrain"]["compile"] = True
    params = parse_params(raw)
    assert not params.compile and params.pretrain.compile
    history = pretrain(params, mnist5k_prepared.prepared, CPU).history
    assert "compile_seconds" in history[0]
    raw["compile"], raw["pretrain"]["compile"] = True, False
    history = pretrain(parse_params(raw), mnist5k_prepared.prepared, CPU).history
    assert "compile_seconds" not in history[0]


def test_each_instruction_set_pin_gets_its_own_kernel_cache() -> None:
    """A kernel compiled under one pin aborted a process under the other: the cache
    folder is keyed by the pin, set with the pins, and a user's own choice is left alone."""
    import os

    from bayesavg.runtime.numerics import CACHE_ENV, keyed_kernel_cache

    portable = {"ATEN_CPU_CAPABILITY": "avx2"}
    native: dict[str, str] = {}
    a, b = keyed_kernel_cache(portable), keyed_kernel_cache(native)
    assert a is not None and b is not None and a != b
    assert a.endswith("bayesavg-avx2") and b.endswith("bayesavg-native")
    assert portable[CACHE_ENV] == a
    mine = {CACHE_ENV: "/somewhere/else"}
    assert keyed_kernel_cache(mine) is None and mine[CACHE_ENV] == "/somewhere/else"
    # this test process was pinned (conftest) before torch loaded: its cache is keyed
    pinned = os.environ.get("ATEN_CPU_CAPABILITY") or "native"
    assert os.environ[CACHE_ENV].endswith(f"bayesavg-{pinned}")


def test_an_epoch_already_compiled_gathers_no_warm_up_batches() -> None:
    """Every later epoch of a compiled run skips the warm-up outright: gathering its
    batches (normalised, channels-last; a host read for streamed data) would be work the
    eager loop does not do, counted against compiled steps."""
    from bayesavg.training.compiled import CompiledStep
    from bayesavg.training.steps import StepContext

    class Untouchable:
        y = torch.zeros(100, dtype=torch.long)

        def __len__(self) -> int:
            return 100

        def batch(self, idx: torch.Tensor) -> None:
            raise AssertionError("a warm-up batch was gathered again")

    compiled = CompiledStep(torch.nn.Linear(4, 3))
    compiled.warmed.add((100, 32))
    assert compiled.warm_up_epoch(None, Untouchable(), 32, 4, StepContext()) == 0.0  # type: ignore[arg-type]
