"""Classification metrics of a predictive distribution (ALGORITHMS §7).

Everything takes log-probabilities: the BMA is accumulated in log space
(logsumexp of per-sample log-softmax), which is the average of
probabilities computed without underflow, so NLL is never clamped.
ECE is computed from the reliability bins, which torchmetrics does not
expose; a test checks the two agree. They differ only for a confidence exactly on a
bin edge k/B: here it counts in the bin below, ((k-1)/B, k/B] as in Guo et al. (2017),
in torchmetrics in the one above (``tests/test_metrics.py`` shows both).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Reliability:
    """Per confidence bin: lower/upper edge, mean confidence, accuracy, count."""

    lower: torch.Tensor
    upper: torch.Tensor
    confidence: torch.Tensor
    accuracy: torch.Tensor
    count: torch.Tensor

    def ece(self) -> torch.Tensor:
        total = self.count.sum().clamp(min=1)
        return ((self.count / total) * (self.accuracy - self.confidence).abs()).sum()

    def rows(self) -> list[dict[str, float | int]]:
        cols = [t.tolist() for t in (self.lower, self.upper, self.confidence, self.accuracy)]
        counts = self.count.long().tolist()
        return [
            {
                "bin": i,
                "lower": lo,
                "upper": up,
                "confidence": conf,
                "accuracy": acc,
                "gap": acc - conf,
                "count": counts[i],
            }
            for i, (lo, up, conf, acc) in enumerate(zip(*cols, strict=True))
        ]


def accuracy(log_probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (log_probs.argmax(dim=1) == y).double().mean()


def nll(log_probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean over points of -log p(y|x) (never a sum)."""
    return -log_probs.gather(1, y[:, None]).double().mean()


def brier(log_probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean over points of sum_c (p_c - 1[c = y])^2."""
    return _brier(log_probs.double().exp(), y)


def _brier(probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    onehot = torch.nn.functional.one_hot(y, probs.shape[1]).double()
    return ((probs - onehot) ** 2).sum(dim=1).mean()


def reliability(log_probs: torch.Tensor, y: torch.Tensor, n_bins: int) -> Reliability:
    """Equal-width confidence bins (lower, upper]; confidence 0 falls in the first."""
    conf, pred = log_probs.double().exp().max(dim=1)
    return _binned(conf, (pred == y).double(), n_bins)


def _binned(conf: torch.Tensor, correct: torch.Tensor, n_bins: int) -> Reliability:
    """``reliability`` from each point's confidence and correctness (1.0 or 0.0)."""
    edges = torch.linspace(0, 1, n_bins + 1, dtype=torch.float64, device=conf.device)
    idx = (torch.bucketize(conf, edges, right=False) - 1).clamp(0, n_bins - 1)
    # A one-hot product instead of index_add_/bincount: deterministic on CUDA too.
    member = torch.nn.functional.one_hot(idx, n_bins).double()
    count = member.sum(dim=0)
    conf_sum = conf @ member
    acc_sum = correct @ member
    denom = count.clamp(min=1)
    return Reliability(edges[:-1], edges[1:], conf_sum / denom, acc_sum / denom, count)


def ece(log_probs: torch.Tensor, y: torch.Tensor, n_bins: int = 20) -> torch.Tensor:
    return reliability(log_probs, y, n_bins).ece()


def adaptive_ece(log_probs: torch.Tensor, y: torch.Tensor, n_bins: int = 20) -> torch.Tensor:
    """ECE over ``n_bins`` equal-mass bins of confidence (ALGORITHMS §11): the points
    sorted by confidence (ties by index) and cut into near-equal contiguous groups, so no
    bin is empty and none holds most of the points."""
    probs = log_probs.double().exp()
    conf, pred = probs.max(dim=1)
    order = torch.sort(conf, stable=True).indices
    correct = (pred == y).double()[order]
    total = torch.zeros((), dtype=torch.float64, device=probs.device)
    for part in torch.arange(order.numel(), device=probs.device).tensor_split(n_bins):
        if part.numel():
            total = total + (correct[part].sum() - conf[order][part].sum()).abs()
    return total / max(1, y.shape[0])


def classwise_ece(log_probs: torch.Tensor, y: torch.Tensor, n_bins: int = 20) -> torch.Tensor:
    """Mean over classes c of the equal-width ECE of p(c) against 1[y = c] (ALGORITHMS
    §11): every class's probability calibrated, not only the top one's."""
    probs = log_probs.double().exp()
    classes = probs.shape[1]
    edges = torch.linspace(0, 1, n_bins + 1, dtype=torch.float64, device=probs.device)
    idx = (torch.bucketize(probs, edges, right=False) - 1).clamp(0, n_bins - 1)
    member = torch.nn.functional.one_hot(idx, n_bins).double()  # (N, C, B)
    hit = torch.nn.functional.one_hot(y, classes).double()
    conf_sum = torch.einsum("nc,ncb->cb", probs, member)
    hit_sum = torch.einsum("nc,ncb->cb", hit, member)
    return (hit_sum - conf_sum).abs().sum(1).mean() / max(1, y.shape[0])


def point_entropy(log_p: torch.Tensor) -> torch.Tensor:
    """-sum_k p_k log p_k over the last dim, from log-probabilities, in nats (0 log 0 = 0)."""
    terms = torch.where(torch.isneginf(log_p), 0.0, log_p.exp() * log_p)
    return -terms.sum(dim=-1)


def entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """Mean over points of the predictive entropy, in nats."""
    return point_entropy(log_probs.double()).mean()


def classification_metrics(
    log_probs: torch.Tensor, y: torch.Tensor, ece_bins: int = 20
) -> dict[str, torch.Tensor]:
    """accuracy, nll, ece (``ece_bins`` bins), ece15, brier, entropy as 0-d device tensors.

    Computed after every sample of an evaluation, so the probabilities, confidences and
    hits are computed once for the three metrics that read them (the same bytes as
    ``ece`` and ``brier`` alone).
    """
    probs = log_probs.double().exp()
    conf, pred = probs.max(dim=1)
    correct = (pred == y).double()
    return {
        "accuracy": accuracy(log_probs, y),
        "nll": nll(log_probs, y),
        "ece": _binned(conf, correct, ece_bins).ece(),
        "ece15": _binned(conf, correct, 15).ece(),
        "brier": _brier(probs, y),
        "entropy": entropy(log_probs),
    }


def protocol_metrics(
    log_probs: torch.Tensor, y: torch.Tensor, ece_bins: int = 20
) -> dict[str, torch.Tensor]:
    """What issue 29's protocol adds for the final predictive (not per sample count):
    adaptive and classwise ECE, and the selective-prediction metrics."""
    from .selective import selective_metrics

    return {
        "ece_adaptive": adaptive_ece(log_probs, y, ece_bins),
        "ece_classwise": classwise_ece(log_probs, y, ece_bins),
        **selective_metrics(log_probs, y),
    }
