"""The claims' statistics: each test's one-sided p-values in both directions and the two-sided one
(``scipy.stats``), the effect's location, and the percentile bootstrap interval resampling whole configurations."""

from __future__ import annotations

import math
import warnings
import zlib
from typing import Optional

import numpy as np

from stability.sweep.claims.schema import Claim

# scipy.stats is imported where a test or the bootstrap runs (_scipy_stats): it takes seconds to import, and the
# package is imported without them (the figures' selection rule, the claims file's schema)

#: differences within TIE of the null are ties: dropped by the sign test and by Wilcoxon
TIE = 1e-9
_SIDES = ("greater", "less", "two-sided")


def _scipy_stats():
    from scipy import stats

    return stats


def location(values, how: str) -> float:
    """The mean or the median of ``values``."""
    return float(np.mean(values) if how == "mean" else np.median(values))


def format_p(v: Optional[float]) -> str:
    """A p-value as the tables and reasons print it."""
    return "–" if v is None else (f"{v:.2g}" if v < 0.001 else f"{v:.3f}")


def p_values(claim: Claim, xs: list[float], ys: Optional[list[float]]) -> tuple[float, float, float, dict]:
    """(p predicted direction, p opposite direction, p two-sided, detail) of the claim's test."""
    test = {"sign": _sign, "wilcoxon": _wilcoxon, "mann-whitney": _mann_whitney, "fisher": _fisher}.get(claim.test)
    if test is None:
        raise ValueError(claim.test)
    p, detail = test(claim, xs, ys)
    opposite = "less" if claim.direction == "greater" else "greater"
    return p[claim.direction], p[opposite], p["two-sided"], detail


def _sign(claim: Claim, xs: list[float], ys) -> tuple[dict, dict]:
    d = [x - claim.null for x in xs]
    pos, neg = sum(v > TIE for v in d), sum(v < -TIE for v in d)
    detail = {"above": pos, "below": neg, "tied": len(d) - pos - neg}
    if pos + neg == 0:
        return dict.fromkeys(_SIDES, 1.0), detail
    stats = _scipy_stats()
    return {alt: float(stats.binomtest(pos, pos + neg, 0.5, alternative=alt).pvalue) for alt in _SIDES}, detail


def _wilcoxon(claim: Claim, xs: list[float], ys) -> tuple[dict, dict]:
    d = [x - claim.null for x in xs]
    nonzero = [v for v in d if abs(v) > TIE]
    detail = {"above": sum(v > 0 for v in nonzero), "below": sum(v < 0 for v in nonzero),
              "tied": len(d) - len(nonzero)}
    if not nonzero:
        return dict.fromkeys(_SIDES, 1.0), detail
    stats = _scipy_stats()
    with warnings.catch_warnings():  # scipy's note that ties switch it to the normal approximation
        warnings.simplefilter("ignore")
        p = {alt: float(stats.wilcoxon(nonzero, zero_method="wilcox", alternative=alt).pvalue) for alt in _SIDES}
    return p, detail


def _mann_whitney(claim: Claim, xs: list[float], ys: list[float]) -> tuple[dict, dict]:
    a = [x - claim.null for x in xs]
    stats = _scipy_stats()
    return {alt: float(stats.mannwhitneyu(a, ys, alternative=alt).pvalue) for alt in _SIDES}, {}


def _fisher(claim: Claim, xs: list[float], ys: list[float]) -> tuple[dict, dict]:
    sa, sb = int(sum(xs)), int(sum(ys))
    table = [[sa, len(xs) - sa], [sb, len(ys) - sb]]
    stats = _scipy_stats()
    return {alt: float(stats.fisher_exact(table, alternative=alt).pvalue) for alt in _SIDES}, {"table": table}


def _resampled(clusters: list[list[float]]) -> tuple[list[list[float]], str]:
    """What the bootstrap resamples: the clusters (configurations), or the units where there is one cluster."""
    if len(clusters) >= 2:
        return clusters, "configurations"
    return [[v] for c in clusters for v in c], "units (one configuration)"


