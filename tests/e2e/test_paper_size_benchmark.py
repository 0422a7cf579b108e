"""benchmarks/paper_size.py's toy run (``--dry-run``): the checkpoint it makes is the trained one with W_x scaled
by the factor it reports, Picard converges on it where the benchmark says so, and the analysis it times is the
one whose JSON it read. Nothing is timed here (the numbers live in benchmarks/RESULTS.md)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT


@pytest.mark.slow  # a training run and an analysis as processes, ~15 s
def test_dry_run_makes_a_scaled_checkpoint_on_which_picard_converges_and_reports_its_stage_timings(tmp_path):
    out, report = tmp_path / "made", tmp_path / "paper-size.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "benchmarks/paper_size.py", "--dry-run", "--out", str(out), "--json",
                        str(report)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(report.read_text())
    made = result["made"]

    # the analysed file is the trained one with only W_x scaled, by the factor reported
    trained = torch.load(out / "tiny-trained.pt", weights_only=False)["model"]
    scaled = torch.load(made["checkpoint"], weights_only=False)["model"]
    assert set(trained) == set(scaled)
    for k, w in trained.items():
        expect = w * made["recall_scale"] if k == "recall_map.x.weight" else w
        assert torch.equal(scaled[k], expect), k

    (run,) = result["runs"]
    analysis = json.loads((out / "tiny-after-0.json").read_text())
    for split in ("val", "hard"):
        # Picard converges on every analysed sample, as the scaling promised
        assert analysis[split]["fixed_point"]["converged_fraction"] == 1.0
        assert made["picard_converged"][f"{made['recall_scale']}/{split}"] == "2/2"
        # the per-stage timings are the JSON's, of the stages that ran
        assert run["timings"][split] == analysis[split]["timings"]
        assert list(run["timings"][split]) == analysis[split]["stages"]
    assert run["wall_s"] >= sum(run["timings"]["val"].values())
