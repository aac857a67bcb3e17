"""More images than memory (issue "Bring your own network and data" §4): the data stage
writes the splits as memory-mapped uint8 arrays, training streams them with prefetching,
and a split that fits both ways gives bitwise the same posterior either way."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from pipeline_repo import prune_landscape
from test_byo_pipeline import write_images

from bayesavg.config import parse_params
from bayesavg.data import storage
from bayesavg.data.prepared import channel_stats, load_prepared, prepare
from bayesavg.runtime.errors import UserError
from bayesavg.training.batches import StreamedData, TrainData
from bayesavg.trajectories import finetune, pretrain_members
from bayesavg.trajectories.common import compute_for, train_data

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
MNIST = ("mnist5k", 0, 0.2, 0.1)


def _rows_read(monkeypatch: pytest.MonkeyPatch, owner: type, name: str) -> list[int]:
    """The number of rows each call of ``owner.name`` returns, recorded as it runs."""
    rows: list[int] = []
    original = getattr(owner, name)

    def counted(self: Any, key: Any) -> Any:
        out = original(self, key)
        rows.append(out.shape[0])
        return out

    monkeypatch.setattr(owner, name, counted)
    return rows


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """mnist5k prepared both ways; chunks of 700 images, so that writes cross chunks."""
    root = tmp_path_factory.mktemp("storage")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(storage, "CHUNK", 700)
        return {
            kind: prepare(*MNIST[:1], root / "raw", root / kind, *MNIST[1:], storage=kind)
            for kind in ("memory", "stream")
        } | {"root": root}


def test_stream_writes_npy_arrays_with_the_memory_splits_and_manifest(
    both: dict[str, Any],
) -> None:
    memory, stream, root = both["memory"], both["stream"], both["root"]
    assert sorted(p.name for p in (root / "stream").iterdir()) == [
        "manifest.json",
        *(f"{s}.{a}.npy" for s in ("test", "train", "val") for a in ("x", "y")),
    ]
    m, s = copy.deepcopy(memory.manifest), copy.deepcopy(stream.manifest)
    assert s.pop("storage") == "stream" and "storage" not in m
    for name in ("train", "val", "test"):
        ms, ss = m["splits"].pop(name), s["splits"].pop(name)
        assert (ss["file"], ss["labels"]) == (f"{name}.x.npy", f"{name}.y.npy")
        assert (ss["n"], ss["per_class"]) == (ms["n"], ms["per_class"])
    assert s == m  # mean and std included: the same bits
    loaded = load_prepared(root / "stream")
    for name in ("train", "val", "test"):
        a, b = getattr(memory, name), getattr(loaded, name)
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    array = np.load(root / "stream" / "train.x.npy", mmap_mode="r")
    assert array.dtype == np.uint8 and array.shape == tuple(memory.train.x.shape)


def test_a_streamed_split_is_memory_mapped_not_read(both: dict[str, Any]) -> None:
    """The images' memory is a mapping of the file (``/proc/self/maps``), not a copy."""
    path = both["root"] / "stream" / "train.x.npy"
    x = load_prepared(both["root"] / "stream").train.x
    ptr = x.data_ptr()
    mapped = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5] == str(path):
            start, end = (int(a, 16) for a in fields[0].split("-"))
            mapped.append(start <= ptr < end)
    assert any(mapped)


def test_a_tampered_or_truncated_streamed_split_is_one_line(
    both: dict[str, Any], tmp_path: Path
) -> None:
    import shutil

    copy = tmp_path / "prepared"
    shutil.copytree(both["root"] / "stream", copy)
    array = np.load(copy / "val.x.npy", mmap_mode="r+")
    array[0, 0, 0, 0] ^= 1
    array.flush()
    del array
    with pytest.raises(UserError, match=r"val\.x\.npy does not match its manifest checksum"):
        load_prepared(copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["splits"]["val"]["n"] += 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match=r"val\.x\.npy holds \d+ images, its manifest \d+"):
        load_prepared(copy, verify=False)


def test_auto_streams_when_the_split_exceeds_a_quarter_of_ram(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(storage, "host_memory", lambda: 4000)
    assert storage.choose("auto", 1000, CPU) == "memory"
    assert storage.choose("auto", 1001, CPU) == "stream"
    assert storage.choose("memory", 10**9, CPU) == "memory"
    assert storage.choose("stream", 1, CPU) == "stream"


def test_auto_counts_the_gpu_memory_when_training_on_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(storage, "host_memory", lambda: 10**12)
    monkeypatch.setattr(storage, "device_memory", lambda d: 8000 if d.type == "cuda" else None)
    assert storage.choose("auto", 2001, torch.device("cuda")) == "stream"
    assert storage.choose("auto", 2001, CPU) == "memory"


def test_histogram_stats_agree_with_the_in_memory_stats() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (37, 3, 9, 11), dtype=torch.uint8, generator=gen)
    x[:, 1] //= 3
    mean, std = channel_stats(x)
    h_mean, h_std = storage.channel_stats_streamed(x)
    assert np.allclose(h_mean, mean, rtol=1e-12, atol=0)
    assert np.allclose(h_std, std, rtol=1e-12, atol=0)