def bootstrap_ci(claim: Claim, clusters_a: list[list[float]], clusters_b: Optional[list[list[float]]],
                 level: float, resamples: int, seed: int) -> tuple[Optional[tuple], str]:
    """The (level) percentile bootstrap interval of the effect, resampling whole clusters (configurations) within
    each arm (``scipy.stats.bootstrap``); where an arm has a single cluster its units are resampled instead."""
    ca, how = _resampled(clusters_a)
    arms = [ca]
    if clusters_b is not None:
        cb, how_b = _resampled(clusters_b)
        arms.append(cb)
        how = how if how == how_b else f"{how} / {how_b}"
    if any(sum(len(c) for c in arm) < 2 for arm in arms):
        return None, how
    rng = np.random.default_rng([seed, zlib.crc32(claim.id.encode())])
    statistic = _effect_statistic(arms, claim.effect == "mean")
    data = tuple(np.arange(len(arm)) for arm in arms)
    stats = _scipy_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = dict(n_resamples=resamples, confidence_level=level, method="percentile", vectorized=True)
        try:
            res = stats.bootstrap(data, statistic, rng=rng, **kw)
        except TypeError:  # scipy < 1.15 names it random_state
            res = stats.bootstrap(data, statistic, random_state=rng, **kw)
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None, how
    if claim.test == "fisher":
        lo, hi = 100.0 * lo, 100.0 * hi
    return (lo, hi), how


def _effect_statistic(arms: list, use_mean: bool):
    """The vectorised statistic ``scipy.stats.bootstrap`` resamples: the effect (arm a's mean or median, minus arm
    b's) of the clusters whose indices it is given."""
    sums = [np.array([sum(c) for c in arm], dtype=float) for arm in arms]
    counts = [np.array([len(c) for c in arm], dtype=float) for arm in arms]

    def loc(arm_i: int, idx):
        idx = np.asarray(idx, dtype=int)
        if use_mean:
            return sums[arm_i][idx].sum(axis=-1) / counts[arm_i][idx].sum(axis=-1)
        flat = lambda row: np.median(np.concatenate([np.asarray(arms[arm_i][j], dtype=float) for j in row]))
        return np.array([flat(row) for row in idx.reshape(-1, idx.shape[-1])]).reshape(idx.shape[:-1])

    def statistic(*idx, axis=-1):
        value = loc(0, idx[0])
        if len(idx) > 1:
            value = value - loc(1, idx[1])
        return value

    return statistic


# ---- version 2: one frame (docs/replication.md, "The statistical frame") ------------------------------------------
# The unit of analysis is the configuration (the claim's cluster keys): a configuration's value is the mean of its
# runs (or of its paired differences); every test, interval and p-value below is computed over those values, and
# every p is two-sided. A verdict is read from the Holm-adjusted p (:func:`holm`) and the side of the estimate.


def _t_summary(estimate: float, se: float, df: float, null: float, level: float) -> dict:
    """Student-t inference for ``estimate`` with standard error ``se`` on ``df`` degrees of freedom: the two-sided
    p of H0 estimate = null, the one-sided ones, and the two-sided ``level`` interval. A zero ``se`` (every value
    equal) is a point mass: p = 0 off the null, 1 on it, and a zero-width interval."""
    if se == 0.0:
        off = abs(estimate - null) > TIE
        side = {"greater": float(not (off and estimate > null)), "less": float(not (off and estimate < null))}
        return {"p": 0.0 if off else 1.0, **side, "ci": (estimate, estimate), "df": df, "t": None}
    stats = _scipy_stats()
    t = (estimate - null) / se
    half = float(stats.t.ppf(0.5 + level / 2.0, df)) * se
    return {"p": float(2.0 * stats.t.sf(abs(t), df)), "greater": float(stats.t.sf(t, df)),
            "less": float(stats.t.cdf(t, df)), "ci": (estimate - half, estimate + half), "df": df, "t": float(t)}


def t_over_configurations(values, null: float, level: float) -> Optional[dict]:
    """One-sample t over the configurations' values against ``null`` (a paired claim's values are the
    configurations' mean differences): estimate, se = s/√k, df = k − 1; None for fewer than 2 configurations."""
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return None
    est = float(v.mean())
    return {"estimate": est, **_t_summary(est, float(v.std(ddof=1) / math.sqrt(v.size)), v.size - 1.0, null, level)}


