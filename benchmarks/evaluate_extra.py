"""(d) SWAG evaluation with the pipeline's default shifts (13 rotations, 7
corruptions of a 200-image test subset) and 1,000 OOD images predicted in the
same pass, against S forward passes over all the images evaluated: the extra
sets must cost forwards only."""

from __future__ import annotations

import statistics
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import torch
from common import INPUT_SHAPE, SEED, TARGET_RATIO, Settings, mnist5k, swag_posterior
from evaluate import run_bound, run_ours
from timing import Variant, interleave, per_round_ratios, ratio, ratio_fields, rounded, warm_up

from bayesavg.config import load_params
from bayesavg.data.extra_sets import ood_images, shift_subset, shifted
from bayesavg.data.prepared import to_input
from bayesavg.data.shift import shifts
from bayesavg.training.train import Tensors

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


def extra_inputs(device: torch.device) -> tuple[dict[str, Tensors], torch.Tensor]:
    """The default params' shifted test subsets (by name) and OOD images, normalised."""
    e = load_params(PARAMS).evaluate
    prep = mnist5k()
    mean, std = prep.manifest["mean"], prep.manifest["std"]
    subset = shift_subset(prep.test, e.shift.n_points, SEED)
    listed = shifts(e.shift.angles, e.shift.corruptions, e.shift.severity)
    splits = {
        f"shift.{name}": Tensors(to_input(x, mean, std, device), subset.y.to(device))
        for name, x in shifted(subset.x, listed, SEED).items()
    }
    with tempfile.TemporaryDirectory() as raw:
        ood = ood_images(e.ood.sets[0], INPUT_SHAPE, raw, (SEED, 0.2, 0.1), e.ood.n_points, SEED)
    return splits, to_input(ood, mean, std, device)


def bench_evaluate_extra(train_data: Tensors, test: Tensors, s: Settings) -> dict[str, Any]:
    """Clean test split, every shift and the OOD set in one pass, against the bound of S
    forwards over all those images, and against the clean split alone."""
    extra, ood = extra_inputs(test.x.device)
    everything = torch.cat([test.x, *(t.x for t in extra.values()), ood])
    posterior = swag_posterior("lenet5", train_data, s)
    args = (posterior, test, None, s.n_samples, s.eval_batch_size)
    variants: dict[str, Variant] = {
        "ours_all": partial(run_ours, *args, extra, ood),
        "bound_all": partial(run_bound, posterior, Tensors(everything, test.y), *args[2:]),
        "ours_test": partial(run_ours, *args),
    }
    warm_up(variants)
    seconds = interleave(variants, s.eval_rounds)
    to_bound = ratio(seconds["ours_all"], seconds["bound_all"])
    return {
        "images": {
            "test": len(test),
            "shifted": sum(len(t) for t in extra.values()),
            "ood": ood.shape[0],
        },
        "n_samples": s.n_samples,
        **ratio_fields("ratio_to_bound", to_bound, 4),
        "cost_vs_test_only": round(
            statistics.median(per_round_ratios(seconds["ours_all"], seconds["ours_test"])), 3
        ),
        "image_ratio_vs_test_only": round(everything.shape[0] / len(test), 3),
        "target_ratio": TARGET_RATIO,
        "seconds_per_round": rounded(seconds),
    }


def show(ex: dict[str, Any]) -> None:
    """(d) in one line: ours over the bound, and the cost over the clean split alone."""
    print(
        f"\n(d) evaluation with shifts and OOD in the same pass, lenet5, {ex['images']}: "
        f"ours / bound {ex['ratio_to_bound']} (range {ex['ratio_to_bound_range']}, target <= "
        f"{ex['target_ratio']}); cost vs test only {ex['cost_vs_test_only']} for "
        f"{ex['image_ratio_vs_test_only']}x the images"
    )
