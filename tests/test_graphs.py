"""The graph-ready training step (``cuda_graphs: true``) on the CPU.

On CUDA the step is captured and replayed; what makes it capturable (static
batch buffers, the rate as a device tensor, the running sums inside the step,
no host synchronisation) runs on every device, and on the CPU it must give the
bytes of today's loop.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from pipeline_repo import small_params

from bayesavg.config import parse_params
from bayesavg.models import build_model
from bayesavg.posteriors import MeanFieldVI, svi_step
from bayesavg.posteriors.file import PosteriorFile, save_posterior
from bayesavg.training.graphs import WARM_UP, GraphStep, rate_dtype, unsupported
from bayesavg.training.optim import SGD, Adam
from bayesavg.training.steps import StepContext, sgd_step
from bayesavg.trajectories import finetune

CPU = torch.device("cpu")


def _params(graphs: bool) -> Any:
    raw = small_params(epochs=2, pretrain_epochs=1, members=2)
    raw["cuda_graphs"] = graphs
    return parse_params(raw)


def _bytes(posterior: PosteriorFile, path: Path) -> bytes:
    save_posterior(path, posterior)
    return path.read_bytes()


@pytest.mark.parametrize("name", ["sgd", "swag", "vi", "hwa", "mc_dropout", "ensemble", "fswag"])
def test_the_graph_ready_step_gives_the_bytes_of_todays_step(
    name: str,
    short_starts: dict[str, PosteriorFile],
    mnist5k_prepared: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """fswag (SAM) cannot be captured: it runs today's step, with a warning."""
    prepared = mnist5k_prepared.prepared
    results = {}
    for graphs in (False, True):
        params = _params(graphs)
        start = short_starts[params.finetune[name].start]
        with caplog.at_level(logging.WARNING):
            results[graphs] = finetune(params, name, prepared, start, CPU)
    plain, graphed = (_bytes(results[g].posterior, tmp_path / f"{g}.pt") for g in (False, True))
    assert plain == graphed
    for a, b in zip(results[False].history, results[True].history, strict=True):
        assert (a["train_loss"], a["train_accuracy"]) == (b["train_loss"], b["train_accuracy"])
    warned = [r.message for r in caplog.records if "cuda_graphs" in r.message]
    assert bool(warned) == (name == "fswag")


def test_what_cannot_be_captured_is_named() -> None:
    assert unsupported(sam=False, sgld=False, precision="bf16", processes=1) is None
    assert "SAM" in unsupported(sam=True, sgld=False, precision="fp32", processes=1)
    assert "SGLD" in unsupported(sam=False, sgld=True, precision="fp32", processes=1)
    assert "bf16" in unsupported(sam=False, sgld=False, precision="fp16", processes=1)
    assert "one process" in unsupported(sam=False, sgld=False, precision="fp32", processes=2)


@pytest.mark.parametrize(("weight_decay", "momentum"), [(0.0, 0.0), (5e-4, 0.9)])
def test_sgd_at_a_tensor_rate_is_bitwise_sgd_at_a_float_rate(
    weight_decay: float, momentum: float
) -> None:
    torch.manual_seed(0)
    start = [torch.randn(1001), torch.randn(3, 7)]
    a, b = ([t.clone() for t in start] for _ in range(2))
    float_opt = SGD(a, momentum=momentum, weight_decay=weight_decay)
    tensor_opt = SGD(b, momentum=momentum, weight_decay=weight_decay)
    rate = torch.zeros((), dtype=torch.float64)
    tensor_opt.param_groups[0]["lr"] = rate
    for i in range(4):
        grads = [torch.randn_like(t) for t in start]
        for params in (a, b):
            for p, g in zip(params, grads, strict=True):
                p.grad = g.clone()
        float_opt.param_groups[0]["lr"] = 0.0123 * (i + 1)
        rate.fill_(0.0123 * (i + 1))
        float_opt.step()
        tensor_opt.step()
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_adam_at_a_float64_tensor_rate_is_bitwise_adam_at_a_float_rate() -> None:
    torch.manual_seed(0)
    start = torch.randn(1001)
    a, b = start.clone(), start.clone()
    float_opt, tensor_opt = Adam([a]), Adam([b])
    tensor_opt.param_groups[0]["lr"] = torch.tensor(0.00123, dtype=torch.float64)
    float_opt.param_groups[0]["lr"] = 0.00123
    for _ in range(3):
        g = torch.randn_like(start)
        a.grad, b.grad = g.clone(), g.clone()
        float_opt.step()
        tensor_opt.step()
    assert torch.equal(a, b)


