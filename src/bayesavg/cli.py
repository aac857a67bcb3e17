"""The ``bayesavg`` command line.

A ``UserError`` becomes one line on stderr and exit code 2 (``entry``);
argparse's own usage errors already exit with 2.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from .config.methods import REGISTRY
from .runtime import numerics
from .runtime.entry import run_entry
from .runtime.errors import UserError

log = logging.getLogger("bayesavg")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bayesavg", description="Bayesian deep learning by weight averaging."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser(
        "evaluate",
        help="evaluate a posterior file on a dataset",
        description="Sample a posterior, average predictions (BMA), write metrics JSON.",
    )
    ev.add_argument(
        "--posterior", required=True, type=Path, help="models/<trajectory>/posterior.pt"
    )
    ev.add_argument(
        "--predictor",
        required=True,
        metavar="METHOD",
        help="; ".join(f"{m.name}: {m.label}" for m in REGISTRY.values()),
    )
    ev.add_argument(
        "--data",
        required=True,
        help="mnist5k, mnist, fashion_mnist, cifar10, cifar100 (test split) or imagefolder:<DIR>",
    )
    ev.add_argument("--samples", type=int, default=30, help="number of weight samples S")
    ev.add_argument("--seed", type=int, default=0, help="sampling seed")
    ev.add_argument(
        "--scale",
        type=float,
        default=None,
        help="covariance scale (default: the method's: "
        + ", ".join(f"{m.name} {m.default_scale:g}" for m in REGISTRY.values() if m.has_scale)
        + ")",
    )
    ev.add_argument("--out", required=True, type=Path, help="metrics JSON to write")
    ev.add_argument("--reliability", type=Path, default=None, help="also write bins as CSV")
    ev.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    ev.add_argument("--batch-size", type=int, default=1000)
    ev.add_argument(
        "--bn-update-fraction",
        type=float,
        default=1.0,
        help="share of the training split used to recompute BatchNorm statistics (0 < f <= 1), "
        "drawn as the pipeline draws it (evaluate.bn_update_fraction)",
    )
    ev.add_argument("--raw-dir", type=Path, default=Path("data/raw"), help="dataset downloads")
    ev.add_argument(
        "--shift",
        action="append",
        default=[],
        metavar="NAME",
        help="also evaluate on the test split shifted: rotate_<degrees> or a corruption "
        "(shot_noise, impulse_noise, translate, shear, scale, brightness, stripe; _<level 1-5> "
        "for another severity), or 'rotations' (all 13 angles, 0 to 180 by 15) or "
        "'corruptions' (all seven); repeatable; results under shift.<NAME>",
    )
    ev.add_argument(
        "--ood",
        action="append",
        default=[],
        metavar="SPEC",
        help="score out-of-distribution inputs against the test split: animal_mnist, a dataset "
        "name (its test split) or imagefolder:<DIR>; repeatable; results under ood.<SPEC>",
    )
    return parser


def _evaluate(args: argparse.Namespace) -> None:
    from .data.extra_sets import ood_images, shifted
    from .data.prepared import load_eval_split
    from .data.shift import parse_many as parse_shifts
    from .evaluation.evaluate import bn_subset, evaluate
    from .posteriors.file import load_posterior
    from .runtime.io import write_csv, write_json
    from .seeding import resolve_device

    if args.predictor not in REGISTRY:
        raise UserError(
            f"--predictor: unknown {args.predictor!r}; choose one of {', '.join(REGISTRY)}"
        )
    if args.samples < 1:
        raise UserError(f"--samples: must be >= 1 (got {args.samples})")
    if args.batch_size < 1:
        raise UserError(f"--batch-size: must be >= 1 (got {args.batch_size})")
    if args.scale is not None and args.scale < 0:
        raise UserError(f"--scale: must be >= 0 (got {args.scale})")
    if not 0 < args.bn_update_fraction <= 1:
        raise UserError(f"--bn-update-fraction: must be in (0, 1] (got {args.bn_update_fraction})")
    device = resolve_device(args.device)
    posterior = load_posterior(args.posterior)
    d = posterior.data
    split_args = (args.raw_dir, posterior.input_shape)
    fractions = (d["seed"], d["test_fraction"], d["val_fraction"], d.get("resize_size"))
    test = load_eval_split(args.data, *split_args, "test", *fractions)
    if test.y.max().item() >= posterior.num_classes:
        raise UserError(
            f"{args.data} has labels up to {test.y.max().item()}, "
            f"the posterior has {posterior.num_classes} classes"
        )
    bn_x = None
    if not REGISTRY[args.predictor].own_buffers and posterior.has_batchnorm:
        train = load_eval_split(d["dataset"], *split_args, "train", *fractions)
        part = bn_subset(train, args.bn_update_fraction, d["seed"])
        log.info(
            "BatchNorm model: %d of the %d training images of %s for BN updates",
            len(part),
            len(train),
            d["dataset"],
        )
        bn_x = posterior.model_input(part.x, device)
    splits = {"test": (posterior.model_input(test.x, device), test.y)}
    try:
        shifts = parse_shifts(args.shift)
    except ValueError as err:
        raise UserError(f"--shift: {err}") from None
    for name, images in shifted(test.x, shifts, d["seed"]).items():
        splits[f"shift.{name}"] = (posterior.model_input(images, device), test.y)
    ood = {
        spec: posterior.model_input(
            ood_images(spec, posterior.input_shape, args.raw_dir, fractions), device
        )
        for spec in dict.fromkeys(args.ood)
    }
    results = evaluate(
        posterior,
        args.predictor,
        splits,
        n_samples=args.samples,
        scale=args.scale,
        bn_x=bn_x,
        batch_size=args.batch_size,
        seed=args.seed,
        device=device,
        ood=ood,
    )
    result = results["test"]
    out: dict[str, object] = {**result.metrics, "predictor": args.predictor, "data": args.data}
    keys = ("accuracy", "nll", "ece", "brier", "entropy")
    if shifts:
        out["shift"] = {
            s.name: {k: results[f"shift.{s.name}"].metrics[k] for k in keys} for s in shifts
        }
    if ood:
        out["ood"] = result.ood
    write_json(args.out, out)
    if args.reliability is not None:
        write_csv(args.reliability, result.reliability.rows())
    log.info("%s on %s: %s", args.predictor, args.data, result.metrics)


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    run_entry(numerics.pin)  # before torch: the same bytes as the pipeline's stages
    if args.command == "evaluate":
        run_entry(lambda: _evaluate(args))
