"""Stage ``rho_wx`` (Figs. 6–7): ρ(W_x) of the recall weight (bias ignored), the one quantity the paper's release
computes; :class:`~stability.analysis.stages.base.NotApplicable` for a model without named recall parts or without
a recall weight.

A torch-free module (:mod:`stability.analysis.stages.base`): the routine is imported where the stage runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union

from stability.analysis.stages.base import Cost, NotApplicable, Stage, applies, fmt
from stability.protocols import has_recall_parts

if TYPE_CHECKING:
    from stability.analysis.fixed_point import AtFixedPoint

NAME = "rho_wx"
KEY = "recall"


@dataclass
class RecallWeight:
    """ρ(W_x) and the leading eigenvalues of the recall weight (bias ignored; Figs. 6–7)."""

    rho_Wx: float
    eigenvalues: list

    def to_dict(self) -> dict:
        return {"rho_Wx": self.rho_Wx, "eigenvalues": self.eigenvalues}


def run(at: AtFixedPoint) -> Union[RecallWeight, NotApplicable]:
    """ρ(W_x) of the recall weight (bias ignored), the one quantity the paper's release computes."""
    from stability.analysis.recall import rho_W_x  # a torch-free module: the routine where the stage runs

    if not has_recall_parts(at.model):
        return NotApplicable("the model does not expose the named recall parts (RecallParts), so no W_x")
    w = rho_W_x(at.model)
    if w is None:
        return NotApplicable("no recall weight (W_x is None)")
    return RecallWeight(rho_Wx=float(w.rho[0]), eigenvalues=w.eigenvalue_lists()[0])


def rows(block: Optional[dict], split: dict) -> list:
    if block is None:
        return []
    if not applies(block):
        return [("ρ(W_x)", "not applicable", block.get("reason", ""))]
    return [("ρ(W_x)", fmt(block["rho_Wx"]), "recall weight (bias ignored)")]


def headline(block: Optional[dict], split: dict) -> dict:
    return {"rho_Wx": (block or {}).get("rho_Wx")}


STAGE = Stage(NAME, KEY, per_sample=False, cost=Cost(0.0004, 0.55, "one", "one"),
              run=run, rows=rows, headline=headline,
              what="ρ(W_x) of the recall weight, bias ignored (Figs. 6–7)")