def test_adams_rate_on_cuda_is_the_float32_its_fused_kernel_reads() -> None:
    """CUDA's fused Adam and SGD read a tensor rate with ``lr.data_ptr<float>()``: a
    float64 rate fails there ("expected scalar type Float"), so the graph step gives them
    float32; every CPU step keeps the float64 rate (bitwise, above)."""
    p = [torch.zeros(3)]
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert rate_dtype(Adam(p), cuda) is rate_dtype(SGD(p), cuda) is torch.float32
    assert rate_dtype(Adam(p), cpu) is rate_dtype(SGD(p), cpu) is torch.float64
    step = GraphStep(torch.nn.Linear(2, 2), Adam(p), sgd_step, StepContext(), cpu)
    assert step.rate.dtype is torch.float64


@pytest.mark.parametrize("kind", ["sgd", "svi"])
def test_the_graph_ready_step_never_reads_the_device_on_the_host(kind: str) -> None:
    """On the meta device a host read (``.item()``, ``bool(t)``) raises, as it would
    break a CUDA graph capture: several steps, the optimizer and the sums included."""
    meta = torch.device("meta")
    model = build_model("lenet5", (1, 28, 28), 10, {}).to(meta)
    if kind == "sgd":
        trained, step = model, sgd_step
        optimizer = SGD(list(model.parameters()), momentum=0.9, weight_decay=5e-4)
    else:
        trained = MeanFieldVI(model, sigma_init=0.01)
        step = svi_step(100)
        optimizer = SGD([trained.mu, trained.rho], momentum=0.9)
    graph = GraphStep(trained, optimizer, step, StepContext(), meta)
    graph.new_epoch()
    x = torch.empty(8, 1, 28, 28, device=meta)
    y = torch.empty(8, dtype=torch.long, device=meta)
    for i in range(3):
        graph(x, y, 0.01 * (i + 1))
    assert graph.loss_sum.device == meta and graph.correct.dtype == torch.int64


class _FakeStream:
    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device

    def wait_stream(self, other: _FakeStream) -> None:
        pass


class _FakeGraph:
    replays = 0

    def replay(self) -> None:
        _FakeGraph.replays += 1


def test_the_step_is_captured_on_a_stream_of_the_batch_s_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch.cuda.graph's own capture stream is on the current device, cuda:0 for a run
    on cuda:1: the step's kernels would go uncaptured to cuda:1 (an error, or an empty
    graph replayed as nothing). The capture is on the device of the batch. CUDA's calls
    are stood in for on the CPU; the step itself runs for real."""
    captured: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def graph(g: _FakeGraph, **kwargs: Any) -> Iterator[None]:
        captured.append(kwargs)
        yield

    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _FakeStream(device))
    model = torch.nn.Linear(4, 3)
    step = GraphStep(model, SGD(list(model.parameters())), sgd_step, StepContext(), CPU)
    step.capture = True
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    for _ in range(WARM_UP + 2):
        step(x, y, 0.1)
    (kwargs,) = captured
    assert isinstance(kwargs.get("stream"), _FakeStream), kwargs
    assert kwargs["stream"].device == x.device and kwargs["capture_error_mode"] == "thread_local"
    assert _FakeGraph.replays == 2  # the capture's own first replay, then the next step's


@pytest.fixture
def fused_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGD's CUDA path on the CPU: torch's fused SGD has a CPU kernel of the same formula."""
    from bayesavg.training import optim

    monkeypatch.setattr(optim, "fused_sgd", lambda params: bool(params))


@pytest.mark.parametrize(("weight_decay", "momentum"), [(0.0, 0.0), (5e-4, 0.9)])
@pytest.mark.usefixtures("fused_everywhere")
def test_on_cuda_a_plain_sgd_step_and_a_captured_one_take_the_same_update(
    weight_decay: float, momentum: float
) -> None:
    """Both are torch.optim.SGD(fused=True) at the float32 rate: the plain step rounds
    its rate as the kernel reads the graph's float32 tensor (CUDA's kernel multiplies in
    double, so there an unrounded rate could move a last bit; the CPU's does not show it:
    the GPU check's ``step_variants`` compares the bytes on CUDA)."""
    from bayesavg.training.optim import float32

    torch.manual_seed(0)
    start = [torch.randn(1001), torch.randn(3, 7)]
    a, b, c = ([t.clone() for t in start] for _ in range(3))
    plain = SGD(a, momentum=momentum, weight_decay=weight_decay)
    graph = SGD(b, momentum=momentum, weight_decay=weight_decay)
    torch_own = torch.optim.SGD(c, lr=0.0, momentum=momentum, weight_decay=weight_decay, fused=True)
    rate = torch.zeros((), dtype=rate_dtype(graph, torch.device("cuda")))
    graph.param_groups[0]["lr"] = rate
    for i in range(5):
        grads = [torch.randn_like(t) for t in start]
        for params in (a, b, c):
            for p, g in zip(params, grads, strict=True):
                p.grad = g.clone()
        lr = 0.0123 * (i + 1)  # not a float32: rounding it matters
        assert float32(lr) != lr and float32(lr) == torch.tensor(lr, dtype=torch.float32).item()
        plain.param_groups[0]["lr"] = lr
        rate.fill_(lr)
        torch_own.param_groups[0]["lr"] = float32(lr)
        plain.step()
        graph.step()
        torch_own.step()
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(a, c, strict=True))
    if momentum:
        assert plain.state_dict()["state"].keys() == {0, 1}


