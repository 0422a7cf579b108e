"""Claims as code (issue 27, item 2): the claims file's schema, each test's p-value against an independent
reference, the decision rule, and `stability claims` on the second edition's 204 records.

Synthetic records are built here where the answer is known in closed form (binomial, signed-rank and
hypergeometric tails counted by hand); the real records' numbers are recomputed from the raw records in the test,
not copied from the engine. No training."""

import json
import math
from itertools import combinations

import pytest

from tests.conftest import ROOT, run_cli
from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from stability.sweep import claims as C
from stability.sweep.record import SplitSummary, StabilitySummary
from stability.sweep.runner import RECORD_FORMAT, RECORD_SCHEMA

CLAIMS = ROOT / "experiments" / "claims.toml"


# ---- helpers -----------------------------------------------------------------------------------------------------
#: the keys every record's split headline and stability summary have (None: not measured here)
SPLIT = {k: None for k, f in SplitSummary.model_fields.items() if f.is_required()}
STABILITY = {k: None for k, f in StabilitySummary.model_fields.items() if f.is_required()}


def rec(norm, recall, lr, seed, val=0.0, hard=0.0, *, loss=0.01, T=8, curve=None, rho=None, monitor=(),
        geometry=None, status="done", task="prefix-sums"):
    """A whole sweep record (the typed record reads it), nothing measured but: accuracies in percent, whole-answer
    curves over 20 iterations (flat, or ``curve`` for val, whose last entry is then the val accuracy), the final
    loss, ρ(W_x), the monitor series and the val split's geometry headline."""
    final = None if status == "diverged" else {
        s: {"test_iteration": 20, "accuracy": v / 100, "position_accuracy": None, "best_accuracy": None,
            "best_iteration": None, "n": None, "curve": [v / 100] * 20} for s, v in (("val", val), ("hard", hard))}
    if final and curve:
        final["val"].update(curve=list(curve), accuracy=curve[-1])
    config = RunConfig(model=ModelConfig(norm=norm, recall=recall), task=TaskConfig(name=task),
                       train=TrainConfig(lr=lr, seed=seed, iterations=T))
    geometry = {f"geometry_{'log_range' if k == 'anisotropy_log_range' else k}": v
                for k, v in (geometry or {}).items()}
    rid = f"{recall}-{norm}-{lr}-{seed}"
    return {"format": RECORD_FORMAT, "schema_version": RECORD_SCHEMA, "id": rid,
            "cell_id": f"ps-{recall}-{norm}-lr{lr:g}-s{seed}", "grid": "test", "axes": {}, "config": config.to_dict(),
            "status": status, "error": "loss is nan" if status == "diverged" else None, "checkpoint": f"{rid}.pt",
            "epochs_completed": 1, "final": final, "loss_last": loss, "monitor": [dict(m) for m in monitor],
            "stability": dict(STABILITY, source="monitor", split="val", rho_Wx=rho),
            "analysis": {"val": dict(SPLIT, **geometry)}, "analysis_note": None,
            "options": {"summary": "analyze", "analyze_samples": 4, "analyze_splits": ["val"],
                        "analyze_max_iter": 500},
            "timing": {"epoch_seconds": 1.0, "eval_and_io_seconds": 0.0, "summary_seconds": 0.0, "run_seconds": 1.0,
                       "wall_seconds": 1.0, "resumed_from_epoch": 0},
            "environment": {"device": "cpu", "host": "test", "torch": "2", "package": "0", "cuda_visible_devices": None},
            "finished_at": "2026-01-01T00:00:00+0000"}


def spec(claim: dict, **top) -> C.ClaimsFile:
    data = {"format": "stability-claims", "version": 1, "title": "test", "task": "prefix-sums", "alpha": 0.05,
            "untrained_loss_fraction": 0.5, "bootstrap": {"resamples": 999, "seed": 1}, **top,
            "claim": [{"id": "c", "paper": "words", "where": "here", **claim}]}
    return C.parse_claims(data, "test")


EXT_VS_INT = dict(design="paired", test="sign", metric="hard.accuracy", direction="greater", min_n=5,
                  a={"label": "external", "recall": ["external"], "norm": ["pre"]},
                  b={"label": "internal", "recall": ["internal"], "norm": ["pre"]},
                  unit=["model.norm", "train.lr", "train.seed"])


def judge(claim: dict, records, **top) -> C.Result:
    s = spec(claim, **top)
    return C.evaluate(s, records)[0]


def pairs(ext, int_, lr=1e-3, norm="pre", metric="hard"):
    out = []
    for seed, (e, i) in enumerate(zip(ext, int_)):
        kw_e, kw_i = {metric: e}, {metric: i}
        out += [rec(norm, "external", lr, seed, **kw_e), rec(norm, "internal", lr, seed, **kw_i)]
    return out


