"""bayesavg against the SWAG reference code on the CPU, on the same images.

The issue's protocol, scaled to a CPU: PreResNet-20 on 3,000 training and 2,000 test
32x32 RGB images (random, uint8: the cost does not depend on the pixels), batch 128,
SGD with momentum, crop (padding 4) + flip, a SWAG snapshot each epoch (rank 20);
then a 30-sample SWAG evaluation (scale 0.5, low rank + diagonal), each sample with
BatchNorm recomputed over the training images.

- Fine-tuning, one epoch a round: ours is ``bayesavg.training.train.train`` with the
  swag trajectory's plan (``scripts/gpu_check_throughput._ours``: uint8 images in
  memory, crop and flip batched); the reference is its ``utils.train_epoch`` over a
  DataLoader of PIL images with its own transforms and model class, then
  ``SWAG.collect_model`` (``_reference`` there).
- Evaluation, ``SAMPLES_A_ROUND`` samples a round: ours is
  ``bayesavg.evaluation.evaluate`` at ``--eval-batch`` (default 128, the reference's:
  on this CPU a batch of 1000 runs PreResNet-20 1.6x slower per image than 128, cache
  misses; the pipeline's ``evaluate.batch_size`` is 1000, a GPU's size); the reference is its
  ``uncertainty.py`` loop: ``SWAG.sample(scale, cov=True)``, ``utils.bn_update`` over
  the training loader (training transforms, not shuffled), softmax of the test loader's
  batches (128) summed on the host.

Both variants run side by side in a child process per numerics mode (the pins are
read when torch loads): ``portable`` (this project's default, AVX2) and ``native``, a
child of each per round (``--rounds``, default 3), the modes alternated. So each ratio
compares the two codes on the same kernels; ``pinned_ours_over_native_reference``
(what a user sees who keeps the default pins) is taken per round, across the round's
two children. The projected protocol is
20 epochs plus 30 samples at the measured rates. Goal: ours at least as fast (ratio
reference seconds / ours seconds >= 1). Nothing is asserted.

Run ``python benchmarks/reference.py [--quick]`` after ``make bench-install`` (about 16
minutes on 2 cores, 1 quick); results go to ``benchmarks/reference.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))  # the GPU check's loops, shared

TRAIN, TEST, BATCH, RANK = 3000, 2000, 128, 20
EPOCHS, SAMPLES, SCALE = 20, 30, 0.5
SAMPLES_A_ROUND = 5
MODES = ("portable", "native")


def _reference_evaluation(swag: Any, x: Any, y: Any, tx: Any, ty: Any, workers: int) -> Any:
    """The reference's ``uncertainty.py`` loop over ``samples`` samples, as a function."""
    import numpy as np
    import torch
    from gpu_check_throughput import MODELS
    from PIL import Image

    cfg = swag.models.PreResNet56  # the transforms are the same for every depth
    kwargs = MODELS["preresnet20"][1]
    collector = swag.posteriors.SWAG(
        swag.models.preresnet.PreResNet,
        no_cov_mat=False,
        max_num_models=RANK,
        num_classes=10,
        **kwargs,
    )
    model = swag.models.preresnet.PreResNet(num_classes=10, **kwargs)
    torch.manual_seed(0)
    for _ in range(3):  # three snapshots a little apart: a posterior with some spread
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p), alpha=0.01)
        collector.collect_model(model)

    def loader(images: Any, labels: Any, transform: Any) -> Any:
        pixels, targets = images.permute(0, 2, 3, 1).numpy(), labels.tolist()

        class Images(torch.utils.data.Dataset):
            def __len__(self) -> int:
                return len(targets)

            def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
                picture = Image.fromarray(np.ascontiguousarray(pixels[i]))
                return transform(picture), targets[i]

        return torch.utils.data.DataLoader(
            Images(),
            batch_size=BATCH,
            shuffle=False,
            num_workers=workers,
            multiprocessing_context="fork" if workers else None,
        )

    train = loader(x, y, cfg.transform_train)
    test = loader(tx, ty, cfg.transform_test)

    def run(samples: int) -> None:
        predictions = np.zeros((len(ty), 10))
        for _ in range(samples):
            collector.sample(scale=SCALE, cov=True)
            swag.utils.bn_update(train, collector, torch.device("cpu"))
            collector.eval()
            k = 0
            with torch.no_grad():
                for inputs, _ in test:
                    out = torch.softmax(collector(inputs), dim=1).numpy()
                    predictions[k : k + len(out)] += out
                    k += len(out)

    return run


