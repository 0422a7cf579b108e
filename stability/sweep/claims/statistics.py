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