# ---- the sign test and the decision rule ---------------------------------------------------------------------------
def test_five_seeds_all_ahead_give_the_one_sided_sign_p_half_to_the_fifth_and_supported():
    r = judge(EXT_VS_INT, pairs([50, 60, 70, 80, 90], [0, 0, 0, 0, 0]))
    assert r.n == 5
    assert r.p == pytest.approx(0.5 ** 5)              # the rule's p: one-sided, predicted direction
    assert r.p_two_sided == pytest.approx(2 * 0.5 ** 5)  # 0.0625, reported beside it
    assert r.p_opposite == pytest.approx(1.0)
    assert r.verdict == "supported"
    assert r.effect == pytest.approx(70.0) and r.unit == "points"
    assert "a ahead in 5, behind in 0, tied in 0" in r.reason


def test_a_reversed_effect_is_contradicted_by_the_opposite_one_sided_test():
    r = judge(EXT_VS_INT, pairs([0, 0, 0, 0, 0], [10, 20, 30, 40, 50]))
    assert r.verdict == "contradicted"
    assert r.p_opposite == pytest.approx(0.5 ** 5) and r.p == pytest.approx(1.0)
    assert r.effect == pytest.approx(-30.0)


def test_fewer_units_than_min_n_is_inconclusive_n_too_small_but_the_numbers_are_reported():
    r = judge(EXT_VS_INT, pairs([50, 60, 70], [0, 0, 0]))
    assert r.verdict == "inconclusive" and r.reason.startswith("a ahead in 3") and "n too small (3 < 5" in r.reason
    assert r.n == 3 and r.p == pytest.approx(0.5 ** 3)


def test_a_mixed_outcome_is_inconclusive_and_ties_are_dropped_by_the_sign_test():
    r = judge(EXT_VS_INT, pairs([50, 60, 70, 0, 0, 5], [0, 0, 0, 10, 20, 5]))
    # 3 ahead, 2 behind, 1 tie: P(X >= 3 | Bin(5, 1/2)) = (10 + 5 + 1) / 32
    assert r.detail["tied"] == 1 and r.p == pytest.approx(16 / 32)
    assert r.verdict == "inconclusive" and "not significant" in r.reason


def test_a_non_inferiority_margin_shifts_the_sign_test():
    # internal 5 points behind in every pair: behind, but within a margin of 10
    claim = {**EXT_VS_INT, "null": -10.0}
    r = judge(claim, pairs([45] * 6, [50] * 6))
    assert r.verdict == "supported" and r.p == pytest.approx(0.5 ** 6)
    assert "a − b above -10 in 6" in r.reason


# ---- Wilcoxon, Mann–Whitney, Fisher against hand-computed distributions --------------------------------------------
def _signed_rank_tail(diffs):
    """P(W+ >= observed) under H0, by enumerating all 2^n sign patterns of the ranks (no ties in |d|)."""
    ranks = {abs(d): i + 1 for i, d in enumerate(sorted(diffs, key=abs))}
    w = sum(ranks[abs(d)] for d in diffs if d > 0)
    n = len(diffs)
    total = sum(1 for k in range(n + 1) for s in combinations(range(1, n + 1), k) if sum(s) >= w)
    return total / 2 ** n


@pytest.mark.parametrize("diffs", [[1, 2, 3, 4, 5], [1, -2, 3, 4, 5], [3, -1, 4, 1.5, 9, -2.5]])
def test_wilcoxon_signed_rank_p_matches_the_enumerated_exact_distribution(diffs):
    claim = {**EXT_VS_INT, "test": "wilcoxon"}
    r = judge(claim, pairs([50 + d for d in diffs], [50] * len(diffs)))
    assert r.p == pytest.approx(_signed_rank_tail(diffs), rel=1e-9)


def test_mann_whitney_p_of_complete_separation_is_one_over_the_number_of_splits():
    claim = dict(design="unpaired", test="mann-whitney", metric="hard.accuracy", direction="greater", min_n=5,
                 a={"label": "post", "recall": ["external"], "norm": ["post"]},
                 b={"label": "pre", "recall": ["external"], "norm": ["pre"]},
                 unit=["model.norm", "model.recall", "train.lr", "train.seed"])
    recs = [rec("post", "external", 1e-3, s, hard=60 + s) for s in range(5)]
    recs += [rec("pre", "external", 1e-3, s, hard=s) for s in range(5)]
    r = judge(claim, recs)
    assert r.p == pytest.approx(1 / math.comb(10, 5)) and r.verdict == "supported"
    assert (r.n_a, r.n_b) == (5, 5) and r.effect == pytest.approx(60.0)


