"""The SWAG reference code (swa-gaussian) for ``scripts/gpu_check.py``: importing it beside
any gpytorch, and one epoch of its own training loop as its run_swag.py runs it."""

from __future__ import annotations

import importlib.util
import sys
import types

import numpy as np
import torch
from gpu_check_parts import LR, MODELS, MOMENTUM, WEIGHT_DECAY, Epoch, Size


def reference_package() -> types.ModuleType | str:
    """The SWAG reference code (swa-gaussian, ``make bench-install``), or why not.

    Its package imports gpytorch at the top for its covariance-based sampling only, and
    names classes gpytorch removed in 1.9 (``gpytorch.lazy.RootLazyTensor``): absent here
    (installed with --no-deps) and too new on GPU images. Empty stand-ins let ``import
    swag`` succeed whatever gpytorch there is, and nothing used here touches them
    (``utils.train_epoch``, ``SWAG.collect_model``); the real modules are put back."""
    if importlib.util.find_spec("swag") is None:
        return "swa-gaussian is not installed (make bench-install)"
    names = ("gpytorch", "gpytorch.lazy", "gpytorch.distributions", "gpytorch.settings")
    saved = {name: sys.modules.get(name) for name in names}
    stubs = {name: types.ModuleType(name) for name in names}
    for attr in ("RootLazyTensor", "DiagLazyTensor", "AddedDiagLazyTensor"):
        setattr(stubs["gpytorch.lazy"], attr, None)
    stubs["gpytorch.distributions"].MultivariateNormal = None  # type: ignore[attr-defined]
    sys.modules.update(stubs)
    try:
        import swag
    finally:
        for name, module in saved.items():
            if module is None:
                del sys.modules[name]
            else:
                sys.modules[name] = module
    return swag


def _reference(model_name: str, device: torch.device, x, y, size: Size) -> Epoch | str:
    """The reference code's loop as its run_swag.py runs it: ``swag.utils.train_epoch`` over
    a DataLoader of PIL images (as torchvision's CIFAR10 gives them) with the model's own
    ``transform_train`` (Resize 32, RandomCrop 32 padding 4, RandomHorizontalFlip,
    ToTensor, Normalize), shuffled, pinned memory, fp32, its own model classes
    (``PreResNet`` depth 20, ``WideResNet28x10``), then ``SWAG.collect_model`` (rank 20).
    Both models take no positional args: 0.1.9's ``SWAG(base, no_cov_mat, cov_mat_rank,
    max_num_models, ...)`` would read them as its own options."""
    swag = reference_package()
    if isinstance(swag, str):
        return swag
    from PIL import Image

    models = swag.models
    if model_name.startswith("preresnet"):
        base, args, kwargs = models.preresnet.PreResNet, [], MODELS[model_name][1]
        transform = models.PreResNet56.transform_train  # the same for every depth
    else:
        cfg = models.WideResNet28x10
        base, args, kwargs, transform = cfg.base, cfg.args, cfg.kwargs, cfg.transform_train
    assert not args, args
    model = base(num_classes=10, **kwargs).to(device)
    collector = swag.posteriors.SWAG(
        base, no_cov_mat=False, max_num_models=size.max_rank, num_classes=10, **kwargs
    ).to(device)
    images, labels = x.permute(0, 2, 3, 1).numpy(), y.tolist()

    class Images(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(labels)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            return transform(Image.fromarray(np.ascontiguousarray(images[i]))), labels[i]

    loader = torch.utils.data.DataLoader(
        Images(),
        batch_size=size.batch_size,
        shuffle=True,
        num_workers=size.workers,
        pin_memory=device.type == "cuda",
        # fork, whatever Python's default (forkserver from 3.14): the local Dataset class
        # cannot be pickled, and the workers do no CUDA work
        multiprocessing_context="fork" if size.workers else None,
    )
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)

    def epoch() -> None:
        swag.utils.train_epoch(loader, model, swag.losses.cross_entropy, opt, device)
        collector.collect_model(model)

    return epoch
