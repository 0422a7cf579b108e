"""The fixed-point solvers on maps with known answers: a linear map, the logistic map's cycles, diverging maps."""

import math

import pytest
import torch

from stability.solvers import SOLVERS, STATUSES, detect_period, residual, solve


def linear_map(n=24, rho=0.9, seed=0):
    """f(x, x0) = A x + B x0 with ρ(A) = rho; x* = (I − A)⁻¹ B x0."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    A = A / torch.linalg.eigvals(A).abs().max() * rho
    B = torch.randn(n, n, generator=g, dtype=torch.float64)
    x0 = torch.randn(3, n, generator=g, dtype=torch.float64)
    x_star = torch.linalg.solve(torch.eye(n, dtype=torch.float64) - A, (x0 @ B.T).T).T
    return (lambda x, x0: x @ A.T + x0 @ B.T), x0, x_star


@pytest.mark.parametrize("method", ["picard", "damped", "anderson"])
def test_every_method_reaches_the_exact_fixed_point_of_a_linear_map(method):
    f, x0, x_star = linear_map()
    r = solve(f, x0, x0, method=method, tol=1e-12, max_iter=3000)
    assert r.status == ["converged"] * 3
    assert torch.allclose(r.x_last, x_star, atol=1e-9, rtol=0)
    assert torch.allclose(r.x_best, x_star, atol=1e-9, rtol=0)
    assert r.residuals.shape == (3, int(r.nfe.max()))
    assert r.period.tolist() == [1, 1, 1]


def test_picard_and_anderson_agree_and_anderson_needs_fewer_evaluations():
    f, x0, x_star = linear_map(rho=0.97, seed=1)
    p = solve(f, x0, x0, method="picard", tol=1e-10, max_iter=5000)
    a = solve(f, x0, x0, method="anderson", tol=1e-10, max_iter=5000, memory=6)
    assert p.status == a.status == ["converged"] * 3
    assert (p.x_best - a.x_best).abs().max() < 1e-7
    assert (a.nfe < 0.4 * p.nfe).all(), (a.nfe, p.nfe)


def test_residual_is_the_relative_linf_criterion_of_consecutive_picard_iterates():
    f, x0, _ = linear_map()
    r = solve(f, x0, x0, tol=1e-8, max_iter=50)
    x1 = f(x0, x0)
    x2 = f(x1, x0)
    expect0 = (x1 - x0).abs().amax(1) / (x1.abs().amax(1) + 1e-8)
    expect1 = (x2 - x1).abs().amax(1) / (x2.abs().amax(1) + 1e-8)
    assert torch.allclose(r.residuals[:, 0], expect0)
    assert torch.allclose(r.residuals[:, 1], expect1)
    assert torch.allclose(residual(x1, x0), expect0)


def test_converged_samples_are_frozen_and_the_batch_continues_for_the_others():
    calls = []

    def f(x, x0):  # per-sample contraction rate x0: sample 0 converges fast, sample 1 slowly
        calls.append(x.shape[0])
        return x0[:, :1] * x + 1.0

    x0 = torch.tensor([[0.1, 0.0], [0.9, 0.0]], dtype=torch.float64)
    r = solve(f, torch.zeros(2, 2, dtype=torch.float64), x0, tol=1e-10, max_iter=1000)
    assert r.status == ["converged", "converged"]
    assert r.nfe[0] < r.nfe[1]
    assert sum(calls) == int(r.nfe.sum())  # no evaluation was spent on a frozen sample
    assert torch.isnan(r.residuals[0, int(r.nfe[0]):]).all()
    assert torch.allclose(r.x_best[:, 0], 1 / (1 - x0[:, 0]), atol=1e-8)


def test_best_residual_is_the_lowest_of_the_trace():
    f, x0, _ = linear_map(rho=0.99, seed=3)
    r = solve(f, x0, x0, method="anderson", tol=1e-14, max_iter=40)
    trace_min = torch.tensor([min(v for v in row if not math.isnan(v)) for row in r.residuals.tolist()],
                             dtype=torch.float64)
    assert torch.allclose(r.best_residual, trace_min)
    assert r.status == ["max-iterations"] * 3


def logistic(x, r):
    return r * x * (1 - x)


def test_logistic_map_fixed_point_two_cycle_and_four_cycle_are_told_apart():
    """r = 2.8: attracting fixed point 1 − 1/r; r = 3.2: the 2-cycle x± = ((r+1) ± √((r−3)(r+1)))/(2r);
    r = 3.5: a 4-cycle. The batch runs all three at once."""
    r_values = torch.tensor([2.8, 3.2, 3.5], dtype=torch.float64)[:, None].expand(3, 4)
    x_init = torch.full((3, 4), 0.3, dtype=torch.float64)
    res = solve(logistic, x_init, r_values, tol=1e-12, max_iter=600)
    assert res.status == ["converged", "stalled", "stalled"]
    assert res.period.tolist() == [1, 2, 4]
    assert abs(float(res.x_best[0, 0]) - (1 - 1 / 2.8)) < 1e-10
    r = 3.2
    disc = math.sqrt((r - 3) * (r + 1))
    orbit = sorted([((r + 1) + disc) / (2 * r), ((r + 1) - disc) / (2 * r)])
    x_last = float(res.x_last[1, 0])
    assert min(abs(x_last - o) for o in orbit) < 1e-9
    assert detect_period(logistic, res.x_last, r_values, max_period=8, tol=1e-8).tolist() == [1, 2, 4]


def test_a_map_with_only_period_two_orbits_is_stalled():
    res = solve(lambda x, x0: -x, torch.ones(2, 3), None, tol=1e-6, max_iter=120, stall_patience=50)
    assert res.status == ["stalled", "stalled"]
    assert res.period.tolist() == [2, 2]


def test_a_diverging_sample_is_reported_and_does_not_stop_the_others():
    def f(x, x0):  # x0 = 2: x ← 2x + 1 diverges; x0 = 0.5: converges to 2
        return x0 * x + 1.0

    x0 = torch.tensor([[2.0], [0.5]], dtype=torch.float64)
    res = solve(f, torch.ones(2, 1, dtype=torch.float64), x0, tol=1e-10, max_iter=500)
    assert res.status == ["diverged", "converged"]
    assert res.nfe[0] < 40  # frozen as soon as it passed diverge_ratio
    assert abs(float(res.x_best[1, 0]) - 2.0) < 1e-9


def test_non_finite_values_are_caught_per_sample():
    def f(x, x0):
        return torch.where(x0 > 0, torch.exp(torch.exp(x)) + x, 0.5 * x)

    x0 = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    res = solve(f, torch.full((2, 1), 3.0, dtype=torch.float64), x0, tol=1e-10, max_iter=100,
                diverge_ratio=1e300)
    assert res.status[0] == "non-finite"
    assert res.status[1] == "converged"
    assert torch.isfinite(res.x_last).all()  # the last finite image is kept


@pytest.mark.parametrize("method", ["picard", "damped", "anderson"])
def test_a_map_without_fixed_point_never_crashes_any_method(method):
    res = solve(lambda x, x0: torch.exp(x), torch.zeros(4, 2, dtype=torch.float64), None, method=method,
                tol=1e-8, max_iter=200)
    assert all(s in STATUSES and s != "converged" for s in res.status)
    assert res.residuals.shape[0] == 4


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="allowed"):
        solve(lambda x, x0: x, torch.zeros(1, 1), None, method="newton")
    with pytest.raises(ValueError, match="damping"):
        solve(lambda x, x0: x, torch.zeros(1, 1), None, method="damped", damping=1.5)


# ---- limited-memory Broyden, the certified x*, the repelling status, nfe ----------------------------------------

def test_broyden_reaches_the_exact_fixed_point_of_a_linear_map_with_fewer_evaluations_than_picard():
    f, x0, x_star = linear_map(n=60, rho=0.97, seed=2)
    p = solve(f, x0, x0, method="picard", tol=1e-10, max_iter=5000)
    b = solve(f, x0, x0, method="broyden", tol=1e-10, max_iter=5000, memory=10)
    assert b.status == ["converged"] * 3
    # x − x* = −(I − A)⁻¹ (f(x) − x): the certified residual bounds the error
    A = f(torch.eye(60, dtype=torch.float64), torch.zeros_like(x0[:1])).T
    bound = torch.linalg.inv(torch.eye(60, dtype=torch.float64) - A).abs().sum(1).max()
    err = (b.x_best - x_star).abs().amax(1)
    assert (err <= bound * (f(b.x_best, x0) - b.x_best).abs().amax(1) * (1 + 1e-6)).all()
    assert (err < 2e-7).all()  # τ · ‖x*‖∞ ≈ 7e-9, times ‖(I − A)⁻¹‖∞
    assert (b.nfe < 0.4 * p.nfe).all(), (b.nfe, p.nfe)
    assert b.rho is not None and torch.allclose(b.rho, torch.full((3,), 0.97, dtype=torch.float64), atol=1e-6)


def test_broyden_memory_is_bounded_by_the_stored_pairs_not_by_max_iter():
    """memory m: 2·m·n numbers per sample; with m far below the iterations needed the rank reduction keeps
    convergence (a dropped-oldest-pair memory needs more than 2× the evaluations on this map)."""
    f, x0, x_star = linear_map(n=200, rho=0.999, seed=1)
    small = solve(f, x0, x0, method="broyden", tol=1e-10, max_iter=3000, memory=10, certify_rho=False)
    full = solve(f, x0, x0, method="broyden", tol=1e-10, max_iter=3000, memory=3000, certify_rho=False)
    assert small.status == full.status == ["converged"] * 3
    assert small.info["memory"] == 10
    assert (small.nfe.double() < 1.5 * full.nfe.double()).all(), (small.nfe, full.nfe)
    assert (small.x_best - x_star).abs().max() < 1e-7


def test_broyden_reports_max_iterations_diverged_and_non_finite_per_sample():
    f, x0, _ = linear_map(rho=0.999, seed=3)
    short = solve(f, x0, x0, method="broyden", tol=1e-14, max_iter=15, max_period=0)
    assert short.status == ["max-iterations"] * 3
    assert short.nfe.tolist() == [15, 15, 15]

    def blow(x, x0):  # x0 < 0: a map with no fixed point whose values explode; x0 > 0: a contraction to 2x0
        return torch.where(x0 < 0, x + 1e3 * (1 + x * x), 0.5 * x + x0)

    x0b = torch.tensor([[-1.0], [1.0]], dtype=torch.float64)
    res = solve(blow, torch.zeros(2, 1, dtype=torch.float64), x0b, method="broyden", tol=1e-10, max_iter=200,
                diverge_ratio=1e3)
    assert res.status == ["diverged", "converged"]
    assert res.nfe[0] <= 3
    assert abs(float(res.x_best[1, 0]) - 2.0) < 1e-9

    def nonfinite(x, x0):
        return torch.where(x0 > 0, torch.exp(torch.exp(x)) + x, 0.5 * x)

    x0n = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    res = solve(nonfinite, torch.full((2, 1), 3.0, dtype=torch.float64), x0n, method="broyden", tol=1e-10,
                max_iter=100, diverge_ratio=1e300)
    assert res.status == ["non-finite", "converged"]
    assert torch.isfinite(res.x_last).all() and torch.isfinite(res.x_best).all()


@pytest.mark.parametrize("method", ["anderson", "broyden"])
def test_a_sample_is_solved_the_same_alone_and_in_a_batch_with_failing_mates(method):
    f, x0, _ = linear_map(n=16, rho=0.95, seed=4)

    def g(x, x0):  # samples with x0[:, 0] > 5 explode, the others follow the linear map
        bad = (x0[:, :1] > 5).to(x.dtype)
        return (1 - bad) * f(x, x0) + bad * (x + 1e3 * (1 + x * x))

    mates = x0.clone()
    mates[1:, 0] = 10.0
    alone = solve(g, x0[:1], x0[:1], method=method, tol=1e-10, max_iter=400, certify_rho=False)
    batch = solve(g, mates, mates, method=method, tol=1e-10, max_iter=400, certify_rho=False, diverge_ratio=1e3)
    assert alone.status == ["converged"] and batch.status[0] == "converged"
    assert batch.status[1:] == ["diverged", "diverged"]
    assert int(alone.nfe[0]) == int(batch.nfe[0])
    assert torch.allclose(alone.x_best[0], batch.x_best[0], atol=1e-12, rtol=0)


@pytest.mark.parametrize("method", ["picard", "damped", "anderson", "broyden", "auto"])
def test_the_returned_fixed_point_is_the_certified_one(method):
    """x_best is the point whose residual was measured: r(x_best), recomputed here, is best_residual < τ."""
    f, x0, _ = linear_map(n=40, rho=0.98, seed=5)
    tol = 1e-6
    r = solve(f, x0, x0, method=method, tol=tol, max_iter=3000, certify_rho=False)
    assert r.status == ["converged"] * 3
    again = residual(f(r.x_best, x0), r.x_best)
    assert torch.allclose(again, r.best_residual, rtol=1e-6, atol=0)  # rounding of f on another batch
    assert (again < tol).all()


def test_a_repelling_fixed_point_found_by_a_root_finder_is_marked_repelling():
    """f(x) = a x + (1 − a) c has the fixed point c with J* = a I: ρ = 2 repels, ρ = 0.5 attracts. Broyden finds
    both; Picard diverges on the first; ``converged`` holds for both (certified roots)."""
    c = torch.tensor([[0.3, -1.2, 2.0], [0.7, 0.1, -0.4]], dtype=torch.float64)
    a = torch.tensor([[2.0], [0.5]], dtype=torch.float64)

    def f(x, x0):
        return x0[:, :1] * x + (1 - x0[:, :1]) * x0[:, 1:]

    x0 = torch.cat([a, c], dim=1)
    start = torch.zeros(2, 3, dtype=torch.float64)
    b = solve(f, start, x0, method="broyden", tol=1e-10, max_iter=100)
    assert b.status == ["repelling", "converged"]
    assert b.converged.tolist() == [True, True] and b.repelling.tolist() == [True, False]
    assert torch.allclose(b.x_best, c, atol=1e-9)
    assert torch.allclose(b.rho, torch.tensor([2.0, 0.5], dtype=torch.float64), atol=1e-8)
    assert b.status_counts()["repelling"] == 1 and b.summary()["rho"][0] == pytest.approx(2.0)
    p = solve(f, start, x0, method="picard", tol=1e-10, max_iter=200)
    assert p.status == ["diverged", "converged"]
    assert p.rho is None  # Picard's fixed points are reached by the map itself: no ρ is computed by default


def test_classify_matches_the_dense_spectral_radius():
    from stability.solvers import classify

    f, x0, _ = linear_map(n=30, rho=0.9, seed=6)
    r = solve(f, x0, x0, method="picard", tol=1e-10, max_iter=2000)
    classify(r, f, x0)
    assert torch.allclose(r.rho, torch.full((3,), 0.9, dtype=torch.float64), atol=1e-7)
    assert r.status == ["converged"] * 3
    assert r.info["rho_products"] > 0


@pytest.mark.parametrize("method", ["picard", "anderson", "broyden"])
def test_nfe_counts_every_evaluation_of_f_including_the_cycle_check(method):
    rows = []

    def counted(x, r):
        rows.append(x.shape[0])
        return logistic(x, r)

    r_values = torch.tensor([2.8, 3.2], dtype=torch.float64)[:, None].expand(2, 4)
    res = solve(counted, torch.full((2, 4), 0.3, dtype=torch.float64), r_values, method=method, tol=1e-12,
                max_iter=300, certify_rho=False)
    assert sum(rows) == int(res.nfe.sum())
    if method == "picard":
        assert res.status == ["converged", "stalled"] and res.period.tolist() == [1, 2]
        assert int(res.nfe[1]) == 300 + 16  # the budget plus the cycle check's 2 · max_period evaluations


def _dense_broyden(f, x, x0, steps):
    """Reference: "good" Broyden with the dense inverse H (H₀ = −I, H ← H + (s − Hy) sᵀH / (sᵀHy)), x ← x − Hg;
    the residual r of every iterate."""
    n = x.shape[1]
    H = -torch.eye(n, dtype=torch.float64).expand(x.shape[0], n, n).clone()
    out, xp, gp = [], None, None
    for _ in range(steps):
        fx = f(x, x0)
        g = fx - x
        out.append(residual(fx, x))
        if xp is not None:
            s, y = x - xp, g - gp
            sH = torch.einsum("bi,bij->bj", s, H)
            Hy = torch.einsum("bij,bj->bi", H, y)
            H = H + torch.einsum("bi,bj->bij", s - Hy, sH) / torch.linalg.vecdot(sH, y)[:, None, None]
        xp, gp = x, g
        x = x - torch.einsum("bij,bj->bi", H, g)
    return torch.stack(out, 1)


def test_broyden_compact_form_follows_the_dense_good_broyden_iteration(monkeypatch):
    """Before its memory is full the compact form (H = −I + Bᵀ K B over the residuals) is the plain "good"
    Broyden iteration: the same residual at every step as the dense inverse-Jacobian update, to rounding (the
    algebra, with the basis stored in float64)."""
    Broyden = SOLVERS["broyden"]

    monkeypatch.setattr(Broyden, "storage", None)
    f, x0, _ = linear_map(n=40, rho=0.98, seed=8)
    ref = _dense_broyden(f, x0.clone(), x0, 30)
    got = solve(f, x0, x0, method="broyden", tol=1e-300, max_iter=30, memory=20, max_period=0,
                certify_rho=False)
    assert got.info["compressions"] == 0 and got.info["basis"] == 40
    assert torch.allclose(got.residuals, ref, rtol=1e-6, atol=0), (got.residuals / ref - 1).abs().max()


def test_broyden_float32_basis_reaches_the_exact_fixed_point_at_tight_tolerance_as_the_float64_one(monkeypatch):
    """The basis stored in float32 for a float64 state rounds each residual by 6e-8 of itself: an error of the
    quasi-Newton direction relative to the step, so the residual still falls to τ = 1e-12 and x_best is the
    exact x* of a linear map, with the evaluations of the float64 basis to within 10 % (memory 10 on a map that
    needs ~180 steps: ~50 rank reductions, each a point where rounding can tip the iteration either way)."""
    Broyden = SOLVERS["broyden"]

    f, x0, x_star = linear_map(n=200, rho=0.99, seed=4)
    kw = dict(tol=1e-12, max_iter=3000, memory=10, certify_rho=False)
    r32 = solve(f, x0, x0, method="broyden", **kw)
    monkeypatch.setattr(Broyden, "storage", None)
    r64 = solve(f, x0, x0, method="broyden", **kw)
    assert r32.info["storage"] == "float32" and r64.info["storage"] == "float64"
    assert r32.info["compressions"] > 0
    assert r32.status == r64.status == ["converged"] * 3
    assert (r32.best_residual < 1e-12).all()
    scale = x_star.abs().amax(1)
    assert ((r32.x_best - x_star).abs().amax(1) / scale < 1e-9).all()
    assert ((r32.nfe - r64.nfe).abs() <= 0.1 * r64.nfe).all(), (r32.nfe, r64.nfe)
    # a float32 state keeps its own dtype
    r = solve(lambda x, x0: f(x.double(), x0.double()).float(), x0.float(), x0.float(), method="broyden",
              tol=1e-5, max_iter=500, certify_rho=False)
    assert r.info["storage"] == "float32" and r.status == ["converged"] * 3


def test_broyden_rank_reduction_is_the_truncated_svd_of_the_correction(monkeypatch):
    """Eckart–Young: the best rank-q approximation of M = Bᵀ K B is M's SVD truncated to q terms. The compressed
    basis must carry it (the new Bᵀ K B equals the truncated SVD, to rounding), represent the last step s and
    residual g_{k−1} exactly, and keep Γ = B Bᵀ."""
    Broyden = SOLVERS["broyden"]

    monkeypatch.setattr(Broyden, "storage", None)

    g = torch.Generator().manual_seed(7)
    A, m, n = 3, 8, 50
    solver = Broyden(A, n, torch.float64, "cpu", memory=m)
    c, q = solver.cap, solver.q
    Bv = torch.randn(A, c, n, generator=g, dtype=torch.float64)
    solver.B.copy_(Bv)
    solver.G.copy_(Bv @ Bv.transpose(1, 2))
    solver.K.copy_(torch.randn(A, c, c, generator=g, dtype=torch.float64))
    solver.sig.copy_(torch.randn(A, c, generator=g, dtype=torch.float64))
    solver.gp.copy_(torch.randn(A, c, generator=g, dtype=torch.float64))
    solver.count[:], solver.kmax, solver.top = c, c, c
    M = Bv.transpose(1, 2) @ solver.K @ Bv  # (A, n, n)
    s_vec = torch.einsum("ac,acn->an", solver.sig, Bv)
    g_vec = torch.einsum("ac,acn->an", solver.gp, Bv)
    Us, sv, Vh = torch.linalg.svd(M)
    best = (Us[:, :, :q] * sv[:, None, :q]) @ Vh[:, :q]
    solver._compress(torch.arange(A))
    k = 2 * q + 2
    Bn = solver.B[:, :k]
    assert solver.count.tolist() == [k] * A and q == m // 2 - 1
    assert torch.allclose(Bn.transpose(1, 2) @ solver.K[:, :k, :k] @ Bn, best, atol=1e-10 * float(sv.max()), rtol=0)
    assert (solver.K[:, k:] == 0).all() and (solver.K[:, :, k:] == 0).all()
    assert torch.allclose(torch.einsum("ac,acn->an", solver.sig[:, :k], Bn), s_vec, atol=1e-10, rtol=0)
    assert torch.allclose(torch.einsum("ac,acn->an", solver.gp[:, :k], Bn), g_vec, atol=1e-10, rtol=0)
    G = Bn @ Bn.transpose(1, 2)
    assert torch.allclose(solver.G[:, :k, :k], G, atol=1e-9 * float(G.abs().max()), rtol=0)


def test_broyden_memory_of_m_pairs_holds_2m_basis_vectors_independent_of_max_iter():
    f, x0, x_star = linear_map(n=200, rho=0.999, seed=1)
    r = solve(f, x0, x0, method="broyden", tol=1e-10, max_iter=3000, memory=10, certify_rho=False)
    assert r.info["basis"] == 20 and r.info["compressions"] > 0
    assert r.status == ["converged"] * 3


def test_classify_above_the_krylov_size_matches_the_constructed_spectral_radius():
    """n = 150 > the Krylov basis (60): restarted Krylov–Schur on Jᵀ, certified to a Ritz residual of 1e-10;
    the linear map's ρ(A) is 0.95 by construction (A scaled by its own dense eigenvalues)."""
    from stability.solvers import classify

    f, x0, _ = linear_map(n=150, rho=0.95, seed=8)
    r = solve(f, x0, x0, method="picard", tol=1e-10, max_iter=3000)
    classify(r, f, x0, tol=1e-10)
    assert torch.allclose(r.rho, torch.full((3,), 0.95, dtype=torch.float64), atol=1e-8)
    assert r.status == ["converged"] * 3


