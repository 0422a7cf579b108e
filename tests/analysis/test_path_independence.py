"""Issue 38: stage ``path_independence``, the asymptotic alignment (AA) score of Anil et al. 2022, on hand-built maps
whose fixed points are known in closed form (numpy) or by an independent scalar computation (bisection), through
the LoopedModel contract."""


import numpy as np
import pytest
import torch
from torch import nn

import stability
from stability.analysis.options import ANALYZE_STAGES, DEFAULT_STAGES, AnalysisOptions
from stability.analysis.path_independence import derangement
from stability.sweep.record import SplitSummary
# LinearMap: x_{t+1} = A x_t + x0, x* = (I − A)⁻¹ x0 attracts when ρ(A) < 1; scalar_roots: the two-basin map's
# three roots by bisection (offset 0.1 = C)
from tests.analysis.test_repelling import LinearMap, scalar_roots

C = 0.1  # the offset of the two-basin map


class TwoBasins(nn.Module):
    """x_{t+1} = tanh(2 x_t + c) per coordinate, from e = x0: two attracting fixed points per coordinate
    (x⁻ < r < x⁺, r repelling); Picard from x goes to x⁺ where x > r, to x⁻ where x < r."""

    def embed(self, inputs):
        return inputs.to(torch.float64)

    def initial_state(self, x0, generator=None):
        return x0

    def step(self, x, x0):
        return torch.tanh(2 * x + C) + 0 * x0

    def readout(self, x):
        return torch.cat([x, -x], -1)


