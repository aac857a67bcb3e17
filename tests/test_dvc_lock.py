"""scripts/dvc_lock.py: dvc.lock rewritten entry by entry, the bytes DVC's full dump writes."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
from pipeline_repo import DVC, ROOT, sh

sys.path.insert(0, str(ROOT / "scripts"))

import dvc_lock

COMMITTED = (ROOT / "dvc.lock").read_text()


@pytest.fixture(scope="module")
def committed() -> dict:
    data = dvc_lock._load(COMMITTED)
    assert dvc_lock._dump(data) == COMMITTED  # DVC's writer gives the committed bytes
    return data


def _entries_only(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """What ``dvc_lock`` dumps from here on, failing on a whole lock: the entries-only
    path is the one under test, not the full dump it falls back to."""
    dumped: list[dict] = []
    full = dvc_lock._dump

    def dump(data: dict) -> str:
        assert "schema" not in data, "fell back to DVC's full dump"
        dumped.append(data)
        return full(data)

    monkeypatch.setattr(dvc_lock, "_dump", dump)
    return dumped


@pytest.fixture()
def entries_only(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    return _entries_only(monkeypatch)


def _changed(entry: dict) -> dict:
    """``entry`` as DVC writes it after a rerun whose first output changed."""
    new = copy.deepcopy(entry)
    new["outs"][0]["md5"] = "0" * 32
    new["outs"][0]["size"] = 7
    return new


@pytest.mark.parametrize("at", [0, 1, 21, -2, -1])
def test_a_rerun_stage_s_entry_is_rewritten_as_dvc_s_full_dump_would(
    committed: dict, at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = copy.deepcopy(committed)
    before = dict(data["stages"])
    name = list(before)[at]
    data["stages"].update({name: _changed(before[name])})  # what dvc.dvcfile does
    expected = dvc_lock._dump(data)
    dumped = _entries_only(monkeypatch)
    out = dvc_lock.splice(COMMITTED, data, before)
    assert out == expected != COMMITTED
    assert dumped == [{"stages": {name: data["stages"][name]}}]


def test_an_unchanged_entry_rewritten_leaves_the_bytes(
    committed: dict, entries_only: list[dict]
) -> None:
    data = copy.deepcopy(committed)
    before = dict(data["stages"])
    data["stages"].update({name: copy.deepcopy(v) for name, v in before.items() if "@" in name})
    assert dvc_lock.splice(COMMITTED, data, before) == COMMITTED


def test_a_new_stage_comes_last_and_a_removed_one_goes(
    committed: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = copy.deepcopy(committed)
    before = dict(data["stages"])
    first = next(iter(before))
    data["stages"]["zz_new"] = _changed(before[first])
    expected = dvc_lock._dump(data)
    with monkeypatch.context() as m:
        _entries_only(m)
        out = dvc_lock.splice(COMMITTED, data, before)
    assert out == expected
    assert [line for line in out.splitlines() if dvc_lock._starts_entry(line)][-1] == "  zz_new:"
    del data["stages"][first], data["stages"]["zz_new"]
    assert dvc_lock.splice(COMMITTED, data, before) == dvc_lock._dump(data)


def test_a_small_lock_with_a_top_level_key_after_the_stages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = {
        "schema": "2.0",
        "stages": {
            "a": {"cmd": "echo 'yes: no' > a", "outs": [{"path": "a", "md5": "1" * 32}]},
            "b@x": {"cmd": "b", "deps": [{"path": "a", "md5": "2" * 32}], "params": {}},
        },
        "datasets": [{"name": "d", "url": "on"}],
    }
    text = dvc_lock._dump(data)
    before = dict(data["stages"])
    data["stages"]["a"] = {**before["a"], "cmd": "a longer command " * 8}
    data["stages"]["c"] = {"cmd": None, "outs": []}
    expected = dvc_lock._dump(data)
    _entries_only(monkeypatch)
    assert dvc_lock.splice(text, data, before) == expected


def _toy(tmp_path: Path) -> Path:
    repo = tmp_path / "toy"
    repo.mkdir()
    (repo / "dvc.yaml").write_text(
        "stages:\n"
        "  a:\n    cmd: echo a > a.txt\n    outs: [a.txt]\n"
        "  b:\n    cmd: cat a.txt > b.txt\n    deps: [a.txt]\n    outs: [b.txt]\n"
    )
    sh(repo, "git", "init", "-q")
    sh(repo, DVC, "init", "-q")
    return repo


def test_dvc_s_lock_writes_take_the_entries_only_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dvc.dvcfile
    from dvc.repo import Repo

    repo = _toy(tmp_path)
    sh(repo, DVC, "repro", "-q")
    before = (repo / "dvc.lock").read_text()
    monkeypatch.setattr(dvc.dvcfile, "modify_yaml", dvc.dvcfile.modify_yaml)  # restored after
    assert dvc_lock.install()
    dumped = _entries_only(monkeypatch)
    monkeypatch.chdir(repo)  # DVC finds the target from the working directory
    with Repo(str(repo)) as dvc_repo:
        dvc_repo.reproduce("a", single_item=True, force=True)
    assert [list(d["stages"]) for d in dumped] == [["a"]]
    assert (repo / "dvc.lock").read_text() == before


def test_dvc_through_it_writes_the_lock_dvc_s_own_writer_does(tmp_path: Path) -> None:
    repo = _toy(tmp_path)
    script = str(ROOT / "scripts" / "dvc_lock.py")
    lock = repo / "dvc.lock"
    sh(repo, sys.executable, script, "repro", "--single-item", "a")  # a new lock: DVC's
    sh(repo, sys.executable, script, "repro", "--single-item", "b")  # b after a
    first = lock.read_text()
    sh(repo, DVC, "commit", "-f", "-q")  # every entry dumped by DVC's own writer
    assert lock.read_text() == first
    yaml_text = (repo / "dvc.yaml").read_text()
    (repo / "dvc.yaml").write_text(yaml_text.replace("echo a >", "echo A >"))
    sh(repo, sys.executable, script, "repro", "--single-item", "a")  # a's entry replaced
    second = lock.read_text()
    assert second != first and "echo A > a.txt" in second
    assert list(dvc_lock._load(second)["stages"]) == ["a", "b"]
    sh(repo, DVC, "commit", "-f", "-q", "a")
    assert lock.read_text() == second


def test_a_dvc_without_the_internals_it_relies_on_keeps_its_own_writer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dvc.dvcfile
    import dvc.utils.serialize._yaml as dvc_yaml

    theirs = dvc.dvcfile.modify_yaml
    monkeypatch.setattr(dvc.dvcfile, "modify_yaml", theirs)
    monkeypatch.delattr(dvc_yaml, "_dump")
    assert not dvc_lock.install()
    assert dvc.dvcfile.modify_yaml is theirs
