"""OOD scores and detection metrics; scikit-learn is the oracle (tests only), and the
animal_mnist loader with its restricted unpickler and checksum."""

from __future__ import annotations

import gzip
import math
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from bayesavg.data import ood_data
from bayesavg.evaluation.ood import (
    OODAccumulator,
    auroc,
    average_precision,
    detection_metrics,
    fpr_at_tpr,
    ood_metrics,
    ood_scores,
    ood_scores_from_log,
)
from bayesavg.runtime.errors import UserError

# --- detection metrics ------------------------------------------------------------


def _case(seed: int, n_in: int, n_out: int, decimals: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores (OOD shifted up) rounded to ``decimals`` so many are tied; labels 1 = OOD."""
    rng = np.random.default_rng(seed)
    s = np.concatenate([rng.normal(0.0, 1.0, n_in), rng.normal(0.7, 1.2, n_out)])
    s = np.round(s, decimals)
    y = np.concatenate([np.zeros(n_in, bool), np.ones(n_out, bool)])
    perm = rng.permutation(s.size)
    return torch.from_numpy(s[perm]), torch.from_numpy(y[perm])


def _sk_fpr95(y: np.ndarray, s: np.ndarray) -> float:
    """FPR at the first ROC point (thresholds decreasing) with TPR >= 0.95."""
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    return float(fpr[np.searchsorted(tpr, 0.95, side="left")])


CASES = [
    (seed, n_in, n_out, dec)
    for seed, (n_in, n_out) in enumerate([(500, 300), (50, 1000), (1000, 40), (7, 3), (200, 200)])
    for dec in (0, 1, 3)
]


@pytest.mark.parametrize(("seed", "n_in", "n_out", "decimals"), CASES)
def test_metrics_match_sklearn_with_ties(seed: int, n_in: int, n_out: int, decimals: int) -> None:
    scores, is_ood = _case(seed, n_in, n_out, decimals)
    s, y = scores.numpy(), is_ood.numpy()
    assert np.unique(s).size < s.size or decimals == 3  # ties present where intended
    assert auroc(scores, is_ood).item() == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert average_precision(scores, is_ood).item() == pytest.approx(
        average_precision_score(y, s), abs=1e-12
    )
    assert average_precision(-scores, ~is_ood).item() == pytest.approx(
        average_precision_score(~y, -s), abs=1e-12
    )
    assert fpr_at_tpr(scores, is_ood).item() == pytest.approx(_sk_fpr95(y, s), abs=1e-15)


@pytest.mark.parametrize("seed", range(4))
def test_detection_metrics_from_in_and_out_scores(seed: int) -> None:
    scores, is_ood = _case(seed, 300, 200, 1)
    got = detection_metrics(scores[~is_ood], scores[is_ood])
    s, y = scores.numpy(), is_ood.numpy()
    assert set(got) == {"auroc", "aupr_in", "aupr_out", "fpr95"}
    assert all(v.dtype == torch.float64 and v.dim() == 0 for v in got.values())
    assert got["auroc"].item() == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert got["aupr_out"].item() == pytest.approx(average_precision_score(y, s), abs=1e-12)
    assert got["aupr_in"].item() == pytest.approx(average_precision_score(~y, -s), abs=1e-12)
    assert got["fpr95"].item() == pytest.approx(_sk_fpr95(y, s), abs=1e-15)


def test_perfect_separation() -> None:
    got = detection_metrics(torch.linspace(0, 1, 50), torch.linspace(2, 3, 20))
    assert got["auroc"].item() == 1.0
    assert got["fpr95"].item() == 0.0
    assert got["aupr_in"].item() == 1.0
    assert got["aupr_out"].item() == 1.0
    # Reversed: every in-distribution input scores above every OOD one.
    worst = detection_metrics(torch.linspace(2, 3, 50), torch.linspace(0, 1, 20))
    assert worst["auroc"].item() == 0.0
    assert worst["fpr95"].item() == 1.0


@pytest.mark.parametrize("seed", range(5))
def test_swapped_labels_give_one_minus_auroc(seed: int) -> None:
    scores, is_ood = _case(seed, 400, 250, 1)
    a = auroc(scores, is_ood).item()
    assert auroc(scores, ~is_ood).item() == pytest.approx(1 - a, abs=1e-12)
    assert auroc(-scores, is_ood).item() == pytest.approx(1 - a, abs=1e-12)


def test_fpr95_by_hand_with_ties() -> None:
    """20 OOD scores 1..20 and in-distribution scores {0, 2, 2, 5, 5, 5}.

    95% of 20 OOD = 19 detected, so t = 2 (the largest t with 19 OOD >= t).
    "score >= 2" flags the in-distribution 2, 2, 5, 5, 5: FPR = 5/6. The tie at 2
    is not split: no threshold flags one 2 and not the other.
    """
    got = detection_metrics(
        torch.tensor([0.0, 2, 2, 5, 5, 5]), torch.arange(1, 21, dtype=torch.float64)
    )
    assert got["fpr95"].item() == pytest.approx(5 / 6, abs=1e-15)


def test_all_tied_scores() -> None:
    got = detection_metrics(torch.zeros(30), torch.zeros(10))
    assert got["auroc"].item() == 0.5
    assert got["fpr95"].item() == 1.0
    assert got["aupr_out"].item() == pytest.approx(10 / 40)
    assert got["aupr_in"].item() == pytest.approx(30 / 40)


def test_metric_input_errors_are_user_errors() -> None:
    with pytest.raises(UserError, match="both in-distribution and OOD"):
        detection_metrics(torch.rand(5), torch.rand(0))
    with pytest.raises(UserError, match="not finite"):
        detection_metrics(torch.tensor([0.1, float("nan")]), torch.rand(3))


def test_ood_metrics_nests_scores() -> None:
    g = torch.Generator().manual_seed(0)
    s_in = {"msp": torch.rand(30, generator=g), "entropy": torch.rand(30, generator=g)}
    s_out = {"msp": torch.rand(10, generator=g) + 0.5, "entropy": torch.rand(10, generator=g)}
    got = ood_metrics(s_in, s_out)
    assert set(got) == {"msp", "entropy"}
    assert got["msp"]["auroc"].item() == detection_metrics(s_in["msp"], s_out["msp"])["auroc"]


# --- scores ----------------------------------------------------------------------


def _log_probs(seed: int, s: int, n: int = 64, k: int = 10, spread: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(spread * torch.randn(s, n, k, generator=g, dtype=torch.float64), -1)


def _brute_scores(probs: np.ndarray) -> dict[str, np.ndarray]:
    """Direct formulas on probabilities: p̄, 1 - max p̄, H[p̄], H[p̄] - mean_s H[p_s]."""

    def h(p: np.ndarray) -> np.ndarray:
        return -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)

    mean = probs.mean(0)
    return {
        "msp": 1 - mean.max(-1),
        "entropy": h(mean),
        "mutual_info": h(mean) - h(probs).mean(0),
    }


@pytest.mark.parametrize(("seed", "s"), [(0, 1), (1, 2), (2, 5), (3, 30)])
def test_scores_match_direct_formulas(seed: int, s: int) -> None:
    lp = _log_probs(seed, s)
    got = ood_scores_from_log(lp)
    want = _brute_scores(lp.exp().numpy())
    for name in ("msp", "entropy", "mutual_info"):
        assert got[name].dtype == torch.float64
        np.testing.assert_allclose(got[name].numpy(), want[name], rtol=0, atol=1e-12)
    from_probs = ood_scores(lp.exp().float())  # float32 probabilities are accepted too
    for name in got:
        np.testing.assert_allclose(from_probs[name].numpy(), got[name].numpy(), atol=1e-5)


def test_mutual_information_is_zero_for_a_single_model() -> None:
    for seed in range(5):
        lp = _log_probs(seed, 1)
        assert torch.equal(
            ood_scores_from_log(lp)["mutual_info"], torch.zeros(64, dtype=torch.float64)
        )
        acc = OODAccumulator()
        acc.add(lp[0])
        assert torch.equal(acc.scores()["mutual_info"], torch.zeros(64, dtype=torch.float64))


def test_mutual_information_is_never_negative() -> None:
    """Nearly identical samples make H[p̄] - mean H[p_s] a difference of nearly equal sums."""
    for seed in range(10):
        base = _log_probs(seed, 1, n=500)
        g = torch.Generator().manual_seed(100 + seed)
        for eps in (0.0, 1e-12, 1e-8, 1.0):
            lp = torch.log_softmax(base + eps * torch.randn(8, 500, 10, generator=g), -1)
            assert (ood_scores_from_log(lp)["mutual_info"] >= 0).all()
            acc = OODAccumulator()
            for sample in lp:
                acc.add(sample)
            assert (acc.scores()["mutual_info"] >= 0).all()


def test_scores_rank_uncertain_inputs_higher() -> None:
    """Higher = more OOD: a confident, agreeing pair scores below a uniform or disagreeing one."""
    f64 = torch.float64
    conf = torch.tensor([[0.98, 0.01, 0.01], [0.98, 0.01, 0.01]], dtype=f64)  # samples agree
    flat = torch.full((2, 3), 1 / 3, dtype=f64)
    split = torch.tensor([[0.98, 0.01, 0.01], [0.01, 0.98, 0.01]], dtype=f64)  # disagree
    got = ood_scores(torch.stack([conf, flat, split], dim=1))  # (S=2, N=3, K=3)
    assert got["msp"][0] < got["msp"][1]
    assert got["entropy"][0] < got["entropy"][1]
    assert got["entropy"][1].item() == pytest.approx(math.log(3), abs=1e-12)
    assert got["mutual_info"][1].item() == pytest.approx(0.0, abs=1e-12)
    assert got["mutual_info"][0] < got["mutual_info"][2]


def test_zero_probabilities_give_finite_scores() -> None:
    onehot = torch.eye(4, dtype=torch.float64)[None]  # (1, 4, 4): certain predictions
    got = ood_scores(onehot)
    for v in got.values():
        assert torch.equal(v, torch.zeros(4, dtype=torch.float64))


@pytest.mark.parametrize(("seed", "s"), [(0, 1), (1, 3), (2, 30)])
def test_accumulator_equals_batch(seed: int, s: int) -> None:
    lp = _log_probs(seed, s, n=200).float()  # float32 log-probs as a model would give
    acc = OODAccumulator()
    for sample in lp:
        acc.add(sample)
    assert acc.n_samples == s
    streamed, batch = acc.scores(), ood_scores_from_log(lp)
    assert set(streamed) == set(batch) == {"msp", "entropy", "mutual_info"}
    for name in batch:
        assert streamed[name].shape == (200,) and streamed[name].dtype == torch.float64
        np.testing.assert_allclose(streamed[name].numpy(), batch[name].numpy(), rtol=0, atol=1e-12)


def test_accumulator_misuse() -> None:
    acc = OODAccumulator()
    with pytest.raises(ValueError, match="no samples"):
        acc.scores()
    acc.add(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="differs"):
        acc.add(torch.zeros(4, 2))


# --- animal_mnist ----------------------------------------------------------------


def test_animal_mnist_loads_10000_images_deterministically() -> None:
    first = ood_data.load_ood("animal_mnist")
    assert first.x.shape == (10000, 1, 28, 28)
    assert first.x.dtype == torch.uint8 and first.y.dtype == torch.int64
    assert first.x.min().item() == 0 and first.x.max().item() == 255
    assert torch.bincount(first.y).tolist() == [1000] * 10
    assert 0.1 < first.x.double().mean().item() / 255 < 0.5  # white shapes on black, like MNIST
    second = ood_data.load_animal_mnist()
    assert torch.equal(first.x, second.x) and torch.equal(first.y, second.y)


class _System:
    """Pickles as a call to os.system: what a tampered data file could contain."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo pwned",))


