"""Claims version 2 (issue 38): the one statistical frame (configurations as units, t-intervals, two-sided p,
Holm across the file), the literal rule of universal claims, the rank-correlation rule, confirmatory seeds, the
registered experiments/claims-v2.toml and the third edition's grid. Every number is checked against scipy.stats
computed here, on synthetic records whose answer is known. No training."""

import json
from itertools import product

import numpy as np
import pytest
from scipy import stats

from stability.errors import ConfigError
from stability.sweep import claims as C
from stability.sweep import grid as G
from stability.sweep.claims.statistics import counterexamples, t_over_configurations, welch_over_configurations
from tests.conftest import ROOT, run_cli
from tests.sweep.test_claims import SPLIT, rec

V2 = ROOT / "experiments" / "claims-v2.toml"
GRID = ROOT / "experiments" / "replication-v3.toml"
LRS = (1e-3, 2.5e-3, 5e-3)


def spec2(*claims, alpha=0.05) -> C.ClaimsFile:
    data = {"format": "stability-claims", "version": 2, "title": "t", "task": "prefix-sums", "alpha": alpha,
            "untrained_loss_fraction": 0.5, "bootstrap": {"resamples": 999, "seed": 1},
            "claim": [{"paper": "words", "where": "here", **c} for c in claims]}
    return C.parse_claims(data, "test")


def with_analysis(r: dict, split: str, **fields) -> dict:
    r["analysis"].setdefault(split, dict(SPLIT)).update(fields)
    return r


ZERO = dict(id="zero", design="one-sample", test="universal", holds="below", floor=1.0, metric="hard.accuracy",
            direction="less", min_n=2, unit=["model.norm", "train.lr", "train.seed"],
            a={"label": "autonomous", "recall": ["none"], "norm": ["pre", "post"], "lr": [1e-3]})


# ---- the statistics against scipy.stats -----------------------------------------------------------------------------
def test_t_over_configurations_equals_scipy_one_sample_t_and_its_interval():
    v = [3.0, -1.0, 7.5, 2.0]
    got = t_over_configurations(v, 0.5, 0.95)
    ref = stats.ttest_1samp(v, 0.5)
    ci = ref.confidence_interval(0.95)
    assert got["p"] == pytest.approx(ref.pvalue, rel=1e-12)
    assert got["ci"] == pytest.approx((ci.low + 0.0, ci.high + 0.0), rel=1e-12)  # scipy's CI is of the mean
    assert got["greater"] == pytest.approx(stats.ttest_1samp(v, 0.5, alternative="greater").pvalue, rel=1e-12)