def test_fisher_exact_p_equals_the_hand_computed_hypergeometric_tail():
    claim = dict(design="unpaired", test="fisher", success={"metric": "hard.accuracy", "at_least": 50.0},
                 direction="greater", min_n=5,
                 a={"label": "post", "recall": ["internal"], "norm": ["post"]},
                 b={"label": "pre", "recall": ["internal"], "norm": ["pre"]},
                 unit=["model.norm", "model.recall", "train.lr", "train.seed"])
    recs = [rec("post", "internal", 1e-3, s, hard=h) for s, h in enumerate([99, 80, 51, 50, 1])]  # 4 of 5 >= 50
    recs += [rec("pre", "internal", 1e-3, s, hard=h) for s, h in enumerate([49, 10, 0, 0, 0])]    # 0 of 5
    r = judge(claim, recs)
    # 10 runs, 4 successes, 5 drawn for arm a: P(X >= 4) = C(4,4) C(6,1) / C(10,5) = 6 / 252
    assert r.p == pytest.approx(math.comb(4, 4) * math.comb(6, 1) / math.comb(10, 5))
    assert r.detail["table"] == [[4, 1], [0, 5]]
    assert r.effect == pytest.approx(80.0) and r.verdict == "supported"


# ---- bootstrap ------------------------------------------------------------------------------------------------
def _three_configurations():
    recs = []
    for lr, gap in ((1e-3, 0.0), (3e-3, 10.0), (1e-2, 20.0)):
        recs += pairs([50 + gap] * 5, [50] * 5, lr=lr)
    return recs


def test_bootstrap_ci_is_reproducible_with_a_fixed_seed_and_changes_with_it():
    recs = _three_configurations()
    claim = {**EXT_VS_INT, "min_n": 5}
    first, again = judge(claim, recs), judge(claim, recs)
    assert first.ci == again.ci and first.ci is not None
    other = judge(claim, recs, bootstrap={"resamples": 999, "seed": 2})
    assert other.effect == first.effect


def test_bootstrap_resamples_whole_configurations_not_runs():
    # 3 configurations whose paired differences are 0, 10 and 20 in every seed: a resample of configurations has a
    # mean that is a multiple of 10/3; resampling single pairs would give multiples of 10/15
    r = judge({**EXT_VS_INT, "min_n": 5}, _three_configurations())
    assert r.ci_resampling == "configurations" and r.effect == pytest.approx(10.0)
    for bound in r.ci:
        assert bound / (10 / 3) == pytest.approx(round(bound / (10 / 3)), abs=1e-9)
    assert r.ci[0] < 10.0 < r.ci[1]


def test_a_bootstrap_claim_is_decided_by_its_interval_against_the_null():
    recs = _three_configurations()
    claim = {**EXT_VS_INT, "test": "bootstrap", "null": -10.0}
    assert judge(claim, recs).verdict == "supported"        # every resampled mean is >= 0 > -10
    assert judge({**claim, "null": 30.0}, recs).verdict == "contradicted"  # every resampled mean is <= 20 < 30
    assert judge({**claim, "null": 10.0}, recs).verdict == "inconclusive"
    assert judge(claim, recs).p is None


# ---- never trained, not measured, symbolic rates, selection -------------------------------------------------------
def test_never_trained_means_final_loss_at_least_the_fraction_of_the_chance_loss():
    assert C.never_trained(rec("pre", "external", 1e-3, 0, loss=0.5 * math.log(2) + 1e-6), 0.5)
    assert C.never_trained(rec("pre", "external", 1e-3, 0, loss=0.5 * math.log(2) - 1e-6), 0.5) is None
    assert C.never_trained(rec("pre", "external", 1e-3, 0, status="diverged"), 0.5) == "diverged"


def test_untrained_runs_are_excluded_and_an_arm_mostly_untrained_is_untestable():
    claim = dict(design="unpaired", test="fisher", success={"metric": "hard.accuracy", "at_least": 5.0},
                 direction="greater", min_n=2, untrained="exclude", untestable_untrained_fraction=0.5,
                 a={"label": "post", "recall": ["external"], "norm": ["post"], "lr": ["highest"]},
                 b={"label": "pre", "recall": ["external"], "norm": ["pre"], "lr": ["highest"]},
                 unit=["model.norm", "model.recall", "train.lr", "train.seed"])
    chance = math.log(2)
    base = [rec("post", "external", 1e-3, s, hard=90) for s in range(4)]  # the lowest rate: not in the claim
    ok = [rec("pre", "external", 1e-2, s, hard=0) for s in range(4)]
    half = [rec("post", "external", 1e-2, s, hard=50, loss=0.01 if s < 2 else chance) for s in range(4)]
    r = judge(claim, base + ok + half)
    assert r.detail["untrained"]["a"] == [2, 4] and r.n_a == 2       # 2 of 4 never trained: excluded, not > 50 %
    assert "never trained (excluded): a 2/4" in r.reason
    most = [rec("post", "external", 1e-2, s, hard=50, loss=0.01 if s < 1 else chance) for s in range(4)]
    r = judge(claim, base + ok + most)
    assert r.verdict == "inconclusive" and r.reason.startswith("untestable: 3 of 4 runs of arm a")


