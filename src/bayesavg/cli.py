"""The ``bayesavg`` command line.

A ``UserError`` becomes one line on stderr and exit code 2 (``entry``);
argparse's own usage errors already exit with 2.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .config.base import SEED_MAX
from .config.methods import REGISTRY
from .runtime import numerics
from .runtime.entry import run_entry
from .runtime.errors import UserError

if TYPE_CHECKING:
    import torch

    from .data.datasets import Split
    from .evaluation.evaluate import Evaluation
    from .posteriors.file import PosteriorFile

log = logging.getLogger("bayesavg")
# The methods --temperature applies to: one network (the pipeline's config has the same rule).
SINGLE = tuple(m.name for m in REGISTRY.values() if m.samples == "one")


class _OneLine(argparse.ArgumentParser):
    """argparse with the project's error form: one ``error:`` line naming the command's
    help, exit 2 (argparse prints its whole usage block first); no abbreviated flags
    (``--sample`` taken as ``--samples`` would break when a flag is added)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _OneLine(prog="bayesavg", description="Bayesian deep learning by weight averaging.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLine)
    track = sub.add_parser(
        "track",
        help="send the MLflow calls stages kept in runs/spool/ while tracking was down",
    )
    track.add_argument("--sync", action="store_true", required=True, help="send them now")
    track.add_argument("--root", default=".", help="the project root (default: here)")
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
    ev.add_argument(
        "--seed",
        type=int,
        default=None,
        help="sampling seed, 0 to 2**63 - 1 (default: the evaluate stage's for the pipeline's "
        "predictor named like --predictor, so its samples and probabilities are the stage's and "
        "the served model's; for another predictor of the method, e.g. dswag: the param "
        "sampling_seed of its MLflow run evaluate@<name>)",
    )
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
    ev.add_argument(
        "--deterministic",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="CUDA's deterministic kernels (the params' deterministic); --no-deterministic: "
        "cuDNN's autotuned fastest, reruns differ in the last bits",
    )
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
        "'corruptions' (all seven), or 'cifar-c' (CIFAR-10-C's 19 corruptions at "
        "severities 1-5: c_<name>_<level>; the official arrays under --raw-dir where "
        "present, generated otherwise); repeatable; results under shift.<NAME>",
    )
    ev.add_argument(
        "--ood",
        action="append",
        default=[],
        metavar="SPEC",
        help="score out-of-distribution inputs against the test split: animal_mnist, a dataset "
        "name (its test split) or imagefolder:<DIR>; repeatable; results under ood.<SPEC>",
    )
    ev.add_argument(
        "--temperature",
        default=None,
        metavar="T|fit",
        help=f"temperature scaling of a single-network predictor ({', '.join(SINGLE)}), as "
        "the pipeline's map_ts and swa_ts: its log-probabilities divided by T > 0 and "
        "renormalised; 'fit': T fitted (NLL) on --val with the untempered predictor, as the "
        "evaluate stage fits it; written as 'temperature'",
    )
    ev.add_argument(
        "--val",
        default=None,
        metavar="DATA",
        help="with --temperature fit: the set T is fitted on, as --data: a dataset name "
        "(the validation split the posterior's data stage made) or imagefolder:<DIR> (all of it)",
    )
    return parser


def _temperature(args: argparse.Namespace) -> float | str | None:
    """--temperature and --val checked before any work: None, a finite T > 0, or 'fit'.
    As in the pipeline's config, only for a single network, where tempering the network
    is tempering the predictive that T is fitted on."""
    if args.val is not None and args.temperature != "fit":
        raise UserError("--val: only used with --temperature fit")
    if args.temperature is None:
        return None
    if args.predictor not in SINGLE:
        raise UserError(
            "--temperature: temperature scaling tempers one network's predictive; "
            f"--predictor {args.predictor} averages several (use {', '.join(SINGLE)})"
        )
    if args.temperature == "fit":
        if args.val is None:
            raise UserError("--temperature fit: needs --val <DATA>, the set to fit T on")
        return "fit"
    try:
        t = float(args.temperature)
    except ValueError:
        t = math.nan
    if not (math.isfinite(t) and t > 0):
        raise UserError(f"--temperature: 'fit' or a finite number > 0 (got {args.temperature!r})")
    return t


