"""Last-layer KFAC Laplace: fitted with laplace-torch, kept and used as plain tensors.

laplace-torch is needed to fit only. Its own state dict holds pickled objects and
predicting needs the library and a deep copy of the network, so a fit is stored as
tensors (loads with ``torch.load(weights_only=True)``) and predicted from them here.

Conventions of laplace-torch 0.3 (``KronLLLaplace``, damping off) reproduced below:

* The layer's parameter vector is the weight (C, D) flattened row-major, then the bias.
* The likelihood GGN of the weight is ``kron(B, A)``: B (C, C) the output-gradient
  factor first, A (D, D) the input factor second, so entry (c*D + d, c'*D + d') is
  ``B[c, c'] * A[d, d']``. The bias is its own block, B alone: the precision is block
  diagonal over [weight, bias]. The factors' product is the GGN summed over n_data points.
* Each factor is eigendecomposed, ``B = Q1 diag(l1) Q1^T`` and ``A = Q2 diag(l2) Q2^T``.
  The posterior precision of a block is ``H * h_factor + delta``: a block of k factors
  has each factor's eigenvalues times ``h_factor ** (1 / k)`` (``h_factor`` is
  1 / sigma_noise^2 / temperature, 1 here) and the prior precision is added to the
  eigenvalue products as ``deltas[block]``, giving eigenvalues ``outer(l1, l2) + delta``
  with eigenvectors ``kron(Q1, Q2)``.

Two of the fit's steps are done here rather than by the libraries, for the bytes: both
call ``torch.sqrt``, whose float32 result on the CPU (MKL's) differs in the last bit
between CPUs (``training.ieee``), so the fitted factors and prior precision did too.
curvlinops' square root of the cross-entropy Hessian is replaced, for the fit only, by
the same formula with the correctly rounded root, and the marginal-likelihood prior
search is laplace-torch's (Adam, step 0.1, 100 steps on the log prior precision, from
1) with torch's fused Adam, whose square root is the exact one.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

from ..training import ieee

LAPLACE_FORMAT = "bayesavg.laplace/1"
KINDS = ("probit", "map")
PRIORS = ("marglik", "none")
# Warnings laplace-torch raises on every fit that say nothing about this fit.
_NOISE = (r".*torch\.jit\.script.*is deprecated", r"By default `link_approx` is `probit`")
# laplace-torch's marginal-likelihood search of the prior precision (optimize_prior_precision)
MARGLIK_STEPS, MARGLIK_LR = 100, 0.1


def last_layer_name(model: nn.Module) -> str:
    """Name of the network's last nn.Linear, the layer the last-layer Laplace treats."""
    names = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not names:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layer for a last-layer Laplace")
    return names[-1]


class _Batches:
    """Re-iterable batches with the ``dataset`` length laplace-torch reads N from."""

    def __init__(self, batches: list[tuple[Tensor, Tensor]]) -> None:
        self.batches = batches
        self.dataset = range(sum(len(y) for _, y in batches))

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class LazyBatches:
    """Re-iterable batches of ``n`` points, each made by ``batch(start, stop)`` as it is
    read (and dropped after), with the ``dataset`` length laplace-torch reads N from: a
    training split, normalised as float32, is four times its uint8 bytes and, streamed,
    larger than the device, so it is never there whole."""

    def __init__(
        self, n: int, batch_size: int, batch: Callable[[int, int], tuple[Tensor, Tensor]]
    ) -> None:
        self.dataset = range(n)
        self.batch_size = batch_size
        self._batch = batch

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        n = len(self.dataset)
        for start in range(0, n, self.batch_size):
            yield self._batch(start, min(start + self.batch_size, n))

    def __len__(self) -> int:
        return math.ceil(len(self.dataset) / self.batch_size)


# What laplace-torch's import logs on the root logger (INFO, so every stage showed it):
# that an optional backend this module never uses is missing, and a command to install it.
_IMPORT_NOISE = "Asdfghjkl backend not available"


class _DropImportNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_IMPORT_NOISE)


def laplace_library() -> ModuleType:
    """laplace-torch (only fitting needs it), imported without its line about asdfghjkl."""
    quiet, root = _DropImportNoise(), logging.getLogger()
    root.addFilter(quiet)
    try:
        import laplace
    finally:
        root.removeFilter(quiet)
    return laplace


