"""Posterior files: every kind loads; a malformed block is refused at load in one line."""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import subprocess
import sys
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest
import torch
from PIL import Image

from bayesavg.models import build_model
from bayesavg.posteriors import HWA
from bayesavg.posteriors.file import PosteriorFile, load_posterior, save_posterior
from bayesavg.runtime.errors import UserError

if TYPE_CHECKING:
    from conftest import TinyPosteriors

BAYESAVG = Path(sys.executable).with_name("bayesavg")
SRC = Path(__file__).resolve().parents[1] / "src"
NAN, INF = math.nan, math.inf
HWA_RANK = 3
HWA_SNAPSHOTS = 4
MEMBERS = 3
SGLD_SAMPLES = 4
# Buffers of preresnet20: the last BatchNorm has 64 channels, the first 16.
BN_MEAN, BN_VAR, BN_COUNT = "bn.running_mean", "blocks.0.bn1.running_var", "bn.num_batches_tracked"


def _noisy(theta: torch.Tensor, n: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [theta + 0.05 * torch.randn(theta.shape, generator=gen) for _ in range(n)]


def _batchnorm_posterior() -> PosteriorFile:
    """An untrained preresnet20 on 3x8x8 inputs: a small network with BatchNorm buffers."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build_model("preresnet20", (3, 8, 8), 10)
    return PosteriorFile.from_model(
        model,
        trajectory="ensemble",
        model_name="preresnet20",
        model_kwargs={},
        input_shape=(3, 8, 8),
        mean=[0.5, 0.5, 0.5],
        std=[0.25, 0.25, 0.25],
        num_classes=10,
        data={"dataset": "cifar10", "seed": 0, "test_fraction": 0.2, "val_fraction": 0.1},
    )


@pytest.fixture(scope="module")
def valid(tiny_posteriors: TinyPosteriors) -> dict[str, PosteriorFile]:
    """One valid posterior of each kind, built with the real collectors."""
    plain = load_posterior(tiny_posteriors.plain)
    swag = load_posterior(tiny_posteriors.swag)
    d = plain.theta.numel()
    rho = torch.full((d,), -5.0)
    hwa = HWA(d, max_rank=HWA_RANK)
    for mu in _noisy(plain.theta, HWA_SNAPSHOTS, seed=1):
        hwa.collect(mu, rho)
    bn = _batchnorm_posterior()
    members = _noisy(bn.theta, MEMBERS, seed=2)
    member_buffers = [
        {k: v + m if v.dtype.is_floating_point else v.clone() for k, v in bn.buffers.items()}
        for m in range(MEMBERS)
    ]
    return {
        "plain": plain,
        "collector": load_posterior(tiny_posteriors.swag),
        "rho": dataclasses.replace(plain, trajectory="vi", rho=rho),
        "hwa": dataclasses.replace(plain, trajectory="hwa", rho=rho, hwa=hwa.state_dict()),
        "batchnorm": bn,
        "ensemble": dataclasses.replace(
            bn, samples={"theta": torch.stack(members), "buffers": member_buffers}
        ),
        "multiswag": dataclasses.replace(
            plain,
            trajectory="multiswag",
            samples={
                "theta": torch.stack([plain.theta, plain.theta + 0.01]),
                "buffers": [{}, {}],
                "collectors": [swag.collector, copy.deepcopy(swag.collector)],
            },
        ),
        "sgld": dataclasses.replace(
            plain,
            trajectory="sgld",
            samples={"theta": torch.stack(_noisy(plain.theta, SGLD_SAMPLES, 3)), "buffers": None},
            extra={"note": "free-form", "values": [1, 2.5, None]},
        ),
    }


@pytest.mark.parametrize(
    ("kind", "provides"),
    [
        ("plain", {"weights"}),
        ("collector", {"weights", "snapshots"}),
        ("rho", {"weights", "variational"}),
        ("hwa", {"weights", "variational", "hwa"}),
        ("batchnorm", {"weights"}),
        ("ensemble", {"weights", "members"}),
        ("multiswag", {"weights", "members", "member_snapshots"}),
        ("sgld", {"weights", "samples"}),
    ],
)
def test_valid_posterior_of_each_kind_loads(
    valid: dict[str, PosteriorFile], tmp_path: Path, kind: str, provides: set[str]
) -> None:
    path = tmp_path / "posterior.pt"
    save_posterior(path, valid[kind])
    rng = torch.get_rng_state()
    loaded = load_posterior(path)
    assert torch.equal(torch.get_rng_state(), rng), "validation must not draw random numbers"
    assert loaded.provides() == provides
    assert torch.equal(loaded.theta, valid[kind].theta)
    assert loaded.extra == valid[kind].extra


Mutation = Callable[[dict[str, Any]], None]
Key = tuple[Hashable, ...]


def _parent(raw: dict[str, Any], key: Key) -> Any:
    for k in key[:-1]:
        raw = raw[k]
    return raw


def _set(key: Key, fn: Callable[[Any], Any]) -> Mutation:
    """Replace the value at ``key`` (a path of dict keys and list indices) by ``fn(value)``."""

    def mutate(raw: dict[str, Any]) -> None:
        parent = _parent(raw, key)
        parent[key[-1]] = fn(parent[key[-1]])

    return mutate


def _poke(key: Key, index: Any, value: float) -> Mutation:
    """Write ``value`` into the tensor at ``key`` at ``index``."""

    def mutate(raw: dict[str, Any]) -> None:
        _parent(raw, key)[key[-1]][index] = value

    return mutate


def _delete(key: Key) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        del _parent(raw, key)[key[-1]]

    return mutate


def _rename(key: Key, new: str) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        parent = _parent(raw, key)
        parent[new] = parent.pop(key[-1])

    return mutate


def _grow(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t, torch.zeros(1, dtype=t.dtype)])


D_MLP = 784 * 32 + 32 + 32 * 10 + 10  # the tiny MLP's parameter count


class Corruption(NamedTuple):
    """A valid posterior of ``kind``, damaged by ``mutate``; ``expected`` is in the message."""

    kind: str
    mutate: Mutation
    expected: str


CORRUPTIONS: dict[str, Corruption] = {
    "multiswag-collectors-count": Corruption(
        "multiswag",
        _set(("samples", "collectors"), lambda c: c[:1]),
        "samples.collectors has 1 entries, expected 2 (one per row of samples.theta)",
    ),
    "multiswag-collector-mean-shape": Corruption(
        "multiswag",
        _set(("samples", "collectors", 1, "mean"), lambda t: t[:-1]),
        f"samples.collectors[1].mean has shape ({D_MLP - 1}), expected ({D_MLP})",
    ),
    "collector-missing-m2": Corruption(
        "collector", _delete(("collector", "m2")), "collector.m2 is missing"
    ),
    "collector-missing-n": Corruption(
        "collector", _delete(("collector", "n_collected")), "collector.n_collected is missing"
    ),
    "collector-not-dict": Corruption(
        "collector", _set(("collector",), lambda c: [c]), "collector is a list, expected a dict"
    ),
    "collector-mean-shape": Corruption(
        "collector",
        _set(("collector", "mean"), lambda t: t[:-1]),
        f"collector.mean has shape ({D_MLP - 1}), expected ({D_MLP})",
    ),
    "collector-deviations-rows": Corruption(
        "collector",
        _set(("collector", "deviations"), lambda t: t[:3]),
        f"collector.deviations has shape (3, {D_MLP}), expected (5, {D_MLP}) "
        "(min(n_collected, max_rank) rows)",
    ),
    "collector-n-below-rows": Corruption(
        "collector",
        _set(("collector", "n_collected"), lambda n: 2),
        f"collector.deviations has shape (5, {D_MLP}), expected (2, {D_MLP})",
    ),
    "collector-max-rank-above-rows": Corruption(
        "collector",
        _set(("collector", "max_rank"), lambda n: 20),
        f"collector.deviations has shape (5, {D_MLP}), expected (6, {D_MLP})",
    ),
    "collector-mean-nan": Corruption(
        "collector",
        _poke(("collector", "mean"), 0, NAN),
        f"collector.mean has non-finite values (1 of {D_MLP})",
    ),
    "collector-deviations-inf": Corruption(
        "collector",
        _poke(("collector", "deviations"), (1, 2), INF),
        f"collector.deviations has non-finite values (1 of {5 * D_MLP})",
    ),
    "collector-m2-negative": Corruption(
        "collector",
        _poke(("collector", "m2"), slice(0, 3), -1.0),
        f"collector.m2 has negative values (3 of {D_MLP})",
    ),
    "collector-m2-nan": Corruption(
        "collector", _poke(("collector", "m2"), 0, NAN), "collector.m2 has non-finite values"
    ),
    "collector-n-negative": Corruption(
        "collector",
        _set(("collector", "n_collected"), lambda n: -1),
        "collector.n_collected is -1, expected >= 0",
    ),
    "collector-n-float": Corruption(
        "collector",
        _set(("collector", "n_collected"), float),
        "collector.n_collected is 6.0 (float), expected an int",
    ),
    "collector-n-tensor": Corruption(
        "collector",
        _set(("collector", "n_collected"), torch.tensor),
        "collector.n_collected is a Tensor, expected an int",
    ),
    "collector-num-params": Corruption(
        "collector",
        _set(("collector", "num_params"), lambda n: n + 1),
        f"collector.num_params is {D_MLP + 1}, expected {D_MLP}",
    ),
    "collector-mean-int": Corruption(
        "collector",
        _set(("collector", "mean"), lambda t: t.long()),
        "collector.mean has dtype torch.int64, expected a floating dtype",
    ),
    "hwa-missing-var": Corruption("hwa", _delete(("hwa", "var")), "hwa.var is missing"),
    "hwa-var-n": Corruption(
        "hwa",
        _set(("hwa", "var", "n_collected"), lambda n: n - 1),
        f"hwa.var.n_collected is {HWA_SNAPSHOTS - 1}, expected {HWA_SNAPSHOTS} as in hwa.mu",
    ),
    "hwa-mu-n": Corruption(
        "hwa",
        _set(("hwa", "mu", "n_collected"), lambda n: n + 1),
        f"hwa.var.n_collected is {HWA_SNAPSHOTS}, expected {HWA_SNAPSHOTS + 1} as in hwa.mu",
    ),
    "hwa-rho-nan": Corruption(
        "hwa",
        _poke(("hwa", "rho", "mean"), 7, NAN),
        f"hwa.rho.mean has non-finite values (1 of {D_MLP})",
    ),
    "hwa-var-rank": Corruption(
        "hwa", _set(("hwa", "var", "max_rank"), lambda n: 2), "hwa.var.max_rank is 2, expected 0"
    ),
    "hwa-rho-num-params": Corruption(
        "hwa",
        _set(("hwa", "rho", "num_params"), lambda n: n - 1),
        f"hwa.rho.num_params is {D_MLP - 1}, expected {D_MLP}",
    ),
    "samples-theta-width": Corruption(
        "sgld",
        _set(("samples", "theta"), lambda t: t[:, :-1]),
        f"samples.theta has shape ({SGLD_SAMPLES}, {D_MLP - 1}), expected (k, {D_MLP})",
    ),
    "samples-theta-empty": Corruption(
        "sgld", _set(("samples", "theta"), lambda t: t[:0]), "samples.theta has no rows"
    ),
    "samples-theta-nan": Corruption(
        "sgld",
        _poke(("samples", "theta"), (2, slice(0, 2)), NAN),
        f"samples.theta has non-finite values (2 of {SGLD_SAMPLES * D_MLP})",
    ),
    "samples-missing-theta": Corruption(
        "sgld", _delete(("samples", "theta")), "samples.theta is missing"
    ),
    "samples-missing-buffers": Corruption(
        "sgld", _delete(("samples", "buffers")), "samples.buffers is missing"
    ),
    "samples-buffers-length": Corruption(
        "ensemble",
        _set(("samples", "buffers"), lambda b: b[:-1]),
        f"samples.buffers has {MEMBERS - 1} entries, expected {MEMBERS}",
    ),
    "samples-buffers-dict": Corruption(
        "ensemble",
        _set(("samples", "buffers"), lambda b: dict(enumerate(b))),
        "samples.buffers is a dict, expected None or a list",
    ),
    "samples-buffer-unknown-key": Corruption(
        "ensemble",
        _rename(("samples", "buffers", 1, BN_MEAN), "bn.running_avg"),
        "samples.buffers[1] has unexpected key 'bn.running_avg'",
    ),
    "samples-buffer-missing-key": Corruption(
        "ensemble",
        _delete(("samples", "buffers", 1, BN_VAR)),
        f"samples.buffers[1].{BN_VAR} is missing",
    ),
    "samples-buffer-shape": Corruption(
        "ensemble",
        _set(("samples", "buffers", 2, BN_MEAN), _grow),
        f"samples.buffers[2].{BN_MEAN} has shape (65), expected (64)",
    ),
    "samples-buffer-inf": Corruption(
        "ensemble",
        _poke(("samples", "buffers", 0, BN_VAR), 0, INF),
        f"samples.buffers[0].{BN_VAR} has non-finite values (1 of 16)",
    ),
    "rho-shape": Corruption(
        "rho", _set(("rho",), lambda t: t[:-1]), f"rho has shape ({D_MLP - 1}), expected ({D_MLP})"
    ),
    "rho-nan": Corruption(
        "rho", _poke(("rho",), 3, NAN), f"rho has non-finite values (1 of {D_MLP})"
    ),
    "theta-nan": Corruption(
        "plain", _poke(("theta",), 0, NAN), f"theta has non-finite values (1 of {D_MLP})"
    ),
    "theta-int": Corruption(
        "plain", _set(("theta",), lambda t: t.long()), "theta has dtype torch.int64"
    ),
    "buffer-shape": Corruption(
        "batchnorm",
        _set(("buffers", BN_MEAN), _grow),
        f"buffers.{BN_MEAN} has shape (65), expected (64)",
    ),
    "buffer-nan": Corruption(
        "batchnorm", _poke(("buffers", BN_VAR), 0, NAN), f"buffers.{BN_VAR} has non-finite values"
    ),
    "buffer-missing": Corruption(
        "batchnorm", _delete(("buffers", BN_VAR)), f"buffers.{BN_VAR} is missing"
    ),
    "buffer-count-float": Corruption(
        "batchnorm",
        _set(("buffers", BN_COUNT), torch.Tensor.float),
        f"buffers.{BN_COUNT} has dtype torch.float32, expected an integer dtype",
    ),
    "missing-trajectory": Corruption("plain", _delete(("trajectory",)), "trajectory is missing"),
    "unknown-model": Corruption(
        "plain", _set(("model", "name"), lambda n: "resnet9000"), "model 'resnet9000' cannot be"
    ),
    "bad-model-kwargs": Corruption(
        "plain", _set(("model", "kwargs"), lambda k: {"depth": 3}), "model 'mlp' cannot be built"
    ),
    "input-shape": Corruption(
        "plain",
        _set(("input", "shape"), lambda s: s[:2]),
        "input.shape is (1, 28) (tuple), expected 3",
    ),
    "input-std-zero": Corruption(
        "plain", _set(("input", "std"), lambda s: [0.0]), "input.std[0] is 0.0, expected > 0"
    ),
    "num-classes-str": Corruption(
        "plain", _set(("num_classes",), str), "num_classes is '10' (str), expected an int"
    ),
    "data-missing-seed": Corruption("plain", _delete(("data", "seed")), "data.seed is missing"),
    "extra-not-dict": Corruption(
        "plain", _set(("extra",), lambda e: [e]), "extra is [{}] (list), expected a dict"
    ),
}


def _write_corrupt(valid: PosteriorFile, mutate: Mutation, path: Path) -> Path:
    raw = copy.deepcopy(valid.to_dict())
    mutate(raw)
    torch.save(raw, path)
    return path


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corrupt_block_is_refused_at_load(
    valid: dict[str, PosteriorFile], tmp_path: Path, case: str
) -> None:
    """One line: the file, then the block and key and what is wrong."""
    kind, mutate, expected = CORRUPTIONS[case]
    path = _write_corrupt(valid[kind], mutate, tmp_path / "posterior.pt")
    with pytest.raises(UserError) as exc:
        load_posterior(path)
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: "), message
    assert expected in message, message


# Through the installed console script: corruptions and the predictor that would use each.
CONSOLE_CASES = {
    "collector-deviations-rows": "swag",
    "samples-theta-nan": "sgld",
    "hwa-missing-var": "hwa",
}


@dataclasses.dataclass(frozen=True)
class Refusal:
    """One finished ``bayesavg evaluate`` process, the posterior and --out it was given."""

    proc: subprocess.CompletedProcess[str]
    posterior: Path
    out: Path


@pytest.fixture(scope="module")
def console_refusals(
    valid: dict[str, PosteriorFile], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Refusal]:
    """``bayesavg evaluate`` on each corrupt file of CONSOLE_CASES, the processes run together.

    Each process spends seconds importing torch; starting them at once keeps the suite fast.
    """
    root = tmp_path_factory.mktemp("console_refusals")
    images = root / "images"
    for label in range(2):
        (images / str(label)).mkdir(parents=True)
        Image.new("L", (28, 28), 100 * label).save(images / str(label) / "0.png")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    started = {}
    for name, predictor in CONSOLE_CASES.items():
        kind, mutate, _ = CORRUPTIONS[name]
        posterior = _write_corrupt(valid[kind], mutate, root / f"{name}.pt")
        out = root / f"{name}.json"
        args = [
            *["evaluate", "--posterior", str(posterior), "--predictor", predictor],
            *["--data", f"imagefolder:{images}", "--out", str(out), "--device", "cpu"],
        ]
        popen = subprocess.Popen(
            [str(BAYESAVG), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        started[name] = (popen, args, posterior, out)
    refusals = {}
    for name, (popen, args, posterior, out) in started.items():
        stdout, stderr = popen.communicate(timeout=180)
        proc = subprocess.CompletedProcess(args, popen.returncode, stdout, stderr)
        refusals[name] = Refusal(proc, posterior, out)
    return refusals


@pytest.mark.parametrize("name", list(CONSOLE_CASES))
def test_console_script_refuses_a_corrupt_block(
    console_refusals: dict[str, Refusal], name: str
) -> None:
    """Exit 2, one ``error:`` line naming the file and the key, no traceback, no output."""
    run = console_refusals[name]
    assert run.proc.returncode == 2, run.proc.stderr
    assert "Traceback" not in run.proc.stderr
    lines = run.proc.stderr.splitlines()
    assert len(lines) == 1, run.proc.stderr
    assert lines[0].startswith(f"error: {run.posterior}: {CORRUPTIONS[name].expected}")
    assert not run.out.exists()
