"""The CPU replication reproduces: one cell of experiments/cpu-replication.toml rerun with
``stability sweep GRID --only CELL_ID`` gives the same record as the committed one — training, the final
evaluation and every non-analysis field bit for bit, and the analysis summary's numbers to 1e-6 relative. The
committed records were written before issue 12's last analysis routes (dense Jacobians by forward-mode columns,
ρ on dense J by ARPACK per matrix, σ_max by Lanczos on JᵀJ, A.8's solves in one batch): the same quantities by
other routes, equal to rounding or, for Krylov ρ, to its tolerance (docs/replication.md, "Reproducing").

The committed results (experiments/results/cpu-replication/records.jsonl) exist once the grid has been run on the
finished toolkit (docs/replication.md). Until then the committed-record comparison is skipped with its reason and
the second test holds the same property without them: the cell run twice gives two identical records. Identical
means :func:`stability.sweep.export.deterministic_view` equal: everything but timings, host and finish time.
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
@pytest.mark.skipif(not COMMITTED.exists(), reason="the replication's records are not committed yet "
                                                   "(experiments/results/cpu-replication/records.jsonl)")
def test_one_cell_rerun_reproduces_its_committed_record(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as the grid is run (its header); thread count changes sums
    committed = {r["cell_id"]: r for r in read_jsonl(COMMITTED)}
    assert CELL in committed, f"{COMMITTED} has no record of {CELL}"
    new, old = deterministic_view(rerun(tmp_path / "r", capsys)), deterministic_view(committed[CELL])
    assert old["final"]["hard"]["curve"] and old["analysis"]["val"]["samples"] == 4
    assert {k: v for k, v in new.items() if k != "analysis"} == {k: v for k, v in old.items() if k != "analysis"}
    differences = list(_differences(new["analysis"], old["analysis"]))
    assert not differences, differences[:5]


def _differences(a, b, where="analysis", rel=1e-6):
    """Where two JSON values differ: numbers beyond ``rel`` relative (or 1e-12 absolute), anything else at all."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            yield where, sorted(set(a) ^ set(b))
        for k in set(a) & set(b):
            yield from _differences(a[k], b[k], f"{where}.{k}", rel)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield where, (len(a), len(b))
        for i, (u, v) in enumerate(zip(a, b)):
            yield from _differences(u, v, f"{where}[{i}]", rel)
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if not (abs(a - b) <= max(1e-12, rel * max(abs(a), abs(b)))):
            yield where, (a, b)
    elif a != b:
        yield where, (a, b)


@pytest.mark.slow
def test_one_cell_run_twice_gives_identical_records(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    first = rerun(tmp_path / "a", capsys)
    second = rerun(tmp_path / "b", capsys)
    assert first["final"]["hard"]["curve"] and first["analysis"]["val"]["samples"] == 4
    assert deterministic_view(first) == deterministic_view(second)
