"""Pretrained weights for ``pretrain.kind: weights``: a torchvision weights name
(downloaded once into the raw-data folder, its sha256 prefix checked) or a local
``state_dict`` file (``torch.save`` or ``.safetensors``), loaded into a network whose
classification head is new (sized for the data, seeded).

Why not ``WeightsEnum.get_state_dict``: it caches under ``$TORCH_HOME``, outside the
pipeline's folders, and offline it fails with a traceback. Here the file lives beside
the datasets, is checked on every use, and a missing one is one line naming the file
and how to supply it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..data.pretrained_inputs import HASH, is_local, torchvision_weights
from ..runtime.errors import UserError
from ..runtime.io import sha256_file


def fetch(spec: str, raw_dir: str | Path) -> Path:
    """The weights file on disk: a local path as given, torchvision's in
    ``<raw_dir>/weights/``, downloaded when absent; checked against its sha256 prefix."""
    if is_local(spec):
        path = Path(spec)
        if not path.is_file():
            raise UserError(f"model.weights: {path} does not exist")
        return path
    url = torchvision_weights(spec).url
    path = Path(raw_dir) / "weights" / url.rsplit("/", 1)[-1]
    expected = HASH.search(path.name)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            torch.hub.download_url_to_file(url, str(path), progress=False)
        except Exception as err:  # URLError, HTTPError, timeouts: all mean "not downloadable"
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserError(
                f"model.weights: could not download {url} ({reason}); put that file at {path}, "
                "or set model.weights to a local state_dict file"
            ) from None
    if expected is not None and not sha256_file(path).startswith(expected[1]):
        raise UserError(
            f"model.weights: {path} does not match its sha256 prefix {expected[1]}; delete it "
            "to download it again"
        )
    return path


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """A ``state_dict`` from ``path``; a checkpoint holding one under ``state_dict`` or
    ``model`` is unwrapped, and DataParallel's ``module.`` prefix dropped."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state: Any = load_file(str(path))
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unpicklers and safetensors raise many types on bad bytes
        raise UserError(
            f"model.weights: cannot read {path} ({type(err).__name__}): not a state_dict "
            "saved by torch.save or safetensors"
        ) from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"model.weights: {path} does not hold a state_dict of tensors")
    return {k.removeprefix("module."): v for k, v in state.items()}


def load_into(
    model: nn.Module, state: dict[str, torch.Tensor], head: str | None, path: Path
) -> None:
    """Copy ``state`` into ``model``, all but the head's entries (``head`` is a module
    name; its weights stay as initialised) and those of a branch the network was built
    without (an attribute set to None: torchvision's auxiliary classifiers, which its own
    builder drops the same way); every other entry must match in name and shape."""
    skip = f"{head}." if head else None
    own = {k: v for k, v in model.state_dict().items() if skip is None or not k.startswith(skip)}
    given = {
        k: v
        for k, v in state.items()
        if (skip is None or not k.startswith(skip))
        and getattr(model, k.partition(".")[0], ...) is not None
    }
    missing = sorted(set(own) - set(given))
    extra = sorted(set(given) - set(own))
    wrong = sorted(k for k in set(own) & set(given) if own[k].shape != given[k].shape)
    if missing or extra or wrong:
        shown = [f"missing {missing[:3]}" * bool(missing), f"unexpected {extra[:3]}" * bool(extra)]
        shown.append(f"shape of {wrong[:3]}" * bool(wrong))
        raise UserError(
            f"model.weights: {path} does not fit the model ({'; '.join(s for s in shown if s)})"
        )
    with torch.no_grad():
        for name, value in model.state_dict(keep_vars=True).items():
            if name in given:
                value.copy_(given[name])
