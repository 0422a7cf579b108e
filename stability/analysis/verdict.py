"""The verdict: the paper's three axes (Section 3.2), reachable, input-dependent and geometry, decided from the
stages' JSON blocks against stated thresholds (:data:`THRESHOLDS`). Independence of the initial iterate is a fact
of the reachable line, not an axis, in two parts said apart: local (App. A.8: ‖dx_T/de·u‖ → 0 at the reached x*)
and global (basins: the x* reached from different starts, compared between converged solves only). So is the
search for repelling fixed points (ρ(J) > 1, App. A.1 case 2): "none found" is said only when stage ``repelling``
ran, with its number of root-finder starts per sample; plain iteration alone cannot find one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from stability.analysis.intervals import (CONFIDENCE, LEVEL, format_interval, median_interval, share_interval,
                                          side)
from stability.stats import FIXED_POINT_STATUSES

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
    brief: dict = field(default_factory=dict)  # the reasons in short, as the printed report shows them
    intervals: dict = field(default_factory=dict)  # the interval of every share and median decided on

    def to_dict(self) -> dict:
        return {"reachable": self.reachable, "input_dependent": self.input_dependent, "geometry": self.geometry,
                "from_every_start": self.from_every_start, "numbers": self.numbers, "thresholds": self.thresholds,
                "reasons": self.reasons, "brief": self.brief, "intervals": self.intervals,
                "confidence": {"each_end": CONFIDENCE, "interval": LEVEL,
                               "rule": "docs/analysis.md, \"The verdict's rule\""}}


def _geometry_axis(geo: Optional[dict], th: dict) -> tuple:
    """(decision, reason, brief, numbers, interval) of the geometry axis from the stage's JSON block: the median
    radius with its order-statistic interval over the pooled radii of the samples whose x* attracts
    (:func:`~stability.analysis.intervals.median_interval`), and the anisotropy (App. B.2)."""
    if geo is None:
        why = ("stage not run (stability analyze runs it unless --only leaves it out; --only geometry runs it "
               "alone)")
        return "not measured", why, "stage not run (--only geometry runs it alone)", {}, None
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
    where = f"{n_att} sample{'' if n_att == 1 else 's'} × {K} directions × ±"
    if not n_att:
        why = f"x* does not attract at θ* on the {n} geometry sample(s): every radius is 0"
        return "no", why, why, nums, None
    pooled = [v for rs, a in zip(geo.get("radii", []), geo.get("attracting_at_theta", [])) if a for v in rs]
    ci = median_interval(pooled)
    t = th["geometry_radius_min"]
    wide = _median_word(ci, t, good="at_or_above")
    round_ = iqr is not None and iqr <= th["geometry_log_iqr_max"]
    dec = "yes" if wide == "yes" and round_ else ("no" if wide == "no" and not round_ else "partly")
    if n_att < n and dec == "yes":
        dec = "partly"
    radius = (f"median radius {r:.3g} {format_interval(ci)} ({where}) "
              f"{_relation(side(ci, t, good='at_or_above'), t, 'at_or_above')}")
    shape = f"IQR of log r {iqr:.2g} {'≤' if round_ else '>'} {th['geometry_log_iqr_max']:g}"
    text = (f"{radius}, anisotropy: {shape} (log max/min {lr:.2g}, balance {bal:.2g}); {t0:.0%} unstable at t → 0")
    brief = f"{radius}; {shape}"
    if n_att < n:
        text += f"; x* attracts at θ* on {n_att} of {n} samples"
        brief += f"; x* attracts on {n_att} of {n} samples"
    if narrow is not None:
        text += f"; narrowest part: {narrow['name']} ({narrow['median_radius']:.3g})"
        brief += f"; narrowest part: {narrow['name'].split(' (')[0]} ({narrow['median_radius']:.2g})"
    return dec, text, brief, nums, ci


def _median_word(ci: Optional[dict], threshold: float, *, good: str) -> str:
    """The rule for a median (docs/analysis.md, "The verdict's rule"): "no" when the median itself is on the bad
    side (the rule before intervals, kept), "yes" when the whole interval is on the good side, "partly" otherwise
    (it straddles the threshold, or n is too small for a bounded interval)."""
    m = None if ci is None else ci["median"]
    if m is None:
        return "partly"
    if (m < threshold) if good == "at_or_above" else (m >= threshold):
        return "no"
    return "yes" if side(ci, threshold, good=good) == "good" else "partly"


def _relation(where: str, threshold, good: str, fmt: str = "g") -> str:
    """"≥ 0.1", "< 1", "straddles 90%": where an interval lies against its threshold, in words."""
    t = format(threshold, fmt)
    if where == "straddles":
        return f"straddles {t}"
    return ("≥ " if (where == "good") == (good == "at_or_above") else "< ") + t


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


def _repelling_brief(rep: Optional[dict]) -> str:
    """The repelling search in short: k of n samples, or not searched."""
    if rep is None:
        return "repelling: not searched"
    k, n = rep.get("samples_with_repelling", 0), rep.get("searched", 0)
    return f"repelling x* found on {k} of {n} samples" if k else f"no repelling x* found ({n} samples searched)"


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


_RANK = {"no": 0, "partly": 1, "yes": 2}


def _weakest(*words: str) -> str:
    """The verdict of a line from the words of its tests: NO if any is NO, YES if all are YES, else PARTLY."""
    return min(words, key=_RANK.__getitem__)


def _converged_samples(fp: dict, values) -> list:
    """The entries of a per-sample list at the samples whose solve found a fixed point (the medians' samples)."""
    status = fp.get("status") or []
    return [v for v, st in zip(values or [], status) if st in FIXED_POINT_STATUSES]


def _reachable(fp: dict, jac: Optional[dict], th: dict) -> tuple:
    """(word, reason, brief, intervals) of the reachable line from the converged share (Wilson interval) and the
    median ρ(J*) over the converged samples (order-statistic interval); docs/analysis.md, "The verdict's rule"."""
    share = fp.get("converged_fraction")
    n = fp.get("samples", len(fp.get("status", [])))
    if not share or not n:
        why = "no sample converged under plain iteration"
        return "no", why, why, {}
    k = int(round(share * n))
    sci, t = share_interval(k, n), th["reachable_share"]
    where = side(sci, t, good="at_or_above")
    conv = (f"converged {k} of {n} = {share:.0%} {format_interval(sci, percent=True)} "
            f"{_relation(where, t, 'at_or_above', '.0%')}")
    words, ints = [{"good": "yes", "bad": "no", "straddles": "partly"}[where]], {"converged_share": sci}
    if jac is None:
        return words[0], f"{conv}; ρ(J*) not measured", f"{conv}; ρ(J*) not measured", ints
    rho = jac.get("spectral_radius_median")
    if rho is None:
        return _weakest(words[0], "partly"), f"{conv}; ρ(J*) not available", f"{conv}; ρ(J*) not available", ints
    limit = 1.0 - th["rho_margin"]
    rci = median_interval(_converged_samples(fp, jac.get("spectral_radius")))
    ints["rho_J_median"] = rci
    words.append(_median_word(rci, limit, good="below"))
    rel = _relation(side(rci, limit, good="below"), limit, "below")
    if rho >= limit:
        rel = f"≥ {limit:g}: x* is not attracting"
    rtext = f"median ρ(J*) {rho:.4g} {format_interval(rci)} (n = {(rci or {}).get('n', 0)}) {rel}"
    return _weakest(*words), f"{conv}; {rtext}, margin {1 - rho:.3g} to 1", f"{conv}; {rtext}", ints


def _input_dependent(ind: Optional[dict], fp: dict, nums: dict, th: dict) -> tuple:
    """(word, reason, brief, interval) of the input-dependent line: the median ‖dx*/dx0‖_F with its order-statistic
    interval, distinct fixed points (Prop. 2), Prop. 5's agreement."""
    g = nums["input_grad_median"]
    if ind is None or g is None:
        why = "stage not run" if ind is None else "no converged sample with a solved implicit gradient"
        return "not measured", why, why, None
    distinct, conv_n = nums["distinct_fixed_points"], nums["converged"] or 0
    several = conv_n >= 2 and distinct is not None
    ci, t = median_interval(ind.get("frobenius") or []), th["input_grad_min"]
    dep = _median_word(ci, t, good="at_or_above")
    text = (f"median ‖dx*/dx0‖_F {g:.3g} {format_interval(ci)} (n = {(ci or {}).get('n', 0)}) "
            f"{_relation(side(ci, t, good='at_or_above'), t, 'at_or_above')}")
    if dep != "no" and several and distinct == 1:
        dep, text = "partly", f"{text}, but all {conv_n} converged samples share one fixed point"
    elif dep != "no" and several:
        text += f"; {distinct} distinct fixed points among {conv_n}"
    brief = text
    e5 = nums["prop5_rel_error"]
    if e5 is not None:
        ok = e5 <= th["prop5_rel_error_max"]
        text += (f"; Prop. 5 {'agrees' if ok else 'does not agree'} (unrolled vs implicit gradient {e5:.2g} "
                 f"{'≤' if ok else '>'} {th['prop5_rel_error_max']:g})")
        brief += f"; Prop. 5 {'agrees' if ok else 'does not agree'} ({e5:.2g})"
    return dep, text, brief, ci


def verdict(results: dict, *, tol: float) -> Verdict:
    """Decide the three axes from the stages' JSON blocks (``results``: stage key → block or None), each share and
    median with its interval (:mod:`stability.analysis.intervals`; docs/analysis.md, "The verdict's rule")."""
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
    reasons, brief = {}, {}
    reach, reasons["reachable"], brief["reachable"], intervals = _reachable(fp, jac, th)
    # from every start: a fact of the reachable line, not an axis; global (basins) decides it, local (A.8) is said
    every = _from_every_start(a8, glo, loc, th, reasons)
    if "from_every_start" in reasons:
        reasons["reachable"] += f"; from every start: {every or 'not measured'}, {reasons['from_every_start']}"
        if glo is not None and glo.get("compared"):
            brief["reachable"] += (f"; from every start: {every or 'not measured'} ({glo.get('differ', 0)} of "
                                   f"{glo['compared']} samples differ)")
        else:
            brief["reachable"] += f"; from every start: {every or 'not measured'}"
    reasons["reachable"] += "; " + _repelling_reason(rep)
    brief["reachable"] += "; " + _repelling_brief(rep)
    dep, reasons["input_dependent"], brief["input_dependent"], ici = _input_dependent(ind, fp, nums, th)
    if ici is not None:
        intervals["input_grad_median"] = ici
    geo_dec, reasons["geometry"], brief["geometry"], geo_nums, gci = _geometry_axis(results.get("geometry"), th)
    nums.update(geo_nums)
    if gci is not None:
        intervals["geometry_median_radius"] = gci
    return Verdict(reachable=reach, input_dependent=dep, geometry=geo_dec, numbers=nums, thresholds=th,
                   reasons=reasons, from_every_start=every, brief=brief, intervals=intervals)
