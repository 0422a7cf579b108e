"""Sweeps: grid expansion and validation, a killed sweep resumed, the SLURM path through submitit's local executor,
and the tables and figures of a small real sweep on the CPU."""

import csv
import json
import math
import os
import statistics
import sys
from pathlib import Path

import pytest

from stability.errors import ConfigError
from stability.sweep import grid as gridlib
from tests.conftest import ROOT, kill_when_ready, run_cli, toml_value


TINY = {
    "task": {"name": "prefix-sums", "train_size": 200, "val_size": 50, "hard_size": 50, "train_length": 8,
             "hard_length": 10},
    "model": {"width": 16, "heads": 2},
    "train": {"epochs": 6, "batch_size": 25, "iterations": 6, "warmup_epochs": 1, "test_iterations": 10,
              "eval_batch_size": 100, "device": "cpu", "monitor_samples": 4},
}


def write_grid(path: Path, *, fixed=None, axes=None, name=None, extra="") -> Path:
    lines = [f'name = "{name or path.stem}"']
    for table, sections in (("fixed", fixed or {}), ("axes", axes or {})):
        for section, options in sections.items():
            lines.append(f"[{table}.{section}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in options.items()]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def tiny_fixed(**overrides):
    fixed = {s: dict(v) for s, v in TINY.items()}
    for key, value in overrides.items():
        section, name = key.split("__")
        fixed[section][name] = value
    return fixed


SWEPT = tiny_fixed(model__norm="pre", train__lr=3e-3)  # the options of the killed-and-resumed sweep


def cli(*args, check=True, timeout=600):
    return run_cli(*args, check=check, timeout=timeout)


# ---- grid expansion and validation --------------------------------------------------------------------------
def test_grid_expands_the_product_of_its_axes_with_stable_unique_ids(tmp_path):
    axes = {"model": {"recall": ["internal", "external", "none"], "norm": ["pre", "post"]},
            "train": {"lr": [1e-4, 1e-3], "seed": [0, 1, 2]}}
    fixed = tiny_fixed()
    g = gridlib.load(write_grid(tmp_path / "g.toml", fixed=fixed, axes=axes))
    assert len(g) == 3 * 2 * 2 * 3
    assert len({c.id for c in g.cells}) == len(g)
    combos = {(c.config.model.recall, c.config.model.norm, c.config.train.lr, c.config.train.seed) for c in g.cells}
    assert len(combos) == len(g)
    # fixed options reach every cell; axes are applied in file order
    assert all(c.config.task.train_length == 8 and c.config.model.width == 16 for c in g.cells)
    first = g.cells[0]
    assert (first.config.model.recall, first.config.model.norm, first.config.train.lr) == ("internal", "pre", 1e-4)
    assert first.id.startswith("prefix-sums_internal_pre_lr1e-4_seed0--")
    # the same file expands to the same ids; a different fixed option gives different ids
    assert [c.id for c in gridlib.load(tmp_path / "g.toml").cells] == [c.id for c in g.cells]
    fixed["model"]["width"] = 32
    g2 = gridlib.load(write_grid(tmp_path / "g2.toml", fixed=fixed, axes=axes))
    assert {c.id for c in g2.cells}.isdisjoint({c.id for c in g.cells})
    assert gridlib.cell_id(first.axes, first.config) == first.id


def test_cells_have_short_readable_ids_unique_within_the_grid(tmp_path):
    g = gridlib.load(write_grid(tmp_path / "g.toml", fixed=tiny_fixed(),
                                axes={"model": {"norm": ["pre", "post"], "recall": ["external", "fixed"]},
                                      "train": {"lr": [1e-3, 3e-4], "seed": [0, 1]}}))
    names = [c.cell_id for c in g.cells]
    assert len(set(names)) == len(g) == 16
    assert names[0] == "ps-external-pre-lr1e-3-s0" and "ps-fixed-post-lr3e-4-s1" in names
    # recall, norm, lr and seed are named even when fixed; other axes follow as name + value
    one = gridlib.load(write_grid(tmp_path / "w.toml", fixed=tiny_fixed(), axes={"model": {"mlp_ratio": [2, 4]}}))
    assert [c.cell_id for c in one.cells] == ["ps-external-post-lr1e-4-s0-mlpratio2",
                                              "ps-external-post-lr1e-4-s0-mlpratio4"]
    # two included grids that differ only in a fixed option would collide: a hash suffix tells them apart
    write_grid(tmp_path / "a.toml", fixed=tiny_fixed(), axes={"train": {"seed": [0]}})
    write_grid(tmp_path / "b.toml", fixed=tiny_fixed(model__width=32), axes={"train": {"seed": [0]}})
    (tmp_path / "top.toml").write_text('include = ["a.toml", "b.toml"]\n')
    both = gridlib.load(tmp_path / "top.toml").cells
    assert len({c.cell_id for c in both}) == 2
    assert all(c.cell_id.startswith("ps-external-post-lr1e-4-s0-") and len(c.cell_id.rsplit("-", 1)[1]) == 6
               for c in both)
    assert gridlib.find_cells(g.cells, [names[3], g.cells[5].id]) == [g.cells[3], g.cells[5]]
    with pytest.raises(ConfigError, match="--only nope: no such cell in GRID; `stability sweep GRID --list`"):
        gridlib.find_cells(g.cells, ["nope"])


@pytest.mark.parametrize("text", ["", 'name = "x"\ndescription = "nothing"\n', "[fixed]\n[axes]\n"])
def test_a_grid_without_cells_is_an_error_not_one_full_size_run(tmp_path, text):
    path = tmp_path / "empty.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="the grid defines no cells"):
        gridlib.load(path)


def test_sweep_list_only_and_results_checks_are_one_line_errors_before_any_work(tmp_path, capsys):
    from stability.cli import main

    grid = write_grid(tmp_path / "g.toml", fixed=tiny_fixed(), axes={"train": {"seed": [0, 1]}})
    assert main(["sweep", str(grid), "--results", str(tmp_path / "r"), "--list"]) == 0
    out = capsys.readouterr().out
    assert "todo     ps-external-post-lr1e-4-s0  prefix-sums_seed0--" in out
    assert main(["sweep", str(grid), "--results", str(tmp_path / "r"), "--only", "ps-nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"--only ps-nope: no such cell in {grid}; `stability sweep {grid} --list` shows the cell ids")
    assert len(err.splitlines()) == 1
    (tmp_path / "file").write_text("x")
    assert main(["sweep", str(grid), "--results", str(tmp_path / "file" / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--results" in err and "is a file, not a directory" in err and len(err.splitlines()) == 1
    assert main(["sweep", str(grid), "--results", str(tmp_path / "file")]) == 2
    assert "is a file, expected a directory" in capsys.readouterr().err
    # nothing timed yet: the estimate says so instead of 0.00 device-hours
    assert main(["sweep", str(grid), "--results", str(tmp_path / "r"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "estimated total: unknown: no finished run" in out and "0.00" not in out
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("text, message", [
    ('nmae = "x"\n', "grid: unknown key(s) nmae; allowed: name, description, include, fixed, axes, slurm"),
    ('[fixed.trian]\nlr = 1\n', "fixed: unknown key(s) trian; allowed: model, task, train"),
    ('[axes.train]\nlearning_rate = [1e-3]\n', "axes.train: unknown key(s) learning_rate; allowed: method, lr"),
    ('[axes.model]\nnorm = ["pre", "sandwich"]\n', "ModelConfig.norm: 'sandwich' is not allowed; allowed: none"),
    ('[axes.train]\nlr = []\n', "axes.train.lr: expected a non-empty list"),
    ('[axes.train]\nseed = [0, 0]\n', "axes.train.seed: repeated value"),
    ('[fixed.train]\nlr = 1e-3\n[axes.train]\nlr = [1e-3]\n', "train.lr is both fixed and an axis"),
    ('[slurm]\npartitoin = "gpu"\n', "slurm: unknown key(s) partitoin; allowed: partition, timeout_min"),
    ('[axes.train\n', "not valid TOML"),
])
def test_grid_refuses_unknown_keys_and_bad_values_naming_the_allowed_ones(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        gridlib.load(path)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_grid_includes_are_a_union_with_fixed_overrides_and_no_cycles(tmp_path):
    write_grid(tmp_path / "a.toml", fixed=tiny_fixed(), axes={"train": {"seed": [0, 1]}},
               extra='[slurm]\ntimeout_min = 30\n')
    write_grid(tmp_path / "b.toml", fixed=tiny_fixed(), axes={"model": {"recall": ["none", "fixed"]}})
    top = tmp_path / "top.toml"
    top.write_text('include = ["a.toml", "b.toml"]\n[fixed.train]\nepochs = 3\n')
    g = gridlib.load(top)
    assert len(g) == 4 and all(c.config.train.epochs == 3 for c in g.cells)
    assert [c.slurm.get("timeout_min") for c in g.cells] == [30, 30, None, None]
    clash = tmp_path / "clash.toml"
    clash.write_text('include = ["a.toml"]\n[fixed.train]\nseed = 5\n')
    with pytest.raises(ConfigError, match="train.seed is an axis here but fixed by the including grid"):
        gridlib.load(clash)
    (tmp_path / "loop.toml").write_text('include = ["loop.toml"]\n')
    with pytest.raises(ConfigError, match="cycle"):
        gridlib.load(tmp_path / "loop.toml")


def test_paper_grid_is_the_papers_600_runs_and_the_smoke_grid_is_small():
    g = gridlib.load(ROOT / "experiments" / "paper.toml")
    assert len(g) == 600
    by_task = {}
    for c in g.cells:
        by_task.setdefault(c.config.task.name, []).append(c)
    assert {t: len(v) for t, v in by_task.items()} == {"chess": 180, "sudoku": 240, "prefix-sums": 180}
    for task, cells in by_task.items():
        lrs = sorted({c.config.train.lr for c in cells})
        assert lrs == ([1e-4, 3e-4, 1e-3, 3e-3] if task == "sudoku" else [1e-4, 3e-4, 1e-3])
        assert {c.config.model.norm for c in cells} == {"none", "pre", "post", "peri", "gru"}
        assert {c.config.model.recall for c in cells} == {"internal", "external", "none", "fixed"}
        assert {c.config.train.seed for c in cells} == {0, 1, 2}
        assert all(c.config.train.epochs == 100 and c.config.train.batch_size == 500
                   and c.config.train.iterations == 30 and c.config.train.test_iterations == 500
                   and c.config.model.width == 256 for c in cells)
    assert {len(gridlib.load(ROOT / "experiments" / f"paper-{t}.toml")) for t in ("chess", "prefix-sums")} == {180}
    smoke = gridlib.load(ROOT / "experiments" / "smoke.toml")
    assert 0 < len(smoke) <= 40 and all(c.config.train.device == "cpu" for c in smoke.cells)
    # the first GPU slice: prefix sums, all five norms, external and internal recall, lr 1e-4, one seed
    first = gridlib.select(g.cells, ["task.name=prefix-sums", "train.lr=1e-4", "model.recall=external,internal",
                                     "train.seed=0"])
    assert len(first) == 10 and {c.config.model.norm for c in first} == {"none", "pre", "post", "peri", "gru"}


def test_replication_grid_is_the_papers_norms_and_recalls_at_three_rates_five_seeds_and_the_baseline():
    """The second edition (docs/replication.md): 4 norms x 3 recalls x 3 rates x 5 seeds + the 15-block
    baseline x 4 norms x 3 rates x 2 seeds; val is every 10-bit string not trained on."""
    g = gridlib.load(ROOT / "experiments" / "replication.toml")
    looped = [c for c in g.cells if c.config.model.recall != "fixed"]
    fixed = [c for c in g.cells if c.config.model.recall == "fixed"]
    assert (len(g), len(looped), len(fixed)) == (4 * 3 * 3 * 5 + 4 * 3 * 2, 180, 24)
    assert {c.config.model.norm for c in g.cells} == {"pre", "peri", "post", "gru"}
    assert {c.config.model.recall for c in looped} == {"internal", "external", "none"}
    assert sorted({c.config.train.lr for c in g.cells}) == [1e-3, 2.5e-3, 5e-3]
    assert {c.config.train.seed for c in looped} == set(range(5)) and {c.config.train.seed for c in fixed} == {0, 1}
    c = g.cells[0].config
    assert (c.task.train_length, c.task.train_size, c.task.val_size, c.task.hard_length) == (10, 800, 224, 40)
    assert c.task.train_size + c.task.val_size == 2 ** c.task.train_length
    assert (c.train.iterations, c.train.test_iterations, c.train.warmup_epochs, c.train.cooldown_at) == (10, 100, 4, 0.6)
    assert c.train.monitor_every == 8 and fixed[0].config.model.depth == 15
    assert g.summary["analyze_geometry"] is True and g.summary["reproducible"] is True
    assert "ps-external-pre-lr2.5e-3-s0" in {c.cell_id for c in g.cells}


@pytest.mark.parametrize("text, message", [
    ("[summary]\nsamples = 3\n", "summary: unknown key(s) samples; allowed: summary, analyze_samples"),
    ("[summary]\nanalyze_splits = \"all\"\n", "summary.analyze_splits: 'all' is not allowed; allowed: val, hard, both"),
    ("[summary]\nanalyze_samples = -1\n", "summary.analyze_samples: -1 is outside [0, 10000000]"),
])
def test_grid_summary_table_is_validated(tmp_path, text, message):
    path = write_grid(tmp_path / "g.toml", fixed=tiny_fixed(), extra=text)
    with pytest.raises(ConfigError) as err:
        gridlib.load(path)
    assert message in str(err.value)


def test_sweep_cli_errors_are_one_line_with_exit_status_2(tmp_path):
    good = write_grid(tmp_path / "g.toml", fixed=tiny_fixed())
    bad = tmp_path / "bad.toml"
    bad.write_text('[fixed.model]\nwidht = 3\n')
    overlap = tmp_path / "overlap.toml"  # 8-bit strings: 100 + 200 cannot be distinct, so val would hold train strings
    overlap.write_text('[fixed.task]\nname = "prefix-sums"\ntrain_size = 100\nval_size = 200\ntrain_length = 8\n')
    cases = [
        (["sweep", bad, "--dry-run"], "unknown key(s) widht; allowed: recall, norm, width"),
        (["sweep", tmp_path / "missing.toml"], "no such grid file"),
        (["sweep", overlap, "--results", tmp_path / "r"], "do not fit in the 256 strings of train_length 8 bits"),
        (["sweep", good, "--results", tmp_path / "r", "--gpus", "64"], "--gpus 64: only"),
        (["sweep", good, "--workers", "2", "--gpus", "1"], "with --gpus N there is one worker per GPU"),
        (["sweep", good, "--where", "train.learning_rate=1"], "unknown option 'learning_rate'; allowed: method"),
        (["tables", tmp_path / "nowhere"], "no such results directory"),
    ]
    for args, message in cases:
        proc = cli(*args, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


# ---- a real sweep, killed and resumed ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """A 4-cell sweep (recall external / none × seeds 0, 1) killed (SIGKILL to its process group) while a cell
    is in flight, then run again with two workers."""
    d = tmp_path_factory.mktemp("sweep")
    grid = write_grid(d / "grid.toml", fixed=SWEPT, axes={"model": {"recall": ["external", "none"]},
                                                                 "train": {"seed": [0, 1]}})
    results = d / "results"
    cmd = [sys.executable, "-m", "stability", "sweep", str(grid), "--results", str(results), "--workers", "1",
           "--summary", "monitor"]

    def in_flight() -> list:
        return [p for p in (results / "runs").glob("*.pt") if not (results / "records" / f"{p.stem}.json").exists()]

    kill_when_ready(cmd, lambda: bool(list((results / "records").glob("*.json")) and in_flight()), deadline_s=240,
                    what="cell in flight")
    from stability import checkpoint as ckpt

    inflight = in_flight()
    killed_epochs = {p.stem: int(ckpt.read(p)["epoch"]) for p in inflight}
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (results / "records").glob("*.json")}
    second = cli("sweep", grid, "--results", results, "--workers", "2", "--summary", "monitor")
    return {"grid": grid, "results": results, "before": before, "killed_epochs": killed_epochs, "second": second}


@pytest.mark.slow
def test_a_killed_sweep_resumes_skipping_finished_cells_and_continuing_the_one_in_flight(resumed):
    results, before, killed = resumed["results"], resumed["before"], resumed["killed_epochs"]
    assert 1 <= len(before) < 4 and killed
    out = resumed["second"].stdout
    assert f"{len(before)} done, {len(killed)} partly trained" in out
    records = {p.name: p for p in (results / "records").glob("*.json")}
    assert len(records) == 4
    for name, (data, mtime) in before.items():  # finished cells were not run again
        assert records[name].read_bytes() == data and records[name].stat().st_mtime_ns == mtime
    for cid, epoch in killed.items():  # the cell in flight continued from its own checkpoint
        rec = json.loads(records[f"{cid}.json"].read_text())
        assert rec["timing"]["resumed_from_epoch"] == epoch >= 1
        assert rec["epochs_completed"] == 6 and rec["status"] == "done"
    assert f"{4 - len(before)} done" in out.splitlines()[-1]
    # every cell's line but the last says the time left (wall time per finished cell × cells to go)
    lines = [line for line in out.splitlines() if line.startswith("[")]
    assert len(lines) == 4 - len(before)
    assert all(" left" in line for line in lines[:-1]) and " left" not in lines[-1]


@pytest.mark.slow
def test_records_hold_config_final_metrics_and_stability_summary(resumed):
    for path in (resumed["results"] / "records").glob("*.json"):
        rec = json.loads(path.read_text())
        assert rec["format"] == "stability-sweep-record" and rec["schema_version"] == 1
        assert rec["id"] == path.stem and rec["config"]["model"]["width"] == 16
        assert rec["axes"]["model.recall"] == rec["config"]["model"]["recall"]
        for split in ("val", "hard"):
            f = rec["final"][split]
            assert f["test_iteration"] == 10 and len(f["curve"]) == 10
            assert f["accuracy"] == f["curve"][-1] and 0.0 <= f["accuracy"] <= 1.0
            assert f["best_accuracy"] == max(f["curve"])
        s = rec["stability"]
        assert s["source"] == "monitor" and 0.0 <= s["converged_fraction"] <= 1.0
        if rec["config"]["model"]["recall"] == "external":
            assert s["rho_Wx"] > 0
        else:
            assert s["rho_Wx"] is None
        assert rec["timing"]["run_seconds"] > 0 and rec["environment"]["device"] == "cpu"
        assert 0 < rec["timing"]["cpu_seconds"] <= rec["timing"]["wall_seconds"] * (os.cpu_count() or 1)


@pytest.mark.slow
def test_dry_run_lists_cell_states_and_estimates_the_cost_of_the_rest(resumed):
    grid = write_grid(resumed["grid"].parent / "more.toml", fixed=SWEPT,
                      axes={"model": {"recall": ["external", "none"]}, "train": {"seed": [0, 1, 2]}})
    proc = cli("sweep", grid, "--results", resumed["results"], "--dry-run")
    out = proc.stdout
    assert "6 cells; 4 done, 0 partly trained, 2 not started" in out
    assert sum(line.strip().startswith("done ") for line in out.splitlines()) == 4
    times = [json.loads(p.read_text())["timing"]["run_seconds"] for p in (resumed["results"] / "records").glob("*.json")]
    mean = sum(times) / len(times)
    assert f"prefix-sums (looped): 2 runs × {mean:.1f} s/run (mean of 4 finished) = {2 * mean / 3600:.2f} h" in out
    assert "estimated total: " in out and "device-hours on cpu" in out
    assert len(list((resumed["results"] / "records").glob("*.json"))) == 4  # a dry run runs nothing


@pytest.mark.slow
def test_only_reruns_one_cell_from_scratch_showing_its_progress(resumed, capfd):
    from stability.cli import main

    results = resumed["results"]
    recs = {json.loads(p.read_text())["cell_id"]: p for p in (results / "records").glob("*.json")}
    assert sorted(recs) == ["ps-external-pre-lr3e-3-s0", "ps-external-pre-lr3e-3-s1", "ps-none-pre-lr3e-3-s0",
                            "ps-none-pre-lr3e-3-s1"]
    # a cell that ran in one go (a resumed one need not be bitwise equal to an uninterrupted run)
    name = sorted(n for n, p in recs.items() if json.loads(p.read_text())["timing"]["resumed_from_epoch"] == 0)[-1]
    before = json.loads(recs[name].read_text())
    code = main(["sweep", str(resumed["grid"]), "--results", str(results), "--only", name, "--summary", "monitor"])
    out = capfd.readouterr().out
    assert code == 0
    assert "4 cells, 1 selected" in out and f"[1/1] done     {name}" in out
    assert f"cpu0: {name}: training (6 epochs)" in out and f"cpu0: {name}: summary by the stability monitor" in out
    after = json.loads(recs[name].read_text())
    assert after["cell_id"] == name and after["finished_at"] >= before["finished_at"]
    assert after["timing"]["resumed_from_epoch"] == 0  # rerun from scratch, not resumed from the old checkpoint
    from stability.sweep.export import deterministic_view

    assert deterministic_view(after) == deterministic_view(before)  # the CPU is deterministic
    assert (results / "records.jsonl").exists() and len((results / "records.jsonl").read_text().splitlines()) == 4


@pytest.mark.slow
def test_quiet_sweep_prints_the_grid_state_and_the_summary_only(resumed, capfd):
    from stability.cli import main

    results = resumed["results"]
    name = sorted(json.loads(p.read_text())["cell_id"] for p in (results / "records").glob("*.json"))[0]
    code = main(["sweep", str(resumed["grid"]), "--results", str(results), "--only", name, "--summary", "monitor",
                 "--quiet"])
    out = capfd.readouterr().out.splitlines()
    assert code == 0 and len(out) == 3  # the grid's state, the files exported, the summary
    assert out[0].startswith("grid ") and "1 selected" in out[0] and out[1].startswith("4 records → ")
    assert out[2].startswith("summary: 1 done")


@pytest.mark.slow
def test_tables_of_a_real_sweep_are_the_seed_means_of_its_records(resumed, tmp_path):
    results = resumed["results"]
    proc = cli("tables", results, "--out", tmp_path / "tables")
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == [
        f"table{n}.{e}" for n in (4, 5) for e in ("csv", "md", "tex")]
    recs = [json.loads(p.read_text()) for p in (results / "records").glob("*.json")]
    for number, split in ((4, "val"), (5, "hard")):
        rows = list(csv.DictReader((tmp_path / "tables" / f"table{number}.csv").open()))
        assert {r["recall"] for r in rows} == {"external", "none"} and len(rows) == 2
        for row in rows:
            values = [100 * r["final"][split]["accuracy"] for r in recs
                      if r["config"]["model"]["recall"] == row["recall"]]
            assert int(row["seeds"]) == len(values) == 2
            assert math.isclose(float(row["mean"]), statistics.mean(values), abs_tol=1e-3)
            assert math.isclose(float(row["std"]), statistics.stdev(values), abs_tol=1e-3)
            md = (tmp_path / "tables" / f"table{number}.md").read_text()
            assert f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f} (2)" in md
        tex = (tmp_path / "tables" / f"table{number}.tex").read_text()
        assert r"\begin{tabular}{llr}" in tex and r"$3 \times 10^{-3}$" in tex and tex.count("{") == tex.count("}")
    assert "Table 4" in proc.stdout and "Prefix sums 3e-3" in proc.stdout


@pytest.mark.slow
def test_result_figures_of_a_real_sweep_are_written(resumed, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from stability.sweep.figures import results_figures

    skipped = []
    paths = results_figures(resumed["results"], tmp_path, log=skipped.append)
    stems = {p.stem for p in paths}
    # autonomous runs give Figure 3; external pre-norm runs give Figures 6 and 7 (ρ(W_x))
    assert {"fig3_accuracy_vs_iterations", "fig6_lr_vs_rho_Wx", "fig7_accuracy_vs_rho_Wx"} <= stems
    for p in paths:
        if p.stem == "correlations":
            continue
        assert p.stat().st_size > 1000
        assert p.read_bytes()[:4] in (b"\x89PNG", b"%PDF")
    assert len(stems - {"correlations"}) + len(skipped) == 7
    assert "correlations" in stems and "Spearman" in (tmp_path / "correlations.md").read_text()
    # the same through the CLI: stability figures --results DIR
    from tests.conftest import run_cli

    proc = run_cli("figures", "--results", resumed["results"], "--only", "results", "--out", tmp_path / "cli")
    assert "fig3_accuracy_vs_iterations.png" in proc.stdout
    assert (tmp_path / "cli" / "fig6_lr_vs_rho_Wx.pdf").exists()
    bad = run_cli("figures", "--only", "results", "--out", tmp_path / "cli2", check=False)
    assert bad.returncode == 2 and "needs --results" in bad.stderr


# ---- the SLURM path, through submitit's local executor -------------------------------------------------------
@pytest.mark.slow
def test_slurm_path_through_submitit_local_executor_with_analysis_and_a_diverged_run(tmp_path):
    grid = write_grid(tmp_path / "slurm.toml", fixed=tiny_fixed(model__recall="internal", model__norm="pre", train__epochs=3),
                      axes={"train": {"lr": [3e-3, 1e6]}}, extra="[slurm]\ntimeout_min = 20\n")
    results = tmp_path / "results"
    proc = cli("sweep", grid, "--results", results, "--executor", "slurm", "--cluster", "local",
               "--analyze-samples", "1", "--analyze-max-iter", "40")
    assert "summary: 1 diverged, 1 done" in proc.stdout
    logs = list((results / "submitit").glob("*_log.out"))
    assert len(logs) == 2  # two submitit jobs ran
    recs = {r["config"]["train"]["lr"]: r for r in map(lambda p: json.loads(p.read_text()),
                                                        (results / "records").glob("*.json"))}
    ok, bad = recs[3e-3], recs[1e6]
    assert bad["status"] == "diverged" and "non-finite" in bad["error"] and bad["final"] is None
    assert ok["status"] == "done" and ok["stability"]["source"] == "analyze"
    summary = ok["analysis"]["val"]
    assert summary["samples"] == 1 and summary["rho_Wx"] == ok["stability"]["rho_Wx"] > 0
    full = json.loads((results / "analysis" / f"{ok['id']}.json").read_text())
    assert full["val"]["recall"]["rho_Wx"] == summary["rho_Wx"]
    # a second submission finds nothing to do; the tables count the diverged run as 0 and mark it
    again = cli("sweep", grid, "--results", results, "--executor", "slurm", "--cluster", "local")
    assert "nothing to run" in again.stdout
    cli("tables", results)
    md = (results / "tables" / "table4.md").read_text()
    assert "0.00 (1)†" in md and "diverged runs, counted as 0" in md


def test_csv_has_the_later_stages_columns_only_where_some_record_has_them():
    """records.csv gains the repelling, e-dependence and geometry columns (and the last training accuracy) when a
    record carries them, and an older grid's CSV keeps its shape."""
    from stability.sweep.export import csv_columns, csv_row
    from tests.sweep.test_claims import SPLIT
    from tests.sweep.test_tables import record

    base = record("prefix-sums", "post", "external", 1e-3, 0, 10, 5)
    old = dict(base, analysis={"val": dict(SPLIT, converged_fraction=1.0)})
    new = dict(base, analysis={"val": dict(SPLIT, converged_fraction=1.0, repelling_found=2,
                                           geometry_median_radius=0.3)},
               curves={"epoch": [1, 2, 3], "loss": [0.3, 0.2, 0.1], "train_accuracy": [0.1, 0.5, None]})
    assert not any("repelling" in c or "geometry" in c or c == "train_accuracy_last" for c in csv_columns([old]))
    cols = csv_columns([old, new])
    assert {"val_repelling_found", "val_geometry_median_radius", "train_accuracy_last"} <= set(cols)
    assert "val_e_global_differ" not in cols          # no record has it
    row = csv_row(new)
    assert row["val_repelling_found"] == 2 and row["train_accuracy_last"] == 0.5
    assert csv_row(old)["val_repelling_found"] == ""


def test_a_readable_cell_id_names_the_learning_rate_it_runs(tmp_path):
    """A rate of two significant digits keeps them (2.5e-3 is "lr2.5e-3", not "lr3e-3"), so `--only` by a readable
    id runs the rate it names; one-digit rates read as before."""
    g = gridlib.load(write_grid(tmp_path / "g.toml", fixed=tiny_fixed(),
                                axes={"train": {"lr": [1e-3, 2.5e-3, 3e-3, 1.25e-2]}}))
    names = [c.cell_id for c in g.cells]
    assert names == ["ps-external-post-lr1e-3-s0", "ps-external-post-lr2.5e-3-s0", "ps-external-post-lr3e-3-s0",
                     "ps-external-post-lr1.25e-2-s0"]
    for c, lr in zip(g.cells, (1e-3, 2.5e-3, 3e-3, 1.25e-2)):
        assert c.config.train.lr == lr and float(c.cell_id.split("-lr")[1].rsplit("-s", 1)[0]) == lr


def _shipped_grids() -> list:
    """Every grid file in experiments/ (the claims file, format stability-claims, is not a grid)."""
    from stability.config import parse_toml

    return sorted(p.name for p in (ROOT / "experiments").glob("*.toml")
                  if parse_toml(p, str(p)).get("format") != "stability-claims")


@pytest.mark.parametrize("name", _shipped_grids())
def test_every_shipped_grid_passes_its_dry_run(name, tmp_path):
    """`stability sweep GRID --dry-run` succeeds for each grid in experiments/: a documented grid that the sweep
    refuses at once (smoke.toml's 200 + 50 strings of 4 bits, of which only 16 exist) cannot ship."""
    from tests.conftest import run_cli

    proc = run_cli("sweep", ROOT / "experiments" / name, "--dry-run", "--results", tmp_path / "r", check=False,
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "error" not in proc.stderr and not (tmp_path / "r").exists()


def test_the_shipped_grids_include_smoke_and_the_paper():
    assert {"smoke.toml", "paper.toml", "replication.toml"} <= set(_shipped_grids())