def test_welch_over_configurations_equals_scipy_welch_and_its_interval():
    x, y = [10.0, 30.0, 25.0, 40.0], [0.0, 5.0, 12.0]
    got = welch_over_configurations(x, y, 0.0, 0.95)
    ref = stats.ttest_ind(x, y, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert got["p"] == pytest.approx(ref.pvalue, rel=1e-12)
    assert got["ci"] == pytest.approx((ci.low, ci.high), rel=1e-12)
    assert got["estimate"] == pytest.approx(np.mean(x) - np.mean(y))


def test_holm_adjusted_p_below_alpha_exactly_when_holms_step_down_rejects():
    rng = np.random.default_rng(0)
    for _ in range(50):
        ps = list(rng.uniform(0, 0.2, size=7) ** 2)
        adj = C.holm(ps)
        order = np.argsort(ps)
        for alpha in (0.001, 0.01, 0.05, 0.1):
            rejected, go_on = set(), True  # the step-down procedure (Holm 1979), written out
            for rank, i in enumerate(order):
                go_on = go_on and ps[i] <= alpha / (len(ps) - rank)
                if go_on:
                    rejected.add(int(i))
            assert {i for i, a in enumerate(adj) if a <= alpha} == rejected
        assert all(a >= p for a, p in zip(adj, ps)) and max(adj) <= 1.0


def test_holm_counts_an_untested_claim_as_p_one_in_a_family_of_m():
    assert C.holm([0.01, None, 0.02]) == pytest.approx([0.03, 1.0, 0.04])


def test_a_counterexample_configurations_p_is_scipys_one_sided_t_times_the_number_of_configurations():
    groups = {("a",): [3.0, 4.0, 5.0, 3.5], ("b",): [0.0, 0.5, 0.0, 0.2], ("c",): [0.0, 0.0, 0.0, 0.0]}
    res = counterexamples(groups, 1.0, "below", 0.05)
    ref = stats.ttest_1samp(groups[("a",)], 1.0, alternative="greater").pvalue
    row = res["configurations"][0]
    assert row["p"] == pytest.approx(min(1.0, 3 * ref), rel=1e-12)
    assert row["counterexample"] == (3 * ref < 0.05)
    assert res["p"] == pytest.approx(row["p"])
    assert res["configurations"][2]["p"] == 1.0  # every run exactly 0: no evidence above the floor


# ---- universal claims, literally ------------------------------------------------------------------------------
def test_a_counterexample_configuration_contradicts_a_universal_claim():
    recs = [rec("pre", "none", 1e-3, s, hard=0.0) for s in range(4)]
    recs += [rec("post", "none", 1e-3, s, hard=h) for s, h in enumerate([10.0, 12.0, 11.0, 13.0])]
    r = C.evaluate_v2(spec2(ZERO), recs)[0]
    p_ref = 2 * stats.ttest_1samp([10.0, 12.0, 11.0, 13.0], 1.0, alternative="greater").pvalue
    assert r.p == pytest.approx(p_ref, rel=1e-12) and r.p_holm == pytest.approx(p_ref, rel=1e-12)
    assert r.verdict == "contradicted" and "post/0.001" in r.reason
    assert r.effect == pytest.approx(11.5)


def test_no_configuration_beyond_the_floor_supports_a_universal_claim():
    recs = [rec(n, "none", 1e-3, s, hard=h) for n in ("pre", "post") for s, h in enumerate([0.0, 0.5, 0.0, 0.0])]
    r = C.evaluate_v2(spec2(ZERO), recs)[0]
    assert r.verdict == "supported" and r.p == 1.0
    assert "no counterexample among 2 configurations" in r.reason


def test_a_mean_beyond_the_floor_within_noise_leaves_a_universal_claim_inconclusive():
    recs = [rec("pre", "none", 1e-3, s, hard=0.0) for s in range(4)]
    recs += [rec("post", "none", 1e-3, s, hard=h) for s, h in enumerate([0.0, 0.0, 0.0, 8.0])]
    r = C.evaluate_v2(spec2(ZERO), recs)[0]
    assert r.verdict == "inconclusive" and r.p == pytest.approx(
        min(1.0, 2 * stats.ttest_1samp([0.0, 0.0, 0.0, 8.0], 1.0, alternative="greater").pvalue))


def test_a_one_run_configuration_beyond_the_floor_is_a_counterexample():
    claim = dict(ZERO, cluster=["model.norm", "train.lr", "train.seed"], floor=5.0)
    recs = [rec("pre", "none", 1e-3, 0, hard=0.0), rec("pre", "none", 1e-3, 1, hard=6.0)]
    r = C.evaluate_v2(spec2(claim), recs)[0]
    assert r.verdict == "contradicted" and r.p == 0.0


def test_a_counterexample_contradicts_below_min_n_while_its_absence_then_supports_nothing():
    claim = dict(ZERO, cluster=["model.norm", "train.lr", "train.seed"], floor=5.0, min_n=3)
    hit = C.evaluate_v2(spec2(claim), [rec("pre", "none", 1e-3, 0, hard=6.0)])[0]
    assert hit.verdict == "contradicted" and hit.n_configurations == 1
    none = C.evaluate_v2(spec2(claim), [rec("pre", "none", 1e-3, 0, hard=1.0)])[0]
    assert none.verdict == "inconclusive" and "n too small (1 configurations < 3" in none.reason


# ---- the effect rule: configurations as units, Holm across the file -------------------------------------------
def paired_records(diffs_by_cfg: dict) -> list:
    out = []
    for (norm, lr), diffs in diffs_by_cfg.items():
        for s, d in enumerate(diffs):
            out += [rec(norm, "external", lr, s, hard=20.0 + d), rec(norm, "internal", lr, s, hard=20.0)]
    return out


PAIRED = dict(design="paired", test="t", metric="hard.accuracy", direction="greater", min_n=3,
              a={"label": "ext", "recall": ["external"], "norm": ["pre", "peri"], "lr": list(LRS)},
              b={"label": "int", "recall": ["internal"], "norm": ["pre", "peri"], "lr": list(LRS)},
              unit=["model.norm", "train.lr", "train.seed"])


def test_a_paired_claims_p_is_scipys_t_over_the_configurations_mean_differences_and_holm_scales_it():
    cfg = {("pre", 1e-3): [10, 12, 8], ("pre", 2.5e-3): [5, 7, 6], ("peri", 1e-3): [20, 18, 25],
           ("peri", 2.5e-3): [3, 1, 2]}
    recs = paired_records(cfg)
    means = [np.mean(v) for _, v in sorted(cfg.items(), key=lambda kv: repr(kv[0]))]
    ref = stats.ttest_1samp(means, 0.0)
    other = dict(PAIRED, id="other", metric="val.accuracy")  # every val accuracy 0: no p, counts as 1
    r, r2 = C.evaluate_v2(spec2(dict(PAIRED, id="c"), other), recs)
    assert r.n_configurations == 4 and r.n_runs == 24
    assert r.p == pytest.approx(ref.pvalue, rel=1e-12)
    assert r.p_holm == pytest.approx(min(1.0, 2 * ref.pvalue), rel=1e-12)
    ci = ref.confidence_interval(0.95)
    assert r.ci == pytest.approx((ci.low, ci.high), rel=1e-12)
    assert r.verdict == ("supported" if 2 * ref.pvalue < 0.05 else "inconclusive")
    assert r2.p is None or r2.p == 1.0


def test_an_effect_on_the_wrong_side_with_a_small_holm_p_is_contradicted_and_shows_that_p():
    cfg = {("pre", 1e-3): [-10, -12, -11], ("pre", 2.5e-3): [-9, -10, -8], ("peri", 1e-3): [-11, -10, -12]}
    r = C.evaluate_v2(spec2(dict(PAIRED, id="c")), paired_records(cfg))[0]
    means = [np.mean(v) for v in cfg.values()]
    assert r.verdict == "contradicted"
    assert r.p == pytest.approx(stats.ttest_1samp(means, 0.0).pvalue, rel=1e-12) and r.p < 0.05


def test_seeds_restrict_a_claim_to_the_fresh_seeds():
    cfg = {("pre", 1e-3): [10, 12, 8, -50], ("pre", 2.5e-3): [5, 7, 6, -50], ("peri", 1e-3): [20, 18, 25, -50]}
    recs = paired_records(cfg)  # seeds 0, 1, 2 and 3; seed 3 reverses the effect
    fresh = C.evaluate_v2(spec2(dict(PAIRED, id="c", seeds=[0, 1, 2], confirmatory=True)), recs)[0]
    means = [np.mean(v[:3]) for v in cfg.values()]
    assert fresh.p == pytest.approx(stats.ttest_1samp(means, 0.0).pvalue, rel=1e-12)
    assert fresh.n_runs == 18


def test_an_unpaired_success_claim_is_welch_over_the_configurations_shares():
    claim = dict(id="c", design="unpaired", test="t", success={"metric": "hard.accuracy", "at_least": 50.0},
                 direction="greater", min_n=2, unit=["model.norm", "train.lr", "train.seed"],
                 a={"label": "outer", "recall": ["internal"], "norm": ["post"], "lr": list(LRS)},
                 b={"label": "no outer", "recall": ["internal"], "norm": ["pre"], "lr": list(LRS)})
    hard_a = {1e-3: [60, 70, 0, 80], 2.5e-3: [60, 0, 0, 90], 5e-3: [55, 65, 75, 85]}
    hard_b = {1e-3: [0, 0, 60, 0], 2.5e-3: [0, 0, 0, 0], 5e-3: [0, 70, 0, 0]}
    recs = [rec("post", "internal", lr, s, hard=h) for lr, v in hard_a.items() for s, h in enumerate(v)]
    recs += [rec("pre", "internal", lr, s, hard=h) for lr, v in hard_b.items() for s, h in enumerate(v)]
    r = C.evaluate_v2(spec2(claim), recs)[0]
    share = lambda d: [100.0 * np.mean(np.array(v) >= 50) for _, v in sorted(d.items())]
    ref = stats.ttest_ind(share(hard_a), share(hard_b), equal_var=False)
    assert r.effect == pytest.approx(np.mean(share(hard_a)) - np.mean(share(hard_b)))
    assert r.p == pytest.approx(ref.pvalue, rel=1e-12)


# ---- the headline: a rank correlation across configurations -------------------------------------------------------
def headline_records(sign: int) -> list:
    out = []
    for i, (norm, lr) in enumerate(product(("pre", "peri", "post", "gru"), LRS)):
        for s in range(2):
            r = rec(norm, "external", lr, s, hard=5.0 * i + s)
            out.append(with_analysis(r, "hard", converged_fraction=(i if sign > 0 else 11 - i) / 11.0,
                                     rho_J_median_all=1.0 - i / 20.0 if sign > 0 else 0.5 + i / 20.0))
    return out


HEADLINE = dict(id="h", design="one-sample", test="spearman", metric="hard.accuracy", direction="greater",
                null=0.1, min_n=10, unit=["model.norm", "model.recall", "train.lr", "train.seed"],
                predictors=[{"metric": "hard.analysis.converged_fraction", "sign": 1},
                            {"metric": "hard.analysis.rho_J_median_all", "sign": -1}],
                a={"label": "looped", "recall": ["external"], "norm": ["pre", "peri", "post", "gru"], "lr": list(LRS)})


@pytest.mark.parametrize("sign, verdict", [(1, "supported"), (-1, "contradicted")])
def test_the_headline_is_a_spearman_correlation_of_the_prediction_score_with_hard_accuracy(sign, verdict):
    recs = headline_records(sign)
    r = C.evaluate_v2(spec2(HEADLINE), recs)[0]
    assert r.n_configurations == 12 and r.verdict == verdict
    score = np.mean([stats.rankdata([sign * i for i in range(12)]),
                     stats.rankdata([-(1.0 - i / 20.0 if sign > 0 else 0.5 + i / 20.0) for i in range(12)])], axis=0)
    target = [5.0 * i + 0.5 for i in range(12)]
    rho = stats.spearmanr(score, target).statistic
    assert r.effect == pytest.approx(rho)
    rc = min(max(rho, -0.999999), 0.999999)
    z = (np.arctanh(rc) - np.arctanh(0.1)) / np.sqrt((1 + rc * rc / 2) / 9)
    assert r.p == pytest.approx(2 * stats.norm.sf(abs(z)), rel=1e-9)


# ---- the files ------------------------------------------------------------------------------------------------
def test_claims_v2_loads_as_version_2_and_every_claim_is_judged_on_fresh_seeds_only():
    spec, sha = C.load_claims(V2)
    assert spec.version == 2 and len(sha) == 64
    ids = {c.id for c in spec.claim}
    v1, _ = C.load_claims(ROOT / "experiments" / "claims.toml")
    assert {c.id for c in v1.claim} <= ids | {"external-pre-zero-accuracy-high-rho-val",
                                               "external-pre-zero-accuracy-high-rho-hard"}
    assert {"headline-performance-tracks-predictions", "recall-degrades-as-rho-wx-grows-hard",
            "path-independence-predicts-extrapolation", "recall-beats-fixed-depth-control-hard",
            "b4-no-accuracy-high-rho-val"} <= ids
    for c in spec.claim:
        assert c.seeds and not set(c.seeds) & set(range(5)), c.id
    assert {c.id for c in spec.claim if c.test == "universal"} >= {"autonomous-zero-hard",
                                                                     "largest-lr-only-outer-norm-nonzero-hard"}


def test_claims_v2_judges_synthetic_records_of_the_third_edition_grid():
    spec, _ = C.load_claims(V2)
    cells = G.load(GRID).cells
    rng = np.random.default_rng(3)
    recs = []
    for cell in cells:
        m = cell.config.model
        r = rec(m.norm, m.recall, float(cell.config.train.lr), cell.config.train.seed,
                val=float(rng.uniform(50, 100)),
                hard=0.0 if m.recall in ("none", "fixed") else float(rng.uniform(0, 80)),
                rho=float(rng.uniform(0.5, 2.0)), monitor=[{"epoch": 1, "rho_Wx": 0.5}])
        r["config"]["model"]["depth"] = m.depth
        with_analysis(r, "hard", converged_fraction=float(rng.uniform()), rho_J_median_all=float(rng.uniform(0.5, 1.5)))
        recs.append(r)
    results = C.evaluate_v2(spec, recs)
    by = {r.id: r for r in results}
    assert len(results) == len(spec.claim)
    assert by["autonomous-zero-hard"].verdict == "supported"                 # every autonomous run at 0 %
    assert by["recall-beats-autonomous-external"].verdict == "supported"   # every configuration ~40 points ahead
    assert by["headline-performance-tracks-predictions"].n_configurations == 36
    assert by["recall-beats-fixed-depth-control-hard"].n_configurations == 12
    assert by["path-independence-predicts-extrapolation"].verdict == "inconclusive"  # the stage is not in records
    tested = [r for r in results if r.p is not None]
    assert [r.p_holm for r in tested] == pytest.approx(
        [a for a, r in zip(C.holm([r.p for r in results]), results) if r.p is not None])


def test_a_version_1_file_refuses_a_version_2_rule_in_one_line():
    data = {"format": "stability-claims", "version": 1, "title": "t", "task": "prefix-sums", "alpha": 0.05,
            "untrained_loss_fraction": 0.5, "bootstrap": {"resamples": 999, "seed": 1},
            "claim": [{"paper": "w", "where": "h", **ZERO}]}
    with pytest.raises(ConfigError, match="test 'universal' needs a version-2 claims file") as exc:
        C.parse_claims(data, "test")
    assert "\n" not in str(exc.value)


def test_a_universal_claim_without_its_floor_is_refused():
    with pytest.raises(ConfigError, match="a universal claim needs floor and holds"):
        spec2({k: v for k, v in ZERO.items() if k != "floor"})


def test_the_third_edition_grid_ties_each_runs_data_seed_to_its_fresh_seed():
    cells = G.load(GRID).cells
    assert len(cells) == 184 and len({c.cell_id for c in cells}) == 184
    assert all(c.config.task.seed == c.config.train.seed for c in cells)
    assert {c.config.train.seed for c in cells} == {5, 6, 7, 8}
    fixed = {(c.config.model.depth, c.config.model.width) for c in cells if c.config.model.recall == "fixed"}
    assert fixed == {(15, 32), (20, 28)}


def test_a_tie_to_an_option_that_is_neither_fixed_nor_an_axis_is_one_config_error():
    with pytest.raises(ConfigError, match="tie.task.seed: follows train.lr, which is neither fixed nor an axis"):
        G.parse({"fixed": {"task": {"name": "prefix-sums"}}, "axes": {"train": {"seed": [5]}},
                 "tie": {"task.seed": "train.lr"}})


ZERO_TOML = """format = "stability-claims"
version = 2
title = "t"
task = "prefix-sums"
alpha = 0.05
untrained_loss_fraction = 0.5
[bootstrap]
resamples = 999
seed = 1
[[claim]]
id = "zero"
paper = "w"
where = "h"
design = "one-sample"
test = "universal"
holds = "below"
floor = 1.0
metric = "hard.accuracy"
direction = "less"
min_n = 12
seeds = [0, 1, 2, 3, 4]
unit = ["model.norm", "train.lr", "train.seed"]
a = { label = "autonomous", recall = ["none"], norm = ["pre", "peri", "post", "gru"], lr = [1e-3, 2.5e-3, 5e-3] }
"""


def test_stability_claims_judges_a_version_2_file_on_the_second_editions_records_as_scipy_does(tmp_path):
    claims = tmp_path / "c.toml"
    claims.write_text(ZERO_TOML)
    out = tmp_path / "v.json"
    res = run_cli("claims", "experiments/results/replication", "--claims", claims, "--json", out, "--markdown",
                  tmp_path / "v.md", cwd=ROOT)
    by_cfg = {}
    for f in sorted((ROOT / "experiments/results/replication/records").glob("*.json")):
        r = json.loads(f.read_text())
        m, t = r["config"]["model"], r["config"]["train"]
        if m["recall"] == "none":
            hard = 0.0 if r["status"] == "diverged" or not r["final"] else 100.0 * r["final"]["hard"]["accuracy"]
            by_cfg.setdefault((m["norm"], t["lr"]), []).append(hard)
    assert len(by_cfg) == 12
    ps = []
    for v in by_cfg.values():
        p = stats.ttest_1samp(v, 1.0, alternative="greater").pvalue
        ps.append(min(1.0, 12 * p) if np.isfinite(p) else float(np.mean(v) <= 1.0))
    data = json.loads(out.read_text())
    got = data["verdicts"][0]
    assert got["p"] == pytest.approx(min(ps), rel=1e-9) and got["n_configurations"] == 12
    worst = max(np.mean(v) for v in by_cfg.values())
    assert got["effect"] == pytest.approx(worst)
    expected = "contradicted" if min(ps) < 0.05 else ("inconclusive" if worst > 1.0 else "supported")
    assert got["verdict"] == expected and f"zero: {expected}" in res.stdout
    assert "p (Holm)" in (tmp_path / "v.md").read_text()


def test_a_malformed_version_2_file_is_one_line_and_exit_2(tmp_path):
    claims = tmp_path / "c.toml"
    claims.write_text(ZERO_TOML.replace('holds = "below"\n', ""))
    bad = run_cli("claims", "experiments/results/replication", "--claims", claims, check=False, cwd=ROOT)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "a universal claim needs floor and holds" in bad.stderr


# ---- the frame on real records: seven verdicts recomputed from the raw JSON with scipy.stats -----------------------
def _second_edition_raw() -> list:
    files = sorted((ROOT / "experiments/results/replication/records").glob("*.json"))
    return [json.loads(f.read_text()) for f in files]


def _acc(r: dict, split: str) -> float:
    return 0.0 if r["status"] == "diverged" or not r["final"] else 100.0 * r["final"][split]["accuracy"]


def _key(r: dict) -> tuple:
    m, t = r["config"]["model"], r["config"]["train"]
    return m["norm"], m["recall"], float(t["lr"]), int(t["seed"])


def _paired_config_means(raw, value, a_of, b_of, config_of) -> list:
    """Per configuration, the mean over its units of a's value − b's (units present in both arms)."""
    a = {k: v for r in raw if (k := a_of(r)) is not None and (v := value(r)) is not None}
    b = {k: v for r in raw if (k := b_of(r)) is not None and (v := value(r)) is not None}
    cfg = {}
    for u in set(a) & set(b):
        cfg.setdefault(config_of(u), []).append(a[u] - b[u])
    return [np.mean(v) for _, v in sorted(cfg.items())]


def test_the_frame_on_the_second_editions_records_agrees_with_scipy_recomputed_from_the_raw_records(tmp_path):
    text = V2.read_text().replace("seeds = [5, 6, 7, 8]", "seeds = [0, 1, 2, 3, 4]")
    (tmp_path / "c.toml").write_text(text)
    spec, _ = C.load_claims(tmp_path / "c.toml")
    got = {r.id: r for r in C.evaluate_v2(spec, C.read_results(ROOT / "experiments/results/replication"))}
    raw = _second_edition_raw()
    rho = lambda r: (r.get("stability") or {}).get("rho_Wx")
    expect = {}
    # rho-wx-grows-with-lr and recall-degrades-as-rho-wx-grows-hard: lr 5e-3 − 1e-3 per (norm, recall, seed)
    at = lambda lr: (lambda r: (_key(r)[0], _key(r)[1], _key(r)[3]) if _key(r)[0] in ("pre", "peri") and _key(r)[1] in (
        "internal", "external") and _key(r)[2] == lr else None)
    expect["rho-wx-grows-with-lr"] = stats.ttest_1samp(_paired_config_means(raw, rho, at(5e-3), at(1e-3),
                                                                            lambda u: u[:2]), 0.0)
    expect["recall-degrades-as-rho-wx-grows-hard"] = stats.ttest_1samp(
        _paired_config_means(raw, lambda r: _acc(r, "hard"), at(5e-3), at(1e-3), lambda u: u[:2]), 0.0)
    # internal-competitive-outer-norm-hard: internal − external per (norm, lr, seed) over post/gru, against −10
    rec_of = lambda recall: (lambda r: (_key(r)[0], _key(r)[2], _key(r)[3]) if _key(r)[0] in ("post", "gru")
                             and _key(r)[1] == recall else None)
    expect["internal-competitive-outer-norm-hard"] = stats.ttest_1samp(
        _paired_config_means(raw, lambda r: _acc(r, "hard"), rec_of("internal"), rec_of("external"),
                             lambda u: u[:2]), -10.0)
    # autonomous-val-to-hard-degradation: runs with val >= 50, per (norm, lr) the mean val − hard, against 20
    cfg = {}
    for r in raw:
        if _key(r)[1] == "none" and _acc(r, "val") >= 50.0 and r["final"]:
            cfg.setdefault((_key(r)[0], _key(r)[2]), []).append(_acc(r, "val") - _acc(r, "hard"))
    expect["autonomous-val-to-hard-degradation"] = stats.ttest_1samp([np.mean(v) for v in cfg.values()], 20.0)
    # outer-norm-extrapolates-internal: per (norm, lr) the share >= 50 % hard, Welch post/gru against pre/peri
    share = {}
    for r in raw:
        if _key(r)[1] == "internal":
            share.setdefault((_key(r)[0], _key(r)[2]), []).append(100.0 * (_acc(r, "hard") >= 50.0))
    arm = lambda norms: [np.mean(v) for k, v in share.items() if k[0] in norms]
    expect["outer-norm-extrapolates-internal"] = stats.ttest_ind(arm(("post", "gru")), arm(("pre", "peri")),
                                                                 equal_var=False)
    # recall-beats-fixed-depth-hard: per (norm, lr) recall's mean (internal and external, every seed) − fixed's
    by = {}
    for r in raw:
        n, rc, lr, _ = _key(r)
        by.setdefault(("fixed" if rc == "fixed" else "recall" if rc != "none" else "none", n, lr), []).append(
            _acc(r, "hard"))
    diffs = [np.mean(by[("recall", n, lr)]) - np.mean(by[("fixed", n, lr)]) for (g, n, lr) in by if g == "fixed"]
    expect["recall-beats-fixed-depth-hard"] = stats.ttest_1samp(diffs, 0.0)
    # the headline: per (norm, recall, lr) mean signed ranks of converged share (+) and rho(J*) over all inputs (−)
    h = {}
    for r in raw:
        if _key(r)[1] != "fixed":
            a = r["analysis"]["hard"]
            h.setdefault(_key(r)[:3], []).append((a["converged_fraction"], a["rho_J_median_all"], _acc(r, "hard")))
    m = np.array([np.mean(v, axis=0) for _, v in sorted(h.items())])
    score = (stats.rankdata(m[:, 0]) + stats.rankdata(-m[:, 1])) / 2
    rho_s = stats.spearmanr(score, m[:, 2]).statistic
    assert got["headline-performance-tracks-predictions"].effect == pytest.approx(rho_s, rel=1e-12)
    assert len(expect) == 6
    for cid, ref in expect.items():
        assert got[cid].p == pytest.approx(ref.pvalue, rel=1e-9), cid
        ci = ref.confidence_interval(0.95)
        assert got[cid].ci == pytest.approx((ci.low, ci.high), rel=1e-9), cid
    adj = C.holm([got[c.id].p for c in spec.claim])
    for c, a in zip(spec.claim, adj):
        if got[c.id].p is not None:
            assert got[c.id].p_holm == pytest.approx(a)


def test_every_analysis_metric_of_claims_v2_names_a_field_the_sweep_record_holds():
    """`<split>.analysis.path_alignment` reads the path stage's headline key, which the record's analysis block has."""
    from stability.analysis.stages import path_independence
    from stability.sweep.claims.records import ANALYSIS_FIELDS

    from stability.sweep.record import SplitSummary

    head = path_independence.STAGE.headline({"other": {"median": 0.5}, "noise": {"median": 0.25}}, {})
    key = ANALYSIS_FIELDS["path_alignment"]
    assert head[key] == 0.5 and key in SplitSummary.model_fields
