"""The numerics wing on maps with known answers (no model needed): the Jacobian type, ρ, σ_max and the input-gradient
of Prop. 5, each against the exact value and the per-sample scipy references of tests/reference_numerics.py.

For f(x, x0) = A x + B x0: J = A, ∂f/∂x0 = B, ρ(J) = ρ(A), dx*/dx0 = (I − A)⁻¹ B, dx_T/de = A^T.
"""

import numpy as np
import pytest
import torch

from tests.reference_numerics import (JacobianOperator, arpack_rho, arpack_sigma_max, dense_rho, implicit_input_jvp,
                                implicit_input_vjp, input_dependence_frobenius, prop5_check, unrolled_input_vjp)
from stability.analysis.initial_iterate import fixed_point_distance, initial_iterate_sensitivity
from stability.analysis.input_dependence import input_dependence_frobenius_batched
from stability.analysis.prop5 import KrylovError, default_T_grid, implicit_input_jvp_batched, prop5_check_batched
from stability.numerics import Linearisation, sigma_max, spectral_radius
from stability.solvers import solve

D64 = torch.float64


@pytest.fixture(scope="module")
def linear():
    n = 40
    g = torch.Generator().manual_seed(0)
    A = torch.randn(n, n, generator=g, dtype=D64)
    A = A / torch.linalg.eigvals(A).abs().max() * 0.8  # ρ(A) = 0.8 exactly, complex pairs included
    B = torch.randn(n, n, generator=g, dtype=D64)
    x0 = torch.randn(2, n, generator=g, dtype=D64)
    f = lambda x, x0: x @ A.T + x0 @ B.T  # noqa: E731
    x_star = solve(f, x0, x0, tol=1e-14, max_iter=3000).x_best
    return f, A, B, x0, x_star


def test_the_linearisation_of_a_linear_map_is_A_and_B_in_every_product(linear):
    f, A, B, x0, x_star = linear
    V = torch.randn(x0.shape, dtype=D64, generator=torch.Generator().manual_seed(1))
    lin = Linearisation(f, x_star, x0, inputs=True)
    for product, M in ((lin.J, A), (lin.jvp, A), (lin.JT, A.T), (lin.K, B), (lin.KT, B.T)):
        assert torch.allclose(product(V), V @ M.T, atol=1e-13)
    assert torch.allclose(lin.JK(V, 2 * V), V @ A.T + 2 * V @ B.T, atol=1e-13)
    assert torch.allclose(lin.dense(), A.expand(2, *A.shape), atol=1e-14)
    assert lin.restrict(torch.tensor([1])).shape == (1, A.shape[0])
    # the reference operator (scipy, one sample) agrees
    J = JacobianOperator(f, x_star[0], x0[0], mode="vjp")
    assert torch.allclose(J.dense(), A, atol=1e-14)
    assert np.allclose(J.rmatvec(V[0].numpy()), (A.T @ V[0]).numpy(), atol=1e-13)
    assert torch.allclose(JacobianOperator(f, x_star[0], x0[0], wrt="x0").dense(), B, atol=1e-14)


def test_spectral_radius_and_sigma_max_of_a_linear_map_are_those_of_A_on_every_route(linear):
    f, A, B, x0, x_star = linear
    lin = Linearisation(f, x_star, x0)
    exact = np.sort(np.abs(np.linalg.eigvals(A.numpy())))[::-1]
    norm = float(torch.linalg.matrix_norm(A, 2))
    for route, product in (("dense", "transpose"), ("dense-krylov", "transpose"), ("krylov", "transpose"),
                           ("krylov", "forward")):
        spec = spectral_radius(lin, route=route, product=product, k=6, tol=1e-12)
        assert (spec.rho - 0.8).abs().max() < 1e-10, route
        assert np.allclose(spec.eigenvalues.abs().numpy(), exact[:6], atol=1e-9), route
        assert (sigma_max(lin, route=route, tol=1e-12) - norm).abs().max() < 1e-9, route
    # the references: ARPACK on the scipy operator and on its transpose, ARPACK's SVD
    J = JacobianOperator(f, x_star[0], x0[0], mode="vjp")
    for transpose in (False, True):
        ref = arpack_rho(J, k=6, tol=1e-12, transpose=transpose)
        assert ref.converged and abs(ref.rho - 0.8) < 1e-10
    assert abs(arpack_sigma_max(J) - norm) < 1e-9