def fit_last_layer(
    model: nn.Module, loader: Iterable[tuple[Tensor, Tensor]], *, prior: str | float = "marglik"
) -> dict[str, Any]:
    """Fit the KFAC last-layer Laplace at the model's weights; its state as plain tensors.

    laplace-torch works on a deep copy in eval mode, so the caller's model (weights,
    buffers, train/eval flag) is untouched. ``prior="marglik"`` tunes one scalar prior
    precision by the Laplace marginal likelihood; ``"none"`` keeps laplace-torch's 1.0; a
    number fixes it.
    A loader without ``.dataset`` (laplace-torch reads N from it) is read into a list.
    """
    fixed = not isinstance(prior, str)
    if (fixed and not 0 < float(prior) < math.inf) or (not fixed and prior not in PRIORS):
        raise ValueError(
            f"prior must be one of {', '.join(PRIORS)} or a positive number, got {prior!r}"
        )
    name = last_layer_name(model)
    layer = model.get_submodule(name)
    if not hasattr(loader, "dataset"):
        loader = _Batches(list(loader))
    with warnings.catch_warnings():
        for message in _NOISE:
            warnings.filterwarnings("ignore", message=message)
        la = laplace_library().Laplace(
            model,
            "classification",
            subset_of_weights="last_layer",
            hessian_structure="kron",
            last_layer_name=name,
            prior_precision=float(prior) if fixed else 1.0,
        )
        with exact_hessian_sqrt():
            la.fit(loader)
        if prior == "marglik":
            _optimize_prior_precision(la)
        deltas = la.posterior_precision.deltas.detach()

    def cpu(t: Tensor) -> Tensor:
        return t.detach().cpu().clone()

    blocks = [
        {"eigenvectors": [cpu(q) for q in qs], "eigenvalues": [cpu(ls) for ls in lss]}
        for qs, lss in zip(la.H.eigenvectors, la.H.eigenvalues, strict=True)
    ]
    return {
        "format": LAPLACE_FORMAT,
        "layer": name,
        "in_features": layer.in_features,
        "out_features": layer.out_features,
        "bias": layer.bias is not None,
        "mean": cpu(la.mean),
        "blocks": blocks,
        "deltas": cpu(deltas).double(),
        "h_factor": 1.0 / float(la.sigma_noise) ** 2 / float(la.temperature),
        "prior_precision": cpu(la.prior_precision).double(),
        "n_data": int(la.n_data),
    }


def cross_entropy_hessian_sqrt(output_one_datum: Tensor) -> Tensor:
    """S with S S^T the Hessian of the cross-entropy at one output (1, C): curvlinops' formula
    ``diag(sqrt p) - p sqrt(p)^T``, with the correctly rounded square root."""
    p = output_one_datum.softmax(dim=1).squeeze()
    p_sqrt = ieee.sqrt(p)
    return torch.diag(p_sqrt) - torch.outer(p, p_sqrt)


@contextmanager
def exact_hessian_sqrt() -> Iterator[None]:
    """While open, curvlinops' KFAC takes the cross-entropy Hessian's square root from
    ``cross_entropy_hessian_sqrt``; other losses keep curvlinops' own."""
    from curvlinops import kfac

    original = kfac.loss_hessian_matrix_sqrt

    def hessian_sqrt(output_one_datum: Tensor, target_one_datum: Tensor, loss_func: nn.Module):
        if isinstance(loss_func, nn.CrossEntropyLoss):
            return cross_entropy_hessian_sqrt(output_one_datum)
        return original(output_one_datum, target_one_datum, loss_func)

    kfac.loss_hessian_matrix_sqrt = hessian_sqrt
    try:
        yield
    finally:
        kfac.loss_hessian_matrix_sqrt = original


def _optimize_prior_precision(la: Any) -> None:
    """laplace-torch's scalar marginal-likelihood search, stepped by fused Adam."""
    log_prior = torch.zeros(1, device=la.mean.device, requires_grad=True)
    optimizer = torch.optim.Adam([log_prior], lr=MARGLIK_LR, fused=True)
    for _ in range(MARGLIK_STEPS):
        optimizer.zero_grad()
        (-la.log_marginal_likelihood(prior_precision=log_prior.exp())).backward()
        optimizer.step()
    la.prior_precision = log_prior.detach().exp()


def _fail(key: str, problem: str) -> ValueError:
    return ValueError(f"laplace state: {key} {problem}")


