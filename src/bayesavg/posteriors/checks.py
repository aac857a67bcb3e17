"""Checks of every block of a posterior file, each failure said in one line.

A file that loads but whose collector, HWA or samples block is malformed
would otherwise fail with a traceback deep inside sampling, or quietly give
NaN metrics. Each checker looks at one block completely: presence and type
of every key, integer fields and how they relate, tensor shapes and dtypes,
and finite values. Every tensor is read once and never copied, so the checks
stay cheap enough to run in every evaluate stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .last_layer_laplace import check_state, last_layer_name

Shape = tuple[int | None, ...]
"""An expected tensor shape; None stands for any size (printed as ``k``)."""


class PosteriorFileError(ValueError):
    """One thing wrong with a posterior file, in one line; the loader adds the path."""


def _describe(value: Any) -> str:
    """A short one-line description of a value for messages: the repr of small plain values."""
    if isinstance(value, bool | int | float | str | list | tuple) and len(repr(value)) <= 40:
        return f"{value!r} ({type(value).__name__})"
    return f"a {type(value).__name__}"


def _fmt(shape: Shape | torch.Size) -> str:
    return "(" + ", ".join("k" if s is None else str(s) for s in shape) + ")"


def as_block(value: Any, where: str) -> Mapping[str, Any]:
    """``value`` as a dict block, or a one-line error naming it."""
    if not isinstance(value, dict):
        raise PosteriorFileError(f"{where} is {_describe(value)}, expected a dict")
    return value


def get(block: Mapping[str, Any], key: str, where: str = "") -> Any:
    """``block[key]``; a missing key is named ``where.key`` (``key`` at the top level)."""
    if key not in block:
        raise PosteriorFileError(f"{where}.{key} is missing" if where else f"{key} is missing")
    return block[key]


def check_int(value: Any, where: str, minimum: int = 0) -> int:
    """A plain int (not a bool, not a float) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise PosteriorFileError(f"{where} is {_describe(value)}, expected an int")
    if value < minimum:
        raise PosteriorFileError(f"{where} is {value}, expected >= {minimum}")
    return value


