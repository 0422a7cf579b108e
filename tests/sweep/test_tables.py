"""Tables 4-6 from sweep records: layout as the paper's, seed statistics, diverged runs, mixed settings refused.

These tests build records by hand (the layout and arithmetic are the subject); tests/sweep/test_sweep.py makes the
tables of a real sweep."""

import csv
import io
import json
import math
import subprocess
import sys

import pytest

from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from stability.errors import ConfigError
from stability.sweep import tables
from stability.sweep.record import typed
from stability.sweep.runner import RECORD_FORMAT, RECORD_SCHEMA
from tests.conftest import run_cli


def record(task, norm, recall, lr, seed, val, hard, *, status="done", width=256, T=500):
    """A whole sweep record (every key the typed record has) with these accuracies in percent."""
    config = RunConfig(model=ModelConfig(recall=recall, norm=norm, width=width), task=TaskConfig(name=task),
                       train=TrainConfig(lr=lr, seed=seed))
    final = None if status == "diverged" else {
        s: {"test_iteration": T, "accuracy": a / 100, "position_accuracy": None, "best_accuracy": a / 100,
            "best_iteration": 3, "n": 100, "curve": [a / 100] * 3} for s, a in (("val", val), ("hard", hard))}
    rid = f"{task}-{norm}-{recall}-{lr}-{seed}-{width}"
    return {"format": RECORD_FORMAT, "schema_version": RECORD_SCHEMA, "id": rid, "cell_id": rid, "grid": "test",
            "axes": {}, "config": config.to_dict(), "status": status,
            "error": "loss is nan" if status == "diverged" else None, "checkpoint": f"runs/{rid}.pt",
            "epochs_completed": 1, "final": final, "loss_last": 0.1, "monitor": [], "stability": None,
            "analysis": None, "analysis_note": None,
            "options": {"summary": "analyze", "analyze_samples": 4, "analyze_splits": ["val", "hard"],
                        "analyze_max_iter": 500},
            "timing": {"epoch_seconds": 1.0, "eval_and_io_seconds": 0.5, "summary_seconds": 0.5, "run_seconds": 2.0,
                       "wall_seconds": 2.0, "cpu_seconds": 2.0, "resumed_from_epoch": 0},
            "environment": {"device": "cpu", "host": "test", "torch": "2", "package": "0", "cuda_visible_devices": None},
            "finished_at": "2026-01-01T00:00:00+0000"}


def paper_like():
    recs = []
    for task, lrs in (("sudoku", (1e-4, 3e-4, 1e-3, 3e-3)), ("chess", (1e-4, 3e-4, 1e-3))):
        for norm in ("pre", "gru"):
            for recall in ("fixed", "none", "external", "internal"):
                for i, lr in enumerate(lrs):
                    for seed in (0, 1, 2):
                        recs.append(record(task, norm, recall, lr, seed, 10 * i + seed, 5 * i + seed))
    return recs


def test_tables_4_and_5_show_sudokus_three_highest_rates_and_table_6_all_four():
    built = {t.number: t for t in tables.build_tables(tables.collect(paper_like()))}
    assert sorted(built) == [4, 5, 6]
    assert [(t, lr) for t, lr, _ in built[4].columns] == [
        ("chess", 1e-4), ("chess", 3e-4), ("chess", 1e-3), ("sudoku", 3e-4), ("sudoku", 1e-3), ("sudoku", 3e-3)]
    assert {s for _, _, s in built[4].columns} == {"val"} and {s for _, _, s in built[5].columns} == {"hard"}
    assert built[6].columns == [("sudoku", lr, s) for s in ("val", "hard") for lr in (1e-4, 3e-4, 1e-3, 3e-3)]
    # rows as the paper's: norms in alphabetical order, recall internal, external, none, fixed
    assert built[4].rows == [(n, r) for n in ("gru", "pre") for r in ("internal", "external", "none", "fixed")]
    md = tables.markdown(built[4])
    assert md.splitlines()[2] == ("| Norm | Recall | Chess 1e-4 | Chess 3e-4 | Chess 1e-3 | Sudoku 3e-4 | Sudoku 1e-3 "
                                  "| Sudoku 3e-3 |")
    assert "| gru | internal |" in md and "|  | external |" in md
    assert "Sudoku 1e-4 (val)" in tables.markdown(built[6]) and "Sudoku 3e-3 (hard)" in tables.markdown(built[6])


