"""Properties of ``bayesavg.training`` that the module-level tests leave open: the loop
against a hand-written one, BatchNorm recomputation on unusual networks, SAM over
partly frozen networks, the optimizers' wiring, sharding and augmentation draws."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torchvision.transforms.v2 import functional as F

from bayesavg.seeding import derive_seed
from bayesavg.training import train as train_module
from bayesavg.training.augment import ATTEMPTS, Augment, EpochDraws, _boxes, apply, draw_epoch
from bayesavg.training.batches import Order, Tensors, TrainData, check_shards, shard
from bayesavg.training.batchnorm import update_bn
from bayesavg.training.distributed import World, in_client_order
from bayesavg.training.monitoring import Monitoring
from bayesavg.training.optim import build
from bayesavg.training.precision import Precision
from bayesavg.training.sam import sam_step
from bayesavg.training.steps import StepContext, sgd, sgd_step
from bayesavg.training.train import loss_and_accuracy, train

CPU = torch.device("cpu")


def _data(n: int, d: int = 5, classes: int = 3, seed: int = 0) -> Tensors:
    g = torch.Generator().manual_seed(seed)
    return Tensors(torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g))


def _mlp(seed: int = 0, batch_norm: bool = False) -> nn.Sequential:
    torch.manual_seed(seed)
    middle = nn.BatchNorm1d(8) if batch_norm else nn.Identity()
    return nn.Sequential(nn.Linear(5, 8), middle, nn.ReLU(), nn.Linear(8, 3))


def _brute_stats(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel float64 mean and unbiased variance; channels on dim 1."""
    flat = h.double().transpose(0, 1).reshape(h.shape[1], -1)
    return flat.mean(1), flat.var(1, unbiased=True)


def _plain_sgd(model: nn.Module, data: Any, **options: Any) -> list[dict[str, float]]:
    """``train`` with momentum-free SGD at rate 0 (unless ``lr`` is given), one epoch of
    batches of 8, a generator seeded 0, no log lines; ``options`` override or add."""
    kwargs: dict[str, Any] = {
        "epochs": 1,
        "batch_size": 8,
        "lr": lambda i: 0.0,
        "generator": torch.Generator().manual_seed(0),
        "log_epochs": False,
    }
    return train(model, sgd(model, 0.0, 0.0), data, **{**kwargs, **options})


# --- the training loop ---------------------------------------------------------------


