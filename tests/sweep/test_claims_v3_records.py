"""The third edition's verdicts recomputed independently: `experiments/claims-v2.toml` as committed (fresh seeds
5–8) judged by the frame on the committed `experiments/results/replication-v3` records, against scipy.stats run on
the raw record JSON here (issue 38: "a test recomputes at least six verdicts independently"). The unit is the
configuration (docs/replication.md, "Third edition"); Holm is recomputed from its definition. No training."""
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from stability.sweep import claims as C
from tests.sweep.test_claims_v2 import _acc, _key, _paired_config_means

ROOT = Path(__file__).resolve().parents[2]
V2 = ROOT / "experiments" / "claims-v2.toml"
RESULTS = ROOT / "experiments" / "results" / "replication-v3"
FRESH = (5, 6, 7, 8)
RATES = (1e-3, 2.5e-3, 5e-3)


def _raw() -> list:
    return [json.loads(f.read_text()) for f in sorted((RESULTS / "records").glob("*.json"))]


def _holm(ps: list) -> list:
    """Holm (1979) step-down adjusted p, a claim without a p counted as 1."""
    p = np.array([1.0 if x is None else x for x in ps])
    order = np.argsort(p, kind="stable")
    adj, running = np.empty_like(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adj[i] = running
    return list(adj)


def _lr_pairs(raw) -> dict:
    """rho-wx-grows-with-lr, recall-degrades-as-rho-wx-grows-{hard,val}: 5e-3 − 1e-3 per (norm, recall, seed)."""
    at = lambda lr: (lambda r: (_key(r)[0], _key(r)[1], _key(r)[3]) if _key(r)[0] in ("pre", "peri") and _key(r)[1]
                     in ("internal", "external") and _key(r)[2] == lr else None)
    rho = lambda r: (r.get("stability") or {}).get("rho_Wx")
    out = {"rho-wx-grows-with-lr": (rho, 0.0)}
    out["recall-degrades-as-rho-wx-grows-hard"] = (lambda r: _acc(r, "hard"), 0.0)
    out["recall-degrades-as-rho-wx-grows-val"] = (lambda r: _acc(r, "val"), 0.0)
    return {cid: stats.ttest_1samp(_paired_config_means(raw, v, at(5e-3), at(1e-3), lambda u: u[:2]), null)
            for cid, (v, null) in out.items()}


def _competitive(raw) -> dict:
    """internal-competitive-outer-norm-hard: internal − external per (norm, lr, seed), post/gru, against −10."""
    rec_of = lambda recall: (lambda r: (_key(r)[0], _key(r)[2], _key(r)[3]) if _key(r)[0] in ("post", "gru")
                             and _key(r)[1] == recall and _key(r)[2] in RATES else None)
    return {"internal-competitive-outer-norm-hard": stats.ttest_1samp(_paired_config_means(
        raw, lambda r: _acc(r, "hard"), rec_of("internal"), rec_of("external"), lambda u: u[:2]), -10.0)}


def _extrapolates(raw) -> dict:
    """outer-norm-extrapolates-internal: per (norm, lr) the share of runs >= 50 % hard; Welch post/gru vs pre/peri."""
    share = {}
    for r in raw:
        if _key(r)[1] == "internal" and _key(r)[2] in RATES:
            share.setdefault((_key(r)[0], _key(r)[2]), []).append(100.0 * (_acc(r, "hard") >= 50.0))
    arm = lambda norms: [np.mean(v) for k, v in share.items() if k[0] in norms]
    return {"outer-norm-extrapolates-internal": stats.ttest_ind(arm(("post", "gru")), arm(("pre", "peri")),
                                                                equal_var=False)}


def _degradation(raw) -> dict:
    """autonomous-val-to-hard-degradation: runs with val >= 50 %, per (norm, lr) the mean val − hard, against 20."""
    cfg = {}
    for r in raw:
        if _key(r)[1] == "none" and _key(r)[2] in RATES and _acc(r, "val") >= 50.0 and r["final"]:
            cfg.setdefault((_key(r)[0], _key(r)[2]), []).append(_acc(r, "val") - _acc(r, "hard"))
    return {"autonomous-val-to-hard-degradation": stats.ttest_1samp([np.mean(v) for v in cfg.values()], 20.0)}


def _geometry(raw) -> tuple:
    """geometry-outer-norm-broadens: attracting runs only (every one of >= 8 val inputs converged), keyed
    (recall, lr, seed, norm): the outer-norm side (post/gru) and the other (pre/peri)."""
    def side(norms):
        def of(r):
            n, rc, lr, s = _key(r)
            a = r["analysis"]["val"] if r.get("analysis") else None
            ok = a and a["converged_fraction"] >= 1.0 and a["samples"] >= 8 and rc in ("internal", "external")
            return (rc, lr, s, n) if ok and n in norms and lr in RATES else None
        return of
    val = lambda r: r["analysis"]["val"]["geometry_median_radius"] if r.get("analysis") else None
    a = {k: val(r) for r in raw if (k := side(("post", "gru"))(r))}
    b = {k: val(r) for r in raw if (k := side(("pre", "peri"))(r))}
    return a, b


def _fixed_depth(raw) -> dict:
    """recall-beats-fixed-depth-hard: per (norm, lr), recall's mean (internal and external, seeds 5–8) − the
    paper's baseline's (15 blocks)."""
    by = {}
    for r in raw:
        n, rc, lr, _ = _key(r)
        if rc == "fixed" and r["config"]["model"]["depth"] != 15:
            continue
        by.setdefault(("fixed" if rc == "fixed" else "recall" if rc != "none" else "none", n, lr), []).append(
            _acc(r, "hard"))
    diffs = [np.mean(by[("recall", n, lr)]) - np.mean(by[("fixed", n, lr)]) for (g, n, lr) in by if g == "fixed"]
    return {"recall-beats-fixed-depth-hard": stats.ttest_1samp(diffs, 0.0)}


def _headline(raw) -> float:
    """Spearman over looped configurations of the prediction score (mean signed ranks of converged share and
    −ρ(J*) over every analysed hard input) with mean hard accuracy."""
    h = {}
    for r in raw:
        if _key(r)[1] != "fixed" and _key(r)[2] in RATES:
            a = r["analysis"]["hard"]
            h.setdefault(_key(r)[:3], []).append((a["converged_fraction"], a["rho_J_median_all"], _acc(r, "hard")))
    m = np.array([np.mean(v, axis=0) for _, v in sorted(h.items())])
    score = (stats.rankdata(m[:, 0]) + stats.rankdata(-m[:, 1])) / 2
    return stats.spearmanr(score, m[:, 2]).statistic, len(m)


def _verdict(holm_p: float, effect: float, predicted: str, null: float) -> str:
    side = (effect > null) if predicted == "greater" else (effect < null)
    return "inconclusive" if holm_p >= 0.05 else ("supported" if side else "contradicted")


@pytest.fixture(scope="module")
def judged():
    spec, _ = C.load_claims(V2)
    return spec, {r.id: r for r in C.evaluate_v2(spec, C.read_results(RESULTS))}


def test_the_third_edition_has_every_cell_of_its_grid_on_fresh_seeds_with_the_data_seed_tied():
    raw = _raw()
    assert len(raw) == 184
    assert {_key(r)[3] for r in raw} <= set(FRESH)
    assert all(r["config"]["task"]["seed"] == r["config"]["train"]["seed"] for r in raw)


def test_seven_third_edition_p_values_and_intervals_equal_scipys_from_the_raw_records(judged):
    spec, got = judged
    raw = _raw()
    expect = {**_lr_pairs(raw), **_competitive(raw), **_extrapolates(raw), **_degradation(raw), **_fixed_depth(raw)}
    assert len(expect) == 7
    for cid, ref in expect.items():
        if np.isnan(ref.pvalue):  # every configuration the same value: no variance, scipy says nan
            assert ref.statistic != ref.statistic and got[cid].p == 1.0 and got[cid].ci[0] == got[cid].ci[1], cid
            continue
        assert got[cid].p == pytest.approx(ref.pvalue, rel=1e-9), cid
        ci = ref.confidence_interval(0.95)
        assert got[cid].ci == pytest.approx((ci.low, ci.high), rel=1e-9), cid
    assert sum(not np.isnan(ref.pvalue) for ref in expect.values()) >= 6


def test_the_geometry_claim_reads_attracting_runs_only_and_pairs_them_as_scipy_does(judged):
    _, got = judged
    a, b = _geometry(_raw())
    cfg = {}
    # the claim's unit is (recall, lr, seed): each side's value is the mean over its attracting norms in the unit
    mean_side = lambda d: {k: np.mean([v for kk, v in d.items() if kk[:3] == k]) for k in {kk[:3] for kk in d}}
    ma, mb = mean_side(a), mean_side(b)
    for u in set(ma) & set(mb):
        cfg.setdefault(u[:2], []).append(ma[u] - mb[u])
    diffs = [np.mean(v) for _, v in sorted(cfg.items())]
    r = got["geometry-outer-norm-broadens"]
    assert r.n_configurations == len(diffs)
    if len(diffs) >= 2:
        ref = stats.ttest_1samp(diffs, 0.0)
        assert r.p == pytest.approx(ref.pvalue, rel=1e-9)
        assert r.effect == pytest.approx(np.mean(diffs), rel=1e-9)


def test_the_headline_verdict_is_the_spearman_of_the_prediction_score_recomputed_from_the_raw_records(judged):
    _, got = judged
    rho_s, n = _headline(_raw())
    r = got["headline-performance-tracks-predictions"]
    assert r.effect == pytest.approx(rho_s, rel=1e-12) and r.n_configurations == n
    assert r.verdict in ("supported", "contradicted", "inconclusive")


def test_holm_over_the_family_and_each_tested_verdict_follow_from_the_recomputed_p(judged):
    spec, got = judged
    adj = _holm([got[c.id].p for c in spec.claim])
    for c, a in zip(spec.claim, adj):
        r = got[c.id]
        if r.p is None:
            continue
        assert r.p_holm == pytest.approx(a, rel=1e-12), c.id
        if c.test == "t" and r.n_configurations >= (c.min_n or 0):
            null = c.null if c.null is not None else 0.0
            assert r.verdict == _verdict(a, r.effect, c.direction, null), c.id