def test_entries_are_seed_means_with_sample_spread_and_seed_count():
    recs = [record("prefix-sums", "post", "external", 1e-4, s, v, h) for s, v, h in ((0, 10, 1), (1, 20, 2), (2, 40, 6))]
    recs += [record("prefix-sums", "post", "internal", 1e-4, s, v, 0) for s, v in ((0, 50), (1, 70))]
    t4, t5 = tables.build_tables(tables.collect(recs))
    md = tables.markdown(t4)
    assert "70.00 ± 0.00" not in md
    assert f"23.33 ± {math.sqrt(((10 - 70 / 3) ** 2 + (20 - 70 / 3) ** 2 + (40 - 70 / 3) ** 2) / 2):.2f} (3)" in md
    assert "60.00 ± 14.14 (2)" in md
    rows = {r["recall"]: r for r in csv.DictReader(io.StringIO(tables.csv_text(t5)))}
    assert rows["external"]["min"] == "1.0000" and rows["external"]["max"] == "6.0000"
    assert rows["external"]["values"] == "1.0000;2.0000;6.0000" and rows["internal"]["seeds"] == "2"
    assert rows["external"]["test_iterations"] == "500"
    tex = tables.latex(t4)
    assert r"23.33{\scriptsize$\pm$15.28}" in tex
    assert r"60.00{\scriptsize$\pm$14.14}\,(2)" in tex  # the seed count is shown where it differs from 3


def test_diverged_runs_count_as_zero_and_are_marked():
    recs = [record("chess", "pre", "external", 1e-3, 0, 30, 10),
            record("chess", "pre", "external", 1e-3, 1, 0, 0, status="diverged")]
    t4 = tables.build_tables(tables.collect(recs))[0]
    assert "15.00 ± 21.21 (2)†" in tables.markdown(t4)
    assert "diverged runs, counted as 0" in tables.markdown(t4)
    assert r"15.00{\scriptsize$\pm$21.21}$^\dagger$" in tables.latex(t4)
    assert next(csv.DictReader(io.StringIO(tables.csv_text(t4))))["diverged"] == "1"


def test_records_of_one_cell_that_differ_in_another_option_are_refused():
    recs = [record("chess", "pre", "none", 1e-3, 0, 30, 10), record("chess", "pre", "none", 1e-3, 1, 30, 10, width=128)]
    with pytest.raises(ConfigError, match=r"differ in model.width \(256 vs 128\).*--where model.width=VALUE"):
        tables.collect(recs)
    kept = tables.filter_records(recs, ["model.width=128"])
    assert [r["config"]["model"]["width"] for r in kept] == [128]
    dup = [record("chess", "pre", "none", 1e-3, 0, 30, 10), record("chess", "pre", "none", 1e-3, 0, 20, 10)]
    with pytest.raises(ConfigError, match="have seed 0"):
        tables.collect(dup)


def test_seeds_whose_data_seed_follows_the_seed_are_one_cell_averaged():
    recs = [record("prefix-sums", "pre", "external", 1e-3, s, v, 0) for s, v in ((5, 40.0), (6, 60.0))]
    for r in recs:
        r["config"]["task"]["seed"] = r["config"]["train"]["seed"]  # the third edition's tie
    cells = tables.collect(recs)
    (cell,) = cells.values()
    assert sorted(cell.seeds) == [5, 6] and sum(cell.values["val"]) / 2 == pytest.approx(50.0)


