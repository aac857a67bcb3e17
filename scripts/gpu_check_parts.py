"""The short-run parts of ``scripts/gpu_check.py`` (CPU vs CUDA, bf16 vs fp32), each a
function returning a dict, and the helpers all parts share (``determinism`` is in
``gpu_check_determinism.py``)."""

from __future__ import annotations

import functools
import hashlib
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from gpu_check_compare import PREDICTORS, compare, without_theta
from gpu_check_runner import Context

from bayesavg.config import Params, parse_params
from bayesavg.data.datasets import Split
from bayesavg.data.prepared import NORMALISATION, Prepared, prepare
from bayesavg.evaluation.evaluate import evaluate
from bayesavg.trajectories import compute_for, finetune, pretrain_members

ROOT = Path(__file__).resolve().parents[1]
MEAN, STD = NORMALISATION["cifar10"]
# The networks the throughput parts train (name, kwargs), and their SGD settings.
MODELS = {
    "preresnet20": ("preresnet", {"depth": 20}),
    "preresnet164": ("preresnet", {"depth": 164}),
    "wideresnet28x10": ("wideresnet28x10", {}),
    "resnet50": ("torchvision:resnet50", {}),  # issue 28: a user's ImageNet network
}
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 0.0003
Epoch = Callable[[], None]
# Before the drift, the arithmetic: one batch's gradient from one LeNet-5 initialisation
# on the CPU and on CUDA, both fp32 (cuDNN in IEEE fp32, not TF32: seeding.
# deterministic_kernels), differ by rounding only, summed in another order: about 1e-6
# relative; a wrong kernel, layout or dtype differs by O(1).
GRADIENT_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Size:
    """How much each part does: ``full`` on a GPU (each part well inside its time box on
    an H100, see gpu_check.PARTS), ``quick`` for a smoke run on the CPU in seconds."""

    pretrain_epochs: int  # short pretrain + SWAG runs on mnist5k (cpu_vs_cuda, bf16_vs_fp32,
    swag_epochs: int  # determinism)
    train_images: int | None  # mnist5k training and test images kept (None: all 3,200
    short_test_images: int | None  # and 1,000)
    swag_samples: int
    cifar_train: int  # determinism's PreResNet-20 run: CIFAR-shaped images, its batch
    cifar_batch: int
    batch_size: int  # throughput: CIFAR-shaped batches of batch_size per epoch (batches,
    batches: tuple[tuple[str, int], ...]  # by model), rounds at most, the reference's
    rounds: int  # loader workers, the SWAG rank of ours and of the reference
    workers: int
    max_rank: int
    bn_images: int  # evaluation: BN-pass images, test images, SWAG epochs, samples, rounds
    test_images: int
    eval_epochs: int
    eval_samples: int
    eval_rounds: int

    @classmethod
    def full(cls) -> Size:
        return cls(
            pretrain_epochs=10,
            swag_epochs=5,
            train_images=None,
            short_test_images=None,
            swag_samples=30,
            cifar_train=2048,
            cifar_batch=128,
            batch_size=128,
            batches=(
                ("preresnet20", 50),
                ("preresnet164", 20),
                ("wideresnet28x10", 30),
                ("resnet50", 20),
            ),
            rounds=5,
            workers=4,  # the reference's run_swag.py default
            max_rank=20,
            bn_images=5000,
            test_images=1000,
            eval_epochs=3,
            eval_samples=30,
            eval_rounds=3,
        )

    @classmethod
    def quick(cls) -> Size:
        return cls(
            pretrain_epochs=1,
            swag_epochs=2,  # SWAG needs two snapshots
            train_images=128,
            short_test_images=200,
            swag_samples=2,
            cifar_train=64,
            cifar_batch=32,
            batch_size=2,  # WRN-28x10: ~30 GFLOP an image for a training step
            batches=(
                ("preresnet20", 4),
                ("preresnet164", 1),
                ("wideresnet28x10", 1),
                ("resnet50", 1),
            ),
            rounds=1,
            workers=0,
            max_rank=2,  # WRN-28x10's 36.5M weights x 20 would be 2.9 GB on the CPU
            bn_images=32,
            test_images=32,
            eval_epochs=2,
            eval_samples=2,
            eval_rounds=1,
        )

    @classmethod
    def of(cls, ctx: Context) -> Size:
        return cls.quick() if ctx.quick else cls.full()


