"""stability.numerics.solve_I_minus_J: batched GMRES and Neumann solves of (I − J_b) x_b = b_b against dense solves
(torch.linalg.solve) and scipy's GMRES, with per-sample residuals checked by recomputing them."""

import numpy as np
import pytest
import torch
from scipy.sparse.linalg import gmres as scipy_gmres

from stability.numerics.gmres import relative_residual, solve_I_minus_J

D64 = torch.float64
RHOS = (0.5, 0.9, 0.97, 0.3)


def batch_of_maps(rhos=RHOS, n=30, seed=0):
    """A_b with spectral radius exactly rhos[b] (complex pairs included), and right-hand sides."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(len(rhos), n, n, generator=g, dtype=D64)
    A = A / torch.linalg.eigvals(A).abs().amax(-1)[:, None, None] * torch.tensor(rhos, dtype=D64)[:, None, None]
    b = torch.randn(len(rhos), n, generator=g, dtype=D64)
    return A, b


def apply(A):
    return lambda V: torch.einsum("bij,bj->bi", A, V)


def dense_solution(A, b):
    return torch.linalg.solve(torch.eye(A.shape[-1], dtype=D64) - A, b)


@pytest.mark.parametrize("method,restart", [("gmres", 60), ("gmres", 7), ("neumann", 60)])
def test_solution_equals_the_dense_solve_and_the_reported_residual_is_the_true_one(method, restart):
    A, b = batch_of_maps()
    x, res, its = solve_I_minus_J(apply(A), b, method=method, tol=1e-12, restart=restart, max_iter=5000)
    ref = dense_solution(A, b)
    cond = torch.linalg.cond(torch.eye(A.shape[-1], dtype=D64) - A)
    err = (x - ref).norm(dim=1) / ref.norm(dim=1)
    assert (err <= 10 * cond * 1e-12).all(), (err, cond)
    assert (res <= 1e-12).all()
    recomputed = relative_residual(apply(A), x, b)
    independent = (b - x + torch.einsum("bij,bj->bi", A, x)).norm(dim=1) / b.norm(dim=1)
    assert torch.allclose(res, recomputed, rtol=1e-6, atol=1e-14)  # atol: the rounding of the check itself
    assert torch.allclose(res, independent, rtol=1e-6, atol=1e-14)
    assert (its >= 1).all()


def test_gmres_agrees_with_scipy_gmres_per_sample():
    A, b = batch_of_maps(n=25, seed=1)
    x, res, its = solve_I_minus_J(apply(A), b, tol=1e-10, restart=20)
    n = A.shape[-1]
    for k in range(A.shape[0]):
        M = (np.eye(n) - A[k].numpy())
        ref, info = scipy_gmres(M, b[k].numpy(), rtol=1e-10, atol=0.0, restart=20, maxiter=500)
        assert info == 0
        assert np.linalg.norm(x[k].numpy() - ref) / np.linalg.norm(ref) < 1e-8
        assert np.linalg.norm(M @ x[k].numpy() - b[k].numpy()) / np.linalg.norm(b[k].numpy()) == pytest.approx(
            float(res[k]), rel=1e-6)


@pytest.mark.parametrize("method", ["gmres", "neumann"])
def test_a_sample_result_does_not_depend_on_its_batch_mates(method):
    A, b = batch_of_maps()
    x, res, its = solve_I_minus_J(apply(A), b, method=method, tol=1e-11)
    for k in range(A.shape[0]):
        xk, rk, ik = solve_I_minus_J(apply(A[k:k + 1]), b[k:k + 1], method=method, tol=1e-11)
        assert torch.allclose(xk[0], x[k], rtol=0, atol=1e-12 * float(x[k].abs().max()))
        assert float(rk[0]) == pytest.approx(float(res[k]), rel=1e-3, abs=1e-15)
        assert abs(int(ik[0]) - int(its[k])) <= 1
    # each sample converges at its own pace: the slow contraction needs more products than the fast one
    assert its[RHOS.index(0.97)] > its[RHOS.index(0.3)]


def test_transposed_system_by_passing_the_transposed_product():
    A, b = batch_of_maps(seed=2)
    AT = A.transpose(1, 2)
    x, res, _ = solve_I_minus_J(apply(AT), b, tol=1e-12)
    ref = torch.linalg.solve((torch.eye(A.shape[-1], dtype=D64) - A).transpose(1, 2), b)
    assert torch.allclose(x, ref, atol=1e-9)
    assert (res <= 1e-12).all()


def test_neumann_flags_a_non_contractive_sample_and_still_solves_the_others():
    A, b = batch_of_maps(rhos=(0.6, 1.3, 0.8), seed=3)
    x, res, its = solve_I_minus_J(apply(A), b, method="neumann", tol=1e-12, max_iter=2000)
    ref = dense_solution(A, b)
    assert float(res[1]) > 1e-3  # ρ > 1: the series diverges; reported, not hidden
    assert its[1] < 2000  # stopped when the residual grew 1e8-fold, not at the budget
    for k in (0, 2):
        assert float(res[k]) <= 1e-12
        assert torch.allclose(x[k], ref[k], atol=1e-9)
    assert torch.allclose(res, relative_residual(apply(A), x, b), rtol=1e-6)


def test_gmres_solves_a_system_neumann_cannot_and_reports_a_budget_shortfall():
    A, b = batch_of_maps(rhos=(1.3, 0.5), seed=3)
    x, res, _ = solve_I_minus_J(apply(A), b, tol=1e-11)  # I − A is invertible though ρ(A) > 1
    assert torch.allclose(x, dense_solution(A, b), atol=1e-8)
    x, res, its = solve_I_minus_J(apply(A), b, tol=1e-11, restart=3, max_iter=12)
    assert (its <= 12).all()
    assert float(res[0]) > 1e-11  # not converged within 12 products: the residual says so
    assert torch.allclose(res, relative_residual(apply(A), x, b), rtol=1e-6)


@pytest.mark.parametrize("method", ["gmres", "neumann"])
def test_the_product_budget_is_kept_residual_checks_included(method):
    A, b = batch_of_maps(seed=4)
    for budget in (2, 5, 13):
        counted = [0]

        def counting(V):
            counted[0] += 1
            return apply(A)(V)

        x, res, its = solve_I_minus_J(counting, b, method=method, tol=1e-14, max_iter=budget, restart=4)
        assert (its <= budget).all() and counted[0] <= budget
        assert torch.allclose(res, relative_residual(apply(A), x, b), rtol=1e-6)


def test_zero_right_hand_side_and_structured_states():
    A, b = batch_of_maps(n=24)
    b[1] = 0
    shape = (A.shape[0], 4, 6)  # the state keeps its trailing shape
    apply_s = lambda V: torch.einsum("bij,bj->bi", A, V.reshape(V.shape[0], -1)).reshape(V.shape)  # noqa: E731
    x, res, its = solve_I_minus_J(apply_s, b.reshape(shape), tol=1e-12)
    assert x.shape == shape
    assert float(res[1]) == 0.0 and int(its[1]) == 0 and float(x[1].abs().max()) == 0.0
    assert torch.allclose(x.reshape(A.shape[0], -1), dense_solution(A, b), atol=1e-9)


def test_initial_guess_is_used():
    A, b = batch_of_maps()
    ref = dense_solution(A, b)
    for method in ("gmres", "neumann"):
        x, res, its = solve_I_minus_J(apply(A), b, method=method, tol=1e-10, x_init=ref)
        assert (its <= 1).all() and (res <= 1e-10).all()


def test_bad_arguments_are_refused():
    A, b = batch_of_maps()
    with pytest.raises(ValueError, match="method"):
        solve_I_minus_J(apply(A), b, method="cg")
    with pytest.raises(ValueError, match="tol"):
        solve_I_minus_J(apply(A), b, tol=float("nan"))


class _Syncs(torch.overrides.TorchFunctionMode):
    """The calls that make the host wait for the device (benchmarks/launch_bound.py's list)."""

    SYNCS = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in self.SYNCS
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("restart", [60, 7])
def test_checking_the_live_samples_every_k_steps_gives_the_same_bits_with_fewer_host_syncs(restart):
    """GMRES's host check of whether a system still steps (issue 35): with a check every 4 or 5 steps instead of
    every one the solution, residuals and products are bit for bit the same (a step with every system stopped is
    masked out), the solution is still the dense one, and the host syncs fall."""
    A, b = batch_of_maps()  # ρ from 0.3 to 0.97: the systems stop at different steps
    runs = {}
    for k in (1, 4, 5):
        with _Syncs() as syncs:
            runs[k] = solve_I_minus_J(apply(A), b, tol=1e-12, restart=restart, max_iter=5000, check_every=k)
        runs[k] = (runs[k], syncs.count)
    (x, res, its), one = runs[1]
    for k in (4, 5):
        (xk, rk, ik), count = runs[k]
        assert torch.equal(xk, x) and torch.equal(rk, res) and torch.equal(ik, its)
        assert count < one
    ref = dense_solution(A, b)
    assert float(((x - ref).norm(dim=1) / ref.norm(dim=1)).max()) < 1e-9