def check_number(value: Any, where: str) -> float:
    """A finite int or float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PosteriorFileError(f"{where} is {_describe(value)}, expected a number")
    if not float("-inf") < value < float("inf"):
        raise PosteriorFileError(f"{where} is {value}, expected a finite number")
    return float(value)


def check_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise PosteriorFileError(f"{where} is {_describe(value)}, expected a string")
    return value


def _all_finite(t: torch.Tensor) -> bool:
    """Whether every value is finite; row by row, so the temporary mask stays one row."""
    if t.dim() >= 2:
        return all(bool(torch.isfinite(row).all()) for row in t)
    return bool(torch.isfinite(t).all())


def check_finite(t: torch.Tensor, where: str) -> None:
    if not _all_finite(t):
        bad = t.numel() - int(torch.isfinite(t).sum())  # only on failure: the count for the message
        raise PosteriorFileError(f"{where} has non-finite values ({bad} of {t.numel()})")


def check_tensor(value: Any, where: str, shape: Shape, why: str = "") -> torch.Tensor:
    """A floating tensor of ``shape`` with finite values; ``why`` explains the shape."""
    if not isinstance(value, torch.Tensor):
        raise PosteriorFileError(
            f"{where} is {_describe(value)}, expected a tensor of shape {_fmt(shape)}{why}"
        )
    if value.dim() != len(shape) or any(
        s is not None and n != s for n, s in zip(value.shape, shape, strict=True)
    ):
        raise PosteriorFileError(
            f"{where} has shape {_fmt(value.shape)}, expected {_fmt(shape)}{why}"
        )
    if not value.dtype.is_floating_point:
        raise PosteriorFileError(f"{where} has dtype {value.dtype}, expected a floating dtype")
    check_finite(value, where)
    return value


def check_buffers(value: Any, where: str, expected: Mapping[str, torch.Tensor]) -> None:
    """Exactly the model's buffers, each of its shape; floating ones finite.

    ``expected`` holds the model's buffers (meta tensors do: only shape and
    dtype are read). Integer buffers (BatchNorm's ``num_batches_tracked``)
    must stay integer.
    """
    buffers = as_block(value, where)
    for name in buffers:
        if name not in expected:
            raise PosteriorFileError(f"{where} has unexpected key {name!r} (not a model buffer)")
    for name, model_buffer in expected.items():
        buffer = get(buffers, name, where)
        key = f"{where}.{name}"
        if model_buffer.dtype.is_floating_point:
            check_tensor(buffer, key, tuple(model_buffer.shape), " (the model's buffer)")
            continue
        if not isinstance(buffer, torch.Tensor) or buffer.shape != model_buffer.shape:
            got = _fmt(buffer.shape) if isinstance(buffer, torch.Tensor) else _describe(buffer)
            raise PosteriorFileError(
                f"{key} is {got}, expected a tensor of shape {_fmt(model_buffer.shape)}"
            )
        if buffer.dtype.is_floating_point or buffer.dtype.is_complex:
            raise PosteriorFileError(
                f"{key} has dtype {buffer.dtype}, expected an integer dtype like the model's"
            )


def check_collector(value: Any, where: str, num_params: int, max_rank: int | None = None) -> int:
    """A ``MomentCollector.state_dict()`` over ``num_params`` values; returns n_collected.

    ``max_rank``, when given, is the rank the block must have (HWA's var and
    rho collectors keep no deviations).
    """
    state = as_block(value, where)
    d = check_int(get(state, "num_params", where), f"{where}.num_params", minimum=1)
    if d != num_params:
        raise PosteriorFileError(
            f"{where}.num_params is {d}, expected {num_params} (the parameters the posterior "
            "covers)"
        )
    rank = check_int(get(state, "max_rank", where), f"{where}.max_rank")
    if max_rank is not None and rank != max_rank:
        raise PosteriorFileError(f"{where}.max_rank is {rank}, expected {max_rank}")
    n = check_int(get(state, "n_collected", where), f"{where}.n_collected")
    check_tensor(get(state, "mean", where), f"{where}.mean", (d,))
    m2 = check_tensor(get(state, "m2", where), f"{where}.m2", (d,))
    if not bool((m2 >= 0).all()):
        bad = int((m2 < 0).sum())
        raise PosteriorFileError(
            f"{where}.m2 has negative values ({bad} of {d}); it is a sum of squared deviations"
        )
    rows = min(n, rank)
    check_tensor(
        get(state, "deviations", where),
        f"{where}.deviations",
        (rows, d),
        " (min(n_collected, max_rank) rows)",
    )
    return n


def check_input(shape: Any, mean: Any, std: Any) -> None:
    """(channels, height, width) and one normalisation mean and std (> 0) per channel."""
    if (
        not isinstance(shape, tuple)
        or len(shape) != 3
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape)
    ):
        raise PosteriorFileError(
            f"input.shape is {_describe(shape)}, expected 3 positive ints (channels, height, width)"
        )
    for key, values in (("mean", mean), ("std", std)):
        if not isinstance(values, list) or len(values) != shape[0]:
            raise PosteriorFileError(
                f"input.{key} is {_describe(values)}, expected a list of {shape[0]} numbers "
                "(one per channel)"
            )
        for i, v in enumerate(values):
            check_number(v, f"input.{key}[{i}]")
    for i, v in enumerate(std):
        if v <= 0:
            raise PosteriorFileError(f"input.std[{i}] is {v}, expected > 0")


def check_data(value: Any) -> None:
    """The split a posterior was trained on, which evaluation redraws."""
    data = as_block(value, "data")
    check_str(get(data, "dataset", "data"), "data.dataset")
    check_int(get(data, "seed", "data"), "data.seed")
    for key in ("test_fraction", "val_fraction"):
        fraction = check_number(get(data, key, "data"), f"data.{key}")
        if not 0 <= fraction < 1:
            raise PosteriorFileError(f"data.{key} is {fraction}, expected in [0, 1)")
    if "resize_size" in data:
        check_int(data["resize_size"], "data.resize_size", minimum=1)


def check_covers(value: Any, names: list[str]) -> None:
    """The names of the parameter tensors a posterior covers, in the model's order."""
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise PosteriorFileError(f"covers is {_describe(value)}, expected a list of names")
    order = {name: i for i, name in enumerate(names)}
    unknown = [v for v in value if v not in order]
    if unknown:
        raise PosteriorFileError(f"covers names {unknown[:3]}, not parameters of the model")
    twice = sorted({v for v in value if value.count(v) > 1})
    if twice:  # counted twice in the collector's length, found once by covered_positions
        raise PosteriorFileError(f"covers names {twice[:3]} more than once")
    if [order[v] for v in value] != sorted(order[v] for v in value):
        raise PosteriorFileError("covers lists the parameters out of the model's order")


HWA_PARTS = ("mu", "var", "rho")


def check_hwa(value: Any, num_params: int) -> None:
    """Three collectors fed by the same snapshots; var and rho keep no deviations."""
    hwa = as_block(value, "hwa")
    counts = {
        part: check_collector(
            get(hwa, part, "hwa"), f"hwa.{part}", num_params, None if part == "mu" else 0
        )
        for part in HWA_PARTS
    }
    for part in HWA_PARTS[1:]:
        if counts[part] != counts["mu"]:
            raise PosteriorFileError(
                f"hwa.{part}.n_collected is {counts[part]}, expected {counts['mu']} as in "
                "hwa.mu (every snapshot feeds all three collectors)"
            )


def check_samples(
    value: Any,
    num_params: int,
    model_buffers: Mapping[str, torch.Tensor],
    covered: int | None = None,
) -> None:
    """k >= 1 weight vectors, with k buffer dicts (ensemble members) or None (SGLD), and
    optionally k SWAG collectors (``collectors``: each member's snapshots, MultiSWAG) over
    ``covered`` parameters (default: all)."""
    samples = as_block(value, "samples")
    theta = check_tensor(get(samples, "theta", "samples"), "samples.theta", (None, num_params))
    k = theta.shape[0]
    if k < 1:
        raise PosteriorFileError("samples.theta has no rows, expected at least one sample")
    buffers = get(samples, "buffers", "samples")
    if buffers is not None:
        for i, member in enumerate(_per_row(buffers, "samples.buffers", k)):
            check_buffers(member, f"samples.buffers[{i}]", model_buffers)
    collectors = samples.get("collectors")  # checked whether or not members have buffers
    if collectors is None:
        return
    for i, collector in enumerate(_per_row(collectors, "samples.collectors", k)):
        check_collector(collector, f"samples.collectors[{i}]", covered or num_params)


def _per_row(value: Any, where: str, k: int) -> list[Any] | tuple[Any, ...]:
    """A list with one entry per row of samples.theta, or a one-line error naming it."""
    if not isinstance(value, list | tuple):
        raise PosteriorFileError(
            f"{where} is {_describe(value)}, expected None or a list of {k} dicts"
        )
    if len(value) != k:
        raise PosteriorFileError(
            f"{where} has {len(value)} entries, expected {k} (one per row of samples.theta)"
        )
    return value


def check_laplace(value: Any, model: torch.nn.Module) -> None:
    """A last-layer Laplace state (``posteriors.last_layer_laplace``) whose layer is the
    model's last linear layer, with its shape."""
    state = as_block(value, "laplace")
    layer = last_layer_name(model)
    if state.get("layer") != layer:
        raise PosteriorFileError(
            f"laplace.layer is {_describe(state.get('layer'))}, expected {layer!r} (the "
            "network's last linear layer)"
        )
    found = model.get_submodule(layer)
    size = sum(p.numel() for p in found.parameters())
    try:
        check_state(dict(state), size)
    except ValueError as err:
        raise PosteriorFileError(str(err)) from None
