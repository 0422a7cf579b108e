"""The verdict: the paper's three axes (Section 3.2), reachable, input-dependent and geometry, decided from the
stages' JSON blocks against stated thresholds (:data:`THRESHOLDS`). Independence of the initial iterate is a fact
of the reachable line, not an axis, in two parts said apart: local (App. A.8: ‖dx_T/de·u‖ → 0 at the reached x*)
and global (basins: the x* reached from different starts, compared between converged solves only). So is the
search for repelling fixed points (ρ(J) > 1, App. A.1 case 2): "none found" is said only when stage ``repelling``
ran, with its number of root-finder starts per sample; plain iteration alone cannot find one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

#: thresholds of the verdict (stated in the report and in the JSON). The geometry ones are set between measured
#: references (benchmarks/RESULTS.md, "Geometry stage"): the toy regions of Figure 5 (internal recall's band, the
#: narrow one of Table 3, against external's) and the demo-sized prefix-sums checkpoints of both recall placements
#: with pre- and post-norm.
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

#: the verdict's axes, in the paper's order (Section 3.2)
AXES = ("reachable", "input_dependent", "geometry")


@dataclass
class Verdict:
    """The paper's three axes (Section 3.2) in words and numbers: reachable, input-dependent, geometry.

    Each axis is "yes", "no", "partly" or "not measured", with the numbers it was decided on and the thresholds
    (:data:`THRESHOLDS`). Independence of the initial iterate (App. A.8) is a consequence of attraction, not an
    axis: it is a fact of the reachable line (``from_every_start``: yes, partly, no or None when not measured)."""

    reachable: str
    input_dependent: str
    geometry: str
    numbers: dict
    thresholds: dict
    reasons: dict
    from_every_start: Optional[str] = None

    def to_dict(self) -> dict:
        return {"reachable": self.reachable, "input_dependent": self.input_dependent, "geometry": self.geometry,
                "from_every_start": self.from_every_start, "numbers": self.numbers, "thresholds": self.thresholds,
                "reasons": self.reasons}


def _geometry_axis(geo: Optional[dict], th: dict) -> tuple:
    """(decision, reason, numbers) of the geometry axis from the stage's JSON block."""
    if geo is None:
        return ("not measured", "stage not run (stability analyze runs it unless --only leaves it out; --only "
                "geometry runs it alone)", {})
    summ = geo.get("summary") or {}
    r, iqr, lr = summ.get("median_radius"), summ.get("log_iqr"), summ.get("log_range")
    bal, t0 = summ.get("balance"), summ.get("unstable_t0")
    n_att, n = summ.get("attracting_samples", 0), summ.get("samples", len(geo.get("samples", [])))
    nums = {"geometry_median_radius": r, "geometry_log_iqr": iqr, "geometry_log_range": lr,
            "geometry_balance": bal, "geometry_unstable_t0": t0}
    groups = [g for g in geo.get("groups") or [] if g.get("median_radius") is not None]
    narrow = min(groups, key=lambda g: g["median_radius"]) if groups else None
    if narrow is not None:
        nums["geometry_narrowest_group"] = narrow["name"]
        nums["geometry_narrowest_group_radius"] = narrow["median_radius"]
    K = geo.get("directions")
    where = f"{n} sample(s) × {K} directions × ±"
    if not n_att:
        return "no", f"x* does not attract at θ* on the {n} geometry sample(s): every radius is 0", nums
    wide, round_ = r >= th["geometry_radius_min"], iqr is not None and iqr <= th["geometry_log_iqr_max"]
    dec = "yes" if wide and round_ else ("partly" if wide or round_ else "no")
    if n_att < n and dec == "yes":
        dec = "partly"
    text = (f"median radius {r:.3g} {'≥' if wide else '<'} {th['geometry_radius_min']:g}, anisotropy: IQR of log r "
            f"{iqr:.2g} {'≤' if round_ else '>'} {th['geometry_log_iqr_max']:g} (log max/min {lr:.2g}, balance "
            f"{bal:.2g}); {t0:.0%} unstable at t → 0 ({where})")
    if n_att < n:
        text += f"; x* attracts at θ* on {n_att} of {n} samples"
    if narrow is not None:
        text += f"; narrowest part: {narrow['name']} ({narrow['median_radius']:.3g})"
    return dec, text, nums


