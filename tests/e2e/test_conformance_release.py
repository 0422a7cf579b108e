"""The whole analysis on the paper's own release checkpoints, imported (issue 14's conformance suite, release part).

The fixtures under tests/fixtures/release/ were written by the release's own training script, with the release
model's logits after every iteration recorded for a fixed batch (docs/release-differences.md). Here the imported
model goes through ``stability.analyze`` like any other looped model, and the numbers the analysis reports are held
against independent references: the recorded release logits (accuracy) and a dense autograd Jacobian (ρ(J*)).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import stability
from stability.analysis.options import AnalysisOptions
from tests.conftest import FIXTURES

RELEASE = FIXTURES / "release"
PREFIX_SUMS = "external_prefix_sums_post_lr0.0001_seed0"
SUDOKU = "internal_sudoku_gru_lr0.0001_seed0"


def _fixture(run: str):
    ref = torch.load(RELEASE / run / "reference_outputs.pt", weights_only=True)
    loaded = stability.load(RELEASE / run / "model_best.pth")
    return loaded.model, ref


def _release_targets(ref, T: int) -> torch.Tensor:
    """The release model's own answer after T iterations: argmax over the class axis of its recorded logits,
    (B, C, *spatial) → (B, *spatial)."""
    return ref["logits_float64"][:, T - 1].argmax(1)


@pytest.mark.parametrize("run", [PREFIX_SUMS, SUDOKU])
def test_analysis_of_an_imported_release_model_scores_the_release_answers_as_correct(run):
    """Accuracy after T iterations against the release's own recorded answers is 1 (every sample) at T (and the analysis'
    readout of every earlier iteration agrees with the recorded per-iteration answers as far as they agree)."""
    model, ref = _fixture(run)
    T = 12
    inputs = ref["inputs_stability_layout"].double()
    targets = _release_targets(ref, T)
    opts = AnalysisOptions(samples=inputs.shape[0], iterations=T, max_iter=60, stages=("reachability", "accuracy"))
    result = stability.analyze(model, inputs, targets, opts)
    acc = result["inputs"]["accuracy"]
    assert acc["iterations"][T - 1] == T
    assert acc["accuracy"][T - 1] == pytest.approx(1.0)  # fractions in the JSON
    # every earlier iteration: the share of samples whose recorded answer at t equals the one at T
    rec = ref["logits_float64"][:, :T].argmax(2)  # (B, T, *spatial)
    same = (rec == targets.unsqueeze(1)).reshape(rec.shape[0], T, -1).all(-1).double().mean(0)
    np.testing.assert_allclose(acc["accuracy"], same.numpy(), atol=1e-9)


def test_rho_of_an_imported_release_model_matches_a_dense_jacobian():
    """ρ(J*) reported by the analysis at the fixed point of the imported prefix-sums release model equals the
    spectral radius of the dense autograd Jacobian of step at the x* the analysis found."""
    model, ref = _fixture(PREFIX_SUMS)
    inputs = ref["inputs_stability_layout"][:1, :16].double()  # 16 of the 48 bits: a dense J of 1,024² entries
    opts = AnalysisOptions(samples=1, iterations=5, max_iter=400, tol=1e-9, stages=("reachability", "rho"))
    result = stability.analyze(model, inputs, None, opts)
    data = result["inputs"]
    rho = data["jacobian"]["spectral_radius"][0]
    m = model.double().eval()
    x_star = result.splits["inputs"].x_star[0].detach()
    with torch.no_grad():
        x0 = m.embed(inputs)[0]
    J = torch.func.jacrev(lambda x: m.step(x.unsqueeze(0), x0.unsqueeze(0))[0])(x_star)
    n = x_star.numel()
    dense = float(np.abs(np.linalg.eigvals(J.detach().reshape(n, n).numpy())).max())
    assert rho == pytest.approx(dense, abs=1e-6)
    assert data["verdict"] is not None
