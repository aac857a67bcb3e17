"""Evaluation spread over processes, and in mixed precision.

Samples are dealt out over the ranks and combined on rank 0 in sample order, so
two processes must give the bytes of one: checked for SWAG (samples from one
sequential generator, a BN update each), MC dropout (masks from torch's global
stream) and SWAG on a network with dropout and BN (masks during the BN update),
with two splits and an OOD set. Ranks are spawned once for every case
(gloo, a file store, see tests/evaluate_workers.py) and have a deadline.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from evaluate_workers import CASES, inputs, plain, posterior, rank_main, run_case
from ranks import spawn_ranks

from bayesavg.evaluation.evaluate import log_softmax_predictions, method_of
from bayesavg.models import for_inference, has_batchnorm
from bayesavg.posteriors.file import load_theta
from bayesavg.predictors.sampling import draws
from bayesavg.runtime import numerics
from bayesavg.seeding import derive_seed, isolated_rng
from bayesavg.training.batchnorm import update_bn
from bayesavg.training.precision import Precision

SPAWN_DEADLINE = 120.0  # seconds for the spawned run; a hang fails, never blocks
WORLD = 2


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The thread count every rank uses (``numerics.threads``), for references built here."""
    before = torch.get_num_threads()
    torch.set_num_threads(numerics.threads({**os.environ, "WORLD_SIZE": str(WORLD)}))
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case evaluated on 2 spawned ranks; the folder of their results."""
    folder = tmp_path_factory.mktemp("evaluate_ranks")
    spawn_ranks(rank_main, WORLD, (WORLD, str(folder)), folder, SPAWN_DEADLINE)
    return folder


def _assert_same(a: Any, b: Any, where: str) -> None:
    """Bitwise equality of nested dicts, lists, floats and tensors."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a, b), f"{where}: tensors differ"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: keys {a.keys()} != {b.keys()}"
        for key in a:
            _assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b or (math.isnan(a) and math.isnan(b)), f"{where}: {a!r} != {b!r}"


@pytest.mark.parametrize("case", list(CASES))
def test_two_processes_give_the_bytes_of_one(two_ranks: Path, one_thread: None, case: str) -> None:
    found = torch.load(two_ranks / f"results-{WORLD}.pt", weights_only=False)[case]
    _assert_same(found, plain(run_case(case)), case)


def test_only_rank_0_gets_results(two_ranks: Path) -> None:
    assert (two_ranks / f"ok-{WORLD}-0").read_text() == "test,val"
    assert (two_ranks / f"ok-{WORLD}-1").read_text() == ""


def _sequential(case: str) -> torch.Tensor:
    """The BMA of the test split as the one-process loop builds it, written out: networks
    drawn one after the other from one generator, each sample's BN update and forward
    pass under torch's global stream seeded by (seed, s)."""
    _, method, samples = CASES[case]
    entry, post, data = method_of(method), posterior(case), inputs()
    model = for_inference(post.build_model("cpu"))
    gen = torch.Generator().manual_seed(11)
    sampled = draws(post, entry, entry.default_scale, gen, torch.device("cpu"), samples)
    x = torch.cat([data["splits"]["test"][0], data["splits"]["val"][0], data["ood"]["noise"]])
    log_sum = None
    for s in range(1, samples + 1):
        theta, buffers = sampled.draw(s - 1)
        load_theta(model, theta, buffers or {})
        with isolated_rng(derive_seed(11, "sample", s)):
            if not entry.own_buffers and has_batchnorm(model):
                update_bn(model, data["bn_x"], 40)
            logp = log_softmax_predictions(model, x, 40, dropout=sampled.dropout)
        log_sum = logp if log_sum is None else torch.logaddexp(log_sum, logp)
    assert log_sum is not None
    return (log_sum - math.log(samples))[:70]


@pytest.mark.parametrize("case", ["swag_bn", "mc_dropout"])
def test_one_process_is_the_sequential_loop(case: str) -> None:
    assert torch.equal(run_case(case)["test"].log_probs, _sequential(case))


def test_fp32_precision_is_no_precision() -> None:
    _assert_same(
        plain(run_case("swag_bn", precision=Precision("fp32", "cpu"))),
        plain(run_case("swag_bn")),
        "fp32",
    )


def test_bf16_on_cpu_is_finite_and_close_to_fp32() -> None:
    """bf16 keeps 8 significant bits: logits of size ~1 move by ~1e-2, so log-probabilities
    by at most 0.1 here and the NLL by at most 0.02."""
    fp32 = run_case("swag_bn")["test"]
    bf16 = run_case("swag_bn", precision=Precision("bf16", "cpu"))["test"]
    assert bf16.log_probs.dtype == torch.float64
    assert all(math.isfinite(v) for v in bf16.metrics.values())
    assert not torch.equal(bf16.log_probs, fp32.log_probs), "autocast changed nothing"
    assert (bf16.log_probs - fp32.log_probs).abs().max() < 0.1
    assert abs(bf16.metrics["nll"] - fp32.metrics["nll"]) < 0.02
    assert abs(bf16.metrics["accuracy"] - fp32.metrics["accuracy"]) <= 3 / 70


def test_a_split_without_its_curve_keeps_its_bytes_and_gets_the_last_row() -> None:
    """``curves`` skips the per-sample metrics of the other splits: every result is the
    bytes of the full run, and their table is the full table's row s = S."""
    full = plain(run_case("swag_bn"))
    some = plain(run_case("swag_bn", curves=("test",)))
    assert [row["samples"] for row in full["val"]["by_samples"]] == [1, 2, 3, 4, 5]
    assert some["val"]["by_samples"] == full["val"]["by_samples"][-1:]
    some["val"]["by_samples"] = full["val"]["by_samples"]
    _assert_same(some, full, "curves")
    none = plain(run_case("swag_bn", curves=()))
    assert none["test"]["by_samples"] == full["test"]["by_samples"][-1:]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"curves": ("tset",)}, r"curves \['tset'\] are not among the splits"),
        (
            {"curves": ("test",), "calibrate": ("test", "val")},
            r"calibrate's target 'val' needs its curve",
        ),
    ],
)
def test_curves_name_splits_that_exist(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        run_case("swag_bn", **extra)
