"""Thread pools of the analysis: ARPACK's small problems on one BLAS thread, the side-by-side splits' pools sized
before their libraries load, and results that do not depend on the strides of the matrices handed to ARPACK."""

import numpy as np
import torch
from threadpoolctl import threadpool_info

from stability.threads import THREAD_ENV, child_thread_env, limit_threads
from stability.numerics import sigma_max, spectral_radius
from stability.numerics.spectra import serial_blas


def _blas_threads() -> list:
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def _strided_batch(B: int, n: int, seed: int = 0) -> torch.Tensor:
    """A (B, n, n) batch laid out as the forward-mode column builder leaves it: strides (n, 1, B·n), so every
    matrix is neither C- nor F-contiguous."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, B, n, generator=g, dtype=torch.float64) / n ** 0.5  # [j, b, i] -> J[b, i, j]
    J = base.permute(1, 2, 0)
    assert not J[0].is_contiguous() and not J[0].t().is_contiguous()
    return J


def test_arpack_rho_of_strided_matrices_matches_lapack_eigenvalues():
    J = _strided_batch(3, 80)
    spec = spectral_radius(J, route="dense-krylov", k=3, tol=1e-12, seed=0)  # on the CPU: ARPACK per matrix
    ref = np.abs(np.linalg.eigvals(J.contiguous().numpy())).max(axis=1)
    np.testing.assert_allclose(spec.rho.numpy(), ref, rtol=1e-10)
    assert float(spec.ritz_residual.max()) < 1e-9


def test_sigma_max_of_strided_matrices_matches_svd():
    J = _strided_batch(3, 80, seed=1)
    ref = np.linalg.svd(J.contiguous().numpy(), compute_uv=False)[:, 0]
    np.testing.assert_allclose(sigma_max(J).numpy(), ref, rtol=1e-12)


def test_serial_blas_runs_openblas_on_one_thread_and_restores_it():
    before = _blas_threads()
    with serial_blas():
        assert set(_blas_threads()) <= {1}
    assert _blas_threads() == before


def test_limit_threads_sizes_torch_and_blas_and_restores_them():
    t0, b0 = torch.get_num_threads(), _blas_threads()
    with limit_threads(1):
        assert torch.get_num_threads() == 1
        assert set(_blas_threads()) <= {1}
    assert torch.get_num_threads() == t0 and _blas_threads() == b0


def test_child_thread_env_is_set_while_processes_start_and_restored(monkeypatch):
    import os

    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    with child_thread_env(1):
        assert all(os.environ[k] == "1" for k in THREAD_ENV)
    assert os.environ["OMP_NUM_THREADS"] == "7" and "OPENBLAS_NUM_THREADS" not in os.environ