# --- helpers -----------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device: torch.device) -> float | None:
    """``torch.cuda.max_memory_allocated`` since the last ``reset_peak`` (None on the CPU)."""
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of ``fn()``, the device synchronised before and after (kernels are async)."""
    sync(device)
    started = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - started


def paced(
    rounds: int, left: Callable[[], float], reserve: float = 5.0, longest: float = 0.0
) -> Iterator[int]:
    """Round numbers up to ``rounds``, stopping early where one more round (taken as 1.5x
    the longest so far, or than ``longest``, an estimate from rounds before) would end
    within ``reserve`` s of the part's time box: a slower GPU than planned gives fewer
    rounds, not a part killed with nothing written. With no estimate the first round
    always starts."""
    for r in range(rounds):
        if (r or longest) and left() < 1.5 * longest + reserve:
            return
        started = time.monotonic()
        yield r
        longest = max(longest, time.monotonic() - started)


def rotation(names: list[str], r: int) -> list[str]:
    """Round ``r``'s order: rotated by one each round (load drift hits every variant)."""
    return names[r % len(names) :] + names[: r % len(names)]


def cifar_shaped(
    n: int, seed: int = 0, shape: tuple[int, int, int] = (3, 32, 32)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random uint8 images (n, *shape) and labels of 10 classes: timing needs no CIFAR."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8)
    return x, torch.randint(0, 10, (n,), generator=g)


def digest(obj: Any) -> str:
    """sha256 of the bytes of every tensor in ``obj`` (with dtype and shape) and the repr
    of everything else, dicts in key order: equal digests, bitwise equal states."""
    h = hashlib.sha256()

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous().reshape(-1)
            h.update(f"{t.dtype}{tuple(x.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                h.update(repr(k).encode())
                walk(x[k])
        elif isinstance(x, list | tuple):
            h.update(b"[")
            for v in x:
                walk(v)
            h.update(b"]")
        else:
            h.update(repr(x).encode())

    walk(obj)
    return h.hexdigest()


def swag_only(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with the swag trajectory alone (no ensemble, dswag, planes, landscapes,
    sweeps naming the others) and its map and swag predictors, as the params validate."""
    raw["finetune"] = {"swag": raw["finetune"]["swag"]}
    raw["evaluate"]["predictors"] = {
        "swag": {
            "map": {"method": "map"},
            "swag": {"method": "swag", "scale": PREDICTORS["swag"]},
        }
    }
    for section in ("plane", "landscape"):
        raw["evaluate"].pop(section, None)
    raw["evaluate"]["dswag_sweep"] = {"workers": []}
    return raw


def _default_params() -> dict[str, Any]:
    return swag_only(yaml.safe_load((ROOT / "params.yaml").read_text()))


def cifar_setup(
    n_train: int, n_test: int, epochs: int, batch: int, precision: str = "fp32", augment=False
) -> tuple[Params, Prepared]:
    """A PreResNet-20 on random CIFAR-shaped images (``n_test`` each for val and test):
    the swag trajectory at a constant rate, a snapshot each epoch, in ``precision``;
    ``augment``: the CIFAR presets' crop (padding 4) + flip."""
    x, y = cifar_shaped(n_train + 2 * n_test, seed=1)
    manifest = {
        "dataset": "cifar_shaped_random",
        "seed": 0,
        "test_fraction": 0.2,
        "val_fraction": 0.2,
        "num_classes": 10,
        "input_shape": [3, 32, 32],
        "mean": MEAN,
        "std": STD,
    }
    a, b = n_train, n_train + n_test
    data = Prepared(Split(x[:a], y[:a]), Split(x[a:b], y[a:b]), Split(x[b:], y[b:]), manifest)
    raw = _default_params()
    raw.update(model={"name": "preresnet", "depth": 20}, precision=precision)
    if augment:
        raw["data"]["augment"] = {"crop_padding": 4, "flip": True}
    swag = raw["finetune"]["swag"]
    swag.update(epochs=epochs, batch_size=min(batch, n_train))
    swag["schedule"] = {"kind": "constant", "lr": 0.05}
    swag["collect"] = {"start_epoch": 0, "every": 0, "max_rank": 20}  # one per epoch
    return parse_params(raw), data


# --- short SWAG runs on mnist5k: CPU vs CUDA, bf16 vs fp32, determinism ------------------


@functools.cache
def _mnist5k(train_images: int | None, test_images: int | None) -> Prepared:
    """The default params' split; the first images of train and test where asked (the
    splits are stratified and shuffled, so a prefix holds every class)."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-data-") as tmp:
        data = prepare("mnist5k", tmp, tmp, 0, 0.2, 0.2)
    train, test = data.train, data.test
    if train_images is not None:
        train = train.subset(torch.arange(train_images))
    if test_images is not None:
        test = test.subset(torch.arange(test_images))
    return Prepared(train, data.val, test, data.manifest)


def short_run(
    device_name: str, precision: str, size: Size, seed: int | None = None
) -> dict[str, Any]:
    """The default params' LeNet-5 pretrained and fine-tuned along their swag trajectory
    (fewer epochs, one pretrained member) on ``device_name`` in ``precision`` through the
    library, as the stages call it (seeded, deterministic kernels on CUDA); test metrics
    of the map (end point) and swag predictors (``size.swag_samples`` samples, scale 0.5);
    ``sha256``: of the posterior's state and of each predictor's test log-probabilities.
    ``seed``: the params' own unless given (scripts/gpu_check_seeds.py)."""
    device = torch.device(device_name)
    data = _mnist5k(size.train_images, size.short_test_images)
    raw = _default_params()
    raw.update(device=device_name, precision=precision)
    if seed is not None:
        raw.update(seed=seed, seeds=[seed])
    raw["pretrain"].update(epochs=size.pretrain_epochs, members=1)
    swag = raw["finetune"]["swag"]
    swag["epochs"] = size.swag_epochs
    per_epoch = -(-len(data.train) // swag["batch_size"])
    swag["schedule"]["cycle_length"] = per_epoch  # one cycle, one snapshot per epoch
    p = parse_params(raw)
    compute = compute_for(p, device)
    reset_peak(device)
    started = time.perf_counter()
    pre = pretrain_members(p, data, device, compute=compute)
    assert pre is not None
    result = finetune(p, "swag", data, pre.posterior, device, compute=compute)
    assert result is not None
    post = result.posterior
    test = {"test": (post.model_input(data.test.x, device), data.test.y)}
    out: dict[str, Any] = {"device": device_name, "precision": precision}
    state = {k: v for k, v in post.to_dict().items() if k != "extra"}
    hashes = {"posterior": digest(state)}
    for method, scale in PREDICTORS.items():
        found = evaluate(
            post,
            method,
            test,
            n_samples=size.swag_samples,
            scale=scale,
            seed=0,
            device=device,
            precision=compute.precision,
        )["test"]
        out[method] = {"accuracy": found.metrics["accuracy"], "nll": found.metrics["nll"]}
        hashes[f"{method}_log_probs"] = digest(found.log_probs)
    sync(device)
    out["seconds"] = round(time.perf_counter() - started, 2)
    out["peak_mib"] = peak_mib(device)
    out["sha256"] = hashes
    out["theta"] = post.theta.detach().cpu().double()
    return out


_cached_run = functools.cache(short_run)  # cpu_vs_cuda on the CPU: the same run twice


def what(size: Size) -> str:
    images = f"{size.train_images or 3200} train, {size.short_test_images or 1000} test images"
    return (
        f"mnist5k ({images}), LeNet-5: pretrain {size.pretrain_epochs} epochs, "
        f"the swag trajectory {size.swag_epochs} epochs (a snapshot each epoch); test "
        f"metrics of map (its end point) and swag ({size.swag_samples} samples, scale 0.5)"
    )


def first_gradient(device: torch.device) -> dict[str, Any]:
    """The relative difference of one batch's loss gradient on ``device`` from the CPU's
    (the same LeNet-5 initialisation and 128 mnist5k images, fp32: IEEE convolutions on
    CUDA, as every stage computes them, not torch's default TF32)."""
    from bayesavg.models import build_model
    from bayesavg.seeding import deterministic_kernels

    deterministic_kernels(device)

    data = _mnist5k(128, 16)
    x = (data.train.x.float() / 255 - 0.5) / 0.25
    y = data.train.y
    torch.manual_seed(0)
    model = build_model("lenet5", (1, 28, 28), int(data.manifest["num_classes"]))
    grads = []
    for where in (torch.device("cpu"), device):
        model.to(where).zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.to(where)), y.to(where))
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]).cpu().double())
    relative = float((grads[1] - grads[0]).norm() / grads[0].norm())
    return {
        "relative_difference": relative,
        "tolerance": GRADIENT_TOLERANCE,
        "within_tolerance": relative <= GRADIENT_TOLERANCE,
    }