def test_a_split_larger_than_memory_gets_histogram_stats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streamed with too little RAM for float64 stats: never materialised whole."""
    import bayesavg.data.prepared as prepared_module

    images = write_images(tmp_path / "images", per_class=6, size=16)
    monkeypatch.setattr(prepared_module, "host_memory", lambda: 100)
    monkeypatch.setattr(prepared_module, "channel_stats", lambda x: pytest.fail("stats in memory"))
    out = prepare(
        f"imagefolder:{images}", tmp_path / "raw", tmp_path / "p", 0, 0.2, 0.2, storage="stream"
    )
    assert out.manifest["storage"] == "stream" and len(out.manifest["mean"]) == 3


def test_an_imagefolder_is_streamed_chunk_by_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoded a chunk at a time into the array, never whole; the same images as in memory."""
    from bayesavg.data.datasets import ImageFolder

    images = write_images(tmp_path / "images", per_class=10, size=20)
    memory = prepare(f"imagefolder:{images}", tmp_path / "raw", tmp_path / "m", 0, 0.2, 0.2)
    largest = _rows_read(monkeypatch, ImageFolder, "read")
    monkeypatch.setattr(storage, "CHUNK", 4)
    stream = prepare(
        f"imagefolder:{images}", tmp_path / "raw", tmp_path / "s", 0, 0.2, 0.2, storage="stream"
    )
    assert max(largest) == 4
    for name in ("train", "val", "test"):
        a, b = getattr(memory, name), getattr(stream, name)
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert stream.manifest["mean"] == memory.manifest["mean"]


def _params(augment: dict[str, Any], **model: Any) -> Any:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    # the data path is under test, not the net
    raw["model"] = {"name": "mlp", "hidden": [32], **model}
    raw["data"]["augment"] = augment
    raw["pretrain"].update(epochs=1, batch_size=100, members=1)
    raw["finetune"] = {
        "s": {
            "start": "pretrain",
            "epochs": 2,
            "batch_size": 64,
            "momentum": 0.9,
            "collect": {"start_epoch": 0, "every": 5, "max_rank": 4},
        }
    }
    raw["evaluate"]["predictors"] = {"s": {"swag": {"method": "swag"}}}
    raw["evaluate"]["plane"]["trajectories"] = []
    raw["evaluate"]["dswag_sweep"]["workers"] = []
    prune_landscape(raw)
    return parse_params(raw)


def test_streaming_trains_bitwise_the_in_memory_posterior(both: dict[str, Any]) -> None:
    """Pretraining and a SWAG trajectory (crop and flip drawn per epoch, a last batch
    of the remainder) from the in-memory and the streamed split: every byte equal."""
    params = _params({"crop_padding": 2, "flip": True})
    assert isinstance(train_data(both["stream"], compute_for(params, CPU)), StreamedData)
    memory_data = train_data(both["memory"], compute_for(params, CPU))
    assert type(memory_data) is TrainData
    out = {}
    for kind in ("memory", "stream"):
        torch.manual_seed(0)
        start = pretrain_members(params, both[kind], CPU)
        run = finetune(params, "s", both[kind], start.posterior, CPU)
        out[kind] = (start, run)
    (start_m, run_m), (start_s, run_s) = out["memory"], out["stream"]
    assert torch.equal(start_m.posterior.theta, start_s.posterior.theta)
    a, b = run_m.posterior, run_s.posterior
    assert torch.equal(a.theta, b.theta)
    assert a.collector is not None and b.collector is not None
    assert sorted(a.collector) == sorted(b.collector)
    for key, value in a.collector.items():
        same = (
            torch.equal(value, b.collector[key])
            if torch.is_tensor(value)
            else value == b.collector[key]
        )
        assert same, key
    drop = {"seconds"}
    assert [{k: v for k, v in r.items() if k not in drop} for r in run_m.history] == [
        {k: v for k, v in r.items() if k not in drop} for r in run_s.history
    ]


