"""The batched Prop. 5 / App. A.8 / ‖dx*/dx0‖_F functions on a small looped transformer (state 6 × 8 = 48):
each sample's result equals the per-sample references' (scipy GMRES, tests/reference_numerics.py) and the
dense-Jacobian answer, does not depend on its batch mates, and the reported GMRES residuals are the true ones."""

import copy

import numpy as np
import pytest
import torch

from tests.reference_numerics import input_dependence_frobenius, prop5_check
from stability.analysis.fixed_point import analysis_model
from stability.analysis.initial_iterate import (initial_iterate_sensitivity, initial_iterate_sensitivity_batched,
                                                prop5_and_initial_iterate_batched)
from stability.analysis.input_dependence import input_dependence_frobenius_batched
from stability.analysis.prop5 import KrylovError, default_T_grid, implicit_input_jvp_batched, prop5_check_batched
from stability.analysis.tangents import unroll_tangents_batched
from stability.config import ModelConfig
from stability.model import build_model
from stability.numerics import Linearisation
from stability.solvers import solve

D64 = torch.float64
L, WIDTH = 6, 8
TS = default_T_grid(50)


def contractive_model(recall="external", norm="pre", scale=0.4, seed=0):
    torch.manual_seed(seed)
    m = analysis_model(build_model(ModelConfig(recall=recall, norm=norm, width=WIDTH, heads=2, attention_window=5)))
    with torch.no_grad():
        m.block.attn.out.weight.mul_(scale)
        m.block.mlp.proj.weight.mul_(scale)
        if m.recall_map is not None:
            m.recall_map.x.weight.mul_(scale)
    return m


@pytest.fixture(scope="module")
def setup():
    m = contractive_model()
    g = torch.Generator().manual_seed(1)
    x0 = m.embed(torch.randint(0, 2, (3, L, 1), generator=g).double() - 0.5)
    sol = solve(m.step, x0, x0, tol=1e-14, max_iter=400, max_period=0)
    assert sol.status == ["converged"] * 3
    return m, x0, sol.x_best


def dense_jacobians(f, x, x0):
    """J = ∂f/∂x and K = ∂f/∂x0 of one sample, (n, n) each, by torch.func.jacrev."""
    Jx, Jx0 = torch.func.jacrev(lambda a, c: f(a[None], c[None])[0], argnums=(0, 1))(x, x0)
    n = x.numel()
    return Jx.reshape(n, n), Jx0.reshape(n, x0.numel())


def test_linearisation_products_equal_the_dense_jacobians(setup):
    m, x0, xs = setup
    lin = Linearisation(m.step, xs, x0, inputs=True)
    g = torch.Generator().manual_seed(2)
    v, w = torch.randn(xs.shape, generator=g, dtype=D64), torch.randn(x0.shape, generator=g, dtype=D64)
    for b in range(3):
        J, K = dense_jacobians(m.step, xs[b], x0[b])
        assert torch.allclose(lin.J(v)[b].flatten(), J @ v[b].flatten(), atol=1e-12)
        assert torch.allclose(lin.JT(v)[b].flatten(), J.T @ v[b].flatten(), atol=1e-12)
        assert torch.allclose(lin.K(w)[b].flatten(), K @ w[b].flatten(), atol=1e-12)
        assert torch.allclose(lin.KT(v)[b].flatten(), K.T @ v[b].flatten(), atol=1e-12)
        assert torch.allclose(lin.JK(v, w)[b].flatten(), J @ v[b].flatten() + K @ w[b].flatten(), atol=1e-12)


def test_an_unrolled_step_equals_a_forward_mode_jvp(setup):
    """One step of the unroll (every step exact): (x_1, dx_1) = (f(e, x0), J dx + K U), a double reverse-mode
    product, against torch.func.jvp."""
    m, x0, xs = setup
    g = torch.Generator().manual_seed(3)
    dx, U = torch.randn(x0.shape, generator=g, dtype=D64), torch.randn(x0.shape, generator=g, dtype=D64)
    one = unroll_tangents_batched(m.step, x0, x0, [1], input_dir=U, e_tangent=dx, freeze_tol=None)
    y, dy = one.x[0], one.input_tangent[0]
    y_ref, dy_ref = torch.func.jvp(m.step, (x0, x0), (dx, U))
    assert torch.equal(y, y_ref.detach()) or torch.allclose(y, y_ref, atol=1e-15)
    assert torch.allclose(dy, dy_ref, atol=1e-12)