def _labelled(
    spec: str, split: str, posterior: PosteriorFile, raw_dir: Path, fractions: tuple[Any, ...]
) -> Split:
    """The ``split`` of ``spec`` (``load_eval_split``), its labels within the posterior's."""
    from .data.prepared import load_eval_split

    data = load_eval_split(spec, raw_dir, posterior.input_shape, split, *fractions)
    if data.y.max().item() >= posterior.num_classes:
        raise UserError(
            f"{spec} has labels up to {data.y.max().item()}, "
            f"the posterior has {posterior.num_classes} classes"
        )
    return data


def _evaluate(args: argparse.Namespace) -> None:
    from .data.extra_sets import official_cifar_c, ood_images, shifted
    from .data.prepared import load_eval_split
    from .data.shift import parse_many as parse_shifts
    from .evaluation.evaluate import bn_inputs, evaluate
    from .posteriors.file import load_posterior
    from .runtime.io import write_csv, write_json
    from .seeding import derive_seed, resolve_device

    if args.predictor not in REGISTRY:
        raise UserError(
            f"--predictor: unknown {args.predictor!r}; choose one of {', '.join(REGISTRY)}"
        )
    if args.samples < 1:
        raise UserError(f"--samples: must be >= 1 (got {args.samples})")
    if args.batch_size < 1:
        raise UserError(f"--batch-size: must be >= 1 (got {args.batch_size})")
    if args.scale is not None and not (math.isfinite(args.scale) and args.scale >= 0):
        raise UserError(f"--scale: must be a finite number >= 0 (got {args.scale})")
    if args.seed is not None and not 0 <= args.seed <= SEED_MAX:
        raise UserError(f"--seed: must be in [0, 2**63 - 1], as the pipeline's (got {args.seed})")
    if not 0 < args.bn_update_fraction <= 1:
        raise UserError(f"--bn-update-fraction: must be in (0, 1] (got {args.bn_update_fraction})")
    _check_outputs(args)
    requested = _temperature(args)
    try:
        device = resolve_device(args.device, args.deterministic)
    except UserError as err:
        raise UserError(f"--{err}") from None  # "device: ..." as the flag the user gave
    posterior = load_posterior(args.posterior)
    d = posterior.data
    seed = (
        args.seed if args.seed is not None else derive_seed(d["seed"], "evaluate", args.predictor)
    )
    split_args = (args.raw_dir, posterior.input_shape)
    fractions = (d["seed"], d["test_fraction"], d["val_fraction"], d.get("resize_size"))
    test = _labelled(args.data, "test", posterior, args.raw_dir, fractions)
    val = None
    if requested == "fit":
        val = _labelled(args.val, "val", posterior, args.raw_dir, fractions)
    bn_x = None
    if not REGISTRY[args.predictor].own_buffers and posterior.has_batchnorm:
        train = load_eval_split(d["dataset"], *split_args, "train", *fractions)
        bn_x = bn_inputs(posterior, train, args.bn_update_fraction, d["seed"], device)
        log.info(
            "BatchNorm model: %d of the %d training images of %s for BN updates",
            len(bn_x),
            len(train),
            d["dataset"],
        )
    splits = {"test": (posterior.inputs(test.x, device), test.y)}
    try:
        shifts = parse_shifts(args.shift)
    except ValueError as err:
        raise UserError(f"--shift: {err}") from None
    official, served = None, []
    if any(s.cifar_c is not None for s in shifts):  # the published arrays where present
        import torch

        positions = torch.arange(len(test))
        official, served = official_cifar_c(args.raw_dir, args.data, d["seed"], test, positions)
    for name, images in shifted(test.x, shifts, d["seed"], official).items():
        splits[f"shift.{name}"] = (posterior.inputs(images, device), test.y)
    ood = {
        spec: posterior.inputs(
            ood_images(spec, posterior.input_shape, args.raw_dir, fractions), device
        )
        for spec in dict.fromkeys(args.ood)
    }

    def run(
        on: dict[str, tuple[torch.Tensor, torch.Tensor]],
        scored: dict[str, torch.Tensor],
        t: float | None,
    ) -> dict[str, Evaluation]:
        return evaluate(
            posterior,
            args.predictor,
            on,
            n_samples=args.samples,
            scale=args.scale,
            bn_x=bn_x,
            batch_size=args.batch_size,
            seed=seed,
            device=device,
            ood=scored,
            temperature=t,
            curves=(),
        )

    temperature = None if isinstance(requested, str) else requested
    if val is not None:
        # The stage's fit (stages/evaluate.py): the untempered predictor, with the same
        # samples, seed and BN images, on the validation set alone; T minimises its NLL.
        from .predictors.calibration import fit_temperature

        val_x = posterior.inputs(val.x, device)
        fitted = run({"val": (val_x, val.y)}, {}, None)["val"]
        try:
            temperature = fit_temperature(fitted.log_probs, val.y)
        except ValueError as err:
            raise UserError(f"--temperature fit on {args.val}: {err}") from None
        log.info("temperature %r fitted on %s (%d images)", temperature, args.val, len(val))
    results = run(splits, ood, temperature)
    result = results["test"]
    out: dict[str, object] = {
        **result.metrics,
        "predictor": args.predictor,
        "data": args.data,
        "seed": seed,
    }
    if temperature is not None:
        out["temperature"] = temperature
        if val is not None:
            out["temperature_fitted_on"] = args.val
    keys = ("accuracy", "nll", "ece", "brier", "entropy")
    if shifts:
        out["shift"] = {
            s.name: {k: results[f"shift.{s.name}"].metrics[k] for k in keys} for s in shifts
        }
    if any(s.cifar_c is not None for s in shifts):  # says which images CIFAR-10-C's are
        out["cifar_c_official"] = served
    if ood:
        out["ood"] = result.ood
    flag = "--out"
    try:
        write_json(args.out, out)
        if args.reliability is not None:
            flag = "--reliability"
            write_csv(args.reliability, result.reliability.rows())
    except OSError as err:
        if flag != "--out":  # the command failed: not one of its files without the other
            Path(args.out).unlink(missing_ok=True)
        raise UserError(f"{flag}: cannot write it: {err.strerror or err}") from None
    log.info("%s on %s: %s", args.predictor, args.data, result.metrics)


