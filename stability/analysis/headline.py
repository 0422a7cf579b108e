"""The headline block of a split: the analysis' numbers under one documented name each, what the sweep's record
keeps of an analysis (``record["analysis"][split]``, which the export, the claims and the figures read) and what
``stability compare`` compares. The long JSON (every per-sample list, the methods, the plane) stays for people and
plots; a program reads this.

Each stage contributes its own numbers (its module's ``headline``, read from its JSON block, so an analysis written
by an earlier version gives its headline the same way); :data:`HEADLINE` documents the keys and fixes their order.
Torch-free: compare and the sweep's record import it without torch.
"""

from __future__ import annotations

from stability.analysis.stages.registry import REGISTRY

#: the headline's keys, in the block's order, each with what it is. The first group is always there (None where
#: its stage did not run or measured nothing); the groups below it only where their stage ran, so a record of an
#: analysis without them keeps its shape. The names differ from the verdict's ``numbers`` where those were written
#: first (docs/architecture.md, "The headline"); a stage's own numbers not listed here come after these, in
#: registry order.
HEADLINE: tuple[tuple[str, str], ...] = (
    ("samples", "samples analysed"),
    ("converged_fraction", "share of the samples whose solve from e converged (Section 3.2's reachability)"),
    ("status_counts", "{status: samples} of that solve"),
    ("nfe_median", "median evaluations of f per sample"),
    ("rho_J_median", "median ρ(J*) over the converged samples (Props. 3–4)"),
    ("rho_J_median_all", "median ρ(J*) over every measured sample"),
    ("sigma_max_median", "median σ_max(J*) = ‖J*‖₂ over the converged samples"),
    ("rho_M_median", "median ρ(M) over the converged samples (Prop. 4)"),
    ("prop4_max_abs_diff", "max |M − J_autograd| (Prop. 4's check)"),
    ("rho_Wx", "ρ(W_x) of the recall weight (Figs. 6–7)"),
    ("input_grad_norm_median", "median ‖dx*/dx0‖_F over the converged samples (Prop. 5)"),
    ("distinct_fixed_points", "distinct x* among the converged samples (Prop. 2)"),
    ("fixed_point_distance_max", "largest distance between the x* from different starts, where every start "
                                 "converged (App. A.8)"),
    ("dxT_de_norm_last", "‖dx_T/de·u‖ at the largest T on the first converged sample (App. A.8)"),
    ("prop5_rel_error_last", "Prop. 5's relative error at the largest T unrolled"),
    ("accuracy_at_fixed_point", "whole-answer accuracy at x*"),
    ("timings_s", "{stage: seconds} of the split"),
    # stage a8's two questions (an analysis written before them has neither)
    ("e_local_exceed", "A.8 local: converged samples with ‖dx_T/de·u‖ above the threshold"),
    ("e_local_measured", "A.8 local: converged samples measured"),
    ("e_local_threshold", "A.8 local: the threshold"),
    ("e_local_max", "A.8 local: the largest ‖dx_T/de·u‖"),
    ("e_local_T", "A.8 local: the T it is measured at"),
    ("e_global_differ", "basins: samples whose x* from two converged starts differ by more than the tolerance"),
    ("e_global_compared", "basins: samples with two or more converged starts"),
    ("e_global_tol", "basins: the tolerance (relative L∞)"),
    ("e_global_distance_max", "basins: the largest distance compared"),
    # stage repelling, where it ran
    ("repelling_found", "samples with a repelling root (ρ(J) > 1 + margin)"),
    ("repelling_searched", "samples searched"),
    ("repelling_starts", "root-finder starts per sample"),
    ("repelling_budget", "iterations per start"),
    ("repelling_ran_out", "samples where a start spent its budget without a root"),
    ("repelling_roots", "distinct roots found in all"),
    # stage geometry, where it ran
    ("geometry_median_radius", "median radius of stability over the attracting samples' directions"),
    ("geometry_log_iqr", "anisotropy: interquartile range of log r"),
    ("geometry_log_range", "anisotropy: log(max r / min r)"),
    ("geometry_balance", "anisotropy: min r / max r"),
    ("geometry_unstable_t0", "share of the radii that are 0 (unstable at t → 0)"),
    # stage path_independence, where it ran (an opt-in stage: Anil et al. 2022's asymptotic alignment)
    ("path_aa_other_median", "median AA score: cos(x* from e, x* from another input's x*)"),
    ("path_aa_noise_median", "median AA score: cos(x* from e, x* from a noise start)"),
    ("path_measured", "samples the AA score was measured on"),
)

_ORDER = {key: i for i, (key, _) in enumerate(HEADLINE)}


def headline(split: dict) -> dict:
    """The headline block of one split of an analysis JSON (``report[split]``)."""
    got = {"samples": split.get("samples")}
    for stage in REGISTRY:
        got.update(stage.headline(split.get(stage.key), split))
    got["timings_s"] = split.get("timings_s") or split.get("timings")
    return dict(sorted(got.items(), key=lambda kv: _ORDER.get(kv[0], len(_ORDER))))


def headlines(report: dict) -> dict:
    """{split: headline block} of an analysis JSON (``Analysis.to_json()`` or a file ``stability analyze`` wrote)."""
    return {split: headline(report[split]) for split in report.get("splits", [])}
