"""What the reachability stage (:mod:`stability.analysis.stages.reachability`) counts: the distinct fixed points
among the samples (Prop. 2: basin selection among a countable set), and the statuses of a solve."""

from __future__ import annotations

from typing import Optional

import torch

from stability.solvers import STATUSES
from stability.stats import distinct_clusters


def distinct_fixed_points(x_star: torch.Tensor, mask: Optional[torch.Tensor] = None, *, tol: float = 1e-3,
                          eps: float = 1e-8) -> tuple[int, list]:
    """Number of distinct fixed points among the samples in ``mask`` (Prop. 2's basin selection).

    Two fixed points are linked when ‖a − b‖∞ ≤ tol · max(‖a‖∞, ‖b‖∞) + ε, and the distinct fixed points are the
    connected components of that relation (:func:`stability.stats.distinct_clusters`, the routine the theory
    checks count Newton solutions with). Returns (count, label per sample; -1 outside the mask).
    """
    B = x_star.shape[0]
    mask = torch.ones(B, dtype=torch.bool) if mask is None else mask.cpu().bool()
    inside = torch.nonzero(mask).flatten().tolist()
    count, sub = distinct_clusters(x_star.detach()[mask.to(x_star.device)], atol=eps, rtol=tol)
    labels = [-1] * B
    for b, lab in zip(inside, sub):
        labels[b] = lab
    return count, labels


def status_counts(status: list) -> dict:
    """{status: count} over the solver's statuses (every one listed, in the solver's order), and any other
    status a solver reports (counted generically, never dropped)."""
    return {s: sum(1 for t in status if t == s) for s in dict.fromkeys([*STATUSES, *status])}