def test_complex_eigenvalues_come_back_complex():
    theta = 0.7
    R = torch.tensor([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]], dtype=D64) * 0.9
    A = torch.block_diag(R, torch.diag(torch.linspace(0.1, 0.5, 10, dtype=D64)))
    f = lambda x, x0: x @ A.T  # noqa: E731
    spec = spectral_radius(Linearisation(f, torch.zeros(1, 12, dtype=D64)), route="krylov", k=4, tol=1e-12)
    lead = complex(spec.eigenvalues[0, 0])
    assert abs(abs(lead) - 0.9) < 1e-10 and abs(abs(lead.imag) - 0.9 * np.sin(theta)) < 1e-10


def test_batched_krylov_matches_arpack_and_the_dense_spectrum_per_sample():
    """A nonlinear map, so that every sample has its own J; the batched routes against per-sample ARPACK."""
    n = 60
    g = torch.Generator().manual_seed(1)
    W = torch.randn(n, n, generator=g, dtype=D64) / n ** 0.5
    f = lambda x, x0: 1.5 * torch.tanh(x @ W.T + x0)  # noqa: E731
    x = torch.randn(3, n, generator=g, dtype=D64)
    x0 = torch.randn(3, n, generator=g, dtype=D64)
    lin = Linearisation(f, x, x0)
    spec = spectral_radius(lin, route="krylov", tol=1e-10, restarts=40)
    sig = sigma_max(lin, route="krylov", tol=1e-12, restarts=40)
    for b in range(3):
        op = JacobianOperator(f, x[b], x0[b])
        assert abs(float(spec.rho[b]) - arpack_rho(op, tol=1e-12).rho) < 1e-6
        assert abs(float(spec.rho[b]) - dense_rho(op.dense())) < 1e-6
        assert abs(float(sig[b]) - arpack_sigma_max(op)) < 1e-6


def test_implicit_input_gradient_of_a_linear_map_is_exact(linear):
    f, A, B, x0, x_star = linear
    n = A.shape[0]
    exact = torch.linalg.solve(torch.eye(n, dtype=D64) - A, B)  # dx*/dx0 = (I − A)⁻¹ B
    u = torch.randn(2, n, dtype=D64, generator=torch.Generator().manual_seed(2))
    sol = implicit_input_jvp_batched(f, x_star, x0, u, tol=1e-12)
    assert torch.allclose(sol.x, u @ exact.T, atol=1e-10) and (sol.residual < 1e-12).all()
    # the references: scipy's GMRES on (I − J) and on (I − J)ᵀ, backprop through T unrolled iterations
    w, info = implicit_input_jvp(f, x_star[0], x0[0], u[0], tol=1e-12)
    assert torch.allclose(w, exact @ u[0], atol=1e-10) and info.residual < 1e-11
    vT, info = implicit_input_vjp(f, x_star[0], x0[0], u[0], tol=1e-12)
    assert torch.allclose(vT, exact.T @ u[0], atol=1e-10)
    assert torch.allclose(unrolled_input_vjp(f, x0[0], x0[0], u[0], 200), exact.T @ u[0], atol=1e-8)


def test_prop5_error_falls_to_the_gmres_tolerance_on_a_linear_map(linear):
    f, A, B, x0, x_star = linear
    chk = prop5_check_batched(f, x_star, x0, x0, default_T_grid(300), tol=1e-12, freeze_tol=None).sample(0)
    errs = chk.rel_error
    assert chk.T == [1, 2, 5, 10, 20, 50, 100, 200, 300]
    assert errs[0] > 0.1
    assert errs[-1] < 1e-9
    assert all(b <= a * 1.5 for a, b in zip(errs, errs[1:]))  # (nearly) monotone decay
    assert chk.gmres_residual < 1e-11
    ref = prop5_check(f, x_star[0], x0[0], x0[0], default_T_grid(300), tol=1e-12)  # scipy GMRES, one sample
    assert np.allclose(ref.rel_error[:-2], errs[:-2], rtol=1e-6)


