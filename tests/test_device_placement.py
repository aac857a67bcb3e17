"""Tensors made in device-side code take their device from their inputs (issue 25).

The CUDA path cannot run in CI, so two CPU checks stand in for it:

- statically, every ``torch.<factory>(...)`` in the library either names its
  ``device=``, is moved at once (``.to(...)``), or sits in a place listed below
  with the reason it is host-side: a new ``torch.tensor(len(data))`` stacked with
  device tensors (DSWAG's ``_sums`` crashed ``finetune@dswag`` on the GPU that way)
  fails here, not on the GPU;
- dynamically, the training steps, per-batch normalisation and augmentation, and
  DSWAG's sums run on the ``meta`` device: any CPU tensor mixed into their
  arithmetic raises there exactly as it would on CUDA.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import bayesavg
from bayesavg.posteriors.vi import MeanFieldVI, svi_step
from bayesavg.training.augment import Augment, draw_epoch
from bayesavg.training.batches import Tensors, TrainData
from bayesavg.training.sam import sam_step
from bayesavg.training.steps import StepContext, sgd_step
from bayesavg.training.train import loss_and_accuracy

SRC = Path(bayesavg.__file__).parent
FACTORIES = {
    "tensor", "as_tensor", "from_numpy", "zeros", "ones", "full", "empty", "empty_strided",
    "arange", "linspace", "logspace", "eye", "rand", "randn", "randint", "randperm",
    "normal", "Generator",
}  # fmt: skip
# Modules that only ever hold host tensors: loading files into CPU tensors, index sets,
# and the report (bootstrap intervals, post-processing of saved predictions).
HOST_MODULES = {"prepared", "datasets", "ood_data", "federated"}
HOST_PACKAGES = {"report"}
# Functions that build on the CPU on purpose, each with why it is safe on CUDA.
HOST_FUNCTIONS = {
    "augment.draw_epoch": "crop offsets and flips from a CPU generator (the same draws on "
    "any device); the loop moves them to the device once per epoch",
    "train.train": "the shuffling generator is a CPU generator (the same order on any "
    "device); the permutation is moved to the device once per epoch",
    "rounds._evaluate": "rank 0's float64 totals on the host, added from results taken "
    "with .cpu(); broadcast() moves them to the device for NCCL",
    "monitoring.Monitoring.rows": "the monitored subset from a CPU generator (the same rows "
    "on any device), moved to the data's device once per run",
    "landscape.random_directions": "float64 directions from a CPU generator, the same on "
    "any device; callers move each one to the model's device",
    "landscape.principal_directions": "the SVD of a posterior file's deviations, which "
    "load on the CPU",
    "ieee.sqrt": "NumPy's square root of a float64 tensor that is on the CPU already (other "
    "devices take torch.sqrt)",
    "plane._axis": "axis values of the plane's grid: Python numbers for the caller",
    "predict.Predictor.__call__": "images from numpy, and placeholder labels; evaluate "
    "moves both to the device",
    "shift._warp": "a 2x3 affine matrix, moved to the images' device before use",
    "shift.rotate": "a 2x2 matrix for _warp",
    "shift._shear": "a 2x2 matrix for _warp",
    "shift._scale": "a 2x2 matrix for _warp",
    "shift._random_signs": "drawn from a CPU generator (the same on any device), moved",
    "shift.corrupt": "the corruption's CPU generator (the same images on any device)",
    "cifar_c.corrupt": "the benchmark's corruptions run in numpy on the host; the result is "
    "moved back to the images' device",
    "cifar_c.official": "the published arrays, read from disk into host memory as every dataset is",
    "extra_sets.official_cifar_c": "the test split's seeded order, drawn on the host as the "
    "data stage drew it, to index host arrays",
    "extra_sets.subset_positions": "the shifted subset's positions, drawn on the host as "
    "shift_subset draws them",
    "cli._evaluate": "the test split's positions on the host, to index host arrays",
    "evaluate.bn_rows": "the BatchNorm images' positions from a CPU generator (the same "
    "images on any device); Inputs moves them to where the images are",
    "storage.read_array": "a memory-mapped file is host memory by nature; training copies "
    "its batches to the device (batches.StreamedData)",
    "storage.channel_stats_streamed": "the data stage's statistics of uint8 images on the "
    "host, into a JSON manifest",
}


Parents = dict[ast.AST, ast.AST]


def _calls(path: Path, wanted: Callable[[ast.Call, Parents], bool]) -> list[tuple[str, int]]:
    """(qualified name of the enclosing function, line) of each call ``wanted`` accepts."""
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def where(node: ast.AST) -> str:
        names = []
        while node in parents:
            node = parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.append(node.name)
        return ".".join(reversed(names)) or "<module>"

    return [
        (where(node), node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and wanted(node, parents)
    ]


def _factory_without_device(node: ast.Call, parents: Parents) -> bool:
    """``torch.<factory>(...)`` with no ``device=``, not moved at once (``.to``/``.cuda``)."""
    func = node.func
    if not (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "torch"
        and func.attr in FACTORIES
    ):
        return False
    if any(k.arg == "device" for k in node.keywords):
        return False
    parent = parents.get(node)
    return not (isinstance(parent, ast.Attribute) and parent.attr in ("to", "cuda"))


def _factory_calls(path: Path) -> list[tuple[str, int]]:
    """(qualified function name, line) of each factory call without a device."""
    return _calls(path, _factory_without_device)


def _library_files() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if not HOST_PACKAGES & set(p.parts))


def test_every_tensor_built_in_device_side_code_names_its_device() -> None:
    unexplained, used = [], set()
    for path in _library_files():
        if path.stem in HOST_MODULES:
            continue
        for func, line in _factory_calls(path):
            key = f"{path.stem}.{func}"
            if key in HOST_FUNCTIONS:
                used.add(key)
            else:
                unexplained.append(f"{path.relative_to(SRC)}:{line} {func}")
    assert not unexplained, (
        "tensors built without device= in device-side code (take the device from an input: "
        "x.new_tensor, torch.zeros_like, device=x.device; or list the function in "
        "HOST_FUNCTIONS with why it is host-side):\n" + "\n".join(unexplained)
    )
    assert used == set(HOST_FUNCTIONS), f"stale HOST_FUNCTIONS: {set(HOST_FUNCTIONS) - used}"


def test_the_check_finds_a_host_tensor_mixed_into_device_code(tmp_path: Path) -> None:
    """The DSWAG bug as it was: the check must flag it."""
    bad = tmp_path / "rounds.py"
    bad.write_text(
        "import torch\n"
        "def _sums(loss, correct, data):\n"
        "    return torch.stack([loss, correct, torch.tensor(len(data), dtype=torch.float64)])\n"
        "def ok(x):\n"
        "    return torch.zeros(3, device=x.device) + torch.arange(3).to(x.device)\n"
    )
    assert _factory_calls(bad) == [("_sums", 3)]


# Code that runs every training step: a tensor made there from Python numbers is a copy
# from pageable host memory, which on CUDA waits for the stream (a host sync per step;
# resized_crop's fallback box was one).
PER_STEP = ["training/augment.py", "training/batches.py", "training/train.py"]
PER_STEP += ["training/graphs.py", "training/sam.py", "training/optim.py", "posteriors/vi.py"]
ONCE = {"optim.Adam.step": "each parameter's step counter, made at its first step"}


def _host_copy(node: ast.Call, parents: Parents) -> bool:
    """``x.new_tensor(...)``, or ``torch.tensor/as_tensor(..., device=...)``."""
    func = node.func
    if not isinstance(func, ast.Attribute):
        return False
    named = any(k.arg == "device" for k in node.keywords)
    return func.attr == "new_tensor" or (func.attr in ("tensor", "as_tensor") and named)


def test_no_tensor_is_made_from_host_numbers_in_a_training_step() -> None:
    found = {
        f"{Path(rel).stem}.{func}": line
        for rel in PER_STEP
        for func, line in _calls(SRC / rel, _host_copy)
    }
    assert found.keys() - ONCE.keys() == set(), (
        "per-step code makes device tensors from host numbers (a host sync per step on "
        f"CUDA): use Python scalars in the ops, or build once; else list in ONCE: {found}"
    )
    assert ONCE.keys() <= found.keys(), f"stale ONCE: {ONCE.keys() - found.keys()}"


def test_the_check_finds_resized_crops_old_fallback_box(tmp_path: Path) -> None:
    bad = tmp_path / "augment.py"
    bad.write_text(
        "def _boxes(box, h, w):\n"
        "    fallback = box.new_tensor([0, 0, h, w])\n"
        "    return torch.tensor(1.0, device=box.device) + torch.tensor(2.0)\n"
    )
    assert _calls(bad, _host_copy) == [("_boxes", 2), ("_boxes", 3)]


# --- the device-side code on the meta device -----------------------------------------

META = torch.device("meta")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.1)
        self.fc = nn.Linear(4 * 8 * 8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.drop(torch.relu(self.bn(self.conv(x)))).flatten(1))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(6, 3, 8, 8, device=META), torch.empty(6, dtype=torch.long, device=META)


@pytest.mark.parametrize("name", ["sgd", "sam"])
def test_training_steps_run_on_another_device(name: str) -> None:
    model = _Net().to(META)
    step = sgd_step if name == "sgd" else sam_step(0.05)
    loss, logits = step(model, *_batch(), StepContext())
    assert loss.device == logits.device == META
    assert all(p.grad is not None and p.grad.device == META for p in model.parameters())


@pytest.mark.parametrize("sam_rho", [0.0, 0.05])
def test_svi_step_runs_on_another_device(sam_rho: float) -> None:
    vi = MeanFieldVI(_Net(), 0.01).to(META)
    loss, _ = svi_step(n_train=100, sam_rho=sam_rho)(vi, *_batch(), StepContext())
    assert loss.device == META and vi.mu.grad is not None and vi.mu.grad.device == META


def test_batches_are_normalised_and_augmented_on_the_images_device() -> None:
    images = torch.empty(10, 3, 8, 8, dtype=torch.uint8, device=META)
    labels = torch.empty(10, dtype=torch.long, device=META)
    augment = Augment(crop_padding=2, flip=True)
    data = TrainData(images, labels, [0.5, 0.4, 0.3], [0.2, 0.2, 0.2], augment, True)
    draws = draw_epoch(10, augment, torch.Generator().manual_seed(0)).to(META)
    idx = torch.arange(4, device=META)
    x, y = data.batch(idx, draws)
    assert x.device == y.device == META and x.dtype == torch.float32
    inputs = data.inputs()
    assert inputs.shape == (10, 3, 8, 8) and inputs[0:4].device == META


def test_monitoring_and_dswag_sums_stay_on_the_device() -> None:
    from bayesavg.dswag.rounds import _sums

    model = _Net().to(META)
    data = Tensors(*_batch())
    assert _sums(model, data).device == META
    loss, accuracy = loss_and_accuracy(model, data)
    assert loss.device == accuracy.device == META
