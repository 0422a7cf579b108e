"""The verdict's uncertainty (issue 33): every share and median it decides on carries its n and an interval, and
the word follows from where that interval lies against the threshold (docs/analysis.md, "The verdict's rule").

References computed here independently of stability/analysis/intervals.py: the Wilson score interval from its
closed form (Wilson 1927), the median's interval by brute force over the order statistics with exact binomial
sums (math.comb)."""

import json
import math
import random

import pytest
from scipy.stats import norm

from stability.analysis.intervals import median_interval, share_interval
from stability.analysis.report import text_report
from stability.analysis.verdict import verdict
from tests.conftest import ROOT

Z = norm.ppf(0.95)  # each end a one-sided 95 % bound: the two-sided 90 % interval


def wilson_closed_form(k, n, z=Z):
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def fixed_point_block(k, n):
    return {"converged_fraction": k / n, "samples": n, "status": ["converged"] * k + ["stalled"] * (n - k),
            "distinct_fixed_points": k}


def jacobian_block(rhos):
    conv = sorted(r for r in rhos if r is not None)
    return {"spectral_radius": list(rhos), "spectral_radius_median": conv[len(conv) // 2] if len(conv) % 2 else
            0.5 * (conv[len(conv) // 2 - 1] + conv[len(conv) // 2])}


@pytest.mark.parametrize("k, want", [(29, "partly"), (28, "partly"), (32, "yes"), (10, "no"), (24, "no")])
def test_the_converged_share_carries_its_wilson_interval_and_the_word_it_implies(k, want):
    n = 32
    lo, hi = wilson_closed_form(k, n)
    ci = share_interval(k, n)
    assert (ci["lo"], ci["hi"]) == pytest.approx((lo, hi), abs=1e-12) and ci["n"] == n and ci["k"] == k
    # the word: YES when the interval is at or above 90 %, NO when wholly below, PARTLY when it straddles
    assert ("yes" if lo >= 0.9 else "no" if hi < 0.9 else "partly") == want
    fp = fixed_point_block(k, n)
    rhos = [0.5] * k + [1.3] * (n - k)  # every converged sample attracting: the ρ part is YES
    v = verdict({"fixed_point": fp, "jacobian": jacobian_block(rhos[:k] + [None] * (n - k))}, tol=1e-5)
    assert v.reachable == want
    assert v.intervals["converged_share"]["lo"] == pytest.approx(lo, abs=1e-12)
    assert f"converged {k} of {n}" in v.brief["reachable"] and f"{lo:.0%}, {hi:.0%}" in v.brief["reachable"]


def brute_force_median_interval(x, level_each_end=0.95):
    """The widest-coverage-free choice: the narrowest symmetric [x_(j), x_(n−j+1)] whose each tail P(B ≤ j − 1),
    B ~ Binomial(n, ½), is at most 5 %, by enumerating j."""
    x, n = sorted(x), len(x)
    best = None
    for j in range(1, (n + 1) // 2 + 1):
        tail = sum(math.comb(n, i) for i in range(j)) / 2 ** n
        if tail <= 1 - level_each_end:
            best = (x[j - 1], x[n - j], 1 - 2 * tail)
    return best


@pytest.mark.parametrize("n", [1, 4, 5, 6, 9, 17, 24, 32, 100])
def test_the_median_interval_is_the_order_statistic_interval_found_by_brute_force(n):
    rng = random.Random(n)
    x = [rng.lognormvariate(0, 1) for _ in range(n)] + [None, float("nan")]  # non-finite entries are left out
    ci, ref = median_interval(x), brute_force_median_interval(x[:n])
    if ref is None:  # too few values for any bounded interval at this level (n ≤ 4)
        assert n <= 4 and ci["lo"] is None and ci["hi"] is None
    else:
        assert (ci["lo"], ci["hi"], ci["coverage"]) == pytest.approx(ref, rel=1e-12)
        assert ci["coverage"] >= 0.9
    assert ci["n"] == n


def test_a_median_is_decided_by_where_its_interval_lies():
    fp = fixed_point_block(32, 32)
    tight = verdict({"fixed_point": fp, "jacobian": jacobian_block([0.5 + 0.001 * i for i in range(32)])},
                    tol=1e-5)
    assert tight.reachable == "yes" and tight.intervals["rho_J_median"]["hi"] < 1
    # median below 1 but the interval reaches past it: PARTLY
    wide = [0.5] * 12 + [0.95, 0.96, 0.97, 0.98, 0.99, 1.1, 1.2, 1.3] + [1.5] * 12
    v = verdict({"fixed_point": fp, "jacobian": jacobian_block(wide)}, tol=1e-5)
    assert v.numbers["rho_J_median"] < 1 and v.intervals["rho_J_median"]["hi"] >= 1 and v.reachable == "partly"
    # the median at or above 1: NO (the rule before intervals, kept)
    v = verdict({"fixed_point": fp, "jacobian": jacobian_block([1.2] * 32)}, tol=1e-5)
    assert v.reachable == "no"
    # the input gradient the same way, against 1e-3
    for grads, want in (([1.0] * 32, "yes"), ([1e-4] * 16 + [1.0] * 16, "partly"), ([1e-5] * 32, "no")):
        v = verdict({"fixed_point": fp, "input_dependence": {"frobenius": grads,
                                                             "frobenius_median": sorted(grads)[15] / 2
                                                             + sorted(grads)[16] / 2}}, tol=1e-5)
        assert v.input_dependent == want, grads


def test_the_geometry_verdict_says_samples_times_directions_and_its_interval():
    radii = [[0.2 + 0.01 * i for i in range(16)] for _ in range(4)]
    geo = {"directions": 8, "samples": [0, 2, 3, 5], "attracting_at_theta": [True] * 4, "radii": radii,
           "groups": [], "summary": {"median_radius": 0.275, "log_iqr": 0.2, "log_range": 0.5, "balance": 0.6,
                                     "unstable_t0": 0.0, "attracting_samples": 4, "samples": 4}}
    v = verdict({"fixed_point": fixed_point_block(32, 32), "geometry": geo}, tol=1e-5)
    ref = brute_force_median_interval([r for rs in radii for r in rs])
    assert (v.intervals["geometry_median_radius"]["lo"], v.intervals["geometry_median_radius"]["hi"]) == ref[:2]
    assert v.geometry == "yes" and "4 samples × 8 directions × ±" in v.brief["geometry"]


def test_no_line_of_the_demos_printed_report_exceeds_100_columns():
    from stability.demo import SAMPLE_RECORD, readme_sample

    record = json.loads((ROOT / SAMPLE_RECORD).read_text())
    analysis = record["analysis"]
    for s in analysis["splits"]:  # the verdict as this code decides it, from the stored blocks
        analysis[s]["verdict"] = verdict(analysis[s], tol=analysis["options"]["tol"]).to_dict()
    for text in (text_report(analysis), readme_sample(record)):
        assert max(map(len, text.splitlines())) <= 100, max(text.splitlines(), key=len)
