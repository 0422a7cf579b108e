"""The CPU replication reproduces bit for bit: one cell of experiments/cpu-replication.toml rerun with
``stability sweep GRID --only CELL_ID`` gives the same record as the committed one (docs/replication.md,
"Reproducing": the committed analysis summaries were recomputed from the grid's checkpoints with the toolkit's
final analysis code, by the sweep's own call).

The second test holds the same property without the committed records: the cell run twice gives two identical
records. Identical means :func:`stability.sweep.export.deterministic_view` equal: everything but timings, host and
finish time.
"""

import json
from pathlib import Path

import pytest

from stability.sweep import grid as gridlib
from stability.sweep.export import deterministic_view, read_jsonl

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "experiments" / "cpu-replication.toml"
COMMITTED = ROOT / "experiments" / "results" / "cpu-replication" / "records.jsonl"
#: the cheapest cell with an analysis: autonomous, no norm, the lowest learning rate
CELL = "ps-none-none-lr1e-3-s0"


def rerun(results: Path, capsys) -> dict:
    """``stability sweep GRID --only CELL --results RESULTS`` in this process; the cell's record."""
    from stability.cli import main

    code = main(["sweep", str(GRID), "--only", CELL, "--results", str(results), "--workers", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"[1/1] done     {CELL}" in out or f"[1/1] diverged {CELL}" in out, out
    recs = [json.loads(p.read_text()) for p in (results / "records").glob("*.json")]
    assert [r["cell_id"] for r in recs] == [CELL]
    return recs[0]


def test_the_cell_is_in_the_grid():
    cells = {c.cell_id: c for c in gridlib.load(GRID).cells}
    assert CELL in cells and cells[CELL].config.model.recall == "none"


@pytest.mark.slow
def test_one_cell_rerun_reproduces_its_committed_record(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as the grid is run (its header); thread count changes sums
    committed = {r["cell_id"]: r for r in read_jsonl(COMMITTED)}
    assert CELL in committed, f"{COMMITTED} has no record of {CELL}"
    rec = rerun(tmp_path / "r", capsys)
    assert committed[CELL]["final"]["hard"]["curve"] and committed[CELL]["analysis"]["val"]["samples"] == 4
    assert deterministic_view(rec) == deterministic_view(committed[CELL])


@pytest.mark.slow
def test_one_cell_run_twice_gives_identical_records(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    first = rerun(tmp_path / "a", capsys)
    second = rerun(tmp_path / "b", capsys)
    assert first["final"]["hard"]["curve"] and first["analysis"]["val"]["samples"] == 4
    assert deterministic_view(first) == deterministic_view(second)
