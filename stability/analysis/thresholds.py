"""The verdict's thresholds (stated in the report and in the JSON), below both the verdict and the stages that
measure against them (A.8's local threshold, the tolerance two fixed points are told apart by)."""

from __future__ import annotations

#: thresholds of the verdict. The geometry ones are set between measured references (benchmarks/RESULTS.md,
#: "Geometry stage"): the toy regions of Figure 5 (internal recall's band, the narrow one of Table 3, against
#: external's) and the demo-sized prefix-sums checkpoints of both recall placements with pre- and post-norm.
THRESHOLDS = {
    "reachable_share": 0.9,  # share of samples whose plain iteration converges
    "rho_margin": 0.0,  # median ρ(J*) over converged samples must be below 1 − margin
    "input_grad_min": 1e-3,  # median ‖dx*/dx0‖_F at least this
    "prop5_rel_error_max": 1e-4,  # the unrolled gradient at T_max within this of the implicit one
    "e_distance_max": 1e-3,  # largest relative distance between the x* from different e (or 100·τ if larger)
    "e_local_max": 1e-3,  # A.8's ‖dx_T/de·u‖ at the largest T (unit u) at most this: x* locally independent of e
    "geometry_radius_min": 0.1,  # median radius of stability (relative step in parameter space) at least this
    "geometry_log_iqr_max": 0.4,  # anisotropy: interquartile range of log r over the directions at most this
}


def distinct_tol(tol: float) -> float:
    """The relative L∞ distance above which two fixed points differ at solver tolerance ``tol``: the threshold's
    ``e_distance_max``, or 100 τ where that is larger (a fixed point is known only to τ)."""
    return max(THRESHOLDS["e_distance_max"], 100 * tol)
