"""The report side by side: ``parallel.fork_map`` and the bytes it must not change."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from test_report_analyses import _inputs

from bayesavg.report import ReportInputs, document, parallel, write_report
from bayesavg.report.uncertainty import compute


def _calibrated_inputs() -> ReportInputs:
    """The analyses' inputs, each predictor with a temperature: every kind of interval."""
    inputs = _inputs()
    predictors = [
        dataclasses.replace(p, metrics={**p.metrics, "calibrated": {"temperature": 1 + i / 10}})
        for i, p in enumerate(inputs.predictors)
    ]
    return dataclasses.replace(inputs, predictors=predictors)


def _pid_of(item: int) -> tuple[int, int]:
    return item * item, os.getpid()


def _nested(item: int) -> list[int]:
    """A fork_map inside a forked process: it must run there, one item after another."""
    return [pid for _, pid in parallel.fork_map(_pid_of, [item, item + 1])] + [os.getpid()]


def _fails(item: int) -> int:
    if item == 3:
        raise ValueError(f"item {item} is bad")
    return item


@pytest.fixture
def two(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "processes", lambda: 2)


def test_results_come_back_in_order_from_other_processes(two: None) -> None:
    found = parallel.fork_map(_pid_of, list(range(9)))
    assert [square for square, _ in found] == [i * i for i in range(9)]
    pids = {pid for _, pid in found}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2


def test_one_process_runs_everything_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "processes", lambda: 1)
    assert parallel.fork_map(_pid_of, [1, 2]) == [(1, os.getpid()), (4, os.getpid())]
    assert parallel.fork_map(_pid_of, []) == []


def test_a_fork_map_in_a_forked_process_stays_there(two: None) -> None:
    for pids in parallel.fork_map(_nested, [1, 5]):
        assert len(set(pids)) == 1 and pids[0] != os.getpid()


def test_a_failing_item_raises_its_error_here(two: None) -> None:
    with pytest.raises(ValueError, match="item 3 is bad"):
        parallel.fork_map(_fails, list(range(6)))
    assert parallel._job is None  # nothing of the failed map is left for the next one


def test_no_fork_where_torch_computes_on_several_threads(two: None) -> None:
    """A child forked after torch's OpenMP pool exists can hang: run here instead."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        (torch.randn(256, 256) @ torch.randn(256, 256)).sum()  # the pool exists now
        assert [pid for _, pid in parallel.fork_map(_pid_of, [1, 2, 3])] == [os.getpid()] * 3
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(("threads", "cores", "expected"), [("1", 2, 2), ("2", 2, 1), ("3", 8, 2)])
def test_processes_fill_the_usable_cores_at_the_stage_threads(
    monkeypatch: pytest.MonkeyPatch, threads: str, cores: int, expected: int
) -> None:
    monkeypatch.setenv("BAYESAVG_THREADS", threads)
    monkeypatch.setattr(parallel.numerics, "usable_cores", lambda: cores)
    assert parallel.processes() == expected


def test_intervals_are_those_of_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = _calibrated_inputs()
    monkeypatch.setattr(parallel, "processes", lambda: 1)
    alone = compute.__wrapped__(inputs)
    monkeypatch.setattr(parallel, "processes", lambda: 2)
    side_by_side = compute.__wrapped__(inputs)
    assert side_by_side == alone
    assert alone.estimates and alone.comparisons
    assert alone.calibrated and alone.calibrated_vs_baseline


def test_sections_of_one_module_share_a_process() -> None:
    """distributed.build and distributed.build_figures share the DSWAG figures."""
    groups = document._groups()
    flat = [b for group in groups for b in group]
    assert sorted(flat, key=document.BODY.index) == list(document.BODY)
    assert len(flat) == len(document.BODY)
    for group in groups:
        assert len({b.__module__ for b in group}) == 1
        assert list(group) == sorted(group, key=document.BODY.index)
    assert len(groups) == len({b.__module__ for b in document.BODY}) < len(document.BODY)


def test_the_report_has_the_bytes_of_one_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    written = {}
    for n in (1, 2):
        monkeypatch.setattr(parallel, "processes", lambda n=n: n)
        paths = write_report(_calibrated_inputs(), tmp_path / str(n))
        written[n] = {name: path.read_bytes() for name, path in paths.items()}
    assert written[1] == written[2]
    assert len(written[1]) > 10  # html, md and the figures, analyses and DSWAG included