def _tensor(value: Any, key: str, shape: tuple[int, ...]) -> Tensor:
    """A finite floating tensor of ``shape``, or a one-line error naming ``key``."""
    if not isinstance(value, Tensor) or not value.is_floating_point():
        raise _fail(key, f"is a {type(value).__name__}, expected a floating tensor")
    if tuple(value.shape) != shape:
        raise _fail(key, f"has shape {tuple(value.shape)}, expected {shape}")
    if not bool(torch.isfinite(value).all()):
        raise _fail(key, "has non-finite values")
    return value


def _int(state: dict, key: str) -> int:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(key, f"is {value!r}, expected a positive int")
    return value


def _precision_eigenvalues(block: dict, h_factor: float, delta: Tensor) -> Tensor:
    """Eigenvalues of one block's posterior precision, in float64, as laplace-torch forms them."""
    ls = [h_factor ** (1 / len(block["eigenvalues"])) * v.double() for v in block["eigenvalues"]]
    return (torch.outer(ls[0], ls[1]) if len(ls) == 2 else ls[0]) + delta.double()


def check_state(state: dict, num_params: int) -> None:
    """Raise a one-line ValueError naming the first bad key of a Laplace state."""
    if not isinstance(state, dict):
        raise ValueError(f"laplace state is a {type(state).__name__}, expected a dict")
    if state.get("format") != LAPLACE_FORMAT:
        raise _fail("format", f"is {state.get('format')!r}, expected {LAPLACE_FORMAT!r}")
    if not isinstance(state.get("layer"), str):
        raise _fail("layer", f"is {state.get('layer')!r}, expected a module name")
    d, c = _int(state, "in_features"), _int(state, "out_features")
    _int(state, "n_data")
    if not isinstance(state.get("bias"), bool):
        raise _fail("bias", f"is {state.get('bias')!r}, expected a bool")
    h_factor = state.get("h_factor")
    if not isinstance(h_factor, float) or not 0 < h_factor < math.inf:
        raise _fail("h_factor", f"is {h_factor!r}, expected a positive finite float")
    bias = state["bias"]
    if c * d + c * bias != num_params:
        raise _fail("in_features", f"{d} x out_features {c} (+bias) != {num_params} parameters")
    _tensor(state.get("mean"), "mean", (num_params,))
    n_blocks = 1 + bias
    blocks = state.get("blocks")
    if not isinstance(blocks, list) or len(blocks) != n_blocks:
        raise _fail("blocks", f"is not a list of {n_blocks} blocks")
    deltas = _tensor(state.get("deltas"), "deltas", (n_blocks,))
    if not bool((deltas > 0).all()):
        raise _fail("deltas", "has values <= 0, expected positive prior precisions")
    prior = state.get("prior_precision")
    if not isinstance(prior, Tensor) or prior.dtype != torch.float64:
        raise _fail("prior_precision", "is not a float64 tensor")
    _tensor(prior, "prior_precision", (1,) if prior.shape != (n_blocks,) else (n_blocks,))
    if not torch.allclose(prior.expand(n_blocks), deltas):
        raise _fail("prior_precision", f"{prior.tolist()} does not match deltas {deltas.tolist()}")
    for i, (block, sizes) in enumerate(zip(blocks, [(c, d), (c,)], strict=False)):
        if not isinstance(block, dict):
            raise _fail(f"blocks[{i}]", f"is a {type(block).__name__}, expected a dict")
        for key in ("eigenvectors", "eigenvalues"):
            if not isinstance(block.get(key), list) or len(block[key]) != len(sizes):
                raise _fail(f"blocks[{i}].{key}", f"is not a list of {len(sizes)} tensors")
        for j, n in enumerate(sizes):
            _tensor(block["eigenvectors"][j], f"blocks[{i}].eigenvectors[{j}]", (n, n))
            vals = _tensor(block["eigenvalues"][j], f"blocks[{i}].eigenvalues[{j}]", (n,))
            # eigh of a PSD factor is accurate to about n * eps * its largest eigenvalue
            tol = 10 * n * torch.finfo(vals.dtype).eps * float(vals.abs().max())
            if float(vals.min()) < -tol:
                raise _fail(f"blocks[{i}].eigenvalues[{j}]", f"has {float(vals.min()):.3g} < 0")
        if not bool((_precision_eigenvalues(block, h_factor, deltas[i]) > 0).all()):
            raise _fail(f"blocks[{i}].eigenvalues", "give a precision that is not positive")