def test_frobenius_estimate_brackets_the_exact_norm(linear):
    f, A, B, x0, x_star = linear
    n = A.shape[0]
    exact = float(torch.linalg.norm(torch.linalg.solve(torch.eye(n, dtype=D64) - A, B)))
    est = input_dependence_frobenius_batched(f, x_star, x0, probes=48, seed=3).sample(0)
    assert abs(est.value - exact) < 4 * est.stderr + 1e-9
    assert 0.7 * exact < est.value < 1.3 * exact
    assert est.value == pytest.approx(input_dependence_frobenius(f, x_star[0], x0[0], probes=48, seed=3).value,
                                      rel=1e-7)


def test_initial_iterate_sensitivity_decays_like_A_to_the_T(linear):
    f, A, B, x0, x_star = linear
    n = A.shape[0]
    u = torch.randn(n, dtype=D64)
    u = u / u.norm()
    sens = initial_iterate_sensitivity(f, x0[0], x0[0], [1, 5, 50], u=u)
    for T, value in zip(sens["T"], sens["norm"]):
        assert abs(value - float((torch.linalg.matrix_power(A, T) @ u).norm())) < 1e-12
    # and the fixed point does not depend on e: three starts, one x*
    starts = [x0, torch.zeros_like(x0), torch.randn_like(x0)]
    xs = [solve(f, s, x0, tol=1e-13, max_iter=3000).x_best for s in starts]
    assert float(fixed_point_distance(xs).max()) < 1e-11


def test_gmres_that_cannot_converge_raises_loudly():
    """I − A singular (A has the eigenvalue 1) and the right-hand side outside its range: no solution."""
    A = torch.diag(torch.tensor([1.0, 0.5, 0.2], dtype=D64))
    f = lambda x, x0: x @ A.T + x0  # noqa: E731
    zero, u = torch.zeros(1, 3, dtype=D64), torch.tensor([[1.0, 0.0, 0.0]], dtype=D64)
    chk = prop5_check_batched(f, zero, zero, zero, [1, 2], u=u, tol=1e-10)
    assert not chk.converged[0]
    with pytest.raises(KrylovError, match="GMRES did not converge"):
        chk.sample(0)
    with pytest.raises(KrylovError, match="GMRES did not converge"):  # scipy's GMRES, the reference, agrees
        implicit_input_jvp(f, zero[0], zero[0], u[0], tol=1e-10)


def _clustered(n: int = 120, batch: int = 3, seed: int = 4):
    """Non-normal real matrices whose leading eigenvalues are a tight cluster of complex pairs at one angle
    (moduli 0.9, 0.8997, 0.8994), as the token-repeated Jacobians of a transformer have, over a bulk below 0.8."""
    g = torch.Generator().manual_seed(seed)
    mats, rhos = [], []
    for b in range(batch):
        blocks = []
        for r in (0.9, 0.8997, 0.8994):
            c, s_ = r * np.cos(2.6 + 0.01 * b), r * np.sin(2.6 + 0.01 * b)
            blocks.append(torch.tensor([[c, -s_], [s_, c]], dtype=D64))
        bulk = torch.randn(n - 6, n - 6, generator=g, dtype=D64)
        bulk = bulk / torch.linalg.eigvals(bulk).abs().max() * 0.78
        D = torch.block_diag(*blocks, bulk)
        P = torch.eye(n, dtype=D64) + 0.3 * torch.randn(n, n, generator=g, dtype=D64) / n ** 0.5
        mats.append(P @ D @ torch.linalg.inv(P))
        rhos.append(float(torch.linalg.eigvals(mats[-1]).abs().max()))
    return torch.stack(mats), rhos


def as_map(A, dtype=D64):
    """Dense matrices A (B, n, n) as the package's operator type (a linear map: J = A), products in A's dtype."""
    return Linearisation(lambda V, _: torch.bmm(A, V.to(A.dtype).unsqueeze(2)).squeeze(2),
                         torch.zeros(A.shape[:2], dtype=dtype), linear=True)


class Counted(Linearisation):
    """J_b = A_b (A carried as x0, so that a subset of samples is a subset of matrices); counts restrictions."""

    calls: list = []

    def restrict(self, index):
        Counted.calls.append(index.tolist())
        return Counted(self.f, self.x[index], self.x0[index])


def per_sample(A):
    return Counted(lambda x, M: torch.bmm(M, x.unsqueeze(2)).squeeze(2), torch.zeros(A.shape[:2], dtype=D64), A)


