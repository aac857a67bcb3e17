"""The CIFAR-10 preset's SWAG protocol in images, for ``gpu_check --speed``'s projection of
its wall time, ours against the SWAG reference code's, from measured training images/s.

Everything is read from ``presets/cifar10.yaml`` (the ``swag`` trajectory, ``data``,
``evaluate.n_samples``, ``monitor``), so the projection follows the preset:

- training: ``epochs`` epochs of CIFAR-10's 50,000 training images less the preset's
  validation share (45,000);
- our monitoring, as ``training.monitoring.Monitoring`` decides it: on each due epoch
  the iterate on its share of the validation and test images and, once a snapshot
  exists, the running average's BatchNorm pass on its share of the training images and
  its test pass (``trajectories.run._monitor``);
- the reference's monitoring, as ``run_swag.py``'s epoch loop decides it (the paper's
  command, ``--eval_freq 5`` and ``--swa_start`` = the preset's first snapshot epoch):
  the test split at epoch 0, every 5th and the last; once collecting, the test
  predictions of every epoch for its SGD ensemble and, on evaluation epochs, the SWAG
  mean's BatchNorm pass over the training images and its test pass;
- the evaluation, the same for both: ``n_samples`` samples, each a BatchNorm pass over
  the training images and a forward pass over the test images.

Forward images (monitoring, evaluation) go at the forward images/s measured for one
evaluation sample of each (``gpu_check_forward``) where both were measured; otherwise a
forward image is assumed to cost a third of a training image (a step is a forward and a
backward of twice its cost), which flatters whichever side's evaluation is slower.

The preset's evaluate stage also scores the validation split, CIFAR-10-C and the OOD
sets with every sample (about twice the forward images); the reference's protocol does
not, so neither projection counts them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bayesavg.training.monitoring import Monitoring

PRESET = Path(__file__).resolve().parents[1] / "presets" / "cifar10.yaml"
CIFAR10_TRAIN, CIFAR10_TEST = 50_000, 10_000  # the official splits
FORWARD_COST = 1 / 3  # of a training image
REFERENCE_EVAL_FREQ = 5  # run_swag.py's --eval_freq default, the paper's command
PROTOCOL_GOAL = 5.0


@dataclass(frozen=True)
class Protocol:
    epochs: int
    first_snapshot: int  # 0-based epoch after which the first snapshot is taken
    train: int
    val: int
    test: int
    samples: int
    eval_batch: int
    every: int
    fraction: float

    @classmethod
    def from_preset(cls, raw: dict[str, Any]) -> Protocol:
        swag, monitor = raw["finetune"]["swag"], raw.get("monitor", {})
        val = round(CIFAR10_TRAIN * raw["data"]["val_fraction"])
        return cls(
            epochs=swag["epochs"],
            first_snapshot=swag["collect"]["start_epoch"],
            train=CIFAR10_TRAIN - val,
            val=val,
            test=CIFAR10_TEST,
            samples=raw["evaluate"]["n_samples"],
            eval_batch=raw["evaluate"].get("batch_size", 1000),
            every=monitor.get("every", 1),
            fraction=monitor.get("fraction", 1.0),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "preset": PRESET.name,
            "epochs": self.epochs,
            "train_images": self.train,
            "test_images": self.test,
            "samples": self.samples,
            "eval_batch": self.eval_batch,
            "monitor": {"every": self.every, "fraction": self.fraction},
            "forward_cost": round(FORWARD_COST, 3),
            "ours_monitored_forward_images": ours_monitored(self),
            "reference_monitored_forward_images": reference_monitored(self),
        }


@functools.cache
def cifar10() -> Protocol:
    """The preset's protocol, read once (the speed part projects after every round)."""
    return Protocol.from_preset(yaml.safe_load(PRESET.read_text()))


def ours_monitored(p: Protocol) -> float:
    """Our monitoring's forward images over the protocol (the module docstring)."""
    monitoring = Monitoring(p.every, p.fraction)

    def share(n: int) -> int:
        return min(n, max(1, round(p.fraction * n)))  # Monitoring.rows' count

    images = 0
    for epoch in range(1, p.epochs + 1):  # 1-based, as Monitoring.due counts
        if monitoring.due(epoch, p.epochs):
            images += share(p.val) + share(p.test)
            if epoch > p.first_snapshot:  # the snapshot after 0-based epoch first_snapshot
                images += share(p.train) + share(p.test)
    return float(images)


def reference_monitored(p: Protocol) -> float:
    """The reference's monitoring's forward images over the protocol, as ``run_swag.py``
    decides them (0-based epochs; it collects where ``epoch + 1 > swa_start``)."""
    freq, images = REFERENCE_EVAL_FREQ, 0
    for epoch in range(p.epochs):
        evaluates = epoch == 0 or epoch % freq == freq - 1 or epoch == p.epochs - 1
        images += p.test * evaluates
        if epoch + 1 > p.first_snapshot:
            images += p.test + (p.train + p.test) * evaluates
    return float(images)


def protocol_hours(
    p: Protocol, train_images_per_s: float, monitored: float, forward_per_s: float | None = None
) -> float:
    """The protocol at ``train_images_per_s``: training, ``monitored`` forward images of
    monitoring and the evaluation, at ``forward_per_s`` (None: at ``FORWARD_COST``)."""
    forward = p.samples * (p.train + p.test) + monitored
    seconds = p.epochs * p.train / train_images_per_s
    if forward_per_s is None:
        seconds += FORWARD_COST * forward / train_images_per_s
    else:
        seconds += forward / forward_per_s
    return seconds / 3600


def projection(
    ours: float,
    reference: float,
    forward: dict[str, float] | None = None,
    fastest: float | None = None,
) -> dict[str, Any]:
    """Hours of ours and of the reference at their training images/s (and, where both
    are given, their measured forward images/s), the reference with and without its own
    monitoring, their ratios, and the goal's verdict (ours as by default: deterministic
    kernels). ``fastest``: ours with ``deterministic: false``'s kernels, beside it."""
    p = cifar10()
    forward = forward or {}
    measured = "ours" in forward and "reference_swag_code" in forward
    mine = forward["ours"] if measured else None
    theirs = forward["reference_swag_code"] if measured else None
    raw = {
        "ours": protocol_hours(p, ours, ours_monitored(p), mine),
        "reference_swag_code": protocol_hours(p, reference, reference_monitored(p), theirs),
        "reference_swag_code_unmonitored": protocol_hours(p, reference, 0.0, theirs),
    }
    if fastest is not None:
        raw["ours_deterministic_false"] = protocol_hours(p, fastest, ours_monitored(p), mine)
    ratio = raw["reference_swag_code"] / raw["ours"]
    out = {
        "protocol_forward": "measured" if measured else "assumed a third of a training image",
        "protocol_hours": {k: round(v, 2) for k, v in raw.items()},
        "protocol_reference_over_ours": round(ratio, 2),
        "protocol_unmonitored_reference_over_ours": round(
            raw["reference_swag_code_unmonitored"] / raw["ours"], 2
        ),
        "goal_protocol": PROTOCOL_GOAL,
        "protocol_goal_met": ratio >= PROTOCOL_GOAL,
    }
    if fastest is not None:
        fast = raw["reference_swag_code"] / raw["ours_deterministic_false"]
        out["protocol_reference_over_ours_deterministic_false"] = round(fast, 2)
    return out