def test_a_missing_geometry_block_is_not_measured_and_a_present_one_is_tested():
    claim = {**EXT_VS_INT, "test": "wilcoxon", "metric": "val.geometry.anisotropy_log_range",
             "a": {"label": "internal", "recall": ["internal"], "norm": ["pre"]},
             "b": {"label": "external", "recall": ["external"], "norm": ["pre"]}}
    bare = pairs([50] * 5, [50] * 5)
    r = judge(claim, bare)
    assert r.verdict == "inconclusive" and r.n == 0
    assert r.reason.startswith("not measured: no analysis.val.geometry block")
    measured = []
    for s in range(6):
        measured += [rec("pre", "internal", 1e-3, s, geometry={"anisotropy_log_range": 3.0 + s, "median_radius": 1}),
                     rec("pre", "external", 1e-3, s, geometry={"anisotropy_log_range": 1.0, "median_radius": 1})]
    r = judge(claim, measured)
    assert r.n == 6 and r.p == pytest.approx(1 / 64) and r.verdict == "supported" and r.unit == "log-range"


def test_rho_wx_through_training_is_the_largest_value_of_the_monitor_series():
    claim = dict(design="one-sample", test="sign", metric="monitor.rho_Wx.max", direction="less", null=1.0,
                 min_n=5, a={"label": "low lr", "recall": ["external"], "norm": ["pre"], "lr": ["lowest"]},
                 unit=["model.norm", "model.recall", "train.seed"])
    series = [{"epoch": e, "rho_Wx": v} for e, v in ((1, 0.5), (2, 0.9), (3, 0.7))]
    recs = [rec("pre", "external", 1e-4, s, monitor=series) for s in range(5)]
    recs += [rec("pre", "external", 1e-3, s, monitor=[{"epoch": 1, "rho_Wx": 3.0}]) for s in range(5)]  # not lowest
    r = judge(claim, recs)
    assert r.effect == pytest.approx(0.9) and r.verdict == "supported" and r.p == pytest.approx(0.5 ** 5)
    r = judge(claim, [rec("pre", "external", 1e-4, s) for s in range(5)])
    assert r.verdict == "inconclusive" and r.reason.startswith("not measured: no monitor series")


def test_symbolic_learning_rates_resolve_to_the_records_rates():
    recs = []
    for lr in (1e-4, 3e-4, 1e-3):
        recs += pairs([lr * 1e5] * 5, [0] * 5, lr=lr)
    for sym, lr in (("lowest", 1e-4), ("middle", 3e-4), ("highest", 1e-3)):
        claim = {**EXT_VS_INT, "a": {**EXT_VS_INT["a"], "lr": [sym]}, "b": {**EXT_VS_INT["b"], "lr": [sym]}}
        assert judge(claim, recs).effect == pytest.approx(lr * 1e5)
    two = [r for r in recs if r["config"]["train"]["lr"] != 3e-4]
    claim = {**EXT_VS_INT, "a": {**EXT_VS_INT["a"], "lr": ["middle"]}, "b": {**EXT_VS_INT["b"], "lr": ["middle"]}}
    r = judge(claim, two)
    assert r.verdict == "inconclusive" and "'middle' is undefined for the records' 2 learning rates" in r.reason


def test_figure3_selection_takes_the_best_mean_hard_configuration_then_val():
    claim = dict(design="one-sample", test="wilcoxon", metric="val.overthinking", direction="less", null=10.0,
                 min_n=5, a={"label": "best autonomous", "recall": ["none"], "norm": ["pre", "post"]},
                 select={"rule": "max-mean", "over": ["model.norm", "train.lr"], "by": ["hard.accuracy",
                                                                                         "val.accuracy"]},
                 unit=["model.norm", "train.lr", "train.seed"])
    keep = [1.0] * 20                                     # no loss from T = 8 to 20
    drop = [1.0] * 8 + [0.5] * 12                         # loses 50 points after T
    recs = [rec("pre", "none", 1e-3, s, hard=0, curve=drop) for s in range(5)]     # hard 0, val 50
    recs += [rec("post", "none", 1e-3, s, hard=0, curve=keep) for s in range(5)]   # hard 0, val 100: wins the tie
    recs += [rec("post", "none", 1e-2, s, hard=0, val=40) for s in range(5)]       # hard 0, val 40
    r = judge(claim, recs)
    assert r.detail["selected"] == {"model.norm": "post", "train.lr": 1e-3}
    assert r.effect == pytest.approx(0.0) and r.verdict == "supported"
    recs += [rec("pre", "none", 3e-3, s, hard=2, curve=drop) for s in range(5)]    # best hard: selected
    r = judge(claim, recs)
    assert r.detail["selected"] == {"model.norm": "pre", "train.lr": 3e-3}
    assert r.effect == pytest.approx(50.0) and r.verdict == "contradicted"