@pytest.mark.usefixtures("fused_everywhere")
def test_a_parameter_whose_first_gradient_comes_late_gets_its_momentum_buffer() -> None:
    """The fused kernel makes every buffer on the first step or none: a parameter that
    first has a gradient after the others' first step takes torch's default step."""
    torch.manual_seed(0)
    first, late = torch.randn(5), torch.randn(4)
    opt = SGD([first, late], momentum=0.9)
    opt.param_groups[0]["lr"] = 0.1
    first.grad = torch.randn(5)
    opt.step()
    first.grad, late.grad = torch.randn(5), torch.randn(4)
    opt.step()
    assert set(opt.state) == {first, late}
    assert torch.equal(opt.state[late]["momentum_buffer"], late.grad)


@pytest.mark.usefixtures("fused_everywhere")
def test_with_a_late_gradient_the_plain_step_still_takes_the_float32_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step where a parameter's buffer is new is torch's default step; its float
    rate is rounded as the captured step's float32 tensor holds it (CUDA's kernels
    multiply in double, where the CPU's round the rate to float32 themselves, so the
    rate passed is what is checked here, then the bytes)."""
    from bayesavg.training import optim

    rates: list[float] = []
    default_step = optim.sgd

    def spy(*args: Any, **kwargs: Any) -> None:
        if not kwargs.get("fused"):
            rates.append(kwargs["lr"])
        default_step(*args, **kwargs)

    monkeypatch.setattr(optim, "sgd", spy)
    torch.manual_seed(0)
    start = [torch.randn(5), torch.randn(4)]
    a, b = ([t.clone() for t in start] for _ in range(2))
    plain, graph = SGD(a, momentum=0.9), SGD(b, momentum=0.9)
    rate = torch.zeros((), dtype=torch.float64)
    graph.param_groups[0]["lr"] = rate
    for i, grads in enumerate([[torch.randn(5), None], [torch.randn(5), torch.randn(4)]] * 2):
        lr = 0.0123 * (i + 1)  # not a float32
        plain.param_groups[0]["lr"] = lr
        rate.fill_(optim.float32(lr))  # what a float32 tensor holds
        for params in (a, b):
            for p, g in zip(params, grads, strict=True):
                p.grad = None if g is None else g.clone()
        plain.step()
        graph.step()
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert rates == [optim.float32(0.0123 * 2)]  # the one step with a new buffer


@pytest.mark.usefixtures("fused_everywhere")
def test_momentum_resumed_into_another_layout_steps_the_fused_kernel() -> None:
    """A checkpoint written with contiguous convolution weights, resumed with
    ``channels_last``: CUDA's fused kernel refuses buffers whose strides differ from
    their parameters' (the CPU's does not check, hence the strides asserted here)."""
    torch.manual_seed(0)
    weight = torch.randn(4, 3, 3, 3)
    saved = SGD([weight.clone()], momentum=0.9)
    saved.param_groups[0]["lr"] = 0.1
    saved.params[0].grad = torch.randn(4, 3, 3, 3)
    saved.step()
    resumed = weight.clone().to(memory_format=torch.channels_last)
    opt = SGD([resumed], momentum=0.9)
    opt.load_state_dict(saved.state_dict())
    buffer = opt.state[resumed]["momentum_buffer"]
    assert buffer.stride() == resumed.stride() and torch.equal(
        buffer, saved.state_dict()["state"][0]["momentum_buffer"]
    )
    resumed.grad = torch.randn(4, 3, 3, 3).to(memory_format=torch.channels_last)
    opt.param_groups[0]["lr"] = 0.1
    opt.step()
    assert torch.isfinite(resumed).all()