def _from_every_start(a8: Optional[dict], glo: Optional[dict], loc: Optional[dict], th: dict,
                      reasons: dict) -> Optional[str]:
    """"yes" / "partly" / "no" / None from the global comparison (x* from different starts, converged solves only;
    a report without it: the largest distance where every start converged), with the local A.8 numbers beside it
    in ``reasons["from_every_start"]``."""
    if a8 is None:
        return None
    fr = a8.get("converged_fraction", {})
    all_conv = bool(fr) and all(v == 1.0 for v in fr.values())
    if glo is not None:
        n, k, tol = glo.get("compared", 0), glo.get("differ", 0), glo.get("tol", th["e_distance_max"])
        every = None if not n else "no" if k else ("yes" if all_conv else "partly")
        text = (f"global (basins): x* from e ∈ {{{', '.join(glo.get('starts', []))}}} differ by > {tol:g} (relative "
                f"L∞) on {k} of {n} samples with two or more converged starts"
                + ("" if all_conv else ", not every start converged") if n else
                "global (basins): no sample converged from two starts")
    else:
        d = a8.get("fixed_point_distance_max")
        every = None if d is None else "no" if d > th["e_distance_max"] else ("yes" if all_conv else "partly")
        text = ("no sample converged from every start" if d is None else
                f"x* from e ∈ {{{', '.join(fr)}}} within {d:.3g} {'≤' if d <= th['e_distance_max'] else '>'} "
                f"{th['e_distance_max']:g}" + ("" if all_conv else ", not every start converged"))
    if loc is not None:
        text += (f"; local (A.8): ‖dx_T/de·u‖ at T = {loc.get('T')} > {loc.get('threshold', th['e_local_max']):g} "
                 f"on {loc.get('exceed', 0)} of {loc.get('measured', 0)} converged samples")
    reasons["from_every_start"] = text
    return every


def _repelling_reason(rep: Optional[dict]) -> str:
    """What the reachable line says about repelling fixed points: only what stage ``repelling`` measured."""
    if rep is None:
        return "repelling fixed points: not searched (stage repelling not run; plain iteration cannot reach one)"
    n, k, out = rep.get("searched", 0), rep.get("samples_with_repelling", 0), rep.get("samples_ran_out", 0)
    starts = rep.get("starts")
    tail = f" ({out} of {n} samples ran out of budget)" if out else ""
    if rep.get("marginal_total"):
        tail += (f"; {rep['marginal_total']} marginal root(s), |ρ(J) − 1| ≤ {rep.get('margin', 0):g}, on "
                 f"{rep.get('samples_with_marginal')} sample(s)")
    if k:
        return (f"repelling fixed point (ρ(J) > 1) found on {k} of {n} samples by {starts} root-finder starts per "
                f"sample{tail}")
    return f"no repelling fixed point found by {starts} root-finder starts per sample ({n} samples){tail}"