def test_an_arm_of_two_recalls_is_averaged_within_its_unit():
    claim = {**EXT_VS_INT, "a": {"label": "recall", "recall": ["internal", "external"], "norm": ["pre"]},
             "b": {"label": "fixed", "recall": ["fixed"], "norm": ["pre"]}}
    recs = []
    for s in range(5):
        recs += [rec("pre", "internal", 1e-3, s, hard=10), rec("pre", "external", 1e-3, s, hard=30),
                 rec("pre", "fixed", 1e-3, s, hard=5)]
    assert judge(claim, recs).effect == pytest.approx(15.0)


# ---- the claims file ---------------------------------------------------------------------------------------------
def test_the_registered_claims_file_loads_and_registers_the_issues_claims():
    s, sha = C.load_claims(CLAIMS)
    assert len(sha) == 64 and s.alpha == 0.05
    by_id = {c.id: c for c in s.claim}
    assert len(by_id) >= 20
    comp = by_id["internal-competitive-outer-norm-hard"]
    assert comp.a.norm == ["post", "gru"] and comp.null < 0
    assert by_id["rho-wx-small-through-training-low-lr"].metric == "monitor.rho_Wx.max"
    fig3 = by_id["no-overthinking-best-autonomous"]
    assert fig3.select is not None and fig3.select.by[0] == "hard.accuracy"
    big = by_id["largest-lr-only-outer-norm-nonzero-hard"]
    assert big.a.lr == ["highest"] and big.untrained == "exclude" and big.untestable_untrained_fraction == 0.5
    assert by_id["geometry-internal-more-anisotropic"].metric == "val.geometry.anisotropy_log_range"
    assert by_id["geometry-outer-norm-broadens"].metric == "val.geometry.median_radius"
    # the paper's norms only: no claim compares the grid's "none" norm
    assert all("none" not in arm.norm for c in s.claim for arm in (c.a, c.b) if arm is not None)


BAD = [
    ("top-level unknown key", lambda d: d.update(alpah=0.05), "unknown key(s) alpah; allowed: format"),
    ("claim unknown key", lambda d: d["claim"][0].update(directon="greater"),
     "claim 'c': unknown key(s) directon; allowed: id, paper"),
    ("wrong test", lambda d: d["claim"][0].update(test="t-test"), "claim 'c'.test: 't-test' is not allowed"),
    ("wrong norm", lambda d: d["claim"][0]["a"].update(norm=["layer"]), "claim 'c'.a.norm[0]: 'layer' is not allowed"),
    ("wrong lr word", lambda d: d["claim"][0]["a"].update(lr=["lowermost"]),
     "claim 'c'.a.lr[0]: 'lowermost' is not allowed; allowed: a number or 'lowest', 'middle' or 'highest'"),
    ("design mismatch", lambda d: d["claim"][0].update(test="fisher"),
     "claim 'c': test 'fisher' does not fit design 'paired'"),
    ("unit on the arms' difference", lambda d: d["claim"][0].update(unit=["model.recall", "train.seed"]),
     "unit key model.recall is what the arms differ in"),
    ("duplicate id", lambda d: d["claim"].append(dict(d["claim"][0])), "claim id 'c' is used twice"),
    ("alpha out of range", lambda d: d.update(alpha=0.7), "alpha: 0.7"),
    ("missing min_n", lambda d: d["claim"][0].pop("min_n"), "claim 'c'.min_n: missing"),
]


def _toml(data: dict) -> str:
    def value(v):
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
    lines = [f"{k} = {value(v)}" for k, v in data.items() if k != "claim"]
    for c in data.get("claim", []):
        lines.append("[[claim]]")
        lines += [f"{k} = {value(v)}" for k, v in c.items()]
    return "\n".join(lines) + "\n"


def _good() -> dict:
    return {"format": "stability-claims", "version": 1, "title": "t", "task": "prefix-sums", "alpha": 0.05,
            "untrained_loss_fraction": 0.5, "bootstrap": {"resamples": 999, "seed": 1},
            "claim": [{"id": "c", "paper": "p", "where": "w", **json.loads(json.dumps(EXT_VS_INT))}]}