def test_krylov_schur_resolves_a_tight_cluster_of_complex_pairs():
    A, rhos = _clustered()
    spec = spectral_radius(as_map(A), route="krylov", product="forward", krylov=30, tol=1e-10, restarts=200)
    assert np.allclose(spec.rho.numpy(), rhos, atol=1e-9)
    assert (spec.ritz_residual < 1e-10).all()
    lead = spec.eigenvalues[:, :2]  # the leading pair, conjugate
    assert torch.allclose(lead[:, 0], lead[:, 1].conj(), atol=1e-8) and (lead[:, 0].imag.abs() > 0.1).all()
    # a sample stops only once the next Ritz pair of the cluster has converged too (to 100 · tol)
    for b in range(A.shape[0]):
        top = torch.linalg.eigvals(A[b]).abs().sort(descending=True).values[:3]
        assert torch.allclose(spec.eigenvalues[b, :3].abs(), top, atol=1e-7)


def test_each_sample_iterates_as_if_alone_and_finished_samples_leave_the_batch():
    A, _ = _clustered(batch=3)
    B, n = A.shape[0], A.shape[1]
    start = torch.randn(B, n, generator=torch.Generator().manual_seed(2), dtype=D64)
    Counted.calls = []
    opts = dict(route="krylov", product="forward", krylov=30, tol=1e-9)
    batch = spectral_radius(per_sample(A), start=start, **opts)
    calls = Counted.calls
    padded = spectral_radius(per_sample(A), start=start, shrink=False, **opts)
    for b in range(B):
        alone = spectral_radius(per_sample(A[b:b + 1]), start=start[b:b + 1], **opts)
        assert int(batch.products[b]) == int(padded.products[b]) == int(alone.products[0])
        assert abs(float(batch.rho[b]) - float(alone.rho[0])) < 1e-12
        assert abs(float(padded.rho[b]) - float(alone.rho[0])) < 1e-12
    assert len(set(batch.products.tolist())) > 1  # the samples needed different numbers of products …
    assert calls and all(len(c) < B for c in calls)  # … and the finished ones were no longer multiplied
    assert batch.matvecs == int(batch.products.sum())


def test_certified_rho_is_exact_even_when_the_fast_products_are_wrong():
    """Fast products off by 1e-3 find a wrong eigenpair; its float64 residual misses the tolerance, so the
    sample is solved again on exact products: the result is the exact operator's ρ."""
    A, rhos = _clustered(batch=2)
    B, n = A.shape[0], A.shape[1]
    wrong = A + 1e-3 * torch.randn(A.shape, generator=torch.Generator().manual_seed(9), dtype=D64)
    opts = dict(route="krylov", product="forward", krylov=30, tol=1e-6, restarts=200)
    spec = spectral_radius(as_map(A), fast=as_map(wrong), **opts)
    assert np.allclose(spec.rho.numpy(), rhos, atol=1e-8)
    assert (spec.ritz_residual < 1e-6).all()
    fast_only = spectral_radius(as_map(wrong), **opts)
    assert (fast_only.rho - torch.tensor(rhos, dtype=D64)).abs().max() > 1e-5  # the wrong products alone miss
    # float32 products: certified on the first pass, to float32's accuracy
    mixed = spectral_radius(as_map(A), fast=as_map(A.float(), torch.float32), **opts)
    assert np.allclose(mixed.rho.numpy(), rhos, atol=1e-6)
    assert (mixed.ritz_residual < 1e-6).all()


def test_a_non_finite_sample_gets_nan_and_leaves_the_others_intact():
    A, rhos = _clustered(batch=3)
    A[1] = float("nan")  # a diverged sample's Jacobian
    B, n = A.shape[0], A.shape[1]
    opts = dict(route="krylov", product="forward", krylov=30, restarts=200)
    for spec in (spectral_radius(as_map(A), tol=1e-9, **opts),
                 spectral_radius(as_map(A), fast=as_map(A.float(), torch.float32), tol=1e-6, **opts)):
        assert torch.isnan(spec.rho[1]) and not bool(spec.ritz_residual[1] < 1)
        assert abs(float(spec.rho[0]) - rhos[0]) < 1e-6 and abs(float(spec.rho[2]) - rhos[2]) < 1e-6
