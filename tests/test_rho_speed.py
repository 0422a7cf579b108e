"""The adaptive (DGKS) reorthogonalisation of the Krylov–Schur ρ, checked against numpy's dense eigenvalues.

``batched_spectral_radius(reorth="adaptive")`` (opt-in; the default is ``"always"``) runs the second classical Gram–Schmidt pass only
when the first removed more than 1 − 1/√2 of the new vector's norm; ``"always"`` is the former CGS2.
"""

import numpy as np
import pytest
import torch

from stability.linalg import batched_spectral_radius

D64 = torch.float64


def _matvec(A):
    return lambda V: torch.bmm(A, V.unsqueeze(2)).squeeze(2)


def _random_batch(B=3, n=120, seed=0):
    """Random dense matrices (a disc of complex pairs, like sudoku-size Jᵀ): the DGKS test never fires."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, n, n, generator=g, dtype=D64) / n ** 0.5


def _near_invariant_batch(B=2, n=80, seed=1):
    """Few distinct eigenvalues (a diagonalisable matrix with 4 clusters): the Krylov space is nearly invariant
    after a few vectors, so A v lies mostly in the basis and the first pass cancels (the DGKS test fires)."""
    g = torch.Generator().manual_seed(seed)
    mats = []
    for _ in range(B):
        lam = torch.tensor([0.9, -0.7, 0.5, 0.2], dtype=D64).repeat_interleave(n // 4)
        lam = lam + 1e-3 * torch.randn(n, generator=g, dtype=D64)
        P = torch.eye(n, dtype=D64) + 0.3 * torch.randn(n, n, generator=g, dtype=D64) / n ** 0.5
        mats.append(P @ torch.diag(lam) @ torch.linalg.inv(P))
    return torch.stack(mats)


def _dense_rho(A):
    return np.abs(np.linalg.eigvals(A.numpy())).max(axis=1)


@pytest.mark.parametrize("make", [_random_batch, _near_invariant_batch])
def test_adaptive_reorthogonalisation_matches_numpy_eig(make):
    A = make()
    B, n = A.shape[0], A.shape[1]
    ref = _dense_rho(A)
    start = torch.randn(B, n, generator=torch.Generator().manual_seed(5), dtype=D64)
    both = {}
    for reorth in ("adaptive", "always"):
        spec = batched_spectral_radius(_matvec(A), (B, n), krylov=30, tol=1e-10, restarts=300, start=start,
                                       reorth=reorth, return_vectors=True)
        assert np.allclose(spec.rho.numpy(), ref, atol=1e-9), reorth
        assert (spec.ritz_residual < 1e-10).all(), reorth
        # the reported Ritz residual is the true one: ‖A u − θ u‖ / (|θ| ‖u‖) recomputed from the vectors
        u, theta = spec.vectors, spec.eigenvalues[:, 0]
        true = (torch.bmm(A.to(u.dtype), u.unsqueeze(2)).squeeze(2) - theta[:, None] * u).norm(dim=1)
        assert (true / (theta.abs() * u.norm(dim=1)) < 1e-9).all(), reorth
        both[reorth] = spec
    # on random matrices the first pass already keeps the vector orthogonal: the same iteration, product for
    # product
    if make is _random_batch:
        assert torch.equal(both["adaptive"].products, both["always"].products)


def test_adaptive_reorthogonalisation_fires_its_second_pass_when_the_first_cancels(monkeypatch):
    """Counted by the basis projections (torch.bmm): two per product, two more for each second pass. Rare on
    random matrices (only once Ritz vectors have converged and A v lies nearly in the basis), frequent on a
    matrix whose Krylov space is nearly invariant after a few vectors."""
    calls = {"bmm": 0}
    real = torch.bmm

    def counting(*a, **k):
        calls["bmm"] += 1
        return real(*a, **k)

    second = {}
    for make in (_random_batch, _near_invariant_batch):
        A = make(B=1)
        op = lambda V: real(A, V.unsqueeze(2)).squeeze(2)  # noqa: E731 (not counted)
        monkeypatch.setattr(torch, "bmm", counting)
        calls["bmm"] = 0
        spec = batched_spectral_radius(op, (1, A.shape[1]), krylov=30, tol=1e-10, restarts=300,
                                       reorth="adaptive")
        monkeypatch.setattr(torch, "bmm", real)
        second[make.__name__] = (calls["bmm"] - 2 * spec.matvecs) / 2 / spec.matvecs
    assert second["_random_batch"] < 0.1 and second["_near_invariant_batch"] > 0.3, second


def test_reorth_rejects_unknown_modes():
    with pytest.raises(ValueError, match="reorth"):
        batched_spectral_radius(_matvec(_random_batch(1, 10)), (1, 10), reorth="never")