@pytest.mark.parametrize("what,mutate,expected", BAD, ids=[b[0] for b in BAD])
def test_a_malformed_claims_file_is_one_error_line_and_exit_2(tmp_path, what, mutate, expected):
    (tmp_path / "records.jsonl").write_text(json.dumps(rec("pre", "external", 1e-3, 0)) + "\n")
    data = _good()
    mutate(data)
    path = tmp_path / "claims.toml"
    path.write_text(_toml(data))
    res = run_cli("claims", tmp_path, "--claims", path, check=False)
    assert res.returncode == 2, res.stderr
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"stability claims: error: {path}: "), err
    assert expected in err, err
    assert res.stdout == ""


def test_a_claims_file_that_is_not_toml_or_absent_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "records.jsonl").write_text(json.dumps(rec("pre", "external", 1e-3, 0)) + "\n")
    (tmp_path / "bad.toml").write_text("[[claim]\nid = 1\n")
    for path, expected in ((tmp_path / "bad.toml", "not valid TOML"), (tmp_path / "none.toml", "no such file")):
        res = run_cli("claims", tmp_path, "--claims", path, check=False)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and expected in res.stderr


def test_the_good_synthetic_file_round_trips_through_toml(tmp_path):
    path = tmp_path / "claims.toml"
    path.write_text(_toml(_good()))
    s, _ = C.load_claims(path)
    assert s.claim[0].a.recall == ["external"] and s.claim[0].min_n == 5


# ---- the second edition's 204 records (issue 27): verdicts recomputed by hand -----------------------------------
SECOND = ROOT / "experiments" / "results" / "replication"


def _index(records):
    return {(r["config"]["model"]["norm"], r["config"]["model"]["recall"], r["config"]["train"]["lr"],
             r["config"]["train"]["seed"]): r for r in records}


def _second_records():
    return [json.loads(p.read_text()) for p in sorted((SECOND / "records").glob("*.json"))]


def _lrs(records):
    return sorted({r["config"]["train"]["lr"] for r in records if r["config"]["model"]["recall"] != "fixed"})


def test_stability_claims_on_the_second_edition_records_agree_with_the_tests_computed_by_hand(tmp_path):
    """Four verdicts recomputed from the records with scipy.stats, without the claims module: the pooled sign test
    of external against internal recall on hard (pre, peri; the two lower rates), Figure 3's selection, the
    one-sample Wilcoxon test of the monitor's largest ρ(W_x) at the lowest rate against 1, and the paired Wilcoxon
    test of the geometry stage's median radius (each arm the mean over its two norms)."""
    from scipy import stats

    out = tmp_path / "v.json"
    run_cli("claims", SECOND, "--claims", CLAIMS, "--json", out)
    v = {c["id"]: c for c in json.loads(out.read_text())["claims"]}
    records = _second_records()
    assert json.loads(out.read_text())["records"] == len(records)
    idx = _index(records)
    lrs = _lrs(records)
    seeds = sorted({r["config"]["train"]["seed"] for r in records})
    acc = lambda r, s: 0.0 if r["status"] == "diverged" else 100 * r["final"][s]["accuracy"]

    # external vs internal without outer norm, hard: per (norm, lr, seed) pair
    d = [acc(idx[(n, "external", lr, s)], "hard") - acc(idx[(n, "internal", lr, s)], "hard")
         for n in ("pre", "peri") for lr in lrs[:2] for s in seeds
         if (n, "external", lr, s) in idx and (n, "internal", lr, s) in idx]
    ahead, behind = sum(x > 0 for x in d), sum(x < 0 for x in d)
    c = v["external-beats-internal-no-outer-norm-hard"]
    assert (c["detail"]["above"], c["detail"]["below"], c["detail"]["tied"]) == (ahead, behind, len(d) - ahead - behind)
    assert c["n"] == len(d) == 20                         # 2 norms x 2 rates x 5 seeds; the sign test drops ties
    assert c["p"] == pytest.approx(stats.binomtest(ahead, ahead + behind, alternative="greater").pvalue)
    assert c["effect"] == pytest.approx(sum(d) / len(d))

    # Figure 3's configuration: the best mean hard accuracy of the autonomous runs, ties broken by val
    cells = {(n, lr) for (n, rc, lr, s) in idx if rc == "none" and n in ("pre", "peri", "post", "gru")}
    mean = lambda n, lr, s: sum(acc(idx[k], s) for k in idx if k[:3] == (n, "none", lr)) / len(seeds)
    best = max(cells, key=lambda k: (mean(*k, "hard"), mean(*k, "val")))
    assert v["no-overthinking-best-autonomous"]["detail"]["selected"] == {"model.norm": best[0], "train.lr": best[1]}

    # App. B.3: the largest ρ(W_x) of each run's training monitor at the lowest rate, against 1
    peaks = [max(m["rho_Wx"] for m in r["monitor"]) for r in records
             if r["config"]["train"]["lr"] == lrs[0] and r["config"]["model"]["recall"] in ("internal", "external")
             and r["config"]["model"]["norm"] in ("pre", "peri")]
    c = v["rho-wx-small-through-training-low-lr"]
    assert c["n"] == len(peaks) and c["p"] == pytest.approx(stats.wilcoxon([p - 1 for p in peaks],
                                                                           alternative="less").pvalue)

    # the geometry axis: outer norm (post, gru) against none (pre, peri), paired by recall x lr x seed
    def radius(norms, recall, lr, s):
        vals = [idx[(n, recall, lr, s)]["analysis"]["val"]["geometry_median_radius"] for n in norms
                if (n, recall, lr, s) in idx]
        return sum(vals) / len(vals) if len(vals) == len(norms) else None

    pairs_ = [(radius(("post", "gru"), rc, lr, s), radius(("pre", "peri"), rc, lr, s))
              for rc in ("internal", "external") for lr in lrs for s in seeds]
    diffs = [a - b for a, b in pairs_ if a is not None and b is not None]
    c = v["geometry-outer-norm-broadens"]
    assert len(diffs) == c["n"] >= 10
    assert c["p"] == pytest.approx(stats.wilcoxon(diffs, alternative="greater").pvalue)


