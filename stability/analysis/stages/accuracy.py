"""Stage ``accuracy`` (Fig. 3): whole-answer and per-position accuracy against the iteration count 1..T and at x*,
by the task's (or argmax) scoring. With the Picard solver the curve is scored during stage reachability's solve
(the same iterates from e; its time is in that stage's). Its result is
:class:`~stability.analysis.accuracy.AccuracyCurve` (the trainer's evaluation builds the same), or
:class:`~stability.analysis.stages.base.NotApplicable` without targets.

A torch-free module (:mod:`stability.analysis.stages.base`): the scoring is imported where the stage runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from stability.analysis.stages.base import Cost, NotApplicable, Stage, applies, fmt

if TYPE_CHECKING:
    from stability.analysis.accuracy import AccuracyCurve
    from stability.analysis.fixed_point import AtFixedPoint

NAME = "accuracy"
KEY = "accuracy"


def run(at: AtFixedPoint) -> Union[AccuracyCurve, NotApplicable]:
    """Accuracy against the iteration count 1..T and at x* (over all samples, and over the converged ones)."""
    # a torch-free module: the scoring where the stage runs
    from stability.analysis.accuracy import accuracy_at, accuracy_vs_iteration

    if at.targets is None:
        return NotApplicable("no targets given")
    acc = at.accuracy_curve
    if acc is not None:
        acc.scored_in = "reachability"  # the stage whose solve scored it (stages.reachability imports this module)
    else:
        acc = accuracy_vs_iteration(at.model, at.score, at.x0, at.e, at.targets, at.options.iterations)
    acc.at_fixed_point = accuracy_at(at.model, at.score, at.x_star, at.targets)
    acc.at_fixed_point_converged = accuracy_at(at.model, at.score, at.x_star, at.targets, at.converged)
    return acc


def curve(block: Optional[dict]) -> Optional[list]:
    """Whole-answer accuracy at iterations 1..T (None where the stage did not run or does not apply)."""
    return block.get("accuracy") if applies(block) else None


def rows(block: Optional[dict], split: dict) -> list:
    if block is None:
        return []
    if not applies(block):
        return [("accuracy", "not applicable", block.get("reason", ""))]
    out = []
    acc, pos = block["accuracy"], block.get("position_accuracy") or []
    if acc:
        best_t = max(range(len(acc)), key=lambda i: acc[i])
        out.append(("accuracy", f"{acc[0]:.1%} (T=1) · best {acc[best_t]:.1%} (T={best_t + 1}) · "
                    f"{acc[-1]:.1%} (T={len(acc)})", f"whole answer right, n = {split['samples']}"))
    if pos:
        out.append(("per-position accuracy", f"{pos[0]:.1%} (T=1) · {pos[-1]:.1%} (T={len(pos)})",
                    "share of positions right"))
    at, conv = block["at_fixed_point"], block.get("at_fixed_point_converged")
    out.append(("accuracy at x*", fmt(at, ".1%") if at is not None else "—",
                f"converged only: {fmt(conv, '.1%') if conv is not None else '—'}"))
    return out


def headline(block: Optional[dict], split: dict) -> dict:
    return {"accuracy_at_fixed_point": (block or {}).get("at_fixed_point")}


STAGE = Stage(NAME, KEY, per_sample=False, cost=Cost(0.001, 1.0, "sample", "batch"), run=run, rows=rows,
              headline=headline,
              what="accuracy against the iteration count and at x* (Fig. 3)")
