"""Stage ``prop4`` (Prop. 4, App. A.7): ρ(M) of the matrix assembled from the model's named recall parts, checked
against autograd's J, per sample (:func:`stability.analysis.recall.prop4`: dense where stage rho left the dense J,
matrix-free on Gaussian probes above). Its result is :class:`~stability.analysis.recall.Prop4Result`, built by that
routine, or :class:`~stability.analysis.stages.base.NotApplicable` for a model without recall parts or recall.

A torch-free module (:mod:`stability.analysis.stages.base`): the routine is imported where the stage runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from stability.analysis.stages import reachability
from stability.analysis.stages.base import Cost, NotApplicable, Stage, applies, fmt
from stability.protocols import has_recall_parts, recall_parts_missing
from stability.stats import FIXED_POINT_STATUSES, median

if TYPE_CHECKING:
    from stability.analysis.fixed_point import AtFixedPoint
    from stability.analysis.recall import Prop4Result

NAME = "prop4"
KEY = "prop4"


def run(at: AtFixedPoint) -> Union[Prop4Result, NotApplicable, None]:
    """Prop. 4 / App. A.7: ρ(M) of the matrix assembled from the named parts, checked against autograd, on the
    first K samples (all, but on large states a few); None past them."""
    import torch  # a torch-free module: the routine and torch where the stage runs

    from stability.analysis.fixed_point import step_copy
    from stability.analysis.recall import prop4

    if not has_recall_parts(at.model):
        return NotApplicable(f"the model does not expose the named recall parts (RecallParts: missing "
                             f"{', '.join(recall_parts_missing(at.model))})")
    if at.model.recall == "none":
        return NotApplicable("no recall (recall none): Prop. 4 concerns recall models")
    o, dense = at.options, at.dense_jacobians  # stage rho's dense Jacobians, when it took the dense route
    spec = at.jacobian_spectra  # stage rho's spectra at this x*, taken where M = J
    mixed = o.eig_precision == "mixed" and at.x_star.dtype == torch.float64
    N, K = at.x_star.shape[0], at.few  # the first K samples (all, but on large states a few)
    out = prop4(at.model, at.x_star[:K], at.x0[:K], probes=o.prop4_probes, k=o.eig_k, tol=o.eig_tol,
                J=None if dense is None else dense.J,
                J_spectra=None if spec is None else spec.spectrum.rows(slice(0, K)),
                fast_model=step_copy(at.model, torch.float32, at.x_star, at.x0) if mixed else None,
                chunk=o.eig_chunk(K, at.x_star.device.type), seed=o.seed, tick=at.tick, restart=o.eig_restart)
    if out is not None and K < N:
        out.rho_M = list(out.rho_M) + [None] * (N - K)
    return out


def _converged_rho_M(block: dict, split: dict) -> list:
    """ρ(M) at the samples whose solve found a fixed point (the medians' samples)."""
    return [r for r, st in zip(block.get("rho_M", []), reachability.statuses(split)) if st in FIXED_POINT_STATUSES]


def rows(block: Optional[dict], split: dict) -> list:
    if block is None:
        return []
    if not applies(block):
        return [("ρ(M) (Prop. 4)", "not applicable", block.get("reason", ""))]
    same = (("; M = J on every probe (to rounding), so J's spectra" if block.get("probes_checked")
             else "; M = J entry by entry, so J's spectra") if block.get("spectra_of_J") == len(block["rho_M"])
            else "")
    return [("ρ(M) median", fmt(median(_converged_rho_M(block, split))),
             f"{block['form']}; max |M − J_autograd| = {fmt(block['max_abs_diff_vs_autograd'], '.2e')}"
             + (f" on {block['probes_checked']} Gaussian probes a sample" if block.get("probes_checked") else "")
             + same)]


def headline(block: Optional[dict], split: dict) -> dict:
    # ρ(M) over the converged samples, as the report's "ρ(M) median" row and as rho_J_median
    b = block or {}
    return {"rho_M_median": median(_converged_rho_M(b, split)),
            "prop4_max_abs_diff": b.get("max_abs_diff_vs_autograd")}


STAGE = Stage(NAME, KEY, per_sample=True,
              cost=Cost(0.0297, 0.15, "sample", "batch", batched=(0.0276, 0.36)),
              run=run, rows=rows, headline=headline,
              what="ρ(M) from the named recall parts, against autograd (Prop. 4, App. A.7)")
