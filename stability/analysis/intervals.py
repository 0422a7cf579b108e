"""The verdict's uncertainty: an interval for every share and median it decides on, and the rule that reads it.

Each end of an interval is a one-sided 95 % confidence bound (:data:`CONFIDENCE`), so the interval is a two-sided
90 % one (:data:`LEVEL`). The verdict asks one-sided questions ("is the share at least 90 %?", "is the median
ρ(J*) below 1?"), and two one-sided tests at 5 % each (as in equivalence testing) accept exactly where one end of
the 90 % interval clears the threshold. A two-sided 95 % interval would make YES unreachable at the demo's n: with
32 of 32 converged its lower end is 32/(32 + 1.96²) = 0.893 < 0.9.

* a share k of n: the Wilson score interval (Wilson 1927), computed by
  ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``;
* a median of n values: the distribution-free interval [x_(j), x_(n−j+1)] from order statistics (Conover,
  *Practical Nonparametric Statistics*, §3.2), j the largest with P(B ≤ j − 1) ≤ 5 %, B ~ Binomial(n, ½); its
  exact coverage 1 − 2 P(B ≤ j − 1) ≥ 90 % is kept beside it. Below n = 5 no such j exists (the range of 4 values
  covers the median with probability 7/8 only): the interval is unbounded, written null.

:func:`side` places an interval against a threshold; docs/analysis.md ("The verdict's rule") states how the
verdict reads it.
"""

from __future__ import annotations

from typing import Iterable, Optional

from stability.stats import finite_values, median

__all__ = ["CONFIDENCE", "LEVEL", "share_interval", "median_interval", "side", "format_interval"]

#: the confidence of each end of an interval (a one-sided bound)
CONFIDENCE = 0.95
#: the two-sided level of the interval [lo, hi]: 1 − 2 (1 − CONFIDENCE)
LEVEL = round(2 * CONFIDENCE - 1, 12)


def share_interval(k: int, n: int, *, confidence: float = CONFIDENCE) -> Optional[dict]:
    """The Wilson score interval of the share k/n, each end a one-sided ``confidence`` bound (None for n = 0):
    {k, n, share, lo, hi, level, method}."""
    from scipy.stats import binomtest

    k, n = int(k), int(n)
    if n <= 0:
        return None
    level = round(2 * confidence - 1, 12)
    ci = binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
    return {"k": k, "n": n, "share": k / n, "lo": float(ci.low), "hi": float(ci.high), "level": level,
            "method": "Wilson score"}


def median_interval(values: Iterable, *, confidence: float = CONFIDENCE) -> Optional[dict]:
    """The distribution-free interval of the median of the finite ``values`` from order statistics:
    [x_(j), x_(n−j+1)], j the largest with P(B ≤ j − 1) ≤ 1 − ``confidence``, B ~ Binomial(n, ½). {n, median, lo,
    hi, level (the nominal two-sided level), coverage (its exact one), method}; lo, hi None when n is too
    small for any j (then no finite interval has the coverage); None for no values."""
    from scipy.stats import binom

    x = sorted(finite_values(values))
    n = len(x)
    if not n:
        return None
    alpha = 1 - confidence
    j = 0
    while j + 1 <= (n + 1) // 2 and binom.cdf(j, n, 0.5) <= alpha:  # x_(j+1) is still a one-sided bound
        j += 1
    out = {"n": n, "median": median(x), "lo": None, "hi": None, "level": round(2 * confidence - 1, 12),
           "coverage": None, "method": "order statistics (binomial)"}
    if j:
        out.update(lo=x[j - 1], hi=x[n - j], coverage=float(1 - 2 * binom.cdf(j - 1, n, 0.5)))
    return out


def side(ci: Optional[dict], threshold: float, *, good: str) -> str:
    """Where the interval lies against ``threshold``: "good" (wholly on the good side), "bad" (wholly on the other)
    or "straddles" (an unbounded end straddles). ``good``: "at_or_above" (good is lo ≥ threshold) or "below"
    (good is hi < threshold)."""
    lo, hi = (None, None) if ci is None else (ci.get("lo"), ci.get("hi"))
    if good == "at_or_above":
        return "good" if lo is not None and lo >= threshold else (
            "bad" if hi is not None and hi < threshold else "straddles")
    if good == "below":
        return "good" if hi is not None and hi < threshold else (
            "bad" if lo is not None and lo >= threshold else "straddles")
    raise ValueError(f"good: {good!r}")


def format_interval(ci: Optional[dict], spec: str = ".3g", *, percent: bool = False) -> str:
    """"[lo, hi]" (percent: "[58%, 87%]"), "[unbounded: n = 4 < 5]" where n is too small for the level."""
    if ci is None:
        return "[—]"
    if ci.get("lo") is None:
        return f"[unbounded: n = {ci['n']} too few]"
    if percent:
        return f"[{ci['lo']:.0%}, {ci['hi']:.0%}]"
    return f"[{ci['lo']:{spec}}, {ci['hi']:{spec}}]"