def test_observe_sees_every_plain_iterate_and_leaves_the_solve_unchanged():
    # samples converging at different rates plus one diverging: the solve stops each at its own step, while
    # observe must see x_t = f^t(e) of the whole batch for every t ≤ observe_steps, even past max_iter
    def f(x, x0):
        return x0[:, :1] * x + 1.0

    x0 = torch.tensor([[0.1, 0.0], [0.9, 0.0], [1.5, 0.0]], dtype=torch.float64)
    e = torch.zeros(3, 2, dtype=torch.float64)
    seen = []
    plain = solve(f, e, x0, tol=1e-10, max_iter=300)
    watched = solve(f, e, x0, tol=1e-10, max_iter=300, observe=lambda t, x: seen.append((t, x.clone())),
                    observe_steps=320)
    assert plain.status == watched.status and plain.status[:2] == ["converged", "converged"]
    assert plain.status[2] != "converged"
    for name in ("x_best", "x_last", "best_residual", "nfe", "period"):
        assert torch.equal(getattr(plain, name), getattr(watched, name)), name
    assert torch.equal(plain.residuals.nan_to_num(-1), watched.residuals.nan_to_num(-1))
    assert [t for t, _ in seen] == list(range(1, 321))
    x = e
    for t, xt in seen:  # independent reference: the plain iteration written out
        x = f(x, x0)
        assert torch.equal(xt, x), t
    # x_t of the slow sample: the geometric sum 1 + 0.9 + ... + 0.9^(t-1)
    assert abs(float(seen[99][1][1, 0]) - (1 - 0.9 ** 100) / 0.1) < 1e-12


