"""Out-of-distribution scores of a predictive distribution, and detection metrics.

Scores are computed per input from S posterior samples' predictive
probabilities (S = 1 for a single model), in float64. Convention: for every
score, **higher means more OOD**, so one threshold rule ("flag as OOD when
score >= t") serves them all:

- ``msp``: 1 - max_k p̄_k, one minus the maximum softmax probability of the
  mean prediction p̄ = mean_s p_s (so confident inputs score low);
- ``entropy``: H[p̄] in nats, the total predictive uncertainty;
- ``mutual_info``: H[p̄] - mean_s H[p_s], the epistemic part (disagreement
  between samples); exactly 0 for S = 1.

Detection metrics take OOD as the positive class (except AUPR-In) and
follow scikit-learn's definitions, ties included, without importing it.
"""

from __future__ import annotations

import math

import torch

from ..runtime.errors import UserError
from .metrics import point_entropy

SCORES = ("msp", "entropy", "mutual_info")
DETECTION_METRICS = ("auroc", "aupr_in", "aupr_out", "fpr95")


def _scores(log_mean: torch.Tensor, mean_entropy: torch.Tensor) -> dict[str, torch.Tensor]:
    """All scores from log p̄ (N, K) and mean_s H[p_s] (N,)."""
    total = point_entropy(log_mean)
    # MI >= 0 exactly by concavity of entropy (Jensen), but the difference of two
    # nearly equal float sums can come out around -1e-16 when the samples agree;
    # clamp that rounding noise so the score keeps its meaning.
    mutual_info = (total - mean_entropy).clamp(min=0.0)
    # 1 - exp(x) as -expm1(x): exact for confident predictions where 1 - MSP ~ 1e-12.
    msp = -torch.expm1(log_mean.max(dim=-1).values)
    return {"msp": msp, "entropy": total, "mutual_info": mutual_info}