def welch_over_configurations(xs, ys, null: float, level: float) -> Optional[dict]:
    """Welch's t for the difference of two arms' mean configuration values against ``null``, with the
    Welch–Satterthwaite degrees of freedom; None when an arm has fewer than 2 configurations."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if x.size < 2 or y.size < 2:
        return None
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx ** 2 / (x.size - 1) + vy ** 2 / (y.size - 1)) if se > 0 else x.size + y.size - 2.0
    est = float(x.mean() - y.mean())
    return {"estimate": est, **_t_summary(est, se, float(df), null, level)}


def holm(ps: list) -> list:
    """Holm's step-down adjustment (Holm 1979) of the family ``ps`` (None counts as p = 1: a claim that could not
    be tested stays in the family it was registered in): adjusted p_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j))."""
    p = [1.0 if v is None else float(v) for v in ps]
    m, out, running = len(p), [0.0] * len(p), 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: p[j])):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def spearman_fisher(x, y, null: float, level: float) -> Optional[dict]:
    """Spearman's ρ of ``x`` and ``y`` (``scipy.stats.spearmanr``) with the Fisher-z test of H0 ρ = ``null`` and
    interval, standard error √((1 + ρ²/2)/(k − 3)) (Bonett & Wright 2000); None for fewer than 4 pairs."""
    if len(x) < 4:
        return None
    stats = _scipy_stats()
    rho = float(stats.spearmanr(x, y).statistic)
    if not math.isfinite(rho):
        return None
    r = min(max(rho, -0.999999), 0.999999)
    se = math.sqrt((1.0 + r * r / 2.0) / (len(x) - 3))
    z = (math.atanh(r) - math.atanh(null)) / se
    half = float(stats.norm.ppf(0.5 + level / 2.0)) * se
    return {"estimate": rho, "p": float(2.0 * stats.norm.sf(abs(z))), "greater": float(stats.norm.sf(z)),
            "less": float(stats.norm.cdf(z)), "ci": (math.tanh(math.atanh(r) - half), math.tanh(math.atanh(r) + half)),
            "z": z}


def counterexamples(groups: dict, floor: float, holds: str, alpha: float) -> dict:
    """A universal claim ("every configuration's value is ``holds`` the floor") against its configurations: each
    configuration's one-sided t-test (over its runs) that its mean lies on the other side of ``floor``,
    Bonferroni-adjusted over the k configurations; a configuration whose adjusted p < α is a counterexample (a
    configuration of one run: a counterexample when its value is beyond the floor, p = 0, else p = 1). The
    claim's p is the smallest adjusted p (1 with no testable configuration); each configuration's one-sided
    (1 − α/k) bound is reported."""
    k = len(groups)
    against = "greater" if holds == "below" else "less"
    rows, p_claim = [], 1.0
    for key, vals in groups.items():
        v = np.asarray(vals, dtype=float)
        if v.size < 2:  # one run: the floor is the whole noise allowance
            beyond = (v[0] > floor) if holds == "below" else (v[0] < floor)
            rows.append({"configuration": list(key), "n": 1, "mean": float(v[0]), "bound": float(v[0]),
                         "p": 0.0 if beyond else 1.0, "counterexample": bool(beyond)})
            p_claim = min(p_claim, 0.0 if beyond else 1.0)
            continue
        one = _t_summary(float(v.mean()), float(v.std(ddof=1) / math.sqrt(v.size)), v.size - 1.0, floor,
                         1.0 - 2.0 * alpha / k)
        p_adj = min(1.0, k * one[against])
        bound = one["ci"][0] if holds == "below" else one["ci"][1]
        rows.append({"configuration": list(key), "n": int(v.size), "mean": float(v.mean()), "bound": bound,
                     "p": p_adj, "counterexample": p_adj < alpha})
        p_claim = min(p_claim, p_adj)
    return {"p": p_claim, "configurations": rows, "k": k}
