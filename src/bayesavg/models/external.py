"""Networks from outside the registry: torchvision's classification builders
(``torchvision:<builder>``) and a user's own factory (``factory:<module>:<function>``).

Both become plain ``nn.Module``s like the registry's, so every posterior, BN
recomputation and sampler works on them unchanged. A posterior file stores the name
with its prefix and the constructor options, never code: rebuilding a factory's network
imports the user's module, which must be importable where the file is used (the
pipeline's repository root, or ``PYTHONPATH``).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from torch import nn

from ..runtime.errors import UserError
from .pooling import deterministic_pooling

TORCHVISION = "torchvision:"
FACTORY = "factory:"
# Builders whose training-mode forward also returns auxiliary classifiers' logits (a
# namedtuple the loss cannot take): built without them, as torchvision builds them by
# default when it loads weights; the pipeline trains, averages and samples the main
# classifier. ``init_weights`` named: torchvision's own initialisation, without its
# FutureWarning about the default.
AUXILIARY = {"googlenet", "inception_v3"}


def is_external(name: str) -> bool:
    return name.startswith((TORCHVISION, FACTORY))


def torchvision_builders() -> list[str]:
    """Every classification builder torchvision has (not detection, video, ...)."""
    import torchvision.models

    return sorted(torchvision.models.list_models(module=torchvision.models))


def torchvision_model(
    builder: str, in_shape: tuple[int, int, int], num_classes: int, **options: Any
) -> nn.Module:
    """``torchvision.models.get_model(builder, num_classes=...)``, random weights: its head
    sized for the data (pretrained weights are loaded afterwards, all but the head's)."""
    builders = torchvision_builders()
    if builder not in builders:
        near = [b for b in builders if b.startswith(builder[:3])][:6] or builders[:6]
        raise UserError(
            f"model.name: torchvision has no classification builder {builder!r}; "
            f"e.g. {', '.join(near)} (torchvision.models.list_models())"
        )
    if in_shape[0] != 3:
        raise UserError(
            f"model.name: torchvision:{builder} takes RGB images (3 channels); the data has "
            f"{in_shape[0]}"
        )
    if builder in AUXILIARY:
        if options.get("aux_logits"):
            raise UserError(
                f"model.options.aux_logits: torchvision:{builder}'s auxiliary classifiers are "
                "not trained here (the posterior is over the main classifier); remove it"
            )
        options = {"aux_logits": False, "init_weights": True, **options}
    import torchvision.models

    return _construct(
        lambda: torchvision.models.get_model(
            builder, weights=None, num_classes=num_classes, **options
        ),
        f"torchvision:{builder}",
        options,
    )


def load_factory(spec: str) -> Callable[..., nn.Module]:
    """The function named by ``package.module:function``, imported from ``sys.path`` or,
    failing that, the working directory (the repository root in a pipeline stage)."""
    module_name, _, function = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if os.getcwd() in sys.path or err.name != module_name.split(".")[0]:
            raise UserError(f"model.factory: cannot import {module_name} ({err})") from None
        sys.path.append(os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as again:
            raise UserError(
                f"model.factory: cannot import {module_name} ({again}); run from the "
                "repository root or put its folder on PYTHONPATH"
            ) from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise UserError(f"model.factory: {module_name} has no function {function!r}")
    return fn


def factory_model(
    spec: str, in_shape: tuple[int, int, int], num_classes: int, **options: Any
) -> nn.Module:
    """``function(input_shape, num_classes, **options)`` of the user's module: an
    ``nn.Module`` whose output is ``num_classes`` logits."""
    fn = load_factory(spec)
    model = _construct(lambda: fn(tuple(in_shape), num_classes, **options), spec, options)
    if not isinstance(model, nn.Module):
        raise UserError(f"model.factory: {spec} returned {type(model).__name__}, not an nn.Module")
    return model


def _construct(build: Callable[[], nn.Module], what: str, options: dict[str, Any]) -> nn.Module:
    """``build()``, a constructor's complaint about its arguments as one line."""
    try:
        return build()
    except TypeError as err:
        if not options:
            raise
        raise UserError(f"model: {what} does not take options {options} ({err})") from None


def build_external(
    name: str, in_shape: tuple[int, int, int], num_classes: int, options: dict[str, Any]
) -> nn.Module:
    """The network, its adaptive pooling made deterministic on CUDA (``pooling``)."""
    if name.startswith(TORCHVISION):
        model = torchvision_model(name.removeprefix(TORCHVISION), in_shape, num_classes, **options)
    else:
        model = factory_model(name.removeprefix(FACTORY), in_shape, num_classes, **options)
    return deterministic_pooling(model)


def head_name(model: nn.Module, num_classes: int) -> str | None:
    """The classification head: the last ``nn.Linear`` (or 1x1 ``nn.Conv2d``, as
    SqueezeNet's) producing ``num_classes`` outputs, by module name; None if there is
    none (a factory's network may end otherwise)."""
    found = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.out_features == num_classes:
            found = name
        elif isinstance(module, nn.Conv2d) and module.out_channels == num_classes:
            found = name if module.kernel_size == (1, 1) else found
    return found