def test_train_is_the_hand_written_minibatch_loop() -> None:
    """Two epochs of 17 points in batches of 8 (the last one short): the same weights as
    torch.optim.SGD stepping over ``randperm(n, generator)`` batches at ``lr(i)``, with
    ``after_step`` called once per step with its 0-based index and each row's train loss
    and accuracy the per-example means over the epoch."""
    data = _data(17)
    model, reference = _mlp(1), _mlp(1)
    rate = lambda i: 0.1 / (1 + i)  # noqa: E731
    steps: list[int] = []
    history = train(
        model,
        sgd(model, 0.9, 5e-4),
        data,
        epochs=2,
        batch_size=8,
        lr=rate,
        generator=torch.Generator().manual_seed(3),
        after_step=steps.append,
        log_epochs=False,
    )
    opt = torch.optim.SGD(reference.parameters(), lr=0.0, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(3)
    i = 0
    for epoch in range(2):
        order = torch.randperm(17, generator=gen)
        loss_sum, correct = 0.0, 0
        for idx in order.split(8):
            for group in opt.param_groups:
                group["lr"] = rate(i)
            opt.zero_grad()
            logits = reference(data.x[idx])
            loss = nn.functional.cross_entropy(logits, data.y[idx])
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(idx)
            correct += int((logits.argmax(1) == data.y[idx]).sum())
            i += 1
        assert history[epoch]["train_loss"] == pytest.approx(loss_sum / 17, rel=1e-6)
        assert history[epoch]["train_accuracy"] == correct / 17
        assert history[epoch]["lr"] == rate(i - 1)
    assert steps == list(range(6))
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


def test_train_trains_a_model_handed_over_in_eval_mode() -> None:
    """The loop switches the network to train mode: BatchNorm normalises by batch
    statistics and updates its running statistics even at rate 0."""
    model = _mlp(2, batch_norm=True).eval()
    _plain_sgd(model, _data(16))
    assert int(model[1].num_batches_tracked) == 2
    assert not torch.equal(model[1].running_mean, torch.zeros(8))


def test_loss_and_accuracy_are_full_data_means_and_keep_the_mode() -> None:
    """Mean cross-entropy and accuracy over all points, whatever the batch size (23 points
    in batches of 10), in eval mode; the network's mode is put back."""
    data = _data(23, seed=4)
    model = _mlp(5, batch_norm=True)
    update_bn(model, data.x)
    model.train()
    loss, acc = loss_and_accuracy(model, data, batch_size=10)
    assert model.training and model[1].training
    with torch.no_grad():
        logits = model.eval()(data.x)
    torch.testing.assert_close(
        loss, nn.functional.cross_entropy(logits, data.y).double(), rtol=1e-6, atol=1e-9
    )
    assert acc.item() == (logits.argmax(1) == data.y).double().mean().item()


def test_validation_rows_read_the_monitoring_subset() -> None:
    """With ``monitoring.fraction`` the validation columns are those of the fixed subset
    of the validation split, not of the whole split."""
    model = _mlp(6)
    val = _data(40, seed=7)
    monitoring = Monitoring(fraction=0.25, seed=11)
    history = _plain_sgd(model, _data(16), val_data=val, monitoring=monitoring)
    subset = monitoring.subset(val)
    assert len(subset) == 10
    loss, acc = loss_and_accuracy(model, subset)
    assert history[0]["val_loss"] == pytest.approx(loss.item(), rel=1e-12)
    assert history[0]["val_accuracy"] == acc.item()
    whole, _ = loss_and_accuracy(model, val)
    assert history[0]["val_loss"] != pytest.approx(whole.item(), rel=1e-6)


def test_augmentation_is_drawn_per_epoch_from_the_seed_and_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each epoch's crops and flips come from a generator seeded by (augment_seed, epoch):
    different epochs augment differently, a resumed run as an uninterrupted one."""
    drawn: list[EpochDraws] = []

    def spy(n: int, aug: Augment, generator: torch.Generator) -> EpochDraws:
        drawn.append(draw_epoch(n, aug, generator))
        return drawn[-1]

    monkeypatch.setattr(train_module, "draw_epoch", spy)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (12, 1, 6, 6), dtype=torch.uint8, generator=g)
    aug = Augment(crop_padding=1, flip=True)
    data = TrainData(x, torch.randint(0, 3, (12,), generator=g), [0.5], [0.25], aug)
    model = nn.Sequential(nn.Flatten(), nn.Linear(36, 3))
    _plain_sgd(model, data, epochs=2, batch_size=6, lr=lambda i: 0.01, augment_seed=5)
    assert len(drawn) == 2
    for epoch, got in enumerate(drawn, start=1):
        want = draw_epoch(12, aug, torch.Generator().manual_seed(derive_seed(5, "augment", epoch)))
        assert torch.equal(got.top, want.top) and torch.equal(got.flip, want.flip)
    assert not torch.equal(drawn[0].top, drawn[1].top)


# --- steps and optimizers ------------------------------------------------------------


def test_the_plain_step_fills_the_gradient_of_the_mean_cross_entropy() -> None:
    data = _data(12)
    model, reference = _mlp(7), _mlp(7)
    loss, logits = sgd_step(model, data.x, data.y)
    want = nn.functional.cross_entropy(reference(data.x), data.y)
    want.backward()
    assert torch.equal(loss, want.detach())
    assert torch.equal(logits, reference(data.x).detach())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


@pytest.mark.parametrize("how", ["steps.sgd", "build sgd", "build adam"])
def test_the_loops_optimizers_take_momentum_and_weight_decay(how: str) -> None:
    """``steps.sgd`` and ``optim.build`` step bitwise as torch.optim with the momentum
    and weight decay they are given (not torch's defaults)."""
    ours, theirs = _mlp(8), _mlp(8)
    if how == "steps.sgd":
        opt = sgd(ours, 0.9, 0.01)
        ref = torch.optim.SGD(theirs.parameters(), lr=0.0, momentum=0.9, weight_decay=0.01)
    elif how == "build sgd":
        opt = build("sgd", ours.parameters(), momentum=0.9, weight_decay=0.01)
        ref = torch.optim.SGD(theirs.parameters(), lr=0.0, momentum=0.9, weight_decay=0.01)
    else:
        opt = build("adam", ours.parameters(), momentum=0.9, weight_decay=0.01)
        ref = torch.optim.Adam(theirs.parameters(), lr=0.0, weight_decay=0.01, fused=True)
    data = _data(8)
    for optimizer, net in ((opt, ours), (ref, theirs)):
        for _ in range(4):
            for group in optimizer.param_groups:
                group["lr"] = 0.05
            optimizer.zero_grad()
            nn.functional.cross_entropy(net(data.x), data.y).backward()
            optimizer.step()
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p, q)


def test_zero_grad_without_set_to_none_zeroes_the_gradients() -> None:
    model = _mlp(9)
    opt = sgd(model, 0.0, 0.0)
    data = _data(4)
    nn.functional.cross_entropy(model(data.x), data.y).backward()
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_one_process_context_is_plain_autograd() -> None:
    """A world of one process is no world: no all-reduce, gradients left as they are."""
    ctx = StepContext(world=World(0, 1, CPU))
    assert ctx.world is None
    p = nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    ctx.reduce_grads([p])
    assert torch.equal(p.grad, torch.full((3,), 2.0))


def test_only_fp16_has_a_loss_scaler() -> None:
    """bfloat16 has float32's exponent range: no scaler (nor for fp32)."""
    assert Precision("bf16", "cpu").scaler() is None and not Precision("bf16").scaled
    assert Precision("fp32", "cpu").scaler() is None
    assert Precision("fp16", "cuda").scaled


def test_sam_perturbs_only_the_trainable_parameters() -> None:
    """With the first layer frozen, e = r g / ||g|| over the trainable parameters alone
    (ALGORITHMS §5); frozen weights keep no gradient and their values."""
    data = _data(16)
    model, reference = _mlp(10), _mlp(10)
    for net in (model, reference):
        net[0].requires_grad_(False)
    frozen = model[0].weight.detach().clone()
    loss, _ = sam_step(0.1)(model, data.x, data.y)
    params = [p for p in reference.parameters() if p.requires_grad]
    ref_loss = nn.functional.cross_entropy(reference(data.x), data.y)
    grads = torch.autograd.grad(ref_loss, params)
    norm = torch.sqrt(sum((g**2).sum() for g in grads))
    with torch.no_grad():
        for p, g in zip(params, grads, strict=True):
            p.add_(0.1 * g / norm)
    want = torch.autograd.grad(nn.functional.cross_entropy(reference(data.x), data.y), params)
    assert torch.allclose(loss, ref_loss)
    assert model[0].weight.grad is None and torch.equal(model[0].weight, frozen)
    trained = [p for p in model.parameters() if p.requires_grad]
    for p, g in zip(trained, want, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=1e-6)


# --- BatchNorm recomputation ----------------------------------------------------------


def test_update_bn_restores_momentum_and_counts_one_update() -> None:
    """The pass runs at momentum 1 internally; afterwards each layer has its own momentum
    back (training goes on with it) and ``num_batches_tracked`` went up by exactly one."""
    model = _mlp(11, batch_norm=True)
    model[1].momentum = 0.3
    model[1].num_batches_tracked.fill_(7)
    update_bn(model, _data(30).x, batch_size=8)
    assert model[1].momentum == 0.3
    assert int(model[1].num_batches_tracked) == 8


class _Shared(nn.Module):
    """One BatchNorm layer applied to two different inputs in one forward pass."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(12)
        self.a, self.b, self.bn = nn.Linear(5, 4), nn.Linear(5, 4), nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.a(x)) + self.bn(self.b(x))


def test_a_shared_batchnorm_layer_gets_the_statistics_of_all_its_inputs() -> None:
    model = _Shared()
    x = _data(37).x
    update_bn(model, x, batch_size=10)
    with torch.no_grad():
        mean, var = _brute_stats(torch.cat([model.a(x), model.b(x)]))
    torch.testing.assert_close(model.bn.running_mean.double(), mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.bn.running_var.double(), var, rtol=1e-5, atol=1e-6)


class _TwoBranches(nn.Module):
    """Conv -> BatchNorm2d and Linear -> BatchNorm1d side by side on the same input, so
    both layers' inputs are independent of the batching."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(13)
        self.conv, self.bn2 = nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)
        self.lin, self.bn1 = nn.Linear(2 * 6 * 6, 4), nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.conv(x)).mean((2, 3)).sum(1) + self.bn1(self.lin(x.flatten(1))).sum(1)


