"""Stage ``input`` (Prop. 5): ‖dx*/dx0‖_F per converged sample, a Hutchinson estimate over ``probes`` random
directions, every sample's probes in one batched solve of (I − J) w = ∂f/∂x0 u
(:func:`stability.analysis.input_dependence.input_dependence_frobenius_batched`).

A torch-free module (:mod:`stability.analysis.stages.base`): the routine is imported where the stage runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from stability.analysis.stages.base import Cost, Stage, fmt
from stability.stats import median

if TYPE_CHECKING:
    from stability.analysis.fixed_point import AtFixedPoint

NAME = "input"
KEY = "input_dependence"


@dataclass
class InputDependence:
    """‖dx*/dx0‖_F per converged sample (Hutchinson estimate; Prop. 5), None elsewhere."""

    frobenius: list
    probes: int

    def to_dict(self) -> dict:
        return {"frobenius": self.frobenius, "frobenius_median": median(self.frobenius), "probes": self.probes,
                "quantity": "‖dx*/dx0‖_F (Hutchinson estimate, Prop. 5)"}


def run(at: AtFixedPoint) -> InputDependence:
    """‖dx*/dx0‖_F per converged sample (Hutchinson; Prop. 5), every sample's probes in one batched solve."""
    # a torch-free module: the routine where the stage runs
    from stability.analysis.input_dependence import input_dependence_frobenius_batched

    o, conv = at.options, at.converged
    frob: list = [None] * conv.numel()
    idx = conv[:at.few].nonzero().flatten()  # the first few samples on large states (AnalysisOptions.few_samples)
    if idx.numel():
        dev = at.x_star.device
        est = input_dependence_frobenius_batched(at.f, at.x_star[idx.to(dev)], at.x0[idx.to(dev)],
                                                 probes=o.probes, tol=max(o.gmres_tol, 1e-8), seed=o.seed,
                                                 check_every=o.live_check_every(dev.type))
        for j, b in enumerate(idx.tolist()):
            frob[b] = float(est.value[j]) if bool(est.converged[j]) else None
    return InputDependence(frobenius=frob, probes=o.probes)


def rows(block: Optional[dict], split: dict) -> list:
    if block is None:
        return []
    return [("‖dx*/dx0‖_F median", fmt(block.get("frobenius_median")), f"Hutchinson, {block.get('probes')} probes")]


def headline(block: Optional[dict], split: dict) -> dict:
    return {"input_grad_norm_median": (block or {}).get("frobenius_median")}


@dataclass(frozen=True)
class Evidence:
    """What the verdict reads of the stage: the median ‖dx*/dx0‖_F and the per-sample values."""

    median: Optional[float]
    values: list

    @classmethod
    def from_block(cls, block: Optional[dict]) -> Optional[Evidence]:
        if block is None:
            return None
        return cls(median=block.get("frobenius_median"), values=block.get("frobenius") or [])


STAGE = Stage(NAME, KEY, per_sample=True,
              cost=Cost(0.115, 1.02, "sample", "batch", batched=(0.109, 0.92)),
              run=run, rows=rows, headline=headline,
              what="‖dx*/dx0‖_F per converged sample, Hutchinson (Prop. 5)")
