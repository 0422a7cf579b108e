"""`stability analyze` as a real process: on a tiny trained checkpoint, on one that never converges, and on
files that are not checkpoints (one clear line, non-zero exit, nothing half-written)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stability.analysis.options import ANALYZE_STAGES, STAGES
from tests.conftest import run_cli

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
FAST = ["--samples", "2", "--max-iter", "150", "--iterations", "30", "--probes", "2", "--quiet"]


def stability(*args, timeout=300):
    return run_cli(*args, check=False, env=ENV, timeout=timeout)


@pytest.fixture(scope="session")
def tiny_checkpoint(small_checkpoint) -> Path:
    """The committed small checkpoint (width 16; val 16 strings of 32 bits, hard 16 of 16 bits)."""
    return small_checkpoint


def test_analyze_writes_text_json_and_plots_for_both_splits(tiny_checkpoint, tmp_path):
    js, plots = tmp_path / "report.json", tmp_path / "plots"
    proc = stability("analyze", tiny_checkpoint, "--split", "both", "--json", js, "--plots", plots, *FAST)
    assert proc.returncode == 0, proc.stderr
    assert "split: val" in proc.stdout and "split: hard" in proc.stdout
    assert "ρ(J*) median" in proc.stdout
    report_lines = [ln for ln in proc.stdout.splitlines() if not ln.startswith(("json: ", "plot: "))]
    assert max(map(len, report_lines)) <= 100, max(report_lines, key=len)  # no printed report line over 100
    report = json.loads(js.read_text())
    assert report["checkpoint"] == str(tiny_checkpoint)
    assert report["config"]["model"]["width"] == 16
    assert report["format"] == "stability-analysis" and report["schema_version"] == 3
    assert proc.stdout.index("VERDICT") < proc.stdout.index("split: val")
    for split in ("val", "hard"):
        block = report[split]
        assert report["verdict"][split] == block["verdict"]
        assert set(block["timings"]) == set(block["stages"]) == set(ANALYZE_STAGES)  # the opt-in stages not
        v = block["verdict"]
        assert v["numbers"]["converged_fraction"] == block["fixed_point"]["converged_fraction"]
        assert v["numbers"]["rho_J_median"] == block["jacobian"]["spectral_radius_median"]
        for axis in ("reachable", "input_dependent", "geometry"):
            assert f"{split:<6} {axis.replace('_', '-')}:" in proc.stdout
            assert v[axis] in ("yes", "no", "partly", "not measured")
        fp = block["fixed_point"]
        assert set(fp) >= {"converged_fraction", "status_counts", "nfe_median", "residual_median"}
        assert sum(fp["status_counts"].values()) == 2 and len(fp["status"]) == 2
        jac = block["jacobian"]
        assert len(jac["spectral_radius"]) == 2
        assert set(jac) >= {"spectral_radius_median", "sigma_max_median"}
        assert all(s >= r - 1e-9 for s, r in zip(jac["sigma_max"], jac["spectral_radius"]))  # σ_max ≥ ρ
        p4 = block["prop4"]
        assert len(p4["rho_M"]) == 2 and p4["max_abs_diff_vs_autograd"] < 1e-10
        # the assembled M and J are the same matrix: the same spectral radius
        assert all(abs(a - b) < 1e-6 for a, b in zip(p4["rho_M"], jac["spectral_radius"]))
        assert block["recall"]["rho_Wx"] > 0
        assert set(block["prop5"]) >= {"T", "rel_error", "gmres_residual"}
        assert "fixed_point_distance_max" in block["initial_iterate"]
        acc = block["accuracy"]
        assert acc["iterations"] == list(range(1, 31)) and len(acc["accuracy"]) == 30
        assert "at_fixed_point" in acc
        if fp["converged_fraction"] > 0:
            assert block["prop5"]["rel_error"][-1] < block["prop5"]["rel_error"][0]
    for name in ("residuals", "eigenvalues", "accuracy", "prop5"):
        png = plots / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_eigensolver_routes_agree_and_the_report_names_the_route(tiny_checkpoint, tmp_path):
    """At this state size (n = 512) the default analysis builds every sample's dense J for stage prop4 and takes ρ
    by ARPACK on each dense matrix; without stage prop4 (--only rho) ρ comes matrix-free, Krylov–Schur on Jᵀ with
    float32 products certified in float64. The two agree."""
    out = {}
    for route, flags in (("dense", []), ("krylov", ["--only", "rho"])):
        js = tmp_path / f"{route}.json"
        proc = stability("analyze", tiny_checkpoint, "--split", "val", "--json", js, *flags, *FAST)
        assert proc.returncode == 0, proc.stderr
        out[route] = json.loads(js.read_text())["val"]["jacobian"]
    dense, krylov = out["dense"]["method"], out["krylov"]["method"]
    assert dense.startswith("dense Jacobian (n = 512") and "ARPACK on each dense J" in dense
    assert krylov.startswith("Krylov–Schur on Jᵀ") and "certified by float64" in krylov
    assert all(out["dense"]["eigen_converged"]) and all(out["krylov"]["eigen_converged"])
    assert all(abs(a - b) < 1e-5 for a, b in zip(out["dense"]["spectral_radius"], out["krylov"]["spectral_radius"]))
    assert all(abs(a - b) < 1e-5 for a, b in zip(out["dense"]["sigma_max"], out["krylov"]["sigma_max"]))


def test_a_checkpoint_that_never_converges_still_gets_its_report(tiny_checkpoint, tmp_path):
    """Turn the trained model into an unnormalised one with blown-up sublayers: iteration runs away."""
    obj = torch.load(tiny_checkpoint, weights_only=True)
    obj["config"]["model"]["norm"] = "none"
    state = {k: v for k, v in obj["model"].items() if "post_norm" not in k}
    for key in ("block.attn.out.weight", "block.mlp.proj.weight"):
        state[key] = state[key] * 40
    obj["model"] = state
    bad = tmp_path / "runaway.pt"
    torch.save(obj, bad)
    js = tmp_path / "runaway.json"
    proc = stability("analyze", bad, "--split", "val", "--json", js, *FAST)
    assert proc.returncode == 0, proc.stderr
    block = json.loads(js.read_text())["val"]
    fp = block["fixed_point"]
    assert fp["converged_fraction"] == 0.0
    assert fp["status_counts"]["converged"] == 0
    assert all(s in ("diverged", "non-finite", "stalled", "max-iterations") for s in fp["status"])
    assert block["prop5"]["rel_error"] == [] and "no sample converged" in block["prop5"]["skipped"]
    assert block["jacobian"]["spectral_radius_median"] is None
    assert "converged" in proc.stdout and "0.0%" in proc.stdout


def _assert_one_line_error(proc, *fragments):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_missing_corrupt_and_foreign_files_fail_with_one_line(tiny_checkpoint, tmp_path):
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(tiny_checkpoint.read_bytes()[:2000])
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint\n")
    cases = [(tmp_path / "missing.pt", "no such file"), (truncated, "corrupt"), (foreign, "foreign"),
             (text, "notes.pt")]
    for path, fragment in cases:
        js = tmp_path / f"{path.stem}.json"
        proc = stability("analyze", path, "--json", js, *FAST)
        _assert_one_line_error(proc, "stability analyze: error:", fragment)
        assert not js.exists()


def test_a_fixed_depth_baseline_is_refused(tiny_checkpoint, tmp_path):
    from stability.config import ModelConfig, from_dict
    from stability.model import build_model

    obj = torch.load(tiny_checkpoint, weights_only=True)
    obj["config"]["model"]["recall"] = "fixed"
    obj["config"]["model"]["depth"] = 2
    obj["model"] = build_model(from_dict(ModelConfig, obj["config"]["model"])).state_dict()
    path = tmp_path / "baseline.pt"
    torch.save(obj, path)
    _assert_one_line_error(stability("analyze", path, *FAST), "fixed-depth baseline has no loop map")


def test_bad_flags_and_an_absent_gpu_give_one_line(tiny_checkpoint):
    _assert_one_line_error(stability("analyze", tiny_checkpoint, "--samples", "0"), "positive integer")
    _assert_one_line_error(stability("analyze", tiny_checkpoint, "--split", "train"), "invalid choice")
    _assert_one_line_error(stability("analyze", tiny_checkpoint, "--eig-precision", "half"), "invalid choice")
    _assert_one_line_error(stability("analyze", tiny_checkpoint, "--geometry-accuracy", "1"), "--geometry-accuracy",
                           "a number in (0, 1)")
    _assert_one_line_error(stability("analyze", tiny_checkpoint, "--eig-route", "arnoldi"), "unrecognized")
    proc = stability("analyze", tiny_checkpoint, "--device", "cuda", "--split", "val", *FAST)
    if torch.cuda.is_available():
        assert proc.returncode == 0, proc.stderr
    else:
        _assert_one_line_error(proc, "no CUDA device")


def test_device_auto_runs_where_it_can_and_names_that_device_in_the_json(tiny_checkpoint, tmp_path):
    """analyze and halt take the device names train takes: auto (cuda when available) is resolved before the work
    and recorded as the device used; cuda:N beyond the machine's devices, or a name that is none, is one line."""
    js = tmp_path / "auto.json"
    proc = stability("analyze", tiny_checkpoint, "--device", "auto", "--split", "val", "--json", js, *FAST)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(js.read_text())["options"]["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    beyond = f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 1}"
    out = tmp_path / "never.json"
    proc = stability("analyze", tiny_checkpoint, "--device", beyond, "--json", out, *FAST)
    _assert_one_line_error(proc, f"device {beyond}")
    assert not out.exists()
    _assert_one_line_error(stability("analyze", tiny_checkpoint, "--device", "tpu", *FAST),
                           "expected auto, cpu, cuda or cuda:N")
    proc = stability("halt", tiny_checkpoint, "--device", "auto", "--samples", "4", "--tol", "0.1")
    assert proc.returncode == 0, proc.stderr
    _assert_one_line_error(stability("halt", tiny_checkpoint, "--device", beyond), f"device {beyond}")
    _assert_one_line_error(stability("halt", tiny_checkpoint, "--device", "gpu"), "expected auto, cpu, cuda")


def test_only_runs_the_named_stages_of_a_checkpoint(tiny_checkpoint, tmp_path, capsys):
    """In process (no subprocess): --only rho,a8 gives those blocks (and reachability), the others null, and only
    the plots whose stage ran; a wrong stage name is one line listing the allowed ones, nothing written."""
    from stability.cli import main

    js, plots = tmp_path / "only.json", tmp_path / "only-plots"
    assert main(["analyze", str(tiny_checkpoint), "--split", "val", "--only", "rho,a8", "--json", str(js),
                 "--plots", str(plots), *FAST]) == 0
    block = json.loads(js.read_text())["val"]
    assert block["stages"] == ["reachability", "rho", "a8"] and set(block["timings"]) == set(block["stages"])
    assert block["jacobian"]["spectral_radius"] and block["initial_iterate"]["starts"] == ["x0", "zeros", "noise"]
    assert all(block[k] is None for k in ("prop4", "recall", "prop5", "input_dependence", "accuracy"))
    assert block["verdict"]["input_dependent"] == "not measured"
    assert sorted(p.name for p in plots.iterdir()) == ["eigenvalues.png", "residuals.png"]
    out = capsys.readouterr().out
    assert "ρ(J*) median" in out and "accuracy at x*" not in out
    bad = tmp_path / "bad.json"
    assert main(["analyze", str(tiny_checkpoint), "--only", "rho,eigen", "--json", str(bad), *FAST]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown stage 'eigen'" in err[0] and ", ".join(STAGES) in err[0]
    assert not bad.exists()


def test_more_samples_than_the_split_has_is_said_not_clamped_silently(tiny_checkpoint, tmp_path):
    js = tmp_path / "r.json"
    proc = stability("analyze", tiny_checkpoint, "--split", "val", "--samples", "1000", "--max-iter", "30",
                     "--iterations", "5", "--probes", "1", "--only", "rho", "--json", js, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "val: the split has 16 samples; analysing all 16 (asked for 1000)" in proc.stderr
    assert json.loads(js.read_text())["val"]["samples"] == 16


@pytest.mark.parametrize("poison", ["all-nan", "one-inf"])
def test_a_checkpoint_with_non_finite_weights_is_refused_in_one_line_naming_them_before_the_analysis(
        poison, small_checkpoint, tmp_path):
    import time

    import torch

    from tests.conftest import run_cli

    obj = torch.load(small_checkpoint, weights_only=True)
    names = [n for n, t in obj["model"].items() if t.is_floating_point()]
    if poison == "all-nan":
        for n in names:
            obj["model"][n] = torch.full_like(obj["model"][n], float("nan"))
    else:
        obj["model"][names[-1]].view(-1)[0] = float("inf")
    bad = tmp_path / "bad.pt"
    torch.save(obj, bad)
    t0 = time.perf_counter()
    proc = run_cli("analyze", bad, "--samples", "2", "--json", tmp_path / "a.json", check=False)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "non-finite weights" in err[0], proc.stderr
    assert (names[0] if poison == "all-nan" else names[-1]) in err[0]
    assert f"in {len(names) if poison == 'all-nan' else 1} of" in err[0]
    assert not (tmp_path / "a.json").exists() and time.perf_counter() - t0 < 30
