"""The whole analysis of a looped language model: ``analyze_lm`` on a save_pretrained directory (its ρ(J*) by blocks
equal to the stages' Krylov ρ(J*), scoring with the ignore index, routing, exits, the precision said),
``stability.analyze`` routing a language model to it, ``stability analyze HF_DIR --inputs ids.pt`` and
``--model stability.lm.huginn:tiny`` on the command line, and the refusals in one line."""

import json

import pytest
import torch

import stability
from stability.config import AnalysisOptions
from stability.lm import LMAnalysis, analyze_lm, pack
from tests.conftest import run_cli
from tests.lm.conftest import ids, padded_mask

FAST = AnalysisOptions(samples=3, stages=("reachability", "rho", "accuracy"), max_iter=40, iterations=6,
                       eig_precision="float64", eig_tol=1e-9)


@pytest.mark.slow
def test_analyze_lm_of_a_directory(inkling_dir):
    a = analyze_lm(inkling_dir, ids(), padded_mask(), options=FAST)
    assert isinstance(a, LMAnalysis)
    out = json.loads(json.dumps(a.to_json()))
    lm, fp, jac = out["lm"], out["inputs"]["fixed_point"], out["inputs"]["jacobian"]
    assert fp["status"] == ["converged"] * 3
    assert lm["precision"]["dtype"] == "float64" and lm["model_steps"] == 2 and lm["causal"]
    # ρ(J*) as the largest per-token ρ (exact blocks) against the stages' Krylov–Schur ρ(J*) of the whole J*
    assert lm["token_rho"]["exact"] == [True] * 3
    assert lm["token_rho"]["rho"] == pytest.approx(jac["spectral_radius"], abs=1e-7)
    assert lm["tokens"]["status_counts"]["pad"] == 5 and lm["tokens"]["converged_sequences"] == 1.0
    assert lm["scoring"]["at_fixed_point"]["scored_tokens"] == 3 * 7 - 5  # next tokens of real tokens only
    assert lm["routing"]["routers"] == ["layers.1.mlp.gate", "layers.2.mlp.gate"]
    assert {r["rule"] for r in lm["exits"]["rules"]} == {"kl", "entropy", "latent", "cosine", "argmax", "residual"}
    assert "LANGUAGE MODEL" in a.summary() and "token ρ max" in a.summary()


def test_stability_analyze_routes_a_language_model(hrm_dir):
    loaded = stability.load(hrm_dir)
    opts = FAST.replace(stages=("reachability",), samples=2)
    a = stability.analyze(loaded, pack(ids(2), padded_mask(2)), options=opts)
    assert isinstance(a, LMAnalysis) and a["lm"]["precision"]["dtype"] == "float64"
    assert a["lm"]["routing"] is None  # HRM has no routers
    b = stability.analyze(loaded.model, ids(2), options=opts)  # the adapter itself, ids without padding
    assert b["lm"]["tokens"]["status_counts"]["pad"] == 0


def test_the_float32_mode_says_so_with_its_tolerances(hrm_dir):
    opts = FAST.replace(stages=("reachability",), samples=2)
    a = analyze_lm(hrm_dir, ids(2), options=opts, precision="float32", lm_stages=("tokens",))
    assert a["lm"]["precision"]["dtype"] == "float32" and a["lm"]["precision"]["tolerances"]["tol"] == 1e-4
    assert "float32" in a.summary()


def test_the_command_line_analyses_a_directory_on_token_ids(hrm_dir, tmp_path):
    torch.save({"input_ids": ids(2), "attention_mask": padded_mask(2)}, tmp_path / "ids.pt")
    res = run_cli("analyze", hrm_dir, "--inputs", tmp_path / "ids.pt", "--only", "rho", "--max-iter", "30",
                  "--iterations", "4", "--json", tmp_path / "a.json", "--quiet")
    assert "LANGUAGE MODEL" in res.stdout and "token ρ max" in res.stdout
    out = json.loads((tmp_path / "a.json").read_text())
    assert out["lm"]["tokens"]["tokens"] == 2 * 8 - 5
    bad = run_cli("analyze", hrm_dir, "--quiet", check=False)
    assert bad.returncode != 0 and "give its token ids with --inputs" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_the_command_line_analyses_the_reference_model(tmp_path):
    ids6 = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    torch.save({"input_ids": ids6, "attention_mask": torch.tensor([[1] * 6, [1] * 4 + [0] * 2])}, tmp_path / "ids.pt")
    res = run_cli("analyze", "--model", "stability.lm.huginn:tiny", "--inputs", tmp_path / "ids.pt", "--only",
                  "rho", "--max-iter", "30", "--iterations", "4", "--json", tmp_path / "a.json", "--quiet")
    assert "LANGUAGE MODEL" in res.stdout
    lm = json.loads((tmp_path / "a.json").read_text())["lm"]
    assert lm["model_steps"] == 8 and lm["tokens"]["status_counts"]["pad"] == 2