def test_streamed_batches_come_in_order_however_many_are_prefetched(
    both: dict[str, Any],
) -> None:
    from bayesavg.training.batches import Order, epoch_bounds

    prepared = both["stream"]
    m = prepared.manifest
    n = len(prepared.train)
    host = torch.randperm(n, generator=torch.Generator().manual_seed(3))
    order, bounds = Order(host, host), epoch_bounds(n, 97, -(-n // 97))
    memory = TrainData(both["memory"].train.x, both["memory"].train.y, m["mean"], m["std"])
    expected = list(memory.epoch(order, bounds, None, None))
    for prefetch, workers in ((1, None), (1, 1), (4, 2), (16, 4)):
        streamed = StreamedData(
            prepared.train.x,
            prepared.train.y,
            m["mean"],
            m["std"],
            prefetch=prefetch,
            workers=workers,
        )
        got = list(streamed.epoch(order, bounds, None, None))
        assert len(got) == len(expected)
        for (x, y, w), (ex, ey, ew) in zip(got, expected, strict=True):
            assert torch.equal(x, ex) and torch.equal(y, ey) and w == ew


def test_streamed_evaluation_is_bitwise_the_in_memory_one_a_batch_at_a_time(
    both: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SWAG with its BatchNorm pass over the whole training split: from the memory-mapped
    split, read a batch at a time (never whole, as float32 or as a uint8 copy), the
    metrics and predictive are bitwise those of the in-memory split, which are bitwise
    those of the whole-tensor inputs the pipeline used before."""
    from bayesavg.data.inputs import Inputs
    from bayesavg.evaluation.evaluate import bn_inputs, bn_subset, evaluate

    params = _params({"crop_padding": 0, "flip": False}, batch_norm=True)
    torch.manual_seed(0)
    start = pretrain_members(params, both["memory"], CPU)
    post = finetune(params, "s", both["memory"], start.posterior, CPU).posterior
    assert post.has_batchnorm
    reads = _rows_read(monkeypatch, Inputs, "__getitem__")
    kw = {"n_samples": 3, "batch_size": 400, "seed": 5}
    got = {}
    for kind in ("memory", "stream"):
        data = both[kind]
        bn_x = bn_inputs(post, data.train, 1.0, params.seed, CPU)
        assert len(bn_x) == len(data.train)
        if kind == "stream":
            assert storage.is_mapped(data.train.x) and bn_x.images is data.train.x
        splits = {
            s: (post.inputs(getattr(data, s).x, CPU), getattr(data, s).y) for s in ("test", "val")
        }
        got[kind] = evaluate(post, "swag", splits, bn_x=bn_x, **kw)
    assert reads and max(reads) <= 400
    data = both["memory"]
    whole = evaluate(
        post,
        "swag",
        {s: (post.model_input(getattr(data, s).x), getattr(data, s).y) for s in ("test", "val")},
        bn_x=post.model_input(bn_subset(data.train, 1.0, params.seed).x),
        **kw,
    )
    for split in ("test", "val"):
        for other in (got["stream"], whole):
            a, b = got["memory"][split], other[split]
            assert torch.equal(a.log_probs, b.log_probs)
            assert json.dumps(a.metrics) == json.dumps(b.metrics)
            assert a.by_samples == b.by_samples


def test_dswag_clients_stream_bitwise_the_whole_tensor_run(
    both: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Distributed SWAG's clients and its per-round evaluation read their shards a batch
    at a time (never the split whole as float32): from memory, and from the memory-
    mapped split, bitwise the run on whole float tensors the trajectory took before."""
    from bayesavg.config import DSWAGTrajectory
    from bayesavg.data.inputs import Inputs
    from bayesavg.data.prepared import to_input
    from bayesavg.dswag import rounds
    from bayesavg.training.batches import Tensors

    def tensors(split: Any, prepared: Any, device: torch.device) -> Tensors:
        """A split whole as float32 on the device, as DSWAG took it before."""
        m = prepared.manifest
        return Tensors(to_input(split.x, m["mean"], m["std"], device), split.y.to(device))

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    params = _params({"crop_padding": 0, "flip": False}, batch_norm=True)
    traj = copy.deepcopy(raw["finetune"]["dswag"])
    traj.update(clients=3, batch_size=64, max_rank=3)
    traj["phase1"]["rounds"] = 1
    traj["phase2"].update(epochs=1, snapshots_per_client=1)
    traj = DSWAGTrajectory.model_validate(traj)
    torch.manual_seed(0)
    start = pretrain_members(params, both["memory"], CPU).posterior
    reads = _rows_read(monkeypatch, Inputs, "__getitem__")
    runs = {}
    for kind in ("memory", "stream"):
        runs[kind] = rounds.finetune_dswag(params, "dswag", both[kind], start, CPU, traj)
    assert reads and max(reads) <= max(traj.batch_size, rounds.EVAL_CHUNK)
    monkeypatch.setattr(rounds, "watched", tensors)  # the whole-tensor inputs of before
    runs["whole"] = rounds.finetune_dswag(params, "dswag", both["memory"], start, CPU, traj)
    a = runs["memory"]
    assert a is not None and a.posterior.collector is not None
    for other in (runs["stream"], runs["whole"]):
        assert other is not None and other.posterior.collector is not None
        assert torch.equal(a.posterior.theta, other.posterior.theta)
        for key, value in a.posterior.collector.items():
            b = other.posterior.collector[key]
            assert torch.equal(value, b) if torch.is_tensor(value) else value == b, key
        drop = {"seconds"}
        assert [{k: v for k, v in r.items() if k not in drop} for r in a.history] == [
            {k: v for k, v in r.items() if k not in drop} for r in other.history
        ]
