"""``cuda_graphs: true``: the whole training step captured once as a CUDA graph, replayed.

A small network on a fast GPU mostly waits for Python and kernel launches
(PreResNet-20 at batch 128: about 320 kernels, ~3 ms of launch time against
1-1.5 ms of GPU work). A replay launches the step's kernels as one. What capture
needs is what this step is made of, on every device ("graph-ready"):

- static batch buffers: each batch is copied into the same tensors;
- the learning rate as a device tensor that the loop fills before each step
  (``fill_`` with a Python number: a kernel argument, no synchronisation); on the
  CPU SGD updates with ``addcmul`` by it and fused Adam takes it natively, both
  bitwise the update at a float rate; on CUDA SGD's and Adam's fused kernels take
  it, as float32 (``rate_dtype``), one launch for all parameters (``optim.fused_sgd``);
- forward, backward, the optimizer's step and the epoch's running loss and
  accuracy sums inside the step; nothing reads a device value on the host.

On the CPU the graph-ready step runs as is: the same bytes as the plain loop
(tested). On CUDA it runs eagerly on a side stream for ``WARM_UP`` steps (cuDNN
picks its kernels, the optimizer makes its state: these are real training
steps), then it is captured and every later full batch replays it. An epoch's
last, shorter batch runs the graph-ready step without a graph. What cannot be
captured runs uncaptured, with a warning (``unsupported``): SAM's replayed RNG state, SGLD's
noise scaled by a float rate, fp16's loss scaler (it reads inf checks on the
host), and data parallelism's all-reduce between backward and step.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from .optim import SGD, Adam, Optimizer

log = logging.getLogger(__name__)

WARM_UP = 3  # eager steps before capture (torch's recipe: a few on a side stream)


def unsupported(*, sam: bool, sgld: bool, precision: str, processes: int) -> str | None:
    """Why a run cannot capture its step, or None."""
    if sam:
        return "SAM replays the RNG state between its two passes, which a graph cannot"
    if sgld:
        return "SGLD's noise is scaled by the rate on the host"
    if precision == "fp16":
        return "fp16's loss scaler checks for infinities on the host; use bf16"
    if processes > 1:
        return "the gradient all-reduce of N processes is not captured; use one process"
    return None


def rate_dtype(optimizer: Optimizer, device: torch.device) -> torch.dtype:
    """The learning-rate tensor's dtype: float64, the rate as the float the plain loop
    passes (bitwise on the CPU, tests/test_graphs.py), except on CUDA, where Adam and SGD
    step with fused kernels that read a tensor rate as float32 (``lr.data_ptr<float>()``)
    and fail on any other dtype. There the rate is rounded to float32: for Adam the
    kernel's float arithmetic rounds a float rate anyway, up to the last bit of the step
    size; plain SGD steps pass the float32 rate too (``optim.fused_sgd``)."""
    if isinstance(optimizer, Adam | SGD) and device.type == "cuda":
        return torch.float32
    return torch.float64


class GraphStep:
    """One graph-ready training step of ``model`` with ``optimizer``; captured on CUDA.

    ``step(module, x, y, ctx)`` is the loop's step (``steps.Step``); the running
    sums ``loss_sum`` (float64, loss times batch size) and ``correct`` (int64)
    are the epoch's, zeroed by ``new_epoch``.
    """

    def __init__(self, model: nn.Module, optimizer: Optimizer, step, ctx, device: torch.device):
        self.model = model
        self.optimizer = optimizer
        self.step = step
        self.ctx = ctx
        self.capture = device.type == "cuda"
        self.rate = torch.zeros((), dtype=rate_dtype(optimizer, device), device=device)
        for group in optimizer.param_groups:
            group["lr"] = self.rate
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.correct = torch.zeros((), dtype=torch.int64, device=device)
        self._buffers: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self._graphs: dict[tuple[int, ...], torch.cuda.CUDAGraph] = {}
        self._eager: dict[tuple[int, ...], int] = {}
        self.full: tuple[int, ...] | None = None

    def new_epoch(self) -> None:
        self.loss_sum.zero_()
        self.correct.zero_()

    def _body(self, x: torch.Tensor, y: torch.Tensor) -> None:
        loss, logits = self.step(self.model, x, y, self.ctx)
        self.optimizer.step()
        self.loss_sum += loss.double() * y.shape[0]
        self.correct += (logits.argmax(1) == y).sum()

    def __call__(self, x: torch.Tensor, y: torch.Tensor, rate: float) -> None:
        """One step on batch (x, y) at learning rate ``rate``."""
        shape = tuple(x.shape)
        if self.full is None:
            self.full = shape
        if shape not in self._buffers:
            self._buffers[shape] = (torch.empty_like(x), torch.empty_like(y))
        sx, sy = self._buffers[shape]
        self.rate.fill_(rate)
        sx.copy_(x)
        sy.copy_(y)
        graph = self._graphs.get(shape)
        if graph is not None:
            graph.replay()
            return
        if not self.capture or shape != self.full:
            self.optimizer.zero_grad(set_to_none=True)
            self._body(sx, sy)
            return
        done = self._eager.get(shape, 0)
        if done < WARM_UP:
            self._eager[shape] = done + 1
            side = torch.cuda.Stream(device=x.device)
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):
                self.optimizer.zero_grad(set_to_none=True)
                self._body(sx, sy)
            torch.cuda.current_stream(x.device).wait_stream(side)
            return
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        # thread_local: streamed data's worker threads (batches.StreamedData) go on
        # pinning and copying the next batches on their own stream meanwhile; the
        # default ("global") mode fails any CUDA call another thread makes during capture.
        # The capture stream is on the batch's GPU: torch's default is a new stream on
        # the current device, cuda:0 for a run on cuda:1, whose kernels then go
        # uncaptured to cuda:1 (an error, or an empty graph whose replays do nothing).
        capturing = torch.cuda.Stream(device=x.device)
        with torch.cuda.graph(graph, stream=capturing, capture_error_mode="thread_local"):
            self._body(sx, sy)
        self._graphs[shape] = graph
        log.info("captured the training step for batches of %s as a CUDA graph", list(shape))
        graph.replay()