def test_each_claim_figure_draws_the_per_unit_values_its_verdict_rests_on(tmp_path):
    """The values a figure draws are the test's units: for a paired sign claim, a − b per unit reproduces the
    counts ahead/behind/tied, and `--figures` writes one PNG per claim that has values (nothing for one without)."""
    r = judge(EXT_VS_INT, pairs([50, 60, 70, 10, 0, 5], [40, 40, 40, 20, 0, 5]))
    a, b = (dict((tuple(u), v) for u, v in r.detail["values"][k]) for k in ("a", "b"))
    assert r.detail["unit_keys"] == ["model.norm", "train.lr", "train.seed"] and set(a) == set(b) and len(a) == 6
    diffs = [a[u] - b[u] for u in a]
    assert (sum(d > 0 for d in diffs), sum(d < 0 for d in diffs), sum(d == 0 for d in diffs)) == (3, 1, 2)
    assert (r.detail["above"], r.detail["below"], r.detail["tied"]) == (3, 1, 2)

    figs = tmp_path / "figs"
    res = run_cli("claims", SECOND, "--claims", CLAIMS, "--figures", figs)
    data_claims = C.evaluate(C.load_claims(CLAIMS)[0], _second_records())
    with_values = {x.id for x in data_claims if x.detail.get("values", {}).get("a")
                   and (x.detail.get("values", {}).get("b") or x.detail.get("values", {}).get("a"))}
    written = {p.stem for p in figs.glob("*.png")}
    assert written and written <= with_values and f"wrote {len(written)} figures" in res.stdout
    assert "geometry-internal-more-anisotropic" not in written            # not measured: nothing to draw
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in figs.glob("*.png"))
    assert not list(tmp_path.glob(".figs.*"))                             # no staging folder left behind


#: the claims file each edition's records are judged against (the second edition's is the default)
CLAIMS_OF = {"experiments/results/replication-v3": "experiments/claims-v2.toml"}


def test_the_claims_tables_in_the_readme_and_replication_page_are_the_output_of_stability_claims(tmp_path):
    """docs/replication.md's verdict table and the README's are generated blocks: rerendering them with
    `stability claims RESULTS --markdown PAGE` from the committed records changes nothing (a stale or hand-edited
    table fails here), and the rest of each page is kept as it is."""
    import shutil

    pages = {"README.md": True, "docs/replication.md": False}  # page -> has a compact block
    for page, compact in pages.items():
        text = (ROOT / page).read_text(encoding="utf-8")
        blocks = C.generated_blocks(text)
        assert blocks and any(c == compact for _, c in blocks), page
        for source in {s for s, _ in blocks}:
            copy = tmp_path / page.replace("/", "_")
            shutil.copy(ROOT / page, copy)
            run_cli("claims", source, "--claims", CLAIMS_OF.get(source, "experiments/claims.toml"), "--markdown", copy,
                    cwd=ROOT)
            assert copy.read_text(encoding="utf-8") == text, f"{page}: the {source} block is stale"


def test_the_committed_verdicts_json_is_what_stability_claims_writes_from_the_committed_records(tmp_path):
    """experiments/results/replication/claims.json, regenerated from the committed records and claims file the way
    it was made (from the checkout's root), is the committed file byte for byte: a change to the engine that moves
    a verdict, a number or the JSON's shape fails here."""
    out = tmp_path / "claims.json"
    run_cli("claims", "experiments/results/replication", "--claims", "experiments/claims.toml", "--json", out,
            cwd=ROOT)
    assert out.read_bytes() == (SECOND / "claims.json").read_bytes()


