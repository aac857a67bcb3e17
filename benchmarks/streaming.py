"""Streamed training data against in-memory (``data.storage``): images per second of an
epoch on the CPU, for a split of 20,000 RGB images at 64x64 (245 MB as uint8).

(a) The data path alone: an epoch's batches (128, random crop and flip drawn per epoch,
    normalised), from the split held in memory (``TrainData``) against the split
    memory-mapped from its ``.npy`` and streamed with prefetching (``StreamedData``).
(b) A training epoch (LeNet-5 on the 64x64 images, SGD) through the library's loop, both
    ways: the share of an epoch that streaming costs once a network trains.

The array is written once and read through the page cache (it fits this machine's RAM:
the case where both paths are possible and the comparison means something). A split
larger than RAM reads from disk, at the disk's speed, and only streaming can train on
it at all. Ratio: streamed seconds over in-memory, per round; rounds in rotated order
(``timing.py``); nothing asserted. Run ``python benchmarks/streaming.py [--quick]``
(about 5 minutes on 2 cores); results go to ``benchmarks/streaming.json``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
MEAN, STD = [0.49, 0.48, 0.45], [0.25, 0.24, 0.26]


def _split(n: int, folder: Path) -> tuple[Any, Any, Any]:
    """Random uint8 images in memory, and the same written as the data stage writes them."""
    import torch

    from bayesavg.data.storage import read_array, write_array

    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 3, 64, 64), dtype=torch.uint8, generator=gen)
    y = torch.randint(0, 10, (n,), generator=gen)
    path = folder / "train.x.npy"
    write_array(path, tuple(x.shape), lambda i, j: x[i:j].numpy())
    return x, y, read_array(path)


def _variants(x: Any, y: Any, mapped: Any, train: bool) -> dict[str, Any]:
    import torch
    from timing import Outcome, Stopwatch

    from bayesavg.training.augment import Augment, draw_epoch
    from bayesavg.training.batches import Order, StreamedData, TrainData, epoch_bounds
    from bayesavg.training.steps import sgd
    from bayesavg.training.train import train as train_loop

    augment = Augment(crop_padding=4, flip=True)
    data = {
        "memory": TrainData(x, y, MEAN, STD, augment),
        "stream": StreamedData(mapped, y, MEAN, STD, augment),
    }
    n, batch = x.shape[0], 128
    bounds = epoch_bounds(n, batch, -(-n // batch))

    def data_only(d: Any) -> Outcome:
        gen = torch.Generator().manual_seed(1)
        host = torch.randperm(n, generator=gen)
        draws = draw_epoch(n, augment, gen)
        with Stopwatch() as watch:
            total = 0.0
            for xb, _, _ in d.epoch(Order(host, host), bounds, None, draws):
                total += float(xb[0, 0, 0, 0])
        return Outcome(watch.seconds, total)

    def epoch(d: Any) -> Outcome:
        from bayesavg.models import build_model

        torch.manual_seed(0)
        model = build_model("lenet5", (3, 64, 64), 10)
        opt = sgd(model, 0.9, 5e-4)
        with Stopwatch() as watch:
            rows = train_loop(
                model,
                opt,
                d,
                epochs=1,
                batch_size=batch,
                lr=lambda _: 0.01,
                generator=torch.Generator().manual_seed(1),
                log_epochs=False,
            )
        return Outcome(watch.seconds, rows[0]["train_loss"])

    run = epoch if train else data_only
    return {name: (lambda d=d: run(d)) for name, d in data.items()}


def bench(x: Any, y: Any, mapped: Any, train: bool, rounds: int) -> dict[str, Any]:
    from timing import interleave, ratio, ratio_fields, rounded, warm_up

    variants = _variants(x, y, mapped, train)
    first = warm_up(variants)
    assert first["memory"].result == first["stream"].result, "streaming changed the epoch"
    seconds = interleave(variants, rounds)
    n = x.shape[0]
    return {
        # median beside the median ratio; best-of beside ``_best``
        "images_per_second": {k: round(n / statistics.median(v), 1) for k, v in seconds.items()},
        "images_per_second_best": {k: round(n / min(v), 1) for k, v in seconds.items()},
        **ratio_fields("stream_over_memory", ratio(seconds["stream"], seconds["memory"]), 3),
        "same_result": True,
        "seconds_per_round": rounded(seconds),
    }


def main() -> None:
    from bayesavg.runtime import numerics

    numerics.pin()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 2,000 images")
    parser.add_argument("--out", type=Path, default=HERE / "streaming.json")
    args = parser.parse_args()
    import torch
    from timing import finish, machine_info, write_results

    torch.set_num_threads(numerics.threads())
    started = time.perf_counter()
    n, rounds = (2000, 2) if args.quick else (20000, 5)
    results: dict[str, Any] = {"machine": machine_info(torch.device("cpu"), False)}
    results["mode"] = "quick" if args.quick else "full"
    results["images"] = [n, 3, 64, 64]
    with tempfile.TemporaryDirectory() as folder:
        x, y, mapped = _split(n, Path(folder))
        results["data_path"] = bench(x, y, mapped, False, rounds)
        results["training_epoch"] = bench(x, y, mapped, True, rounds)
        del mapped
    wall = finish(results, started)
    write_results(args.out, results)
    print(f"\nstreamed against in-memory training data ({results['mode']}, {wall:.0f} s):")
    for part in ("data_path", "training_epoch"):
        r = results[part]
        print(
            f"  {part}: images/s (median) {r['images_per_second']}, stream/memory seconds "
            f"{r['stream_over_memory']} {r['stream_over_memory_range']}, best-of "
            f"{r['stream_over_memory_best']}"
        )


if __name__ == "__main__":
    main()