def cpu_vs_cuda(ctx: Context) -> dict[str, Any]:
    """Does the GPU compute, train and predict like the CPU (same params, seeds, fp32)?"""
    size, device = Size.of(ctx), torch.device(ctx.device)
    gradient = first_gradient(device)
    ctx.report({"first_gradient": gradient})
    dev = _cached_run(str(device), "fp32", size)  # the GPU's first: kept if the CPU is slow
    ctx.report(
        {"what": what(size), "first_gradient": gradient, "runs": {device.type: without_theta(dev)}}
    )
    cpu = _cached_run("cpu", "fp32", size)
    if device.type == "cpu":  # --device cpu: the same (cached) run twice, for the JSON's shape
        found = compare(cpu, dev, ("cpu", "cpu_same_run"), what(size))
    else:
        found = compare(cpu, dev, ("cpu", "cuda"), what(size))
    return {"what": what(size), "first_gradient": gradient, **found}


def bf16_vs_fp32(ctx: Context) -> dict[str, Any]:
    """Does bf16 autocast (fp32 master weights) give fp32's test metrics?"""
    size, device = Size.of(ctx), ctx.device
    fp32 = short_run(device, "fp32", size)
    ctx.report({"what": what(size), "runs": {"fp32": without_theta(fp32)}})
    bf16 = short_run(device, "bf16", size)
    return {"what": what(size), **compare(fp32, bf16, ("fp32", "bf16"), what(size))}
