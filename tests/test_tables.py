"""Tables 4-6 from sweep records: layout as the paper's, seed statistics, diverged runs, mixed settings refused.

These tests build records by hand (the layout and arithmetic are the subject); tests/test_sweep.py makes the
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
from stability.sweep.runner import RECORD_FORMAT, RECORD_SCHEMA


def record(task, norm, recall, lr, seed, val, hard, *, status="done", width=256, T=500):
    config = RunConfig(model=ModelConfig(recall=recall, norm=norm, width=width), task=TaskConfig(name=task),
                       train=TrainConfig(lr=lr, seed=seed))
    final = None if status == "diverged" else {
        s: {"test_iteration": T, "accuracy": a / 100, "curve": [a / 100] * 3} for s, a in (("val", val), ("hard", hard))}
    return {"format": RECORD_FORMAT, "schema_version": RECORD_SCHEMA, "id": f"{task}-{norm}-{recall}-{lr}-{seed}-{width}",
            "config": config.to_dict(), "status": status, "final": final}


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
    proc = subprocess.run([sys.executable, "-m", "stability", "tables", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "not a sweep record" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "tables").exists()