class LastLayerLaplace:
    """N(mean, Sigma) over the last layer's parameters, predicted without laplace-torch."""

    def __init__(self, state: dict) -> None:
        """Use ``from_state_dict``, which checks the state first."""
        self._state = state
        self.in_features: int = state["in_features"]
        self.out_features: int = state["out_features"]
        self.bias: bool = state["bias"]
        self.mean: Tensor = state["mean"]
        self._mean64 = self.mean.double()
        self._vectors = [[q.double() for q in b["eigenvectors"]] for b in state["blocks"]]
        self._eig = [
            _precision_eigenvalues(block, state["h_factor"], delta)
            for block, delta in zip(state["blocks"], state["deltas"], strict=True)
        ]

    @classmethod
    def from_state_dict(
        cls, state: dict, device: torch.device | str | None = None
    ) -> LastLayerLaplace:
        """Check ``state`` and move its tensors to ``device`` (None: where they are)."""
        get = state.get if isinstance(state, dict) else {}.get
        c, d = get("out_features"), get("in_features")
        # a bad in_features or out_features is reported by check_state itself
        sizes_ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (c, d))
        check_state(state, c * d + c * bool(get("bias")) if sizes_ok else -1)

        def move(value: Any) -> Any:
            if isinstance(value, Tensor):
                return value if device is None else value.to(device)
            if isinstance(value, list):
                return [move(v) for v in value]
            if isinstance(value, dict):
                return {k: move(v) for k, v in value.items()}
            return value

        return cls(move(state))

    def state_dict(self) -> dict:
        """The state this posterior was built from (tensors shared, not copied)."""
        return dict(self._state)

    @property
    def num_params(self) -> int:
        return self.mean.numel()

    def sample(self, n: int | None, generator: torch.Generator) -> Tensor:
        """Draws ``mean + P^(-1/2) z`` (symmetric root, as laplace-torch): (P,) or (n, P)."""
        if not isinstance(generator, torch.Generator):
            raise TypeError("sample needs a torch.Generator: draws must be reproducible")
        count, device = (1 if n is None else n), self.mean.device
        c, d = self.out_features, self.in_features
        z = torch.randn(
            count, self.num_params, generator=generator, dtype=torch.float64, device=device
        )
        q1, q2 = self._vectors[0]
        zw = z[:, : c * d].reshape(count, c, d)
        zw = q1 @ ((q1.T @ zw @ q2) * self._eig[0].rsqrt()) @ q2.T
        parts = [zw.reshape(count, c * d)]
        if self.bias:
            qb = self._vectors[1][0]
            parts.append(((z[:, c * d :] @ qb) * self._eig[1].rsqrt()) @ qb.T)
        theta = (self._mean64 + torch.cat(parts, dim=1)).to(self.mean.dtype)
        return theta[0] if n is None else theta

    def logit_variance(self, features: Tensor) -> Tensor:
        """diag(J Sigma J^T) per input, (N, C), from the eigenbasis; no dense covariance.

        J = [I_C kron phi^T, I_C], so the weight part is
        ``sum_i Q1[c, i]^2 sum_j (phi . Q2[:, j])^2 / eig[i, j]`` and the bias adds its own
        marginal variances (the blocks are uncorrelated).
        """
        phi = self._features(features)
        q1, q2 = self._vectors[0]
        var = ((phi @ q2).square() @ self._eig[0].reciprocal().T) @ q1.square().T
        if self.bias:
            qb = self._vectors[1][0]
            var = var + qb.square() @ self._eig[1].reciprocal()
        return var

    def log_probs(self, features: Tensor, kind: str = "probit") -> Tensor:
        """float64 log predictive probabilities (N, C) from the last layer's inputs (N, D).

        "probit": laplace-torch's GLM predictive, softmax(f_mu / sqrt(1 + pi/8 var_f));
        "map": softmax at the mean.
        """
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        phi = self._features(features)
        c, d = self.out_features, self.in_features
        logits = phi @ self._mean64[: c * d].reshape(c, d).T
        if self.bias:
            logits = logits + self._mean64[c * d :]
        if kind == "probit":
            logits = logits / ieee.sqrt(1 + math.pi / 8 * self.logit_variance(phi))
        return torch.log_softmax(logits, dim=-1)

    def _features(self, features: Tensor) -> Tensor:
        if features.dim() != 2 or features.shape[1] != self.in_features:
            raise ValueError(
                f"features have shape {tuple(features.shape)}, expected (N, {self.in_features})"
            )
        return features.to(device=self.mean.device, dtype=torch.float64)
