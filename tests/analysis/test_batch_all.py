"""``AnalysisOptions.batch`` (``--batch auto|all``, issue 35): ``all`` runs the stages on all samples at once with
the eigensolver's restarts batched, as on a GPU, here on the CPU. Its numbers agree with the CPU default's (the
per-sample path, which ``auto`` keeps) to the eigensolver's tolerance and with dense references, with the same
statuses and flags; ``auto`` on the CPU is the per-sample path."""

import numpy as np
import pytest
import torch

from stability.analysis.options import AnalysisOptions
from stability.analysis.pipeline import analyze_split
from stability.cli import build_parser
from stability.config import TaskConfig
from stability.tasks import make_task
from tests.analysis.test_few_samples import L, _contractive_model


def dense_rho(model, x, x0) -> float:
    """ρ of ∂step/∂x at one sample by the dense autograd Jacobian and numpy's eigvals (the reference)."""
    J = torch.func.jacrev(lambda t: model.step(t.unsqueeze(0), x0.unsqueeze(0))[0])(x)
    n = x.numel()
    return float(np.abs(np.linalg.eigvals(J.reshape(n, n).numpy())).max())


@pytest.mark.parametrize("precision,tol", [("mixed", 1e-6), ("float64", 1e-10)])
def test_batch_all_agrees_with_the_per_sample_default_and_the_dense_reference_on_the_matrix_free_route(precision,
                                                                                                      tol):
    task = make_task(TaskConfig(name="prefix-sums", train_size=4, val_size=4, hard_size=2, train_length=L,
                                hard_length=8))
    m = _contractive_model()
    base = dict(samples=4, tol=1e-10, max_iter=80, iterations=5, probes=2, eig_tol=tol, eig_precision=precision,
                stages=("reachability", "rho", "prop4"))
    with pytest.MonkeyPatch.context() as mp:  # the matrix-free routes at this size
        mp.setattr("stability.numerics.spectra.DENSE_MAX", 8)
        mp.setattr("stability.numerics.spectra.DENSE_KRYLOV_MAX", 8)
        auto = analyze_split(m, task, "val", AnalysisOptions(**base))
        every = analyze_split(m, task, "val", AnalysisOptions(**base, batch="all"))
    a, e = auto.to_dict(), every.to_dict()
    assert a["fixed_point"]["status"] == e["fixed_point"]["status"] == ["converged"] * 4
    assert a["jacobian"]["method"].startswith("Krylov–Schur on Jᵀ (torch, 1 sample(s) per batch;")
    assert e["jacobian"]["method"].startswith("Krylov–Schur on Jᵀ (torch, 4 sample(s) per batch, restarts batched;")
    assert e["jacobian"]["eigen_converged"] == a["jacobian"]["eigen_converged"] == [True] * 4
    rho_a, rho_e = np.array(a["jacobian"]["spectral_radius"]), np.array(e["jacobian"]["spectral_radius"])
    ref = np.array([dense_rho(m, every.x_star[b], every.x0[b]) for b in range(4)])
    assert np.all(np.abs(rho_e - rho_a) <= tol * rho_a) and np.all(np.abs(rho_e - ref) <= tol * ref)
    assert np.allclose(e["jacobian"]["sigma_max"], a["jacobian"]["sigma_max"], rtol=tol)
    assert np.allclose(e["prop4"]["rho_M"], a["prop4"]["rho_M"], rtol=tol)


def test_batch_is_a_flag_of_analyze_and_auto_by_default():
    args = build_parser("analyze").parse_args(["analyze", "ckpt.pt", "--batch", "all"])
    assert args.batch == "all" and AnalysisOptions().batch == "auto"
    assert AnalysisOptions().eig_restart == "auto" and AnalysisOptions(batch="all").eig_restart == "batched"
    assert AnalysisOptions().eig_chunk(32, "cpu") == 1 and AnalysisOptions().eig_chunk(32, "cuda") == 32
    assert AnalysisOptions(batch="all").eig_chunk(32, "cpu") == 32
    assert AnalysisOptions(batch="all", eig_batch=4).eig_chunk(32, "cpu") == 4
    with pytest.raises(Exception, match="batch"):
        AnalysisOptions(batch="some")