def test_the_third_editions_verdicts_json_is_what_stability_claims_writes_from_its_records(tmp_path):
    """experiments/results/replication-v3/claims.json, regenerated from the third edition's committed records and
    experiments/claims-v2.toml from the checkout's root, is the committed file byte for byte."""
    out = tmp_path / "claims.json"
    run_cli("claims", "experiments/results/replication-v3", "--claims", "experiments/claims-v2.toml", "--json", out,
            cwd=ROOT)
    assert out.read_bytes() == (ROOT / "experiments" / "results" / "replication-v3" / "claims.json").read_bytes()


def test_figure3_draws_the_configuration_the_registered_rule_selects():
    """Figure 3 and the claim no-overthinking-best-autonomous select by one rule (best mean hard, then val): on the
    second edition's records both pick post / 1e-3, and a tie on hard is broken by val, not by the sort order."""
    from stability.sweep.figures import best_autonomous

    records = _second_records()
    s, _ = C.load_claims(CLAIMS)
    claim = next(r for r in C.evaluate(s, records) if r.id == "no-overthinking-best-autonomous")
    norm, lr, runs = best_autonomous(records, "prefix-sums")
    assert {"model.norm": norm, "train.lr": lr} == claim.detail["selected"] == {"model.norm": "post", "train.lr": 1e-3}
    tie = [rec("gru", "none", 1e-3, 0, val=40, hard=0), rec("post", "none", 1e-3, 0, val=90, hard=0)]
    assert best_autonomous(tie, "prefix-sums")[0] == "post"


def test_geometry_metrics_read_the_records_geometry_summary_as_the_sweep_writes_it():
    """The claims' geometry metrics are read from a committed second-edition record, whose analysis summary the
    sweep wrote (``analysis.val.geometry_median_radius``, ``geometry_log_range``)."""
    recs = sorted((ROOT / "experiments" / "results" / "replication" / "records").glob(
        "prefix-sums_pre_external_lr1e-3_seed0--*.json"))
    assert recs, "the second edition's record of ps-external-pre-lr1e-3-s0 is committed"
    r = json.loads(recs[0].read_text())
    val = r["analysis"]["val"]
    assert C.metric_value(r, "val.geometry.median_radius") == (val["geometry_median_radius"], None)
    assert C.metric_value(r, "val.geometry.anisotropy_log_range") == (val["geometry_log_range"], None)
    assert val["geometry_median_radius"] > 0 and val["geometry_log_range"] > 0


def test_claims_output_says_the_direction_its_test_took_and_on_which_side_the_effect_lies(tmp_path):
    """Each line names its one-sided test (A > B, A − B > null, A < null) and whether the effect lies in that
    direction: a "contradicted" next to an effect of the other sign is read as what it is. The verdicts, numbers
    and JSON are unchanged (the JSON is checked against the committed claims.json elsewhere)."""
    res = run_cli("claims", SECOND, "--claims", CLAIMS, "--json", tmp_path / "v.json")
    spec, _ = C.load_claims(CLAIMS)
    by_id = {c.id: c for c in spec.claim}
    verdicts = {c["id"]: c for c in json.loads((tmp_path / "v.json").read_text())["claims"]}
    lines = [line for line in res.stdout.splitlines() if line.split(" ", 1)[0] in by_id]
    assert len(lines) == len(by_id)
    for line in lines:
        claim, v = by_id[line.split(" ", 1)[0]], verdicts[line.split(" ", 1)[0]]
        sym = ">" if claim.direction == "greater" else "<"
        assert f"test: one-sided {claim.test}, {C.hypothesis(claim)}" in line, line
        assert f" {sym} " in C.hypothesis(claim), line
        assert C.hypothesis(claim).startswith("A − B" if claim.b is not None and claim.null else "A"), line
        if v["effect"] is None:
            continue
        gap = (v["effect"] - claim.null) * (1 if claim.direction == "greater" else -1)
        side = "in that direction" if gap > 0 else "against it" if gap < 0 else "at"
        assert f"; effect {v['effect']:+.3g} {v['unit']} (" in line and f"), {side}" in line, line
        disagree = (v["verdict"] == "contradicted" and gap >= 0) or (v["verdict"] == "supported" and gap <= 0)
        assert ("yet the test went the other way: it weighs" in line) == disagree, line
    # the hostile tester's case: "contradicted" beside an effect of +1.7 points (a mean; the sign test weighs signs)
    fixed = next(line for line in lines if line.startswith("recall-beats-fixed-depth-val "))
    assert "contradicted" in fixed and "test: one-sided sign, A > B (A recall, B fixed depth)" in fixed
    assert "effect +1.7 points (the mean of A − B), in that direction, yet the test went the other way: it " \
           "weighs the signs of A − B against the null, not the effect's mean" in fixed
