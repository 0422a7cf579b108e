"""Stage ``reachability`` (Section 3.2): x* per sample by the solver from e (Def. 3.3), and did iteration reach a
fixed point — if not, why (statuses, cycles) — and how many distinct fixed points the inputs select among
(Prop. 2). It always runs first: it sets the solve every other stage reads (``AtFixedPoint.solution``).

A torch-free module (:mod:`stability.analysis.stages.base`): the solver and the summary's tensor work are
imported in the functions that run them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from stability.analysis.stages import accuracy
from stability.analysis.stages.base import Cost, Stage, fmt

if TYPE_CHECKING:
    from stability.analysis.fixed_point import AtFixedPoint
    from stability.solvers import SolveResult

NAME = "reachability"
KEY = "fixed_point"


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
    drift: Optional[dict] = None  # the drifting test's growth powers (AnalysisOptions.drift; analysis.drift)

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
            **({} if self.drift is None else {"drift": self.drift}),
        }


def reachability(result: SolveResult, *, distinct_tol: Optional[float] = None, solver: Optional[str] = None,
                 max_iter: Optional[int] = None) -> Reachability:
    """Summarise a solve: statuses (why a sample did not converge), cycles, and distinct fixed points among the
    converged samples (tolerance default max(1e-3, 100·τ)); nothing is recomputed."""
    # a torch-free module: the routines where a solve is summarised
    from stability.analysis.reachability import distinct_fixed_points, status_counts

    cycles: dict = {}
    for p in result.period.tolist():
        if p >= 2:
            cycles[p] = cycles.get(p, 0) + 1
    tol = distinct_tol if distinct_tol is not None else max(1e-3, 100 * result.tol)
    conv = result.converged
    count = distinct_fixed_points(result.x_best, conv, tol=tol)[0] if bool(conv.any()) else 0
    # one transfer for the batch (a float per sample would sync with the device per sample)
    res = [None if not math.isfinite(v) else v for v in result.best_residual.double().tolist()]
    summ = result.summary()  # the solver's own medians (stability.stats.median)
    nfe = result.nfe.tolist()
    trace = [[None if not math.isfinite(v) else float(v) for v in row] for row in result.residuals.tolist()]
    return Reachability(status=list(result.status), period=result.period.tolist(), nfe=nfe, residual=res,
                        converged_fraction=float(conv.double().mean()) if len(result.status) else 0.0,
                        status_counts=status_counts(list(result.status)),
                        nfe_median=summ["nfe_median"], residual_median=summ["residual_median"], cycles=cycles,
                        distinct_fixed_points=count, distinct_tol=tol, solver=solver or result.method, tol=result.tol,
                        max_iter=max_iter, residual_trace=trace)


def run(at: AtFixedPoint) -> Reachability:
    """x* per sample by the solver from e (Def. 3.3), and the reachability summary (Section 3.2)."""
    from stability.solvers import Solve  # a torch-free module: the solver where the stage runs

    o = at.options
    curve = None
    if accuracy.NAME in o.stages and at.targets is not None and o.solver == "picard":
        # Picard from e is the iteration the accuracy curve scores: the solve's evaluations give it (stage accuracy)
        from stability.analysis.accuracy import CurveRecorder

        curve = CurveRecorder(at.model, at.score, o.iterations, at.targets)
    at.solve(Solve(method=o.solver, tol=o.tol, max_iter=o.max_iter, name="analysis", batched=o.solver_batched),
             observe=curve.observe if curve else None, observe_steps=o.iterations if curve else 0)
    if curve is not None:
        at.accuracy_curve = curve.curve()
    drift = None
    if o.drift:  # the drifting status (issue 38), only where asked for
        from stability.analysis.drift import mark_drifting  # a torch-free module: the test where it runs

        drift = mark_drifting(at.solution, at.f, at.x0, o.max_iter)
    reach = reachability(at.solution, solver=o.solver, max_iter=o.max_iter)
    reach.drift = drift
    at.log(f"{at.split}: {int(at.converged.sum())}/{at.converged.numel()} converged ({o.solver}, τ={o.tol:g})")
    return reach


def statuses(split: dict) -> list:
    """The solver's status of every sample of a split's JSON block (the samples the medians are taken over)."""
    return (split.get(KEY) or {}).get("status") or []


def rows(block: Optional[dict], split: dict) -> list:
    """The split table's rows: converged share with the statuses, cycles, evaluations, residual, distinct x*."""
    if block is None:
        return []
    counts = ", ".join(f"{k} {v}" for k, v in block["status_counts"].items() if v)
    cycles = ", ".join(f"period {k}: {v}" for k, v in block.get("cycles", {}).items()) or "none"
    return [
        ("converged", f"{block['converged_fraction']:.1%}  ({counts})",
         f"{block['solver']}, τ = {block['tol']:g}, ≤ {block['max_iter']} iterations"),
        ("cycles", cycles, "period-k orbits among unconverged samples"),
        ("nfe median", fmt(block["nfe_median"]), "evaluations of f per sample"),
        ("residual median", fmt(block["residual_median"]), "lowest ‖f(x)−x‖∞/‖f(x)‖∞"),
        ("distinct fixed points", fmt(block.get("distinct_fixed_points")), "among converged samples (Prop. 2)"),
    ]


def headline(block: Optional[dict], split: dict) -> dict:
    b = block or {}
    return {"converged_fraction": b.get("converged_fraction"), "status_counts": b.get("status_counts"),
            "nfe_median": b.get("nfe_median"), "distinct_fixed_points": b.get("distinct_fixed_points")}


@dataclass(frozen=True)
class Evidence:
    """What the verdict reads of the stage: the converged share of n samples, every sample's status, and the
    distinct fixed points among the converged ones."""

    share: Optional[float]
    samples: int
    status: list
    distinct: Optional[int]

    @classmethod
    def from_block(cls, block: Optional[dict]) -> Evidence:
        b = block or {}
        return cls(share=b.get("converged_fraction"), samples=b.get("samples", len(b.get("status", []))),
                   status=b.get("status") or [], distinct=b.get("distinct_fixed_points"))

    @property
    def converged(self) -> Optional[int]:
        """How many samples converged (None when the share is not known)."""
        return None if self.share is None else int(round(self.share * self.samples))


STAGE = Stage(NAME, KEY, per_sample=False,
              cost=Cost(0.077, 0.33, "sample", "batch", batched=(0.0708, 0.37)),
              run=run, rows=rows, headline=headline,
              what="x* by the solver from e, statuses, cycles, distinct fixed points (Section 3.2)")
