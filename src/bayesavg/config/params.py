"""The whole of params.yaml: the sections together, the cross-section rules, and loading
with one clear error line."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from ..runtime.errors import UserError
from .base import _NAME, Seed, _Section
from .data_model import DataParams, ModelParams
from .evaluation import EvaluateParams
from .methods import PROVIDES, REGISTRY
from .run import CheckpointParams, MonitorParams, ReportParams, TrackingParams
from .trajectories import (
    STARTS,
    AnyTrajectory,
    DSWAGTrajectory,
    LaplaceTrajectory,
    PretrainParams,
)


class Params(_Section):
    seed: Seed = 0
    # The seeds the report averages over: ``seed`` is the pipeline's own stages, every
    # other one the stages ``finetune_seed@<s>`` and ``evaluate_seed@<s>``, which rerun
    # every trajectory and predictor.
    seeds: list[Seed] = Field(default_factory=lambda: [0])
    device: str = "auto"
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    channels_last: Literal["auto"] | bool = "auto"
    compile: bool = False
    cuda_graphs: bool = False
    # CUDA's kernels: deterministic (a rerun gives the same bytes) or cuDNN's autotuned
    # fastest (``seeding.deterministic_kernels``); the CPU's are deterministic either way
    deterministic: bool = True
    data: DataParams = DataParams()
    model: ModelParams = ModelParams()
    pretrain: PretrainParams = PretrainParams()
    finetune: dict[str, AnyTrajectory]
    evaluate: EvaluateParams
    checkpoint: CheckpointParams = CheckpointParams()
    monitor: MonitorParams = MonitorParams()
    tracking: TrackingParams = TrackingParams()
    report: ReportParams = ReportParams()

    @model_validator(mode="after")
    def _check(self) -> Params:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device: {self.device!r} is not one of auto, cpu, cuda, cuda:N")
        if self.seed not in self.seeds:
            raise ValueError(
                f"seeds: {self.seeds} does not list the pipeline's seed {self.seed}, whose "
                f"results are its own stages; set both (-S seed={self.seed} -S "
                f"'seeds=[{self.seed}]')"
            )
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: {self.seeds} lists a seed twice")
        if self.precision == "fp16" and self.device == "cpu":
            raise ValueError("precision: fp16 needs a CUDA device; use bf16 or fp32 on the CPU")
        if (self.pretrain.kind == "weights") != (self.model.weights is not None):
            raise ValueError(
                "pretrain.kind: weights starts from model.weights, and model.weights is read "
                "only by it: set both or neither"
            )
        for name, traj in self.finetune.items():
            if not re.fullmatch(_NAME, name):
                raise ValueError(f"finetune.{name}: trajectory names are lower-case identifiers")
            if name in STARTS:
                raise ValueError(f"finetune.{name}: the name {name!r} is a stage's, not free")
            if getattr(traj, "members", None) is not None and traj.members > self.pretrain.members:
                raise ValueError(
                    f"finetune.{name}.members: {traj.members} members need pretrain.members "
                    f">= {traj.members} (it is {self.pretrain.members})"
                )
            if traj.start not in STARTS:
                origin = self.finetune.get(traj.start)
                if origin is None or traj.start == name:
                    raise ValueError(
                        f"finetune.{name}.start: {traj.start!r} is not pretrain, init or "
                        "another trajectory"
                    )
                if origin.start not in STARTS:
                    raise ValueError(
                        f"finetune.{name}.start: {traj.start} must itself start from pretrain "
                        "or init"
                    )
                if traj.kind == "hwa" and origin.kind != "vi":
                    raise ValueError(f"finetune.{name}.start: hwa continues a vi trajectory")
            if traj.kind == "laplace" and (
                traj.start == "init" or "members" in self._provides(traj.start)
            ):
                raise ValueError(
                    f"finetune.{name}.start: a Laplace approximation needs one trained network "
                    f"(pretrain or a trajectory that is not an ensemble), not {traj.start!r}"
                )
        for name in self.evaluate.plane.trajectories:
            traj = self.finetune.get(name)
            if traj is None or not traj.provides() & {"snapshots", "hwa"}:
                raise ValueError(
                    f"evaluate.plane.trajectories: {name!r} is not a finetune trajectory that "
                    "collects snapshots"
                )
        whole = list(self.evaluate.plane.trajectories) + list(
            self.evaluate.landscape.swag.trajectories
        )
        for name in whole:
            if getattr(self.finetune.get(name), "posterior", None) is not None:
                raise ValueError(
                    f"finetune.{name}.posterior: the loss plane and the SWAG directions need a "
                    f"posterior over every parameter; drop {name} from evaluate.plane / "
                    "evaluate.landscape.swag, or posterior.params"
                )
        sweep = self.evaluate.dswag_sweep
        if sweep.workers and not isinstance(self.finetune.get(sweep.trajectory), DSWAGTrajectory):
            raise ValueError(
                f"evaluate.dswag_sweep.trajectory: {sweep.trajectory!r} is not a finetune "
                "trajectory of kind dswag (or set workers: [])"
            )
        if sweep.workers and f"{sweep.trajectory}_sweep" in self.finetune:
            raise ValueError(
                f"finetune.{sweep.trajectory}_sweep: the name is the worker sweep's "
                f"(models/{sweep.trajectory}_sweep); rename the trajectory"
            )
        if sweep.workers and self.finetune[sweep.trajectory].start != "init":
            raise ValueError(
                f"evaluate.dswag_sweep.trajectory: {sweep.trajectory} must start from init "
                "(the sweep trains every W from the same fresh network, as the paper)"
            )
        for trajectory in self.evaluate.predictors:
            if trajectory not in self.finetune:
                raise ValueError(
                    f"evaluate.predictors.{trajectory}: {trajectory!r} is not a finetune "
                    f"trajectory ({', '.join(self.finetune)})"
                )
        for name, pred in self.evaluate.by_name.items():
            key = f"evaluate.predictors.{pred.trajectory}.{name}"
            if not re.fullmatch(_NAME, name):
                raise ValueError(f"{key}: predictor names are lower-case identifiers")
            traj = self.finetune[pred.trajectory]
            method = REGISTRY[pred.method]
            if method.stochastic_dropout and self.dropout_of(pred.trajectory) == 0:
                raise ValueError(
                    f"{key}.method: {pred.method} needs dropout; set finetune.{pred.trajectory}"
                    ".dropout (or model.dropout) above 0"
                )
            if method.needs not in traj.provides():
                raise ValueError(
                    f"{key}.method: {pred.method} needs {PROVIDES[method.needs]}, but finetune."
                    f"{pred.trajectory} is kind {traj.kind}"
                    + ("" if getattr(traj, "collect", None) else " with no 'collect' section")
                )
            if pred.scale is not None and not method.has_scale:
                raise ValueError(
                    f"{key}.scale: {pred.method} has no covariance scale; remove the key"
                )
            if isinstance(traj, LaplaceTrajectory):
                continue
            if isinstance(traj, DSWAGTrajectory):
                if pred.method == "swag" and traj.snapshots() < 2:
                    raise ValueError(
                        f"finetune.{pred.trajectory}.phase2: {key} needs >= 2 snapshots; "
                        "raise snapshots_per_client or client_fraction"
                    )
                continue
            per_epoch = traj.collect is not None and not traj.collect.every
            few = traj.collect is not None and traj.epochs - traj.collect.start_epoch < 2
            if pred.method == "swag" and per_epoch and traj.schedule.kind != "cyclic" and few:
                raise ValueError(
                    f"finetune.{pred.trajectory}.collect.start_epoch: {key} needs >= 2 "
                    "snapshots; collect from an earlier epoch or set collect.every"
                )
        self._check_landscape()
        return self

    def _check_landscape(self) -> None:
        """Every landscape entry names a trajectory with a centre (an ensemble has none)."""
        land = self.evaluate.landscape
        named = [
            *(
                (f"evaluate.landscape.lines.{n}.{end}", getattr(spec, end))
                for n, spec in land.lines.items()
                for end in ("a", "b")
            ),
            *(("evaluate.landscape.rays.centres", t) for t in land.rays.centres),
        ]
        for key, name in named:
            traj = self.finetune.get(name)
            if traj is None or "members" in traj.provides():
                raise ValueError(
                    f"{key}: {name!r} is not a finetune trajectory with one centre "
                    "(an ensemble has none)"
                )
        for name in land.swag.trajectories:
            traj = self.finetune.get(name)
            if traj is None or "snapshots" not in traj.provides():
                raise ValueError(
                    f"evaluate.landscape.swag.trajectories: {name!r} is not a finetune "
                    "trajectory that collects SWAG snapshots"
                )
            if isinstance(traj, DSWAGTrajectory) and traj.snapshots() < 2:
                raise ValueError(
                    f"evaluate.landscape.swag.trajectories: {name!r} has {traj.snapshots()} "
                    "snapshot; principal directions need >= 2"
                )

    def _provides(self, start: str) -> set[str]:
        traj = self.finetune.get(start)
        return traj.provides() if traj is not None else {"weights"}

    def dropout_of(self, trajectory: str) -> float | None:
        """The dropout rate a trajectory trains with: its own, its start's, or the model's
        (None: a torchvision or factory network's own layers decide)."""
        traj = self.finetune[trajectory]
        if traj.dropout is not None:
            return traj.dropout
        if traj.start not in STARTS:
            return self.dropout_of(traj.start)
        return self.model.effective_dropout()


_TAGS = ("trajectory", "dswag", "laplace")  # the trajectory union's tags: not keys of params.yaml


def _location(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a params.yaml key (validator names and union tags dropped)."""
    parts = [str(p) for p in loc]
    kept = [p for i, p in enumerate(parts) if not p.startswith("function-")]
    if len(kept) > 2 and kept[0] == "finetune" and kept[2] in _TAGS:
        del kept[2]
    return ".".join(kept)


# pydantic's name for one member of a union (``Literal["auto"] | bool``): not a params key
_MEMBER = re.compile(r"literal\[.*\]|constrained-\w+|bool|int|float|str")


def _union(errors: list[Any]) -> dict[str, Any] | None:
    """The first error with the union's members merged: its key without the member's name,
    and every member's requirement (``Input should be 'auto' or a valid boolean``)."""
    loc = errors[0]["loc"]
    if not loc or not _MEMBER.fullmatch(str(loc[-1])):
        return None
    alike = [
        e["msg"].removeprefix("Input should be ")
        for e in errors
        if len(e["loc"]) == len(loc)
        and e["loc"][:-1] == loc[:-1]
        and _MEMBER.fullmatch(str(e["loc"][-1]))
    ]
    if len(alike) < 2:
        return None
    return {**errors[0], "loc": loc[:-1], "msg": "Input should be " + " or ".join(alike)}


def _format_error(err: ValidationError) -> str:
    errors = err.errors()
    first = _union(errors) or errors[0]
    loc = _location(first["loc"])
    if first["type"] == "extra_forbidden":
        return f"params.yaml: unknown key {loc!r}; remove it or fix its spelling"
    if first["type"] == "missing":
        return f"params.yaml: missing key {loc!r}"
    msg = first["msg"].removeprefix("Value error, ")
    named = re.match(r"^([\w.]+): (.*)$", msg)
    if named:
        loc, msg = ".".join(filter(None, [loc, named[1]])), named[2]
    got = first.get("input")
    shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
    return f"params.yaml: {loc}: {msg}{shown}"


def parse_params(raw: Any) -> Params:
    """Validate a params mapping; raise ``UserError`` with one line on the first problem."""
    if not isinstance(raw, dict):
        raise UserError("params.yaml: the top level must be a mapping of sections")
    _check_finite(raw, "")  # first: a NaN would fail range checks with a puzzling message
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise UserError(_format_error(err)) from None


def _check_finite(node: Any, path: str) -> None:
    if isinstance(node, float) and not math.isfinite(node):
        raise UserError(f"params.yaml: {path}: must be a finite number (got {node})")
    if isinstance(node, dict):
        for k, v in node.items():
            _check_finite(v, f"{path}.{k}" if path else str(k))
    if isinstance(node, list):  # evaluate.shift.angles, *.sigma_multiples
        for i, v in enumerate(node):
            _check_finite(v, f"{path}.{i}")


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``params.yaml``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror}") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeys)  # a SafeLoader
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML{_where(err)}") from None
    return parse_params(raw)


class _UniqueKeys(yaml.SafeLoader):
    """``yaml.safe_load``, refusing a key given twice in one mapping: PyYAML would keep
    the last silently (and DVC's own reader refuses the file)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} given twice (lines {seen[key]} and {line})",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep)


def _where(err: yaml.YAMLError) -> str:
    """' at line L, column C: what is wrong', from the parser's marks where it has them."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{at}: {problem}"