def test_latex_tables_are_well_formed_booktabs():
    for t in tables.build_tables(tables.collect(paper_like())):
        tex = tables.latex(t)
        lines = tex.splitlines()
        spec = next(ln for ln in lines if ln.startswith(r"\begin{tabular}")).split("{")[2].rstrip("}")
        assert len(spec) == 2 + len(t.columns)
        body = lines[lines.index(r"\midrule") + 1: lines.index(r"\bottomrule")]
        data = [ln for ln in body if ln != r"\midrule"]
        assert len(data) == len(t.rows)
        assert all(ln.endswith(r" \\") and ln.count(" & ") == len(spec) - 1 for ln in data)
        assert tex.count("{") == tex.count("}") and r"\toprule" in tex and r"\end{table}" in tex


def test_tables_cli_refuses_a_foreign_json_file_in_one_line(tmp_path):
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "x.json").write_text(json.dumps({"hello": 1}))
    proc = run_cli("tables", tmp_path, check=False)
    assert proc.returncode == 2
    assert "not a sweep record" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "tables").exists()


# ---- figure data, rank correlations and the records export on synthetic records ---------------------------------
def analysed(norm, recall, lr, seed, hard, *, conv, rho_J=None, rho_Wx=None, grad=None, val=None):
    """A record with an analysis summary on val and hard (conv = converged share; rho_J None: undefined)."""
    rec = record("prefix-sums", norm, recall, lr, seed, hard if val is None else val, hard, T=60)
    rec["cell_id"] = f"ps-{recall}-{norm}-lr{lr:g}-s{seed}"
    block = {"samples": 4, "converged_fraction": conv, "status_counts": {}, "nfe_median": 10.0, "rho_J_median": rho_J,
             "rho_J_median_all": rho_J, "sigma_max_median": None, "rho_M_median": rho_J, "prop4_max_abs_diff": None,
             "rho_Wx": rho_Wx, "input_grad_norm_median": grad, "distinct_fixed_points": 4 if conv else 0,
             "fixed_point_distance_max": None, "accuracy_at_fixed_point": None}
    rec["analysis"] = {"val": dict(block), "hard": dict(block)}
    rec["stability"] = {"source": "analyze", "split": "val", "rho_Wx": rho_Wx, "rho_J_median": rho_J,
                        "converged_fraction": conv, "input_grad_norm_median": grad, "samples": 4}
    rec["final"]["val"]["position_accuracy"] = 0.9
    rec["final"]["hard"]["position_accuracy"] = 0.8
    return rec


def synthetic_grid():
    """Twelve looped runs over two seeds with known predictors, two of them without a converged sample, one
    diverged, one fixed-depth baseline."""
    recs = []
    spec = [  # norm, recall, lr, hard (seed 0), conv, rho_J, rho_Wx, grad
        ("post", "external", 1e-3, 90.0, 1.0, 0.30, 0.5, 3.0),
        ("post", "internal", 1e-3, 70.0, 1.0, 0.50, 0.7, 2.0),
        ("pre", "external", 1e-3, 60.0, 0.75, 0.70, 0.9, 5.0),
        ("pre", "internal", 3e-3, 20.0, 0.25, 0.95, 1.2, 9.0),
        ("pre", "none", 1e-3, 0.0, 0.0, None, None, None),
        ("gru", "external", 3e-3, 40.0, 0.0, None, 1.4, None),
    ]
    for seed in (0, 1):
        for norm, recall, lr, hard, conv, rho_J, rho_Wx, grad in spec:
            bump = 5.0 * seed if hard else 0.0
            recs.append(analysed(norm, recall, lr, seed, hard + bump, conv=conv, rho_J=rho_J, rho_Wx=rho_Wx,
                                 grad=None if grad is None else grad + seed))
    recs.append(record("prefix-sums", "none", "external", 1e-2, 0, 0, 0, status="diverged", T=60))
    recs[-1]["cell_id"] = "ps-external-none-lr1e-2-s0"
    recs.append(record("prefix-sums", "post", "fixed", 1e-3, 0, 50, 30, T=60))
    recs[-1]["cell_id"] = "ps-fixed-post-lr1e-3-s0"
    return recs