def _check_outputs(args: argparse.Namespace) -> None:
    """``--out`` and ``--reliability`` checked before any work, so that a path that cannot
    be written fails in a second, not after the evaluation, and neither names the
    posterior being read (it would be overwritten) or the other output."""
    named = {"--out": args.out, "--reliability": args.reliability}
    given = {flag: Path(p).resolve() for flag, p in named.items() if p is not None}
    posterior = Path(args.posterior).resolve()
    for flag, path in given.items():
        if path == posterior:
            raise UserError(f"{flag}: {path} is the --posterior file; name another file")
        if path.is_dir():
            raise UserError(f"{flag}: {path} is a folder; name a file")
        folder = next(p for p in path.parents if p.exists())  # where its folders would go
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            raise UserError(f"{flag}: cannot write under {folder}")
    if len(set(given.values())) < len(given):
        raise UserError("--reliability: the --out file; name another file")


def main(argv: Sequence[str] | None = None) -> None:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the command's parser, which names its own help
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    run_entry(numerics.pin)  # before torch: the same bytes as the pipeline's stages
    if args.command == "evaluate":
        run_entry(lambda: _evaluate(args))
    elif args.command == "track":
        run_entry(lambda: _track(args))


def _track(args: argparse.Namespace) -> None:
    """Send the tracking calls stages spooled while the store was unreachable."""
    from .tracking.source import default_store
    from .tracking.spool import bound_retries, check_reachable, pending, replay_all

    root = Path(args.root).resolve()
    if not root.is_dir():
        raise UserError(f"--root: {args.root} is not a folder (the project root, beside dvc.yaml)")
    uri, artifacts = default_store(root)
    folder = root / "runs" / "spool"
    waiting = pending(folder, uri)
    if not waiting:
        print(f"tracking: nothing spooled for {uri} in {folder}")
        return
    problem = check_reachable(uri)
    if problem is not None:
        raise UserError(problem.replace("; nothing was computed", "; the spool is kept"))
    bound_retries()
    spools, calls = replay_all(folder, uri, artifacts)
    print(f"tracking: sent {calls} spooled calls from {spools} spool(s) to {uri}")