def _our_evaluation(x: Any, y: Any, tx: Any, ty: Any, batch: int) -> Any:
    """``evaluate`` of a PreResNet-20 SWAG posterior (two epochs of the swag trajectory on
    the same images: rank 2, as the reference's three snapshots give rank 3 at most)."""
    import torch
    from gpu_check_parts import cifar_setup

    from bayesavg.data.datasets import Split
    from bayesavg.data.prepared import Prepared
    from bayesavg.evaluation.evaluate import evaluate
    from bayesavg.trajectories import finetune, initial_network

    p, data = cifar_setup(64, 64, 2, 64)
    data = Prepared(Split(x, y), Split(tx[:500], ty[:500]), Split(tx, ty), data.manifest)
    cpu = torch.device("cpu")
    result = finetune(p, "swag", data, initial_network(p, data), cpu)
    assert result is not None
    post = result.posterior
    bn_x = post.model_input(data.train.x, cpu)
    test = {"test": (post.model_input(tx, cpu), ty)}

    def run(samples: int) -> None:
        evaluate(
            post, "swag", test, n_samples=samples, scale=SCALE, bn_x=bn_x, seed=0, batch_size=batch
        )

    return run


def child(quick: bool, workers: int, eval_batch: int, round_index: int) -> dict[str, Any]:
    """Both codes side by side under this process's numerics, one round after a warm-up
    (``round_index`` rotates which code goes first): seconds per epoch, per sample."""
    import dataclasses

    import torch
    from gpu_check_parts import Size, cifar_shaped, rotation
    from gpu_check_reference import _reference, reference_package
    from gpu_check_throughput import _ours

    from bayesavg.training.precision import Precision

    swag = reference_package()
    if isinstance(swag, str):
        raise SystemExit(swag)
    train_n, test_n = (256, 256) if quick else (TRAIN, TEST)
    x, y = cifar_shaped(train_n + test_n, seed=2)
    x, y, tx, ty = x[:train_n], y[:train_n], x[train_n:], y[train_n:]
    size = dataclasses.replace(Size.full(), batch_size=BATCH, max_rank=RANK, workers=workers)
    cpu = torch.device("cpu")
    training = {
        "ours": _ours("preresnet20", cpu, Precision("fp32", "cpu"), x, y, size),
        "reference": _reference("preresnet20", cpu, x, y, size),
    }
    evaluation = {
        "ours": _our_evaluation(x, y, tx, ty, eval_batch),
        "reference": _reference_evaluation(swag, x, y, tx, ty, workers),
    }
    samples = 1 if quick else SAMPLES_A_ROUND
    for name in training:  # warm-up: one epoch, one sample
        training[name]()
        evaluation[name](1)
    seconds: dict[str, dict[str, list[float]]] = {
        "epoch": {name: [] for name in training},
        "sample": {name: [] for name in training},
    }
    for name in rotation(list(training), round_index):
        started = time.perf_counter()
        training[name]()
        seconds["epoch"][name].append(time.perf_counter() - started)
    for name in rotation(list(training), round_index + 1):
        started = time.perf_counter()
        evaluation[name](samples)
        seconds["sample"][name].append((time.perf_counter() - started) / samples)
    return {"train_images": train_n, "test_images": test_n, "seconds": seconds}


def _merge(found: dict[str, dict[str, Any]], mode: str, run: dict[str, Any]) -> None:
    """A child's round appended to its mode's seconds."""
    if mode not in found:
        found[mode] = run
        return
    for kind, per_code in run["seconds"].items():
        for code, values in per_code.items():
            found[mode]["seconds"][kind][code].extend(values)


def _median_ratio(ours: list[float], reference: list[float]) -> list[float]:
    ratios = sorted(b / a for a, b in zip(ours, reference, strict=True))
    return [round(statistics.median(ratios), 3), round(ratios[0], 3), round(ratios[-1], 3)]


