"""Stage ``prop5`` (Prop. 5): on the first converged sample, the unrolled input-gradient dx_T/dx0·u (from e, held
fixed) against the implicit one (I − J)⁻¹ ∂f/∂x0 u (GMRES), against T, by the batched routes of
:mod:`stability.analysis.prop5`. Its unroll from e also carries App. A.8's dx_T/de·u, which it leaves for stage a8
(``AtFixedPoint.initial_iterate_tangent``).

A torch-free module (:mod:`stability.analysis.stages.base`): the routines are imported where the stage runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from stability.analysis.stages.base import Cost, Stage, fmt, last

if TYPE_CHECKING:
    from stability.analysis.fixed_point import AtFixedPoint
    from stability.analysis.prop5 import Prop5Check

NAME = "prop5"
KEY = "prop5"


@dataclass
class Prop5Stage:
    """Prop. 5 on the first converged sample: :class:`~stability.analysis.prop5.Prop5Check`, or why not."""

    check: Optional[Prop5Check] = None
    sample: Optional[int] = None
    x_star_residual: Optional[float] = None
    skipped: Optional[str] = None

    def to_dict(self) -> dict:
        base = ({"T": [], "rel_error": [], "gmres_residual": None} if self.check is None else self.check.to_dict())
        out = {**base, "sample": self.sample}
        if self.x_star_residual is not None:
            out["x_star_residual"] = self.x_star_residual
        if self.skipped:
            out["skipped"] = self.skipped
        out["note"] = "dx_T/dx0 unrolled from e held fixed, as Prop. 5 states it (by A.8 the limit is the same)"
        return out


def run(at: AtFixedPoint) -> Prop5Stage:
    """Prop. 5 on the first converged sample: dx_T/dx0·u (unrolled from e, held fixed) against the implicit
    (I − J)⁻¹ ∂f/∂x0 u (GMRES)."""
    # a torch-free module: the routines where the stage runs
    from stability.analysis.initial_iterate import prop5_and_initial_iterate_batched
    from stability.analysis.prop5 import KrylovError
    from stability.solvers import POLISH, solve

    o, first = at.options, at.first_converged
    if first is None:
        return Prop5Stage(skipped="no sample converged: Prop. 5 needs a fixed point")
    # polish x* of that sample by further Picard steps, so that the error floor is set by GMRES and the
    # unrolled T, not by the solver's τ
    sl = slice(first, first + 1)
    polish = solve(at.f, at.x_star[sl], at.x0[sl], POLISH.replace(max_iter=o.max_iter))
    # one unroll from e carries both tangents: dx_T/dx0·u here and A.8's dx_T/de·u (kept for stage a8)
    p5, at.initial_iterate_tangent = prop5_and_initial_iterate_batched(at.f, polish.x_best, at.x0[sl], at.e[sl],
                                                                       at.T_grid, tol=o.gmres_tol, seed=o.seed)
    try:
        chk = p5.sample(0)
    except KrylovError as exc:
        return Prop5Stage(sample=first, skipped=str(exc))
    return Prop5Stage(check=chk, sample=first, x_star_residual=float(polish.best_residual[0]))


def largest_T(block: Optional[dict]) -> Optional[int]:
    """The largest T the check unrolled (None where it did not run or was skipped)."""
    return last((block or {}).get("T"))


def rows(block: Optional[dict], split: dict) -> list:
    if block is None:
        return []
    err, T = block.get("rel_error"), block.get("T")
    if not err:
        return [("Prop. 5 error", "—", block.get("skipped", ""))]
    return [("Prop. 5 error", f"{err[0]:.3g} (T={T[0]}) → {err[-1]:.3g} (T={T[-1]})",
             f"‖dx_T/dx0·u − dx*/dx0·u‖/‖·‖; GMRES residual {fmt(block['gmres_residual'], '.2e')}")]


def headline(block: Optional[dict], split: dict) -> dict:
    return {"prop5_rel_error_last": last((block or {}).get("rel_error"))}


@dataclass(frozen=True)
class Evidence:
    """What the verdict reads of the stage: the relative error at the largest T (None where not computed)."""

    rel_error_last: Optional[float]

    @classmethod
    def from_block(cls, block: Optional[dict]) -> Evidence:
        err = (block or {}).get("rel_error")
        return cls(rel_error_last=err[-1] if err else None)


STAGE = Stage(NAME, KEY, per_sample=False,
              cost=Cost(1.15, 0.80, "one", "one", batched=(1.31, 0.87)),
              run=run, rows=rows, headline=headline,
              what="the unrolled input-gradient against the implicit one (Prop. 5)")