def test_bn2d_and_bn1d_layers_of_one_network_each_get_their_full_data_statistics() -> None:
    """Channels of layers with different elements per channel (B*H*W and B) are each
    weighted by their own counts."""
    model = _TwoBranches()
    x = torch.randn(29, 2, 6, 6) + torch.linspace(0, 2, 29).view(-1, 1, 1, 1)
    update_bn(model, x, batch_size=8)
    with torch.no_grad():
        for bn, h in ((model.bn2, model.conv(x)), (model.bn1, model.lin(x.flatten(1)))):
            mean, var = _brute_stats(h)
            torch.testing.assert_close(bn.running_mean.double(), mean, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(bn.running_var.double(), var, rtol=1e-5, atol=1e-6)


def test_layers_without_running_statistics_are_left_alone() -> None:
    """``track_running_stats=False`` layers always normalise by the batch: nothing to
    recompute, and the tracked layers beside them are still recomputed."""
    torch.manual_seed(14)
    lin = nn.Linear(5, 4)
    model = nn.Sequential(lin, nn.BatchNorm1d(4), nn.BatchNorm1d(4, track_running_stats=False))
    x = _data(21).x
    update_bn(model, x, batch_size=8)
    with torch.no_grad():
        mean, var = _brute_stats(lin(x))
    torch.testing.assert_close(model[1].running_mean.double(), mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model[1].running_var.double(), var, rtol=1e-5, atol=1e-6)
    assert model[2].running_mean is None


def test_a_constant_channel_gets_a_variance_of_zero_never_below() -> None:
    """A channel constant over the data (a dead unit) has variance 0; the float64
    E[x^2] - E[x]^2 of the recomputation can round below 0, which BatchNorm would turn
    into a NaN (sqrt of a negative), so it must be clamped at 0."""
    lin = nn.Linear(2, 1)
    with torch.no_grad():
        lin.weight.zero_()
        lin.bias.fill_(7.77)
    model = nn.Sequential(lin, nn.BatchNorm1d(1))
    update_bn(model, torch.zeros(500, 2), batch_size=3)
    assert model[1].running_var.item() >= 0.0
    assert model[1].running_var.item() < 1e-10
    assert model[1].running_mean.item() == pytest.approx(7.77)


# --- batches and ranks ----------------------------------------------------------------


def test_the_ranks_shares_partition_each_batch_in_order() -> None:
    """Rank r of N takes the r-th of N near-equal contiguous pieces; together they are the
    batch, and each yielded share is its fraction of the batch."""
    idx = torch.randperm(11, generator=torch.Generator().manual_seed(0))
    for size in (1, 2, 3, 4):
        pieces = [shard(idx, World(r, size, CPU)) for r in range(size)]
        assert torch.equal(torch.cat(pieces), idx)
        assert max(map(len, pieces)) - min(map(len, pieces)) <= 1
    data = _data(10)
    order = torch.arange(10)
    bounds = [(0, 7), (7, 10)]
    for rank in range(2):
        got = list(data.epoch(Order(order, order), bounds, World(rank, 2, CPU), None))
        assert [share for *_, share in got] == ([4 / 7, 2 / 3] if rank == 0 else [3 / 7, 1 / 3])
        assert torch.equal(got[0][1], data.y[:4] if rank == 0 else data.y[4:7])


def test_every_rank_needs_one_example_of_each_batch_two_under_batchnorm() -> None:
    check_shards(10, 4, 3, 2, batch_norm=False)  # batches 4, 4, 2: one each at least
    with pytest.raises(Exception, match="cannot be shared by 2 processes"):
        check_shards(10, 4, 3, 2, batch_norm=True)  # the last batch of 2: one each only
    check_shards(12, 4, 3, 2, batch_norm=True)  # batches of 4: two each
    with pytest.raises(Exception, match="cannot be shared by 3 processes"):
        check_shards(10, 4, 3, 3, batch_norm=False)  # the last batch of 2 for 3 ranks
    check_shards(9, 4, 3, 1, batch_norm=True)


def test_client_results_must_be_float64_of_the_agreed_shape() -> None:
    taken: list[int] = []
    world = World(0, 1, CPU)
    in_client_order(
        world,
        [0, 1],
        lambda c: torch.zeros(2, dtype=torch.float64),
        lambda c, r: taken.append(c),
        (2,),
    )
    assert taken == [0, 1]
    with pytest.raises(ValueError, match="expected"):
        in_client_order(world, [0], lambda c: torch.zeros(2), lambda c, r: None, (2,))


# --- augmentation draws -----------------------------------------------------------------


def test_draws_are_top_then_left_then_flip_from_one_generator() -> None:
    """``draw_epoch``'s documented stream: randint top, randint left, rand < 0.5 flip."""
    aug = Augment(crop_padding=2, flip=True)
    got = draw_epoch(9, aug, torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(4)
    top = torch.randint(0, 5, (9,), generator=g)
    left = torch.randint(0, 5, (9,), generator=g)
    flip = torch.rand(9, generator=g) < 0.5
    assert torch.equal(got.top, top) and torch.equal(got.left, left)
    assert torch.equal(got.flip, flip)


@pytest.mark.parametrize(
    ("height", "width", "box"),
    [(10, 20, [0.0, 3.0, 10.0, 13.0]), (20, 10, [3.0, 0.0, 13.0, 10.0]), (12, 12, [0, 0, 12, 12])],
)
def test_a_box_no_try_fits_is_torchvisions_central_fallback(
    height: int, width: int, box: list[float]
) -> None:
    """Scale 1 at ratio 4/3 fits in no image that is not 4:3: RandomResizedCrop then takes
    the centre crop of the whole image clamped to the ratio range (h = w / (3/4) for a
    tall image, w = h * 4/3 for a wide one)."""
    uniforms = torch.zeros(1, ATTEMPTS, 4, dtype=torch.float64)
    uniforms[..., 0] = 1.0 - 1e-9
    uniforms[..., 1] = 1.0 - 1e-9
    assert _boxes(uniforms, height, width).tolist() == [[float(v) for v in box]]


def test_a_box_at_the_image_corner_replicates_the_edge_as_torchvision() -> None:
    """Upsampling a 12x12 box at (0, 0) reads beyond the image's first row and column:
    torchvision clamps to the edge pixel, and so must this crop (not zero-fill)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (2, 3, 24, 24), generator=g, dtype=torch.uint8)
    box = torch.zeros(2, ATTEMPTS, 4)
    box[..., 0] = (12 * 12 / (24 * 24) - 0.08) / 0.92
    box[..., 1] = 0.5
    assert _boxes(box.double(), 24, 24).tolist() == [[0.0, 0.0, 12.0, 12.0]] * 2
    zeros = torch.zeros(2, dtype=torch.int64)
    ours = apply(x, EpochDraws(zeros, zeros, zeros.bool(), box), Augment(resized_crop=True))
    theirs = F.resized_crop(x, 0, 0, 12, 12, [24, 24], antialias=False)
    corner = (slice(None), slice(None), slice(0, -2), slice(0, -2))
    assert (ours[corner].int() - theirs[corner].int()).abs().max() <= 1
