"""Last-layer KFAC Laplace: the stored tensors against laplace-torch's own posterior."""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import sys
import warnings
import weakref
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bayesavg.posteriors import last_layer_laplace as lap
from bayesavg.posteriors.last_layer_laplace import (
    LAPLACE_FORMAT,
    LastLayerLaplace,
    LazyBatches,
    check_state,
    fit_last_layer,
    last_layer_name,
)


@dataclasses.dataclass
class Fitted:
    model: nn.Sequential
    loader: DataLoader
    before: dict[str, torch.Tensor]
    state: dict[str, Any]
    la: Any  # laplace-torch's own fit of the same model, for reference
    x_test: torch.Tensor


def _train() -> tuple[nn.Sequential, DataLoader]:
    """A small MLP 8 -> 16 -> 3 fitted to 200 synthetic points of 3 classes."""
    torch.manual_seed(0)
    x = torch.randn(200, 8)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=5e-2)
    for _ in range(30):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model, DataLoader(TensorDataset(x, y), batch_size=64)


def _reference(model: nn.Module, loader: DataLoader, marglik: bool = True) -> Any:
    """laplace-torch fitted directly, as fit_last_layer is documented to do."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import laplace

        la = laplace.Laplace(
            model, "classification", subset_of_weights="last_layer", hessian_structure="kron"
        )
        la.fit(loader)
        if marglik:
            la.optimize_prior_precision(method="marglik", prior_structure="scalar")
    return la


@pytest.fixture(scope="module")
def fitted() -> Fitted:
    model, loader = _train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = fit_last_layer(model, loader)
    return Fitted(model, loader, before, state, _reference(model, loader), torch.randn(50, 8))


def _without_bias(fitted: Fitted) -> Fitted:
    """The same network with its output bias dropped; prior left at 1.0 to stay quick."""
    model = nn.Sequential(fitted.model[0], nn.Tanh(), nn.Linear(16, 3, bias=False))
    model[2].weight.data.copy_(fitted.model[2].weight.data)
    state = fit_last_layer(model, fitted.loader, prior="none")
    la = _reference(model, fitted.loader, marglik=False)
    return Fitted(model, fitted.loader, {}, state, la, fitted.x_test)


def _dense_covariance(state: dict) -> torch.Tensor:
    """Sigma rebuilt densely from the stored eigendecompositions (the slow, obvious way)."""
    blocks = []
    for block, delta in zip(state["blocks"], state["deltas"], strict=True):
        qs = [q.double() for q in block["eigenvectors"]]
        ls = [state["h_factor"] ** (1 / len(qs)) * v.double() for v in block["eigenvalues"]]
        q = torch.kron(qs[0], qs[1]) if len(qs) == 2 else qs[0]
        eig = (torch.outer(ls[0], ls[1]).flatten() if len(ls) == 2 else ls[0]) + delta
        blocks.append(q @ torch.diag(1 / eig) @ q.T)
    return torch.block_diag(*blocks)


def _features(model: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model[:-1](x)


def test_dense_covariance_equals_laplace_torch(fitted: Fitted) -> None:
    # KronLaplace has no posterior_covariance: its dense covariance is the decomposed
    # posterior precision to the power -1
    theirs = fitted.la.posterior_precision.to_matrix(exponent=-1).double()
    ours = _dense_covariance(fitted.state)
    assert ours.shape == (3 * 16 + 3, 3 * 16 + 3)
    assert float((ours - theirs).norm() / theirs.norm()) < 1e-6
    assert torch.equal(fitted.state["mean"], fitted.la.mean)


@pytest.mark.parametrize("bias", [True, False])
def test_probit_log_probs_equal_laplace_torch(fitted: Fitted, bias: bool) -> None:
    case = fitted if bias else _without_bias(fitted)
    post = LastLayerLaplace.from_state_dict(case.state)
    feats = _features(case.model, case.x_test)
    ours = post.log_probs(feats, "probit")
    theirs = case.la(case.x_test, pred_type="glm", link_approx="probit").double().log()
    assert ours.dtype == torch.float64 and ours.shape == (50, 3)
    assert float((ours - theirs).abs().max()) < 1e-5
    map_ = post.log_probs(feats, "map")
    with torch.no_grad():
        expected = torch.log_softmax(case.model(case.x_test).double(), -1)
    assert float((map_ - expected).abs().max()) < 1e-5
    # the variance term is not negligible here, so the probit check compares something
    assert float((ours - map_).abs().max()) > 1e-3


def test_logit_variance_equals_dense_form(fitted: Fitted) -> None:
    post = LastLayerLaplace.from_state_dict(fitted.state)
    feats = _features(fitted.model, fitted.x_test)
    js, _ = fitted.la.backend.last_layer_jacobians(fitted.x_test)
    sigma = _dense_covariance(fitted.state)
    dense = torch.einsum("ncp,pq,nkq->nck", js.double(), sigma, js.double())
    ours = post.logit_variance(feats)
    assert torch.allclose(ours, dense.diagonal(dim1=1, dim2=2), rtol=1e-10, atol=0)


def test_samples_have_the_posterior_moments(fitted: Fitted) -> None:
    post = LastLayerLaplace.from_state_dict(fitted.state)
    n = 20000
    draws = post.sample(n, torch.Generator().manual_seed(0))
    assert draws.dtype == fitted.state["mean"].dtype and draws.shape == (n, 51)
    one = post.sample(None, torch.Generator().manual_seed(1))
    assert one.shape == (51,)
    assert torch.equal(one, post.sample(1, torch.Generator().manual_seed(1))[0])
    sigma = _dense_covariance(fitted.state)
    var = sigma.diagonal()
    # For Gaussian draws an empirical covariance entry has standard error
    # sqrt((S_ii S_jj + S_ij^2) / n) and the mean sqrt(S_ii / n). With 51 * 52 / 2
    # distinct entries the largest |z| of a correct sampler is about 4; 5 bounds it
    # (chance of a false alarm ~1e-3), while a wrong factor or transposed
    # Kronecker order gives z in the tens or more.
    x = draws.double()
    z_cov = (torch.cov(x.T) - sigma) / torch.sqrt((torch.outer(var, var) + sigma**2) / n)
    z_mean = (x.mean(0) - fitted.state["mean"].double()) / torch.sqrt(var / n)
    assert float(z_cov.abs().max()) < 5
    assert float(z_mean.abs().max()) < 5


def test_state_round_trips_through_weights_only_load(fitted: Fitted, tmp_path) -> None:
    post = LastLayerLaplace.from_state_dict(fitted.state)
    path = tmp_path / "laplace.pt"
    torch.save(post.state_dict(), path)
    loaded = LastLayerLaplace.from_state_dict(torch.load(path, weights_only=True))
    feats = _features(fitted.model, fitted.x_test)
    assert torch.equal(loaded.log_probs(feats, "probit"), post.log_probs(feats, "probit"))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(loaded.sample(5, g1), post.sample(5, g2))


def test_marglik_tunes_the_prior_and_leaves_the_model_alone(fitted: Fitted) -> None:
    prior = fitted.state["prior_precision"]
    assert prior.dtype == torch.float64 and prior.shape == (1,)
    assert float(prior) > 0 and abs(float(prior) - 1.0) > 1e-3
    assert torch.allclose(prior, fitted.la.prior_precision.double())
    assert fitted.state["n_data"] == 200
    after = fitted.model.state_dict()
    assert after.keys() == fitted.before.keys()
    assert all(torch.equal(after[k], v) for k, v in fitted.before.items())
    assert fitted.model.training  # the caller's train/eval flag is untouched too


def test_plain_batches_fit_like_a_dataloader(fitted: Fitted) -> None:
    from_loader = fit_last_layer(fitted.model, fitted.loader, prior="none")
    from_list = fit_last_layer(fitted.model, list(fitted.loader), prior="none")
    assert float(from_list["prior_precision"]) == 1.0 and from_list["n_data"] == 200
    for a, b in zip(from_loader["blocks"], from_list["blocks"], strict=True):
        assert all(
            torch.equal(x, y) for x, y in zip(a["eigenvalues"], b["eigenvalues"], strict=True)
        )
    with pytest.raises(ValueError, match="prior"):
        fit_last_layer(fitted.model, fitted.loader, prior="grid")


def test_lazy_batches_fit_like_a_dataloader_with_one_batch_alive(fitted: Fitted) -> None:
    """The Laplace trajectory's training split, made a batch at a time as it is read
    (a streamed split's float32 copy would not fit on the device): the same fit, and at
    most one batch alive at any moment."""
    x, y = fitted.loader.dataset.tensors
    made: list[weakref.ref[torch.Tensor]] = []
    most_alive = 0

    def batch(i: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal most_alive
        gc.collect()
        most_alive = max(most_alive, 1 + sum(r() is not None for r in made))
        xb = x[i:j].clone()
        made.append(weakref.ref(xb))
        return xb, y[i:j]

    lazy = LazyBatches(len(x), 64, batch)
    assert len(lazy) == 4 and len(lazy.dataset) == 200
    assert [len(b) for b, _ in lazy] == [64, 64, 64, 8]  # re-iterable: laplace reads it again
    made.clear()
    got = fit_last_layer(fitted.model, lazy, prior="none")
    want = fit_last_layer(fitted.model, fitted.loader, prior="none")
    assert got["n_data"] == 200
    for a, b in zip(got["blocks"], want["blocks"], strict=True):
        assert all(
            torch.equal(u, v) for u, v in zip(a["eigenvalues"], b["eigenvalues"], strict=True)
        )
    assert most_alive <= 2  # the one being made, and at most the one laplace-torch just used


def _broken(state: dict, key: str, value: Any, index: tuple[int, ...] = ()) -> dict:
    bad = {**state, "blocks": [{k: list(v) for k, v in b.items()} for b in state["blocks"]]}
    if index:
        bad["blocks"][index[0]][key][index[1]] = value
    else:
        bad[key] = value
    return bad


def test_check_state_names_the_bad_key(fitted: Fitted) -> None:
    state = fitted.state
    check_state(state, 51)
    vecs = state["blocks"][0]["eigenvectors"][1]
    vals = state["blocks"][0]["eigenvalues"][1]
    cases = [
        (_broken(state, "format", "bayesavg.laplace/0"), "format"),
        (_broken(state, "eigenvectors", vecs[:-1], (0, 1)), "blocks[0].eigenvectors[1]"),
        (_broken(state, "mean", torch.full_like(state["mean"], float("nan"))), "mean"),
        (_broken(state, "eigenvalues", vals - 2 * float(vals.max()), (0, 1)), "eigenvalues[1]"),
        (_broken(state, "prior_precision", state["prior_precision"] * 2), "prior_precision"),
    ]
    for bad, key in cases:
        with pytest.raises(ValueError) as err:
            check_state(bad, 51)
        assert key in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="in_features"):
        check_state(state, 50)
    with pytest.raises(ValueError, match=r"laplace state: mean has shape \(50,\)"):
        LastLayerLaplace.from_state_dict(_broken(state, "mean", state["mean"][:-1]))
    assert state["format"] == LAPLACE_FORMAT  # the originals were not modified


def test_predicting_never_imports_laplace(fitted: Fitted, monkeypatch) -> None:
    # a fresh copy of the module, loaded and used while `import laplace` fails
    for name in [m for m in sys.modules if m == "laplace" or m.startswith("laplace.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "laplace", None)
    # named inside the package, so its relative imports (bayesavg.training.ieee) resolve
    fresh_name = "bayesavg.posteriors._fresh_laplace"
    spec = importlib.util.spec_from_file_location(fresh_name, lap.__file__)
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    post = fresh.LastLayerLaplace.from_state_dict(fitted.state)
    feats = _features(fitted.model, fitted.x_test)
    expected = LastLayerLaplace.from_state_dict(fitted.state).log_probs(feats, "probit")
    assert torch.equal(post.log_probs(feats, "probit"), expected)
    post.sample(2, torch.Generator().manual_seed(0))


def test_last_layer_name_finds_nested_linear() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
            self.head = nn.Sequential(nn.Dropout(), nn.Sequential(nn.Linear(4, 2)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(x))

    assert last_layer_name(Net()) == "head.1.0"
    with pytest.raises(ValueError, match=r"no nn\.Linear"):
        last_layer_name(nn.Sequential(nn.ReLU()))


def test_a_fixed_prior_precision_is_kept_and_a_bad_one_refused(fitted: Fitted) -> None:
    state = fit_last_layer(fitted.model, fitted.loader, prior=0.7)
    assert torch.allclose(state["prior_precision"], torch.tensor([0.7], dtype=torch.float64))
    assert torch.allclose(state["deltas"], torch.full((2,), 0.7, dtype=torch.float64))
    for bad in (0.0, -1.0, "mle"):
        with pytest.raises(ValueError, match="prior must be one of marglik, none or a positive"):
            fit_last_layer(fitted.model, fitted.loader, prior=bad)


def test_the_hessian_root_is_curvlinops_formula_with_the_correctly_rounded_root() -> None:
    from curvlinops.kfac_utils import loss_hessian_matrix_sqrt

    from bayesavg.training import ieee

    torch.manual_seed(0)
    outputs = torch.randn(200, 1, 10) * 4
    loss = nn.CrossEntropyLoss(reduction="sum")
    for out in outputs:
        s = lap.cross_entropy_hessian_sqrt(out)
        p = out.softmax(dim=1).squeeze()
        root = ieee.sqrt(p)
        assert torch.equal(s, torch.diag(root) - torch.outer(p, root))
        # curvlinops' own differs at most by torch.sqrt's last bit
        assert torch.allclose(s, loss_hessian_matrix_sqrt(out, torch.tensor([0]), loss), atol=2e-7)
        # and S S^T is the cross-entropy Hessian diag(p) - p p^T
        p64 = out.double().softmax(dim=1).squeeze()
        hessian = torch.diag(p64) - torch.outer(p64, p64)
        assert torch.allclose(s.double() @ s.double().T, hessian, atol=1e-6)


def test_the_exact_root_is_used_inside_the_fit_only() -> None:
    from curvlinops import kfac

    original = kfac.loss_hessian_matrix_sqrt
    out = torch.randn(1, 4)
    with lap.exact_hessian_sqrt():
        swapped = kfac.loss_hessian_matrix_sqrt
        assert swapped is not original
        ce = swapped(out, torch.tensor([1]), nn.CrossEntropyLoss(reduction="sum"))
        assert torch.equal(ce, lap.cross_entropy_hessian_sqrt(out))
        mse = swapped(out, torch.zeros(1, 4), nn.MSELoss(reduction="sum"))
        assert torch.equal(mse, original(out, torch.zeros(1, 4), nn.MSELoss(reduction="sum")))
    assert kfac.loss_hessian_matrix_sqrt is original
    with pytest.raises(RuntimeError, match="inside"), lap.exact_hessian_sqrt():
        raise RuntimeError("inside")
    assert kfac.loss_hessian_matrix_sqrt is original


@pytest.mark.parametrize(
    ("network", "message"),
    [
        (
            "torchvision:squeezenet1_1",
            r"^finetune\.laplace: a last-layer Laplace treats the last nn\.Linear, which must "
            r"be the head \(the 5 logits\); torchvision:squeezenet1_1's head is "
            r"'classifier\.1', a Conv2d, and no nn\.Linear: choose another network or method$",
        ),
        ("torchvision:resnet18", None),
        ("lenet5", None),
    ],
)
def test_a_laplace_needs_a_linear_head(network: str, message: str | None) -> None:
    """SqueezeNet's head is a 1x1 convolution: one line before any fitting, not a
    traceback from laplace-torch or a Laplace over another layer."""
    from bayesavg.models import build_model
    from bayesavg.runtime.errors import UserError
    from bayesavg.trajectories.laplace_fit import check_last_layer

    shape = (1, 28, 28) if network == "lenet5" else (3, 64, 64)
    with torch.device("meta"):
        model = build_model(network, shape, 5)
    start = type("Start", (), {"num_classes": 5, "model_name": network})()
    if message is None:
        check_last_layer(model, start, "laplace")
    else:
        with pytest.raises(UserError, match=message):
            check_last_layer(model, start, "laplace")
    sequential = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    with pytest.raises(UserError, match=r"head is '0', a Linear, its last nn\.Linear '2'"):
        check_last_layer(sequential, start, "laplace")


IMPORT_LOG = (
    "from bayesavg.runtime.entry import setup_logging\n"
    "setup_logging()\n"
    "{import_it}\n"
    "import logging\n"
    "logging.info('after the import')\n"
)


@pytest.mark.parametrize(
    ("import_it", "noisy"),
    [
        ("import laplace", True),
        (
            "from bayesavg.posteriors.last_layer_laplace import laplace_library\nlaplace_library()",
            False,
        ),
    ],
)
def test_the_fit_imports_laplace_without_its_asdfghjkl_line(import_it: str, noisy: bool) -> None:
    """laplace-torch's import logs on the root logger that a backend never used here is
    not installed, with a command to install it: a stage's log shows it as advice.
    The library's own import does print it (else the filter would be dead code); the
    fit's does not, and the root logger logs as before after it."""
    import subprocess

    code = IMPORT_LOG.format(import_it=import_it)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert ("Asdfghjkl backend not available" in done.stderr) is noisy, done.stderr
    assert "INFO root: after the import" in done.stderr