class _Eval:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (eval, ("1 + 1",))


def test_restricted_unpickler_refuses_other_globals() -> None:
    """Arrays themselves are read in the animal_mnist test: the files are numpy 1.x
    pickles (``numpy.core``), which numpy 2 no longer writes."""
    with pytest.raises(pickle.UnpicklingError, match=r"refusing to unpickle (posix|os|nt)\.system"):
        ood_data.restricted_loads(pickle.dumps(_System()))
    with pytest.raises(pickle.UnpicklingError, match=r"refusing to unpickle builtins\.eval"):
        ood_data.restricted_loads(pickle.dumps(_Eval()))
    with pytest.raises(pickle.UnpicklingError, match="expected a numpy array, got dict"):
        ood_data.restricted_loads(pickle.dumps({"a": 1}))


def test_tampered_file_is_refused_before_unpickling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even with a matching digest, a pickle naming os.system is a clear UserError."""
    folder = tmp_path / "animal_mnist" / "data" / "Animal_MNIST"
    folder.mkdir(parents=True)
    path = folder / "animal_data_version_3.gz"
    with gzip.open(path, "wb") as f:
        f.write(pickle.dumps(_System()))
    monkeypatch.setattr(ood_data, "animal_mnist_dir", lambda: folder)
    monkeypatch.setitem(
        ood_data.ANIMAL_MNIST_FILES, "animal_data_version_3.gz", ood_data.sha256_file(path)
    )
    with pytest.raises(UserError, match="refusing to unpickle"):
        ood_data.load_animal_mnist()


def test_checksum_mismatch_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ood_data.ANIMAL_MNIST_FILES, "animal_data_version_3.gz", "0" * 64)
    with pytest.raises(UserError, match=r"sha256 68a30346781a\.\.\., expected 000000000000"):
        ood_data.load_animal_mnist()


def test_missing_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ood_data.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"pip install --no-deps animal-mnist==0\.4"):
        ood_data.load_animal_mnist()


def test_unknown_ood_set() -> None:
    with pytest.raises(UserError, match="unknown OOD set 'svhn'"):
        ood_data.load_ood("svhn")