def test_implicit_input_jvp_equals_the_dense_solve_with_a_true_residual(setup):
    m, x0, xs = setup
    u = torch.randn(x0.shape, generator=torch.Generator().manual_seed(4), dtype=D64)
    w, res, its = implicit_input_jvp_batched(m.step, xs, x0, u, tol=1e-12)
    for b in range(3):
        J, K = dense_jacobians(m.step, xs[b], x0[b])
        rhs = K @ u[b].flatten()
        ref = torch.linalg.solve(torch.eye(J.shape[0], dtype=D64) - J, rhs)
        assert torch.allclose(w[b].flatten(), ref, rtol=0, atol=1e-9 * float(ref.abs().max()))
        true_res = float((w[b].flatten() - J @ w[b].flatten() - rhs).norm() / rhs.norm())
        assert float(res[b]) == pytest.approx(true_res, rel=1e-3, abs=1e-15)
        assert float(res[b]) <= 1e-12


@pytest.fixture(scope="module")
def per_sample_prop5(setup):
    m, x0, xs = setup
    return [prop5_check(m.step, xs[b], x0[b], x0[b], TS, tol=1e-10, seed=5) for b in range(3)]


@pytest.mark.parametrize("freeze_tol", [None, 1e-14])
def test_prop5_batched_equals_the_per_sample_scipy_check(setup, per_sample_prop5, freeze_tol):
    m, x0, xs = setup
    batched = prop5_check_batched(m.step, xs, x0, x0, TS, tol=1e-10, seed=5, freeze_tol=freeze_tol)
    assert batched.rel_error.shape == (3, len(TS))
    for b in range(3):
        ref = per_sample_prop5[b]
        got = batched.sample(b)
        assert got.T == ref.T
        # rel_error above the GMRES floor to 1e-6 relative; at the floor both sit at the solvers' tolerance
        np.testing.assert_allclose(got.rel_error, ref.rel_error, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(got.fixed_point_distance, ref.fixed_point_distance, rtol=1e-6, atol=1e-13)
        assert got.gmres_residual <= 1e-10 and ref.gmres_residual <= 1e-9
        assert got.rel_error[0] > 1e-2 and got.rel_error[-1] < 1e-8
    if freeze_tol is None:
        assert (batched.frozen_at == 0).all()
    else:
        assert (batched.frozen_at > 0).all()  # the trajectory reached x* to rounding before T = 50


def test_freezing_the_linearisation_changes_the_unrolled_tangent_by_rounding_only(setup):
    m, x0, xs = setup
    u = torch.randn(x0.shape, generator=torch.Generator().manual_seed(6), dtype=D64)
    exact = unroll_tangents_batched(m.step, x0, x0, TS, input_dir=u, initial_dir=u, freeze_tol=None)
    frozen = unroll_tangents_batched(m.step, x0, x0, TS, input_dir=u, initial_dir=u, freeze_tol=1e-14)
    scale = exact.input_tangent.flatten(2).norm(dim=2)
    diff = (exact.input_tangent - frozen.input_tangent).flatten(2).norm(dim=2)
    assert (diff <= 1e-11 * scale).all()
    diff_e = (exact.initial_tangent - frozen.initial_tangent).flatten(2).norm(dim=2)
    assert (diff_e <= 1e-11 * exact.initial_tangent.flatten(2).norm(dim=2) + 1e-300).all()


def test_the_dense_and_the_matrix_free_frozen_linearisation_agree(setup):
    m, x0, xs = setup
    u = torch.randn(x0.shape, generator=torch.Generator().manual_seed(11), dtype=D64)
    Ts = [1, 10, 100, 150]
    dense = unroll_tangents_batched(m.step, x0, x0, Ts, input_dir=u, initial_dir=u, dense_max=10_000)
    free = unroll_tangents_batched(m.step, x0, x0, Ts, input_dir=u, initial_dir=u, dense_max=0)
    assert (dense.frozen_at > 0).all() and (dense.frozen_at < Ts[-1] - x0[0].numel()).all()  # dense J used
    assert torch.allclose(dense.input_tangent, free.input_tangent, rtol=1e-12, atol=1e-14)
    assert torch.allclose(dense.initial_tangent, free.initial_tangent, rtol=1e-12, atol=1e-300)


def test_a_sample_result_does_not_depend_on_its_batch_mates(setup):
    m, x0, xs = setup
    full = prop5_check_batched(m.step, xs, x0, x0, TS, tol=1e-10)
    fro = input_dependence_frobenius_batched(m.step, xs, x0, probes=3, tol=1e-9)
    for b in range(3):
        alone = prop5_check_batched(m.step, xs[b:b + 1], x0[b:b + 1], x0[b:b + 1], TS, tol=1e-10)
        np.testing.assert_allclose(alone.rel_error[0], full.rel_error[b], rtol=1e-6, atol=1e-9)
        assert int(alone.frozen_at[0]) == int(full.frozen_at[b])
        fa = input_dependence_frobenius_batched(m.step, xs[b:b + 1], x0[b:b + 1], probes=3, tol=1e-9)
        assert float(fa.value[0]) == pytest.approx(float(fro.value[b]), rel=1e-8)


def test_initial_iterate_batched_equals_the_per_sample_function_and_decays(setup):
    m, x0, xs = setup
    batched = initial_iterate_sensitivity_batched(m.step, x0, x0, TS, seed=7)
    for b in (0, 2):
        ref = initial_iterate_sensitivity(m.step, x0[b], x0[b], TS, seed=7)
        got = batched.sample(b)
        assert got["T"] == ref["T"]
        np.testing.assert_allclose(got["norm"], ref["norm"], rtol=1e-9, atol=0)
    assert (batched.norm[:, -1] < 1e-6 * batched.norm[:, 0]).all()  # A.8: the start is forgotten


def test_one_shared_unroll_gives_both_stages_the_separate_results(setup):
    m, x0, xs = setup
    p5, a8 = prop5_and_initial_iterate_batched(m.step, xs, x0, x0, TS, tol=1e-10, seed=8)
    p5_alone = prop5_check_batched(m.step, xs, x0, x0, TS, tol=1e-10, seed=8)
    a8_alone = initial_iterate_sensitivity_batched(m.step, x0, x0, TS, seed=8)
    np.testing.assert_allclose(p5.rel_error, p5_alone.rel_error, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(a8.norm, a8_alone.norm, rtol=1e-9, atol=0)


def test_frobenius_batched_equals_per_sample_and_the_dense_norm(setup):
    m, x0, xs = setup
    # 12 systems in solves of at most 5
    est = input_dependence_frobenius_batched(m.step, xs, x0, probes=4, tol=1e-9, seed=9, batch=5)
    for b in range(3):
        ref = input_dependence_frobenius(m.step, xs[b], x0[b], probes=4, tol=1e-9, seed=9)
        got = est.sample(b)
        assert got.value == pytest.approx(ref.value, rel=1e-7)
        assert got.stderr == pytest.approx(ref.stderr, rel=1e-5)
        assert got.gmres_residual_max <= 1e-9
    # with many probes the estimate approaches the dense ‖(I − J)⁻¹ K‖_F
    many = input_dependence_frobenius_batched(m.step, xs[:1], x0[:1], probes=400, tol=1e-9, seed=9)
    J, K = dense_jacobians(m.step, xs[0], x0[0])
    exact = float(torch.linalg.solve(torch.eye(J.shape[0], dtype=D64) - J, K).norm())
    assert abs(float(many.value[0]) - exact) < 4 * float(many.stderr[0]) + 1e-3 * exact


def test_an_autonomous_map_that_ignores_x0_gets_the_per_sample_results():
    """recall none: f does not read x0, so ∂f/∂x0 = 0 and dx*/dx0 = 0; A.8 still decays."""
    m = contractive_model(recall="none", norm="pre", seed=12)
    g = torch.Generator().manual_seed(12)
    x0 = m.embed(torch.randint(0, 2, (2, L, 1), generator=g).double() - 0.5)
    xs = solve(m.step, x0, x0, tol=1e-14, max_iter=400, max_period=0).x_best
    Ts = [1, 5, 20]
    p5, a8 = prop5_and_initial_iterate_batched(m.step, xs, x0, x0, Ts, tol=1e-10)
    ref = prop5_check(m.step, xs[0], x0[0], x0[0], Ts, tol=1e-10)
    assert float(p5.w.abs().max()) == 0.0 and p5.sample(0).rel_error == ref.rel_error == [0.0] * 3
    ref_a8 = initial_iterate_sensitivity(m.step, x0[1], x0[1], Ts)
    np.testing.assert_allclose(a8.sample(1)["norm"], ref_a8["norm"], rtol=1e-9)
    assert input_dependence_frobenius_batched(m.step, xs, x0, probes=2).value.tolist() == [0.0, 0.0]


def test_the_analysis_reuses_the_prop5_unroll_for_A8_with_the_same_numbers():
    """run_stages: with stage prop5 the A.8 ‖dx_T/de‖ comes from Prop. 5's unroll; without it, from its own."""
    from stability.analysis.options import AnalysisOptions, parse_stages
    from stability.analysis.pipeline import run_stages

    m = contractive_model(seed=13)
    inputs = torch.randint(0, 2, (2, L, 1), generator=torch.Generator().manual_seed(13)).double() - 0.5
    base = dict(samples=2, max_iter=60, iterations=5, tol=1e-8)
    both = run_stages(m, inputs, None, AnalysisOptions(stages=parse_stages("prop5,a8"), **base)).to_dict()
    alone = run_stages(m, inputs, None, AnalysisOptions(stages=parse_stages("a8"), **base)).to_dict()
    got, ref = both["initial_iterate"], alone["initial_iterate"]
    assert got["sample"] == ref["sample"] == 0 and got["T"] == ref["T"] == default_T_grid(60)
    np.testing.assert_allclose(got["dxT_de_norm"], ref["dxT_de_norm"], rtol=1e-9)
    assert both["prop5"]["rel_error"][-1] < 1e-8


def test_a_sample_whose_gmres_misses_the_tolerance_is_flagged_and_raises_only_for_itself():
    """f(x, x0) = A_b x + x0 with ρ(A_0) = 0.99 and ρ(A_1) = 0.02: within 12 products GMRES solves sample 1
    to 1e-12 but not sample 0, and only sample 0 is reported as failed."""
    g = torch.Generator().manual_seed(10)
    n = 20
    A = torch.randn(2, n, n, generator=g, dtype=D64)
    A = A / torch.linalg.eigvals(A).abs().amax(-1)[:, None, None] * torch.tensor([0.99, 0.02], dtype=D64)[:, None, None]
    f = lambda x, x0: torch.einsum("bij,bj->bi", A, x) + x0  # noqa: E731
    x0 = torch.randn(2, n, generator=g, dtype=D64)
    xs = torch.linalg.solve(torch.eye(n, dtype=D64) - A, x0)
    # (f indexes A by batch position, so the unroll must keep the whole batch: freeze_tol=None)
    res = prop5_check_batched(f, xs, x0, x0, [1, 10], tol=1e-12, max_iter=12, restart=12, freeze_tol=None)
    assert res.converged.tolist() == [False, True]
    assert res.gmres_residual[0] > 1e-11 and res.gmres_residual[1] <= 1e-12
    with pytest.raises(KrylovError, match="did not converge"):
        res.sample(0)
    assert res.sample(1).gmres_residual <= 1e-12