def test_observe_is_refused_for_a_root_finder():
    f, x0, _ = linear_map()
    with pytest.raises(ValueError, match="observe needs plain Picard"):
        solve(f, x0, x0, method="anderson", observe=lambda t, x: None, observe_steps=3)


def test_broyden_sample_is_solved_the_same_alone_and_in_a_batch_with_other_restarts_and_rank_reductions():
    """Restarts (a low restart factor) and rank reductions (memory 3) fall on different steps in different
    samples, so the batch runs with unequal basis sizes; each sample's iterates must still be its own."""
    g = torch.Generator().manual_seed(11)
    n = 12
    W = torch.randn(n, n, generator=g, dtype=torch.float64) / n ** 0.5

    def f(x, x0):  # a tanh map, its gain per sample in x0[:, 0]
        return torch.tanh(x0[:, :1] * (x @ W.T)) + x0

    x0 = torch.randn(4, n, generator=g, dtype=torch.float64) * 0.5
    x0[:, 0] = torch.tensor([1.2, 2.0, 1.6, 2.4])
    kw = dict(tol=1e-10, max_iter=400, memory=3, restart_factor=1.5, certify_rho=False, max_period=0)
    batch = solve(f, x0, x0, method="broyden", **kw)
    assert sum(batch.info["restarts"]) > 0 and batch.info["compressions"] > 0
    assert len(set(batch.info["restarts"])) > 1  # restarts differ between samples
    for b in range(4):
        alone = solve(f, x0[b:b + 1], x0[b:b + 1], method="broyden", **kw)
        assert alone.status[0] == batch.status[b]
        assert int(alone.nfe[0]) == int(batch.nfe[b])
        assert torch.allclose(alone.x_best[0], batch.x_best[b], atol=1e-12, rtol=0)