def summarise(found: dict[str, Any]) -> dict[str, Any]:
    """Per mode: medians, reference/ours per round (median, min, max), the projected
    protocol (``EPOCHS`` epochs + ``SAMPLES`` samples at the measured medians)."""
    out: dict[str, Any] = {}
    for mode, run in found.items():
        s = run["seconds"]
        med = {k: {n: statistics.median(v) for n, v in s[k].items()} for k in s}
        protocol = {n: EPOCHS * med["epoch"][n] + SAMPLES * med["sample"][n] for n in med["epoch"]}
        out[mode] = {
            "seconds_per_epoch": {n: round(v, 3) for n, v in med["epoch"].items()},
            "seconds_per_sample": {n: round(v, 3) for n, v in med["sample"].items()},
            "training_reference_over_ours": _median_ratio(
                s["epoch"]["ours"], s["epoch"]["reference"]
            ),
            "evaluation_reference_over_ours": _median_ratio(
                s["sample"]["ours"], s["sample"]["reference"]
            ),
            "protocol_seconds": {n: round(v, 1) for n, v in protocol.items()},
            "protocol_reference_over_ours": round(protocol["reference"] / protocol["ours"], 3),
            "raw": run,
        }
    if set(MODES) <= set(out):  # per round: the two children of a round ran one after the other
        ours = _protocol_per_round(found["portable"]["seconds"], "ours")
        ref = _protocol_per_round(found["native"]["seconds"], "reference")
        out["pinned_ours_over_native_reference"] = _median_ratio(ours, ref)
    return out


def _protocol_per_round(seconds: dict[str, dict[str, list[float]]], code: str) -> list[float]:
    epochs, samples = seconds["epoch"][code], seconds["sample"][code]
    return [EPOCHS * e + SAMPLES * s for e, s in zip(epochs, samples, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument(
        "--workers", type=int, default=0, help="the reference's DataLoader workers (default 0)"
    )
    parser.add_argument(
        "--eval-batch", type=int, default=BATCH, help="our evaluation's batch (default 128)"
    )
    parser.add_argument("--out", type=Path, default=HERE / "reference.json")
    parser.add_argument("--rounds", type=int, default=3, help="child pairs, modes alternated")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from bayesavg.runtime import numerics

    numerics.pin()  # threads and instruction set, before torch loads
    if args.child:
        import torch

        torch.set_num_threads(numerics.threads())
        print(json.dumps(child(args.quick, args.workers, args.eval_batch, args.round)))
        return
    from timing import finish, machine_info, rotation, warn_if_oversubscribed, write_results

    started = time.perf_counter()
    import torch

    threads = numerics.threads()  # the child's, beside the reference's loader workers
    what = f"{threads} thread(s) + {args.workers} loader worker(s)"
    warn_if_oversubscribed(what, threads + args.workers)

    results: dict[str, Any] = {"machine": machine_info(torch.device("cpu"), False)}
    results["mode"] = "quick" if args.quick else "full"
    results["setting"] = {
        "model": "preresnet20",
        "train_images": TRAIN,
        "test_images": TEST,
        "batch_size": BATCH,
        "max_rank": RANK,
        "protocol_epochs": EPOCHS,
        "protocol_samples": SAMPLES,
        "reference_loader_workers": args.workers,
        "our_eval_batch": args.eval_batch,
    }
    found: dict[str, dict[str, Any]] = {}
    for r in range(1 if args.quick else args.rounds):
        for mode in rotation(list(MODES), r):  # a child per mode and round, alternated
            env = dict(os.environ, BAYESAVG_NUMERICS=mode)
            for var in numerics.ISA_PINS:
                env.pop(var, None)  # this process's own pins; the child sets its mode's
            argv = [sys.executable, __file__, "--child", "--workers", str(args.workers)]
            argv += ["--eval-batch", str(args.eval_batch), "--round", str(r)]
            argv += ["--quick"] * args.quick
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            _merge(found, mode, json.loads(done.stdout.splitlines()[-1]))
    results.update(summarise(found))
    wall = finish(results, started)
    write_results(args.out, results)
    print(
        f"\nbayesavg against the SWAG reference code on the CPU ({results['mode']}, {wall:.0f} s)"
    )
    for mode in MODES:
        r = results[mode]
        print(
            f"  {mode}: epoch ours {r['seconds_per_epoch']['ours']} s, reference "
            f"{r['seconds_per_epoch']['reference']} s (reference/ours "
            f"{r['training_reference_over_ours'][0]}); sample ours "
            f"{r['seconds_per_sample']['ours']} s, reference "
            f"{r['seconds_per_sample']['reference']} s "
            f"({r['evaluation_reference_over_ours'][0]}); protocol reference/ours "
            f"{r['protocol_reference_over_ours']} (goal >= 1)"
        )
    print(
        "  default pins (ours) against the reference unpinned, median [min, max] over rounds: "
        f"{results['pinned_ours_over_native_reference']}"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