def test_figures_keep_runs_without_a_converged_sample_in_a_marked_strip_and_list_the_rest():
    from stability.sweep import figures

    recs = synthetic_grid()
    six = figures.figure6_rho_J_data(recs)
    strip = [m for p in six["panels"].values() for m in p["missing"] if m["reason"] == figures.NO_CONVERGED]
    # every looped run that trained but never converged is in the drawn data (4: two configs × two seeds)
    assert sorted(m["cell_id"] for m in strip) == sorted(
        [f"ps-none-pre-lr0.001-s{s}" for s in (0, 1)] + [f"ps-external-gru-lr0.003-s{s}" for s in (0, 1)])
    drawn = sum(len(p["points"]) + len(p["missing"]) for p in six["panels"].values())
    assert drawn == 13  # 12 analysed looped runs + the diverged one; the fixed-depth baseline has no loop map
    assert "4 run(s) with no converged probe sample" in six["caption"]
    assert "1 diverged run(s) not drawn (ps-external-none-lr1e-2-s0)" in six["caption"]

    seven = figures.accuracy_scatter_data([r for r in map(typed, recs) if figures._looped(r)], "rho_J_median")
    assert len(seven["points"]) == 8 and len(seven["missing"]) == 5
    gru = [m for m in seven["missing"] if m["cell_id"] == "ps-external-gru-lr0.003-s1"][0]
    assert gru["reason"] == figures.NO_CONVERGED and gru["hard"] == 45.0  # its accuracy is plotted, in the strip

    new = figures.hard_vs_fixed_point_data(recs)
    assert len(new["points"]) == 12 and [m["cell_id"] for m in new["missing"]] == ["ps-external-none-lr1e-2-s0"]
    assert sum(p["rho_J"] is None for p in new["points"]) == 4  # drawn in the ρ(J*) panel's strip


