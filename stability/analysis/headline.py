"""The headline block of a split: the analysis' numbers under one documented name each, what the sweep's record
keeps of an analysis (``record["analysis"][split]``, which the export, the claims and the figures read) and what
``stability compare`` compares. The long JSON (every per-sample list, the methods, the plane) stays for people and
plots; a program reads this.

Each stage contributes its own numbers (its module's ``headline``, read from its JSON block, so an analysis written
by an earlier version gives its headline the same way); :class:`SplitSummary` types and documents the keys
and fixes their order (:data:`HEADLINE` lists them).
Torch-free: compare and the sweep's record import it without torch.
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from stability.analysis.stages.registry import REGISTRY
from stability.config import Real, RecordPart


class SplitSummary(RecordPart):
    """The headline block of one split, typed: its keys in the block's order, each with what it is (its field's
    description). The fields without a default are always there (None where their stage did not run or measured
    nothing); those defaulting to None only where their stage ran, so a record of an analysis without them keeps
    its shape. The names differ from the verdict's ``numbers`` where those were written first
    (docs/architecture.md, "The headline"); a stage's own numbers not listed here come after these, in registry
    order. The sweep record holds one per analysed split (:class:`stability.sweep.record.SweepRecord`)."""

    samples: Optional[int] = Field(description="samples analysed")
    converged_fraction: Optional[Real] = Field(description="share of the samples whose solve from e converged "
                                                           "(Section 3.2's reachability)")
    status_counts: Optional[dict[str, int]] = Field(description="{status: samples} of that solve")
    nfe_median: Optional[Real] = Field(description="median evaluations of f per sample")
    rho_J_median: Optional[Real] = Field(description="median ρ(J*) over the converged samples (Props. 3–4)")
    rho_J_median_all: Optional[Real] = Field(description="median ρ(J*) over every measured sample")
    sigma_max_median: Optional[Real] = Field(description="median σ_max(J*) = ‖J*‖₂ over the converged samples")
    rho_M_median: Optional[Real] = Field(description="median ρ(M) over the converged samples (Prop. 4)")
    prop4_max_abs_diff: Optional[Real] = Field(description="max |M − J_autograd| (Prop. 4's check)")
    rho_Wx: Optional[Real] = Field(description="ρ(W_x) of the recall weight (Figs. 6–7)")
    input_grad_norm_median: Optional[Real] = Field(description="median ‖dx*/dx0‖_F over the converged samples "
                                                               "(Prop. 5)")
    distinct_fixed_points: Optional[int] = Field(None, description="distinct x* among the converged samples (Prop. 2)")
    fixed_point_distance_max: Optional[Real] = Field(description="largest distance between the x* from different "
                                                                 "starts, where every start converged (App. A.8)")
    dxT_de_norm_last: Optional[Real] = Field(None, description="‖dx_T/de·u‖ at the largest T on the first converged "
                                                               "sample (App. A.8)")
    prop5_rel_error_last: Optional[Real] = Field(None, description="Prop. 5's relative error at the largest T unrolled")
    accuracy_at_fixed_point: Optional[Real] = Field(description="whole-answer accuracy at x*")
    timings_s: Optional[dict[str, Real]] = Field(None, description="{stage: seconds} of the split")
    # stage a8's two questions (an analysis written before them has neither)
    e_local_exceed: Optional[int] = Field(None, description="A.8 local: converged samples with ‖dx_T/de·u‖ above the "
                                                            "threshold")
    e_local_measured: Optional[int] = Field(None, description="A.8 local: converged samples measured")
    e_local_threshold: Optional[Real] = Field(None, description="A.8 local: the threshold")
    e_local_max: Optional[Real] = Field(None, description="A.8 local: the largest ‖dx_T/de·u‖")
    e_local_T: Optional[int] = Field(None, description="A.8 local: the T it is measured at")
    e_global_differ: Optional[int] = Field(None, description="basins: samples whose x* from two converged starts "
                                                             "differ by more than the tolerance")
    e_global_compared: Optional[int] = Field(None, description="basins: samples with two or more converged starts")
    e_global_tol: Optional[Real] = Field(None, description="basins: the tolerance (relative L∞)")
    e_global_distance_max: Optional[Real] = Field(None, description="basins: the largest distance compared")
    # stage repelling, where it ran
    repelling_found: Optional[int] = Field(None, description="samples with a repelling root (ρ(J) > 1 + margin)")
    repelling_searched: Optional[int] = Field(None, description="samples searched")
    repelling_starts: Optional[int] = Field(None, description="root-finder starts per sample")
    repelling_budget: Optional[int] = Field(None, description="iterations per start")
    repelling_ran_out: Optional[int] = Field(None, description="samples where a start spent its budget without a root")
    repelling_roots: Optional[int] = Field(None, description="distinct roots found in all")
    # stage geometry, where it ran
    geometry_median_radius: Optional[Real] = Field(None, description="median radius of stability over the attracting "
                                                                     "samples' directions")
    geometry_log_iqr: Optional[Real] = Field(None, description="anisotropy: interquartile range of log r")
    geometry_log_range: Optional[Real] = Field(None, description="anisotropy: log(max r / min r)")
    geometry_balance: Optional[Real] = Field(None, description="anisotropy: min r / max r")
    geometry_unstable_t0: Optional[Real] = Field(None, description="share of the radii that are 0 (unstable at t → 0)")
    # stage path_independence, where it ran (an opt-in stage: Anil et al. 2022's asymptotic alignment)
    path_aa_other_median: Optional[Real] = Field(None, description="median AA score: cos(x* from e, x* from another "
                                                                   "input's x*)")
    path_aa_noise_median: Optional[Real] = Field(None, description="median AA score: cos(x* from e, x* from a noise "
                                                                   "start)")
    path_measured: Optional[int] = Field(None, description="samples the AA score was measured on")


#: the headline's keys, in the block's order, each with what it is: read from :class:`SplitSummary`, the one list
HEADLINE: tuple[tuple[str, str], ...] = tuple((key, info.description)
                                              for key, info in SplitSummary.model_fields.items())

_ORDER = {key: i for i, (key, _) in enumerate(HEADLINE)}


def headline(split: dict) -> dict:
    """The headline block of one split of an analysis JSON (``report[split]``)."""
    got = {"samples": split.get("samples")}
    for stage in REGISTRY:
        got.update(stage.headline(split.get(stage.key), split))
    got["timings_s"] = split.get("timings_s") or split.get("timings")
    return dict(sorted(got.items(), key=lambda kv: _ORDER.get(kv[0], len(_ORDER))))


def typed_headline(split: dict) -> SplitSummary:
    """The headline block of one split of an analysis JSON, typed (a ConfigError line naming the key that does not
    fit)."""
    return SplitSummary(**headline(split))


def headlines(report: dict) -> dict:
    """{split: headline block} of an analysis JSON (``Analysis.to_json()`` or a file ``stability analyze`` wrote)."""
    return {split: headline(report[split]) for split in report.get("splits", [])}
