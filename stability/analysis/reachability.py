"""Reachability (Section 3.2): did iteration reach a fixed point, and if not, why — and, for autonomous models,
how many distinct fixed points the inputs select among (Prop. 2: basin selection among a countable set).

Built from a :class:`~stability.solvers.SolveResult`; nothing is recomputed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from stability.solvers import SolveResult
from stability.stats import distinct_clusters


@dataclass
class Reachability:
    """Per-sample statuses, periods of detected orbits, nfe and best residuals, with their summaries."""

    status: list
    period: list
    nfe: list
    residual: list
    converged_fraction: float
    status_counts: dict
    nfe_median: Optional[float]
    residual_median: Optional[float]
    cycles: dict = field(default_factory=dict)  # {period k: number of samples on a period-k orbit}
    distinct_fixed_points: Optional[int] = None
    distinct_tol: Optional[float] = None
    solver: Optional[str] = None
    tol: Optional[float] = None
    max_iter: Optional[int] = None
    residual_trace: list = field(default_factory=list)  # (B, N) relative residual at every evaluation

    @property
    def samples(self) -> int:
        return len(self.status)

    def to_dict(self) -> dict:
        return {
            "samples": self.samples,
            "converged_fraction": self.converged_fraction,
            "status_counts": self.status_counts,
            "nfe_median": self.nfe_median,
            "residual_median": self.residual_median,
            "status": self.status,
            "period": self.period,
            "nfe": self.nfe,
            "residual": self.residual,
            "cycles": {str(k): v for k, v in self.cycles.items()},
            "distinct_fixed_points": self.distinct_fixed_points,
            "distinct_tol": self.distinct_tol,
            "solver": self.solver,
            "tol": self.tol,
            "max_iter": self.max_iter,
            "residual_trace": self.residual_trace,
        }


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
    from stability.solvers import STATUSES

    return {s: sum(1 for t in status if t == s) for s in dict.fromkeys([*STATUSES, *status])}


def reachability(result: SolveResult, *, distinct_tol: Optional[float] = None, solver: Optional[str] = None,
                 max_iter: Optional[int] = None) -> Reachability:
    """Summarise a solve: statuses (why a sample did not converge), cycles, and distinct fixed points among the
    converged samples (tolerance default max(1e-3, 100·τ))."""
    cycles: dict = {}
    for p in result.period.tolist():
        if p >= 2:
            cycles[p] = cycles.get(p, 0) + 1
    tol = distinct_tol if distinct_tol is not None else max(1e-3, 100 * result.tol)
    conv = result.converged
    count = distinct_fixed_points(result.x_best, conv, tol=tol)[0] if bool(conv.any()) else 0
    res = [None if not torch.isfinite(r) else float(r) for r in result.best_residual.double()]
    summ = result.summary()  # the solver's own medians (stability.stats.median)
    nfe = result.nfe.tolist()
    trace = [[None if not math.isfinite(v) else float(v) for v in row] for row in result.residuals.tolist()]
    return Reachability(status=list(result.status), period=result.period.tolist(), nfe=nfe, residual=res,
                        converged_fraction=float(conv.double().mean()) if len(result.status) else 0.0,
                        status_counts=status_counts(list(result.status)),
                        nfe_median=summ["nfe_median"], residual_median=summ["residual_median"], cycles=cycles,
                        distinct_fixed_points=count, distinct_tol=tol, solver=solver or result.method, tol=result.tol,
                        max_iter=max_iter, residual_trace=trace)