def test_result_figures_draw_every_run_and_carry_their_data(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from stability.sweep import figures

    recs = synthetic_grid()
    fig = figures.figure7_rho_J(recs)
    assert len(fig.stability_data["points"]) + len(fig.stability_data["missing"]) == 13
    ax = fig.axes[0]
    # both encodings have a legend: colour = recall (first legend, kept as an artist) and marker = norm
    titles = {leg.get_title().get_text() for leg in [ax.get_legend()] + [a for a in ax.artists]}
    assert {"colour: recall", "marker: norm"} <= titles
    assert "whole-answer" in ax.get_ylabel()
    strip_points = sum(len(c.get_offsets()) for c in ax.collections if len(c.get_offsets()) and
                       float(c.get_offsets()[0][0]) > max(p["x"] for p in fig.stability_data["points"]))
    assert strip_points == 4
    three = figures.figure3_by_recall(recs)
    labels = [t.get_text() for t in three.axes[1].get_legend().get_texts()]
    assert any(t.startswith("external: post, lr 0.001 (2/2 seeds)") for t in labels)
    assert any(t.startswith("fixed depth: post") for t in labels)
    assert figures.figure_hard_vs_fixed_point(recs) is not None


def test_rank_correlations_are_scipys_spearman_pooled_and_per_seed():
    from scipy.stats import spearmanr

    from stability.sweep import correlations

    recs = synthetic_grid()
    out = correlations.rank_correlations(recs)
    assert out["runs"] == 12 and out["seeds"] == [0, 1]
    rows = correlations.predictor_table(recs)
    hard = [r["hard"] for r in rows]
    # ρ(J*): an undefined value (no converged sample) ranks above every measured one
    rho_J = [math.inf if r["rho_J"] is None or r["rho_J"] == math.inf else r["rho_J"] for r in rows]
    assert out["predictors"]["rho_J"]["pooled"]["rho"] == pytest.approx(spearmanr(rho_J, hard).statistic, abs=1e-12)
    assert out["predictors"]["rho_J"]["pooled"]["n"] == 12
    assert out["predictors"]["rho_J"]["undefined_runs"] == 4
    conv = [r["converged_share"] for r in rows]
    assert out["predictors"]["converged_share"]["pooled"]["rho"] == pytest.approx(spearmanr(conv, hard).statistic)
    # ‖dx*/dx0‖ and ρ(W_x): runs without a value are left out (autonomous runs have no W_x)
    keep = [(r["input_grad_norm"], r["hard"]) for r in rows if r["input_grad_norm"] is not None]
    assert out["predictors"]["input_grad_norm"]["pooled"]["n"] == len(keep) == 8
    assert out["predictors"]["input_grad_norm"]["pooled"]["rho"] == pytest.approx(
        spearmanr(*zip(*keep)).statistic)
    wx = [(r["rho_Wx"], r["hard"]) for r in rows if r["rho_Wx"] is not None]
    assert out["predictors"]["rho_Wx"]["pooled"]["n"] == 10
    assert out["predictors"]["rho_Wx"]["pooled"]["rho"] == pytest.approx(spearmanr(*zip(*wx)).statistic)
    # per seed, and the spread over seeds
    per = []
    for s in (0, 1):
        sub = [r for r in rows if r["seed"] == s]
        res = spearmanr([r["converged_share"] for r in sub], [r["hard"] for r in sub]).statistic
        assert out["predictors"]["converged_share"]["by_seed"][str(s)]["rho"] == pytest.approx(res)
        per.append(res)
    p = out["predictors"]["converged_share"]
    assert p["seed_mean"] == pytest.approx(sum(per) / 2)
    assert p["seed_std"] == pytest.approx(abs(per[0] - per[1]) / math.sqrt(2))
    assert out["ranking"][0] in correlations.PREDICTORS and len(out["ranking"]) == 4
    md = correlations.markdown(out)
    assert "| median ρ(J*) |" in md and "seed 1" in md


def test_records_export_is_one_jsonl_line_and_one_csv_row_per_record(tmp_path):
    from stability.sweep import export

    recs = synthetic_grid()
    paths = export.write_records(recs, tmp_path)
    assert [p.name for p in paths] == ["records.jsonl", "records.csv"]
    back = export.read_jsonl(tmp_path / "records.jsonl")
    assert len(back) == len(recs) and sorted(r.cell_id for r in back) == sorted(r["cell_id"] for r in recs)
    rows = list(csv.DictReader((tmp_path / "records.csv").open()))
    assert len(rows) == len(recs)
    row = [r for r in rows if r["cell_id"] == "ps-internal-pre-lr0.003-s1"][0]
    assert float(row["hard_accuracy"]) == pytest.approx(0.25) and row["hard_rho_J_median"] == "0.95"
    assert row["hard_converged_fraction"] == "0.25" and row["val_position_accuracy"] == "0.9"
    gru = [r for r in rows if r["cell_id"] == "ps-external-gru-lr0.003-s0"][0]
    assert gru["hard_rho_J_median"] == ""  # undefined is empty, not 0
    # the deterministic view drops timings and host, keeps results
    rec = dict(recs[0], timing={"run_seconds": 1.0}, environment={"host": "a"}, finished_at="now")
    rec["analysis"]["val"]["timings_s"] = {"solve": 1.0}
    view = export.deterministic_view(rec)
    assert "timing" not in view and "environment" not in view and "timings_s" not in view["analysis"]["val"]
    assert view["final"] == recs[0]["final"]


def test_caption_says_one_seed_in_the_singular():
    recs = [record("prefix-sums", "post", "external", 1e-3, 0, 50, 20)]
    t4 = tables.build_tables(tables.collect(recs))[0]
    assert "over 1 seed (" in tables.markdown(t4) and "over 1 seeds" not in tables.markdown(t4)
    two = recs + [record("prefix-sums", "post", "external", 1e-3, 1, 60, 30)]
    assert "over 2 seeds (" in tables.markdown(tables.build_tables(tables.collect(two))[0])


def test_a_learning_rate_is_labelled_with_the_digits_that_give_it_back():
    """Column labels name the rate the runs used: 2.5e-3 stays 2.5e-3 (it printed 3e-3), in text and LaTeX."""
    from stability.sweep.tables import lr_latex, lr_text

    assert [lr_text(x) for x in (1e-3, 2.5e-3, 5e-3, 3e-4, 1e-2)] == ["1e-3", "2.5e-3", "5e-3", "3e-4", "1e-2"]
    assert lr_latex(2.5e-3) == "$2.5 \\times 10^{-3}$" and float(lr_text(2.5e-3)) == 2.5e-3
