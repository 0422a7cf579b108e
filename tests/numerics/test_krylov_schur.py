"""The package's one spectral radius (``stability.numerics.spectral_radius``) on batches of matrices whose
spectra are known: every route against numpy's dense eigenvalues, and the reported Ritz residual is the true one."""

import numpy as np
import pytest
import torch

from stability.errors import ConfigError
from stability.numerics import Linearisation, sigma_max, spectral_radius

D64 = torch.float64


def as_map(A):
    """A batch of dense matrices A (B, n, n) as the package's operator type: a linear map, J = A."""
    return Linearisation(lambda V, _: torch.bmm(A, V.unsqueeze(2)).squeeze(2), torch.zeros(A.shape[:2], dtype=D64),
                         linear=True)


def random_batch(B=3, n=120, seed=0):
    """Random dense matrices (a disc of complex pairs, like sudoku-size Jᵀ)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, n, n, generator=g, dtype=D64) / n ** 0.5


def clustered_batch(B=2, n=80, seed=1):
    """Four clusters of eigenvalues (0.9, −0.7, 0.5, 0.2, each spread by 1e-3), a non-normal basis."""
    g = torch.Generator().manual_seed(seed)
    mats = []
    for _ in range(B):
        lam = torch.tensor([0.9, -0.7, 0.5, 0.2], dtype=D64).repeat_interleave(n // 4)
        lam = lam + 1e-3 * torch.randn(n, generator=g, dtype=D64)
        P = torch.eye(n, dtype=D64) + 0.3 * torch.randn(n, n, generator=g, dtype=D64) / n ** 0.5
        mats.append(P @ torch.diag(lam) @ torch.linalg.inv(P))
    return torch.stack(mats)


def numpy_rho(A):
    return np.abs(np.linalg.eigvals(A.numpy())).max(axis=1)


@pytest.mark.parametrize("make", [random_batch, clustered_batch])
@pytest.mark.parametrize("product", ["forward", "transpose"])
def test_krylov_route_matches_numpy_eig_and_its_ritz_residual_is_the_true_one(make, product):
    A = make()
    B, n = A.shape[0], A.shape[1]
    start = torch.randn(B, n, generator=torch.Generator().manual_seed(5), dtype=D64)
    spec = spectral_radius(as_map(A), route="krylov", product=product, krylov=30, tol=1e-10, restarts=300,
                           start=start, return_vectors=True)
    assert np.allclose(spec.rho.numpy(), numpy_rho(A), atol=1e-9)
    assert (spec.ritz_residual < 1e-10).all()
    # ‖A u − θ u‖ / (|θ| ‖u‖) recomputed from the vectors (of A, or of Aᵀ for the transposed products)
    u, theta = spec.vectors, spec.eigenvalues[:, 0]
    M = A if product == "forward" else A.transpose(1, 2)
    true = (torch.bmm(M.to(u.dtype), u.unsqueeze(2)).squeeze(2) - theta[:, None] * u).norm(dim=1)
    assert (true / (theta.abs() * u.norm(dim=1)) < 1e-9).all()


def test_dense_routes_match_numpy_and_sigma_max_matches_the_svd():
    A = clustered_batch(B=3, n=40)
    ref = numpy_rho(A)
    dense = spectral_radius(A, route="dense", k=4)
    assert np.allclose(dense.rho.numpy(), ref, atol=1e-12) and dense.eigenvalues.shape == (3, 4)
    assert (dense.ritz_residual == 0).all()
    krylov = spectral_radius(A, route="dense-krylov", k=4, tol=1e-10)
    assert np.allclose(krylov.rho.numpy(), ref, atol=1e-8) and (krylov.ritz_residual < 1e-10).all()
    one = spectral_radius(A[1], route="dense", k=2)  # one matrix alone: numpy's LAPACK
    assert one.rho.shape == (1,) and float(one.rho[0]) == pytest.approx(ref[1], abs=1e-12)
    svd = np.linalg.svd(A.numpy(), compute_uv=False)[:, 0]
    for route in ("dense", "dense-krylov"):
        assert np.allclose(sigma_max(A, route=route).numpy(), svd, rtol=1e-12)
    assert np.allclose(sigma_max(as_map(A), route="krylov", tol=1e-12).numpy(), svd, rtol=1e-9)


def test_unknown_routes_and_products_are_config_errors():
    A = random_batch(1, 10)
    with pytest.raises(ConfigError, match="unknown route 'lapack'"):
        spectral_radius(A, route="lapack")
    with pytest.raises(ConfigError, match="unknown product"):
        spectral_radius(as_map(A), route="krylov", product="reverse")
    with pytest.raises(ConfigError, match="needs a Linearisation"):
        spectral_radius(A, route="krylov")
    with pytest.raises(ConfigError, match="shrink=False"):
        spectral_radius(as_map(A), route="krylov", shrink=True)
