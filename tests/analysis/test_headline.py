"""The headline block of a split (stability/analysis/headline.py): one documented name per quantity, each stage
giving its own from its JSON block, read the same way from an analysis written by an earlier version; what the
sweep's record keeps of an analysis and what `stability compare` compares."""

import copy
import json

from stability.analysis.headline import HEADLINE, headline, headlines
from stability.analysis.stages.registry import REGISTRY, stage
from stability.compare import ANALYSIS_QUANTITIES, compare_analyses
from stability.sweep.runner import analysis_summary
from stability.config import OPT_IN_STAGES
from tests.conftest import ROOT

DOCUMENTED = [key for key, _ in HEADLINE]
#: the headline keys of the opt-in stages (which the demo does not run), read from each stage's headline
OPT_IN_KEYS = {key for name in OPT_IN_STAGES for key in stage(name).headline({}, {})}


def _demo() -> dict:
    """docs/demo-sample.json's analysis: a real run of every stage (the geometry stage included), schema 3."""
    return json.loads((ROOT / "docs" / "demo-sample.json").read_text())["analysis"]


def test_every_key_of_the_headline_is_documented_once_and_comes_in_the_documented_order():
    assert len(DOCUMENTED) == len(set(DOCUMENTED)) and all(what for _, what in HEADLINE)
    for split, block in headlines(_demo()).items():
        keys = list(block)
        assert OPT_IN_KEYS and OPT_IN_KEYS < set(DOCUMENTED)
        # every stage `stability demo` runs ran: every key but the opt-in stages', the conditional ones included
        assert set(keys) == set(DOCUMENTED) - OPT_IN_KEYS, split
        assert keys == [k for k in DOCUMENTED if k in block]


def test_the_sweep_records_analysis_block_is_each_splits_headline():
    report = _demo()
    assert analysis_summary(report) == headlines(report) == {s: headline(report[s]) for s in report["splits"]}


def test_a_stage_that_did_not_run_leaves_its_headline_numbers_none_or_out_and_nothing_fails():
    report = _demo()
    split = copy.deepcopy(report["val"])
    for stage in REGISTRY[1:]:  # every stage but reachability, as --only reachability writes them
        split[stage.key] = None
    got = headline(split)
    assert got["converged_fraction"] == report["val"]["fixed_point"]["converged_fraction"]
    assert got["rho_J_median"] is None and got["prop5_rel_error_last"] is None and got["rho_Wx"] is None
    assert not any(k.startswith(("repelling_", "geometry_", "e_local_", "e_global_")) for k in got)


def test_compare_takes_every_analysis_quantity_from_the_headline():
    a = _demo()
    b = copy.deepcopy(a)
    b["val"]["jacobian"]["spectral_radius_median"] = 0.5
    cmp = compare_analyses(a, b)
    rows = {(r.split, r.label.split(" (T = ")[0]): r for r in cmp.rows}
    for split in a["splits"]:
        ha, hb = headline(a[split]), headline(b[split])
        for label, key, _ in ANALYSIS_QUANTITIES:
            row = rows.get((split, label))
            if row is not None:
                assert (row.a, row.b) == (ha[key], hb[key]), (split, label)
    assert rows[("val", "ρ(J*) median")].b == 0.5 and rows[("val", "ρ(J*) median")].changed
    assert {key for _, key, _ in ANALYSIS_QUANTITIES} <= set(DOCUMENTED)