def _cos(a, b):
    a, b = np.ravel(a), np.ravel(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_the_restart_permutation_sends_every_sample_to_another_one():
    for n in (2, 3, 7, 32):
        sigma = derangement(n, torch.Generator().manual_seed(n)).tolist()
        assert sorted(sigma) == list(range(n)) and all(s != b for b, s in enumerate(sigma))


def test_a_contractive_map_is_path_independent_its_aa_score_is_one_from_every_restart():
    """x ↦ A x + x0 with ρ(A) = 0.35: every start reaches x* = (I − A)⁻¹ x0, so the cosine of the restarts' final
    states to x* is 1, as numpy's x* says (cos(x*, x*) = 1 up to the solve's τ)."""
    A = np.array([[0.3, 0.2, 0.0], [0.0, -0.35, 0.1], [0.05, 0.0, 0.2]])
    inputs = torch.tensor(np.random.default_rng(0).normal(size=(6, 3, 1)))
    o = AnalysisOptions(samples=6, stages=("path_independence",), tol=1e-13, max_iter=400)
    a = stability.analyze(LinearMap(A), inputs, options=o)
    block = a["inputs"]["path_independence"]
    assert block["starts"] == ["other", "noise"] and block["samples"] == 6 and block["max_iter"] == 400
    x_ref = np.linalg.solve(np.eye(3) - A, inputs[..., 0].numpy().T).T  # (I − A) x* = x0, per sample
    restarted = {s: np.array(block[s]["cosine"]) for s in ("other", "noise")}
    for b in range(6):  # every start reaches the closed-form x*: each score is the cosine of x* with itself
        for s in ("other", "noise"):
            assert restarted[s][b] == pytest.approx(_cos(x_ref[b], x_ref[b]), abs=1e-12)
    for s in ("other", "noise"):
        assert block[s]["converged_fraction"] == 1.0 and block[s]["median"] == pytest.approx(1.0, abs=1e-12)
    head = a.headline()["inputs"]
    assert head["path_aa_other_median"] == pytest.approx(1.0, abs=1e-12) and head["path_measured"] == 6
    assert SplitSummary(**head).to_dict() == head  # a sweep record holds the stage's headline as it is


def test_a_map_with_two_attracting_fixed_points_is_path_dependent_as_the_basins_say():
    """tanh(2x + c) per coordinate: x* from e takes x⁺ where x0 > r and x⁻ elsewhere; restarted from another
    input's x* (already a fixed point) it stays there, and from noise it takes the basin of each noise coordinate.
    The AA scores, their median and its order-statistic interval (n = 6: the smallest and largest score) match the
    cosines numpy computes from the bisection roots."""
    lo, r, hi = scalar_roots()
    signs = np.array([[1, 1, 1, 1], [-1, -1, -1, -1], [1, -1, 1, -1], [-1, 1, -1, 1], [1, 1, -1, -1],
                      [1, 1, 1, -1]], dtype=float)
    inputs = torch.tensor(0.5 * signs[..., None])  # e = x0 = ±0.5, on either side of r ≈ −0.05
    o = AnalysisOptions(samples=6, stages=("path_independence",), tol=1e-13, max_iter=500, seed=3)
    block = stability.analyze(TwoBasins(), inputs, options=o)["inputs"]["path_independence"]
    x_star = np.where(signs > 0, hi, lo)
    sigma = block["source"]
    assert sorted(sigma) == list(range(6)) and all(s != b for b, s in enumerate(sigma))
    other = [_cos(x_star[b], x_star[sigma[b]]) for b in range(6)]
    # the noise start as the stage draws it (its seed: the options'), each coordinate's basin by the root r
    gen = torch.Generator().manual_seed(3)
    torch.randperm(6, generator=gen)
    noise = torch.randn((6, 4, 1), generator=gen, dtype=torch.float64).numpy()[..., 0]
    from_noise = [_cos(x_star[b], np.where(noise[b] > r, hi, lo)) for b in range(6)]
    for start, ref in (("other", other), ("noise", from_noise)):
        np.testing.assert_allclose(block[start]["cosine"], ref, rtol=0, atol=1e-10)
        assert block[start]["median"] == pytest.approx(float(np.median(ref)), abs=1e-10)
        ci = block[start]["interval"]
        assert (ci["lo"], ci["hi"]) == (pytest.approx(min(ref), abs=1e-10), pytest.approx(max(ref), abs=1e-10))
        assert block[start]["mean"] == pytest.approx(float(np.mean(ref)), abs=1e-10)
    assert block["other"]["median"] < 0.5  # well below 1: the final state depends on the path


def test_one_sample_has_no_other_input_and_is_restarted_from_noise_only():
    o = AnalysisOptions(samples=1, stages=("path_independence",), tol=1e-12, max_iter=300)
    block = stability.analyze(LinearMap(np.eye(2) * 0.5), torch.ones(1, 2, 1), options=o)["inputs"]
    pi = block["path_independence"]
    assert pi["starts"] == ["noise"] and pi["source"] is None and "other" not in pi
    assert pi["noise"]["cosine"][0] == pytest.approx(1.0, abs=1e-12)  # x* = 2 · (1, 1) from every start


def test_the_stage_is_opt_in_and_an_analysis_without_it_has_no_aa_numbers():
    assert "path_independence" not in DEFAULT_STAGES and "path_independence" not in ANALYZE_STAGES
    assert "path_independence" not in AnalysisOptions().stages
    o = AnalysisOptions(samples=2, stages=("reachability",), tol=1e-12, max_iter=100)
    a = stability.analyze(LinearMap(np.eye(2) * 0.5), torch.ones(2, 2, 1), options=o)
    assert "path_independence" not in a["inputs"]
    assert not [k for k in a.headline()["inputs"] if k.startswith("path_")]


def test_the_second_edition_grid_analyses_as_before_and_the_grid_settings_turn_both_parts_on():
    """experiments/replication.toml's summary gives the AnalysisOptions its records were made with, field for field
    (written out here as they were before issue 38), and its record form has no new key; a grid that sets
    ``analyze_path_independence`` and ``analyze_drift`` adds the stage and the drifting status."""
    from stability.config import DEFAULT_STAGES as BEFORE_DEFAULT
    from stability.config import SweepSummary
    from stability.sweep import grid as gridlib
    from stability.sweep.runner import analysis_options
    from tests.conftest import ROOT

    summary = SweepSummary(**gridlib.load(ROOT / "experiments" / "replication.toml").summary)
    got = analysis_options(summary, 100, "cpu")
    before = AnalysisOptions(samples=4, max_iter=500, iterations=100, device="cpu", workers=1, geometry_samples=1,
                             geometry_pick="first",
                             stages=("reachability", "rho", "prop4", "rho_wx", "prop5", "input", "a8", "repelling",
                                     "accuracy", "geometry"))
    assert got == before and got.to_dict() == before.to_dict() and "drift" not in got.to_dict()
    assert BEFORE_DEFAULT + ("geometry",) == before.stages
    assert set(summary.to_record()) == {"summary", "analyze_samples", "analyze_splits", "analyze_max_iter",
                                        "reproducible", "analyze_geometry"}
    third = summary.replace(analyze_path_independence=True, analyze_drift=True)
    opts = analysis_options(third, 100, "cpu")
    assert "path_independence" in opts.stages and opts.drift is True
    assert third.to_record()["analyze_path_independence"] is True and third.to_record()["analyze_drift"] is True
    assert SweepSummary.from_record(third.to_record()) == third


def test_the_command_line_runs_the_stage_and_the_drift_test_where_named_and_refuses_a_wrong_name(small_checkpoint,
                                                                                                  tmp_path):
    """``--only path_independence --drift`` on the committed small checkpoint (its 4 hard samples converge): the
    options say so, the block is there, and every restart reaches x* again (cosine 1 to the solve's τ, 1e-5); a
    misspelt stage is one error line, exit 2."""
    import json

    from tests.conftest import run_process

    js = tmp_path / "a.json"
    run_process("analyze", small_checkpoint, "--split", "hard", "--samples", "4", "--max-iter", "150", "--only",
                "path_independence", "--drift", "--quiet", "--workers", "1", "--json", js)
    d = json.loads(js.read_text())
    assert d["options"]["drift"] is True and d["options"]["stages"] == ["reachability", "path_independence"]
    fp, pi = d["hard"]["fixed_point"], d["hard"]["path_independence"]
    assert fp["converged_fraction"] == 1.0 and fp["drift"]["power"] == [None] * 4
    for start in ("other", "noise"):
        assert pi[start]["converged_fraction"] == 1.0 and min(pi[start]["cosine"]) > 1 - 1e-5
    proc = run_process("analyze", small_checkpoint, "--only", "path", check=False)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "unknown stage 'path'" in err[0]