def verdict(results: dict, *, tol: float) -> Verdict:
    """Decide the three axes from the stages' JSON blocks (``results``: stage key → block or None)."""
    th = {**THRESHOLDS, "e_distance_max": max(THRESHOLDS["e_distance_max"], 100 * tol)}
    fp, jac = results.get("fixed_point") or {}, results.get("jacobian")
    ind, p5, a8 = results.get("input_dependence"), results.get("prop5"), results.get("initial_iterate")
    share = fp.get("converged_fraction")
    rho = (jac or {}).get("spectral_radius_median")
    nums = {"converged_fraction": share, "rho_J_median": rho, "rho_margin": None if rho is None else 1.0 - rho,
            "distinct_fixed_points": fp.get("distinct_fixed_points"),
            "converged": None if share is None else int(round(share * fp.get("samples", len(fp.get("status", []))))),
            "input_grad_median": (ind or {}).get("frobenius_median"),
            "prop5_rel_error": (p5 or {}).get("rel_error", [None])[-1] if (p5 or {}).get("rel_error") else None,
            "e_distance_max": (a8 or {}).get("fixed_point_distance_max")}
    loc, glo, rep = (a8 or {}).get("local"), (a8 or {}).get("global"), results.get("repelling")
    nums.update({"e_local_exceed": (loc or {}).get("exceed"), "e_local_measured": (loc or {}).get("measured"),
                 "e_global_differ": (glo or {}).get("differ"), "e_global_compared": (glo or {}).get("compared"),
                 "repelling_found": (rep or {}).get("samples_with_repelling"),
                 "repelling_searched": (rep or {}).get("searched"), "repelling_starts": (rep or {}).get("starts")})
    reasons = {}
    # reachable: share converged, median ρ(J*) < 1 − margin
    limit = 1.0 - th["rho_margin"]
    if not share:
        reach, reasons["reachable"] = "no", "no sample converged under plain iteration"
    elif jac is None:
        reach = "yes" if share >= th["reachable_share"] else "partly"
        reasons["reachable"] = f"{share:.0%} converged; ρ(J*) not measured"
    elif rho is None:
        reach, reasons["reachable"] = "partly", f"{share:.0%} converged; ρ(J*) not available"
    elif rho >= limit:
        reach, reasons["reachable"] = "no", f"median ρ(J*) = {rho:.4g} ≥ {limit:g}: x* is not attracting"
    else:
        reach = "yes" if share >= th["reachable_share"] else "partly"
        reasons["reachable"] = (f"{share:.0%} converged (threshold {th['reachable_share']:.0%}), median ρ(J*) = "
                                f"{rho:.4g}, margin {1 - rho:.3g} to 1")
    # from every start: a fact of the reachable line, not an axis; global (basins) decides it, local (A.8) is said
    every = _from_every_start(a8, glo, loc, th, reasons)
    if "from_every_start" in reasons:
        reasons["reachable"] += f"; from every start: {every or 'not measured'}, {reasons['from_every_start']}"
    reasons["reachable"] += "; " + _repelling_reason(rep)
    # input-dependent: ‖dx*/dx0‖_F, distinct fixed points, Prop. 5 agreement
    g = nums["input_grad_median"]
    distinct, conv_n = nums["distinct_fixed_points"], nums["converged"] or 0
    if ind is None or g is None:
        dep = "not measured"
        reasons["input_dependent"] = ("stage not run" if ind is None else "no converged sample with a solved "
                                      "implicit gradient")
    else:
        several = conv_n >= 2 and distinct is not None
        if g < th["input_grad_min"]:
            dep = "no"
            reasons["input_dependent"] = f"median ‖dx*/dx0‖_F = {g:.3g} < {th['input_grad_min']:g}"
        elif several and distinct == 1:
            dep = "partly"
            reasons["input_dependent"] = (f"‖dx*/dx0‖_F = {g:.3g}, but all {conv_n} converged samples share one "
                                          f"fixed point")
        else:
            dep = "yes"
            reasons["input_dependent"] = (f"median ‖dx*/dx0‖_F = {g:.3g} ≥ {th['input_grad_min']:g}"
                                          + (f"; {distinct} distinct fixed points among {conv_n}" if several else ""))
        e5 = nums["prop5_rel_error"]
        if e5 is not None:
            ok = e5 <= th["prop5_rel_error_max"]
            reasons["input_dependent"] += (f"; Prop. 5 {'agrees' if ok else 'does not agree'} (unrolled vs implicit "
                                           f"gradient {e5:.2g} {'≤' if ok else '>'} {th['prop5_rel_error_max']:g})")
    # geometry: the radii of stability and their anisotropy (stage geometry)
    geo_dec, reasons["geometry"], geo_nums = _geometry_axis(results.get("geometry"), th)
    nums.update(geo_nums)
    return Verdict(reachable=reach, input_dependent=dep, geometry=geo_dec, numbers=nums, thresholds=th,
                   reasons=reasons, from_every_start=every)
