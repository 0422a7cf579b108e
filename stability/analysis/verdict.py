"""The verdict: the paper's three axes (Section 3.2), reachable, input-dependent and geometry, decided from the stages'
JSON blocks, each read through its stage's typed ``Evidence`` (:mod:`stability.analysis.stages`), against stated
thresholds (:data:`THRESHOLDS`, :mod:`stability.analysis.thresholds`). Independence of the initial iterate is a fact
of the reachable line, not an axis, in two parts said apart: local (App. A.8: ‖dx_T/de·u‖ → 0 at the reached x*) and
global (basins: the x* reached from different starts, compared between converged solves only). So is the search for
repelling fixed points (ρ(J) > 1, App. A.1 case 2): "none found" is said only when stage ``repelling`` ran, with its
number of root-finder starts per sample; plain iteration alone cannot find one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from stability.analysis.intervals import (CONFIDENCE, LEVEL, format_interval, median_interval, share_interval,
                                          side)
from stability.analysis.stages import a8 as a8_stage
from stability.analysis.stages import geometry as geometry_stage
from stability.analysis.stages import input as input_stage
from stability.analysis.stages import prop5 as prop5_stage
from stability.analysis.stages import reachability as reachability_stage
from stability.analysis.stages import repelling as repelling_stage
from stability.analysis.stages import rho as rho_stage
from stability.analysis.thresholds import THRESHOLDS, distinct_tol
from stability.stats import FIXED_POINT_STATUSES

__all__ = ["AXES", "THRESHOLDS", "Verdict", "verdict"]

#: the verdict's axes, in the paper's order (Section 3.2); the third is the geometry stage's, and named after it
AXES = ("reachable", "input_dependent", geometry_stage.NAME)


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
        return {**dict(zip(AXES, (self.reachable, self.input_dependent, self.geometry))),
                "from_every_start": self.from_every_start, "numbers": self.numbers, "thresholds": self.thresholds,
                "reasons": self.reasons, "brief": self.brief, "intervals": self.intervals,
                "confidence": {"each_end": CONFIDENCE, "interval": LEVEL,
                               "rule": "docs/analysis.md, \"The verdict's rule\""}}


def _or(value, default):
    """``value``, or ``default`` where the block did not have it."""
    return default if value is None else value


def _geometry_axis(geo: Optional[geometry_stage.Evidence], th: dict) -> tuple:
    """(decision, reason, brief, numbers, interval) of the geometry axis from the stage's evidence: the median
    radius with its order-statistic interval over the pooled radii of the samples whose x* attracts
    (:func:`~stability.analysis.intervals.median_interval`), and the anisotropy (App. B.2)."""
    if geo is None:
        why = ("stage not run (stability analyze runs it unless --only leaves it out; --only geometry runs it "
               "alone)")
        return "not measured", why, "stage not run (--only geometry runs it alone)", {}, None
    r, iqr, lr, bal, t0 = geo.median_radius, geo.log_iqr, geo.log_range, geo.balance, geo.unstable_t0
    n_att, n = geo.attracting, geo.samples
    nums = {"geometry_median_radius": r, "geometry_log_iqr": iqr, "geometry_log_range": lr,
            "geometry_balance": bal, "geometry_unstable_t0": t0}
    if geo.narrowest is not None:
        nums["geometry_narrowest_group"], nums["geometry_narrowest_group_radius"] = geo.narrowest
    where = f"{n_att} sample{'' if n_att == 1 else 's'} × {geo.directions} directions × ±"
    if not n_att:
        why = f"x* does not attract at θ* on the {n} geometry sample(s): every radius is 0"
        return "no", why, why, nums, None
    ci = median_interval(geo.pooled)
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
    if geo.narrowest is not None:
        name, radius_of = geo.narrowest
        text += f"; narrowest part: {name} ({radius_of:.3g})"
        brief += f"; narrowest part: {name.split(' (')[0]} ({radius_of:.2g})"
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


def _from_every_start(a8: Optional[a8_stage.Evidence], th: dict, reasons: dict) -> Optional[str]:
    """"yes" / "partly" / "no" / None from the global comparison (x* from different starts, converged solves only;
    a report without it: the largest distance where every start converged), with the local A.8 numbers beside it
    in ``reasons["from_every_start"]``."""
    if a8 is None:
        return None
    fr, glo, loc = a8.converged_fraction, a8.global_, a8.local
    all_conv = bool(fr) and all(v == 1.0 for v in fr.values())
    if glo is not None:
        n, k, tol = _or(glo.compared, 0), _or(glo.differ, 0), _or(glo.tol, th["e_distance_max"])
        every = None if not n else "no" if k else ("yes" if all_conv else "partly")
        text = (f"global (basins): x* from e ∈ {{{', '.join(glo.starts)}}} differ by > {tol:g} (relative "
                f"L∞) on {k} of {n} samples with two or more converged starts"
                + ("" if all_conv else ", not every start converged") if n else
                "global (basins): no sample converged from two starts")
    else:
        d = a8.distance_max
        every = None if d is None else "no" if d > th["e_distance_max"] else ("yes" if all_conv else "partly")
        text = ("no sample converged from every start" if d is None else
                f"x* from e ∈ {{{', '.join(fr)}}} within {d:.3g} {'≤' if d <= th['e_distance_max'] else '>'} "
                f"{th['e_distance_max']:g}" + ("" if all_conv else ", not every start converged"))
    if loc is not None:
        text += (f"; local (A.8): ‖dx_T/de·u‖ at T = {loc.T} > {_or(loc.threshold, th['e_local_max']):g} "
                 f"on {_or(loc.exceed, 0)} of {_or(loc.measured, 0)} converged samples")
    reasons["from_every_start"] = text
    return every


def _repelling_brief(rep: Optional[repelling_stage.Evidence]) -> str:
    """The repelling search in short: k of n samples, or not searched."""
    if rep is None:
        return "repelling: not searched"
    k, n = _or(rep.found, 0), _or(rep.searched, 0)
    return f"repelling x* found on {k} of {n} samples" if k else f"no repelling x* found ({n} samples searched)"


def _repelling_reason(rep: Optional[repelling_stage.Evidence]) -> str:
    """What the reachable line says about repelling fixed points: only what stage ``repelling`` measured."""
    if rep is None:
        return "repelling fixed points: not searched (stage repelling not run; plain iteration cannot reach one)"
    n, k, out = _or(rep.searched, 0), _or(rep.found, 0), _or(rep.ran_out, 0)
    tail = f" ({out} of {n} samples ran out of budget)" if out else ""
    if rep.marginal_total:
        tail += (f"; {rep.marginal_total} marginal root(s), |ρ(J) − 1| ≤ {_or(rep.margin, 0):g}, on "
                 f"{rep.samples_with_marginal} sample(s)")
    if k:
        return (f"repelling fixed point (ρ(J) > 1) found on {k} of {n} samples by {rep.starts} root-finder starts "
                f"per sample{tail}")
    return f"no repelling fixed point found by {rep.starts} root-finder starts per sample ({n} samples){tail}"


_RANK = {"no": 0, "partly": 1, "yes": 2}


def _weakest(*words: str) -> str:
    """The verdict of a line from the words of its tests: NO if any is NO, YES if all are YES, else PARTLY."""
    return min(words, key=_RANK.__getitem__)


def _converged_samples(fp: reachability_stage.Evidence, values: list) -> list:
    """The entries of a per-sample list at the samples whose solve found a fixed point (the medians' samples)."""
    return [v for v, st in zip(values, fp.status) if st in FIXED_POINT_STATUSES]


def _reachable(fp: reachability_stage.Evidence, jac: Optional[rho_stage.Evidence], th: dict) -> tuple:
    """(word, reason, brief, intervals) of the reachable line from the converged share (Wilson interval) and the
    median ρ(J*) over the converged samples (order-statistic interval); docs/analysis.md, "The verdict's rule"."""
    share, n = fp.share, fp.samples
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
    rho = jac.rho_median
    if rho is None:
        return _weakest(words[0], "partly"), f"{conv}; ρ(J*) not available", f"{conv}; ρ(J*) not available", ints
    limit = 1.0 - th["rho_margin"]
    rci = median_interval(_converged_samples(fp, jac.rho))
    ints["rho_J_median"] = rci
    words.append(_median_word(rci, limit, good="below"))
    rel = _relation(side(rci, limit, good="below"), limit, "below")
    if rho >= limit:
        rel = f"≥ {limit:g}: x* is not attracting"
    rtext = f"median ρ(J*) {rho:.4g} {format_interval(rci)} (n = {(rci or {}).get('n', 0)}) {rel}"
    return _weakest(*words), f"{conv}; {rtext}, margin {1 - rho:.3g} to 1", f"{conv}; {rtext}", ints


def _input_dependent(ind: Optional[input_stage.Evidence], nums: dict, th: dict) -> tuple:
    """(word, reason, brief, interval) of the input-dependent line: the median ‖dx*/dx0‖_F with its order-statistic
    interval, distinct fixed points (Prop. 2), Prop. 5's agreement."""
    g = nums["input_grad_median"]
    if ind is None or g is None:
        why = "stage not run" if ind is None else "no converged sample with a solved implicit gradient"
        return "not measured", why, why, None
    distinct, conv_n = nums["distinct_fixed_points"], nums["converged"] or 0
    several = conv_n >= 2 and distinct is not None
    ci, t = median_interval(ind.values), th["input_grad_min"]
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


def _numbers(fp: reachability_stage.Evidence, jac: Optional[rho_stage.Evidence], ind: Optional[input_stage.Evidence],
             p5: prop5_stage.Evidence, a8: Optional[a8_stage.Evidence],
             rep: Optional[repelling_stage.Evidence]) -> dict:
    """The numbers the three axes are decided on (the verdict's ``numbers``, under the names they were first written
    with; docs/architecture.md, "The record")."""
    rho = None if jac is None else jac.rho_median
    loc, glo = (None, None) if a8 is None else (a8.local, a8.global_)
    return {"converged_fraction": fp.share, "rho_J_median": rho, "rho_margin": None if rho is None else 1.0 - rho,
            "distinct_fixed_points": fp.distinct, "converged": fp.converged,
            "input_grad_median": None if ind is None else ind.median, "prop5_rel_error": p5.rel_error_last,
            "e_distance_max": None if a8 is None else a8.distance_max,
            "e_local_exceed": None if loc is None else loc.exceed,
            "e_local_measured": None if loc is None else loc.measured,
            "e_global_differ": None if glo is None else glo.differ,
            "e_global_compared": None if glo is None else glo.compared,
            "repelling_found": None if rep is None else rep.found,
            "repelling_searched": None if rep is None else rep.searched,
            "repelling_starts": None if rep is None else rep.starts}


def verdict(results: dict, *, tol: float) -> Verdict:
    """Decide the three axes from the stages' JSON blocks (``results``: stage key → block or None, a split's block
    of the JSON), read through each stage's typed evidence, each share and median with its interval
    (:mod:`stability.analysis.intervals`; docs/analysis.md, "The verdict's rule")."""
    th = {**THRESHOLDS, "e_distance_max": distinct_tol(tol)}
    fp = reachability_stage.Evidence.from_block(results.get(reachability_stage.KEY))
    jac = rho_stage.Evidence.from_block(results.get(rho_stage.KEY))
    ind = input_stage.Evidence.from_block(results.get(input_stage.KEY))
    p5 = prop5_stage.Evidence.from_block(results.get(prop5_stage.KEY))
    a8 = a8_stage.Evidence.from_block(results.get(a8_stage.KEY))
    rep = repelling_stage.Evidence.from_block(results.get(repelling_stage.KEY))
    nums = _numbers(fp, jac, ind, p5, a8, rep)
    reasons, brief = {}, {}
    reach, reasons["reachable"], brief["reachable"], intervals = _reachable(fp, jac, th)
    # from every start: a fact of the reachable line, not an axis; global (basins) decides it, local (A.8) is said
    every = _from_every_start(a8, th, reasons)
    if "from_every_start" in reasons:
        glo = a8.global_
        reasons["reachable"] += f"; from every start: {every or 'not measured'}, {reasons['from_every_start']}"
        if glo is not None and glo.compared:
            brief["reachable"] += (f"; from every start: {every or 'not measured'} ({_or(glo.differ, 0)} of "
                                   f"{glo.compared} samples differ)")
        else:
            brief["reachable"] += f"; from every start: {every or 'not measured'}"
    reasons["reachable"] += "; " + _repelling_reason(rep)
    brief["reachable"] += "; " + _repelling_brief(rep)
    dep, reasons["input_dependent"], brief["input_dependent"], ici = _input_dependent(ind, nums, th)
    if ici is not None:
        intervals["input_grad_median"] = ici
    geo = geometry_stage.Evidence.from_block(results.get(geometry_stage.KEY))
    geo_dec, reasons[AXES[2]], brief[AXES[2]], geo_nums, gci = _geometry_axis(geo, th)
    nums.update(geo_nums)
    if gci is not None:
        intervals["geometry_median_radius"] = gci
    return Verdict(reachable=reach, input_dependent=dep, geometry=geo_dec, numbers=nums, thresholds=th,
                   reasons=reasons, from_every_start=every, brief=brief, intervals=intervals)
