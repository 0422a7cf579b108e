"""A committed replication record reproduces on any machine where its hardware signature says the same bits are
possible (docs/replication.md, "What reproduces where").

``experiments/results/cpu-replication/pinned-records.jsonl`` holds every cell of experiments/cpu-replication.toml
run with ``--reproducible`` (every CPU kernel choice pinned, stability/hardware.py). Rerun the same way with
``stability sweep GRID --only CELL --reproducible``, it must give the same record bit for bit (apart from timings,
the environment and the finish time: :func:`stability.sweep.export.deterministic_view`) on any x86-64 CPU, Intel or
AMD, AVX2 or AVX-512, as long as the library versions in its signature are the installed ones; where they are
not, the test skips and says which version differs. One cell is rerun (about a minute); which one is a choice of
cost, any other gives its record the same way. The first edition's ``records.jsonl`` was made unpinned and before
records carried a signature: it reproduces only on the machine that made it, so it is not rerun here.
"""

import json
from pathlib import Path

import pytest

from stability import hardware
from stability.sweep import grid as gridlib
from stability.sweep.export import deterministic_view, read_jsonl
from tests.conftest import run_process

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "experiments" / "cpu-replication.toml"
PINNED = ROOT / "experiments" / "results" / "cpu-replication" / "pinned-records.jsonl"
#: a recall cell whose val and hard samples all converge (pinned: val 100 %, hard 1.5 %), so every analysis stage runs
#: on both splits, Prop. 4 on the hard split by its matrix-free route (n = 1,024: M = J on every probe, J's spectra)
CELL = "ps-external-post-lr1e-3-s0"


def test_every_pinned_record_is_a_cell_of_the_grid_and_says_it_was_pinned():
    cells = {c.cell_id: c for c in gridlib.load(GRID).cells}
    records = {r["cell_id"]: r for r in read_jsonl(PINNED)}
    assert set(records) == set(cells)  # the whole grid, one record per cell
    for cell_id, rec in records.items():
        assert rec["id"] == cells[cell_id].id and rec["options"]["reproducible"] is True
        sig = rec["environment"]["hardware"]
        assert sig["reproducible"] is True and sig["cpu_capability"] == "DEFAULT" and sig["threads"] == 1
        assert sig["mkldnn"] is False and sig["dispatch_env"]["MKL_CBWR"] == "COMPATIBLE"
    rec = records[CELL]
    assert rec["final"]["hard"]["curve"] and rec["analysis"]["val"]["converged_fraction"] > 0


@pytest.mark.slow
def test_a_pinned_rerun_of_the_cell_reproduces_its_pinned_record_bit_for_bit(tmp_path):
    committed = {r["cell_id"]: r for r in read_jsonl(PINNED)}[CELL]
    results = tmp_path / "r"
    proc = run_process("sweep", GRID, "--only", CELL, "--results", results, "--workers", "1", "--reproducible")
    assert f"[1/1] done     {CELL}" in proc.stdout, proc.stdout + proc.stderr
    rec = json.loads(next((results / "records").glob("*.json")).read_text())
    possible, why = hardware.same_bits_possible(committed["environment"]["hardware"], rec["environment"]["hardware"])
    if not possible:
        pytest.skip(f"the committed record cannot be matched bit for bit here: {why}")
    assert deterministic_view(rec) == deterministic_view(committed)