def ood_scores_from_log(log_probs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Scores (N,) each from per-sample log-probabilities (S, N, K); higher = more OOD."""
    if log_probs.dim() != 3:
        raise ValueError(f"log_probs must be (S, N, K), got {tuple(log_probs.shape)}")
    lp = log_probs.double()
    # Averaging probabilities in log space (as evaluate does): no underflow, and for
    # S = 1 log p̄ is the input itself, so H[p̄] equals mean_s H[p_s] bit for bit.
    log_mean = torch.logsumexp(lp, dim=0) - math.log(lp.shape[0])
    return _scores(log_mean, point_entropy(lp).mean(dim=0))


def ood_scores(probs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Scores (N,) each from per-sample probabilities (S, N, K); higher = more OOD."""
    if probs.dim() != 3:
        raise ValueError(f"probs must be (S, N, K), got {tuple(probs.shape)}")
    return ood_scores_from_log(probs.double().log())


class OODAccumulator:
    """Streaming scores: one sample's log-probabilities (N, K) at a time.

    Keeps O(N·K) state, the running log-sum-exp of log-probabilities (so the
    mean prediction is built the way evaluate builds the BMA) and the running
    sum of per-sample entropies, so S samples never need to be held at once.
    """

    def __init__(self) -> None:
        self._log_sum: torch.Tensor | None = None
        self._entropy_sum: torch.Tensor | None = None
        self.n_samples = 0

    def add(self, log_probs: torch.Tensor) -> None:
        """Add one posterior sample's log-probabilities, shape (N, K)."""
        lp = log_probs.double()
        if lp.dim() != 2:
            raise ValueError(f"log_probs must be (N, K), got {tuple(lp.shape)}")
        if self._log_sum is None or self._entropy_sum is None:
            self._log_sum = lp.clone()
            self._entropy_sum = point_entropy(lp)
        else:
            if lp.shape != self._log_sum.shape:
                raise ValueError(
                    f"log_probs shape {tuple(lp.shape)} differs from the first sample's "
                    f"{tuple(self._log_sum.shape)}"
                )
            self._log_sum = torch.logaddexp(self._log_sum, lp)
            self._entropy_sum = self._entropy_sum + point_entropy(lp)
        self.n_samples += 1

    def scores(self) -> dict[str, torch.Tensor]:
        """``msp``, ``entropy``, ``mutual_info`` (N,) each, float64; higher = more OOD."""
        if self._log_sum is None or self._entropy_sum is None:
            raise ValueError("no samples added")
        log_mean = self._log_sum - math.log(self.n_samples)
        return _scores(log_mean, self._entropy_sum / self.n_samples)


def _check(scores: torch.Tensor, positive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if scores.dim() != 1 or positive.shape != scores.shape:
        raise ValueError(
            f"scores and labels must be 1-D of equal length, got {tuple(scores.shape)} "
            f"and {tuple(positive.shape)}"
        )
    if not bool(torch.isfinite(scores).all()):
        raise UserError("OOD scores are not finite (NaN or infinite predictions); check the model")
    positive = positive.bool()
    n_pos = int(positive.sum())
    if n_pos == 0 or n_pos == positive.numel():
        raise UserError(
            "OOD detection metrics need both in-distribution and OOD inputs; "
            f"got {n_pos} positive of {positive.numel()}"
        )
    return scores.double(), positive


def _curve(scores: torch.Tensor, positive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """True and false positive counts for "positive iff score >= t" at each distinct t.

    Thresholds are the distinct scores in decreasing order: tied inputs are
    flagged together, never split (scikit-learn's ``_binary_clf_curve``).
    """
    scores, positive = _check(scores, positive)
    order = torch.argsort(scores, descending=True, stable=True)
    s = scores[order]
    y = positive[order].double()
    last_of_tie = torch.nonzero(s[1:] != s[:-1]).flatten()
    ends = torch.cat([last_of_tie, last_of_tie.new_tensor([s.numel() - 1])])
    tps = torch.cumsum(y, dim=0)[ends]
    fps = (ends + 1).double() - tps
    return tps, fps


def auroc(scores: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """Area under the ROC curve (trapezoids; ties count one half), ``positive`` = 1."""
    tps, fps = _curve(scores, positive)
    zero = tps.new_zeros(1)
    tpr = torch.cat([zero, tps / tps[-1]])
    fpr = torch.cat([zero, fps / fps[-1]])
    return torch.trapezoid(tpr, fpr)


def average_precision(scores: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """Area under precision-recall as sum_t (R_t - R_{t-1}) P_t (sklearn's definition).

    No interpolation: the step sum, not the trapezoid, which overestimates.
    """
    tps, fps = _curve(scores, positive)
    precision = tps / (tps + fps)
    recall = tps / tps[-1]
    steps = torch.diff(recall, prepend=recall.new_zeros(1))
    return (steps * precision).sum()


def fpr_at_tpr(scores: torch.Tensor, positive: torch.Tensor, tpr: float = 0.95) -> torch.Tensor:
    """False-positive rate at the highest threshold that detects >= ``tpr`` of positives.

    Rule "positive iff score >= t"; t is the largest observed score with
    TPR(t) >= ``tpr``, which gives the smallest FPR reaching that TPR. Tied
    scores share the decision, so TPR may overshoot ``tpr``.
    """
    if not 0.0 < tpr <= 1.0:
        raise ValueError(f"tpr must be in (0, 1], got {tpr}")
    tps, fps = _curve(scores, positive)
    # tps / n >= tpr in float64 is exact for any realistic n (both sides are
    # correctly rounded), and matches scikit-learn's tpr array compared to tpr.
    reached = (tps / tps[-1]) >= tpr
    first = torch.argmax(reached.int())  # the first True; the last threshold always reaches 1
    return fps[first] / fps[-1]


def detection_metrics(score_in: torch.Tensor, score_out: torch.Tensor) -> dict[str, torch.Tensor]:
    """AUROC, AUPR-In, AUPR-Out, FPR95 of one score (higher = more OOD), as 0-d tensors.

    OOD is the positive class for ``auroc``, ``aupr_out`` and ``fpr95`` (the
    share of in-distribution inputs flagged when 95% of OOD inputs are);
    ``aupr_in`` takes in-distribution as positive, with scores negated.
    """
    scores = torch.cat([score_in.double(), score_out.double().to(score_in.device)])
    is_ood = torch.cat(
        [
            torch.zeros(score_in.numel(), dtype=torch.bool, device=scores.device),
            torch.ones(score_out.numel(), dtype=torch.bool, device=scores.device),
        ]
    )
    return {
        "auroc": auroc(scores, is_ood),
        "aupr_in": average_precision(-scores, ~is_ood),
        "aupr_out": average_precision(scores, is_ood),
        "fpr95": fpr_at_tpr(scores, is_ood, 0.95),
    }


def ood_metrics(
    scores_in: dict[str, torch.Tensor], scores_out: dict[str, torch.Tensor]
) -> dict[str, dict[str, torch.Tensor]]:
    """``{score: detection_metrics}`` for every score both dicts have (e.g. ``scores()``)."""
    return {
        name: detection_metrics(scores_in[name], scores_out[name])
        for name in scores_in
        if name in scores_out
    }
