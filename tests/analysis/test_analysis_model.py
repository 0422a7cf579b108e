"""The analysis on small looped transformers of every (recall, norm) combination, built directly (untrained).

Checks the numerical promises: the assembled Prop. 4 / App. A.7 matrix equals the autograd Jacobian of
``step``, matrix-free ρ(J) agrees with the dense eigen-decomposition and with ARPACK (tests/reference_numerics.py)
to 1e-5, and on a contractive model the Prop. 5 error falls to the GMRES tolerance as T grows.
"""

import copy

import numpy as np
import pytest
import torch

from stability.analysis.accuracy import accuracy_vs_iteration
from stability.analysis.fixed_point import analysis_model
from stability.analysis.initial_iterate import fixed_point_distance
from tests.reference_numerics import JacobianOperator, arpack_rho, arpack_sigma_max, dense_rho
from stability.analysis.prop5 import default_T_grid, prop5_check_batched
from stability.analysis.stages.reachability import reachability
from stability.analysis.recall import RecallMatrixOperator, prop4, recall_form, rho_W_x
from stability.config import ModelConfig, TaskConfig
from stability.model import build_model
from stability.numerics import Linearisation, spectral_radius
from stability.solvers import solve

RECALLS = ["none", "external", "internal"]
NORMS = ["none", "pre", "peri", "post", "gru"]
L = 6  # tokens; state 6 × 16 = 96


def small_model(recall, norm, *, seed=0, width=16, heads=2):
    torch.manual_seed(seed)
    cfg = ModelConfig(recall=recall, norm=norm, width=width, heads=heads, attention_window=5)
    return analysis_model(build_model(cfg))


def inputs(n=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (n, L, 1), generator=g).double() - 0.5)


def make_contractive(model, scale=0.3):
    """Shrink the sublayers' output and the recall weight so that the loop map contracts (Banach)."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        m.block.attn.out.weight.mul_(scale)
        m.block.mlp.proj.weight.mul_(scale)
        if m.recall_map is not None:
            m.recall_map.x.weight.mul_(scale)
        if m.block.gru is not None:
            for cell in m.block.gru:
                cell.weight_hh.mul_(scale)
    return m


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("recall", RECALLS)
def test_assembled_recall_matrix_equals_autograd_jacobian_of_step(recall, norm):
    m = small_model(recall, norm)
    x0 = m.embed(inputs())
    x = solve(m.step, x0, x0, tol=1e-10, max_iter=60).x_best  # near x* where reachable, else a trajectory point
    x = x + 0.1 * torch.randn_like(x)  # and off the fixed point, where the factors still hold
    for b in range(2):
        M = RecallMatrixOperator(m, x[b:b + 1], x0[b:b + 1]).linear_map().dense()[0]
        J = JacobianOperator(m.step, x[b], x0[b]).dense()
        assert M.shape == (L * 16, L * 16)
        assert (M - J).abs().max() < 1e-12 * max(1.0, float(J.abs().max()))
    result = prop4(m, x, x0)
    if recall == "none":
        assert result is None
    else:
        assert result.max_abs_diff_vs_autograd < 1e-12
        assert result.columns_checked == L * 16
        dense_rhos = [dense_rho(JacobianOperator(m.step, x[b], x0[b]).dense()) for b in range(2)]
        assert np.allclose(result.rho_M, dense_rhos, atol=1e-5)
        assert result.form.startswith({"external": "M_ext", "internal": "M_int"}[recall])
        assert ("A.7" in result.form) == (norm in ("post", "gru"))


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("recall", RECALLS)
def test_matrix_free_spectral_radius_matches_arpack_and_the_dense_eigendecomposition(recall, norm):
    m = small_model(recall, norm, seed=1)
    x0 = m.embed(inputs(seed=1))
    x = solve(m.step, x0, x0, tol=1e-10, max_iter=100).x_best
    spec = spectral_radius(Linearisation(m.step, x[:1], x0[:1]), route="krylov", k=6, tol=1e-10)
    op = JacobianOperator(m.step, x[0], x0[0], mode="vjp")
    arpack = arpack_rho(op, k=6, tol=1e-10, transpose=True)
    assert abs(float(spec.rho[0]) - dense_rho(op.dense())) < 1e-5
    assert abs(float(spec.rho[0]) - arpack.rho) < 1e-5
    assert abs(float(spec.eigenvalues[0, 0].abs()) - abs(arpack.eigenvalues[0])) < 1e-5


def test_batched_krylov_matches_dense_on_a_model():
    m = small_model("internal", "peri", seed=2)
    x0 = m.embed(inputs(3, seed=2))
    x = solve(m.step, x0, x0, tol=1e-10, max_iter=100).x_best
    spec = spectral_radius(Linearisation(m.step, x, x0), route="krylov", tol=1e-10, restarts=60, krylov=40)
    for b in range(3):
        ref = dense_rho(JacobianOperator(m.step, x[b], x0[b]).dense())
        assert abs(float(spec.rho[b]) - ref) < 1e-5


def reference_ritz_residual(apply, shape, theta, u):
    """‖A u − θ u‖ / (|θ| ‖u‖) per sample, in complex128, for a real operator A (A u = A Re u + i A Im u): the
    test's own reference, independent of the certificate's implementation."""
    B = shape[0]
    u = u.to(torch.complex128).reshape(shape)
    Au = torch.complex(apply(u.real).detach().double(), apply(u.imag).detach().double()).reshape(B, -1)
    u = u.reshape(B, -1)
    theta = theta.to(torch.complex128)
    return (Au - theta[:, None] * u).abs().norm(dim=1) / (theta.abs() * u.abs().norm(dim=1))


@pytest.mark.parametrize("recall,norm", [("external", "gru"), ("internal", "pre")])
def test_mixed_precision_spectral_radius_matches_dense_and_reports_a_float64_residual(recall, norm):
    """float32 products of the model's float32 copy, each result certified by float64 products."""
    m = small_model(recall, norm, seed=4)
    m32 = copy.deepcopy(m).float()
    x0 = m.embed(inputs(2, seed=4))
    x = solve(m.step, x0, x0, tol=1e-10, max_iter=200).x_best
    exact, fast = Linearisation(m.step, x, x0), Linearisation(m32.step, x.float(), x0.float())
    spec = spectral_radius(exact, route="krylov", fast=fast, tol=1e-6, krylov=40)
    for b in range(2):
        ref = dense_rho(JacobianOperator(m.step, x[b], x0[b]).dense())
        assert abs(float(spec.rho[b]) - ref) < 1e-5
    assert (spec.ritz_residual < 1e-6).all()
    # the float32 route alone, checked by float64 products the same way, stays above the float64 floor
    plain = spectral_radius(fast, route="krylov", tol=1e-7, krylov=40, return_vectors=True, dtype=torch.float64)
    floor = reference_ritz_residual(exact.JT, tuple(x.shape), plain.eigenvalues[:, 0], plain.vectors)
    assert (floor > 1e-9).all() and (floor < 1e-5).all()


@pytest.mark.parametrize("recall,norm", [("external", "post"), ("internal", "post"), ("external", "none")])
def test_prop5_error_falls_toward_the_gmres_tolerance_on_a_contractive_model(recall, norm):
    m = make_contractive(small_model(recall, norm, seed=3))
    x0 = m.embed(inputs(1, seed=3))
    sol = solve(m.step, x0, x0, tol=1e-14, max_iter=400)
    assert sol.status == ["converged"]
    rho = float(spectral_radius(Linearisation(m.step, sol.x_best, x0)).rho[0])
    assert rho < 1
    chk = prop5_check_batched(m.step, sol.x_best, x0, x0, default_T_grid(200), tol=1e-12).sample(0)
    errs = chk.rel_error
    assert errs[0] > 1e-2  # one iteration is far from the implicit gradient
    assert errs[-1] < 1e-9  # ... and T = 200 is at the GMRES tolerance (plus x*'s own error)
    assert chk.gmres_residual < 1e-11
    tail = [e for t, e in zip(chk.T, errs) if t >= 5]
    assert all(b <= a * 1.5 + 1e-12 for a, b in zip(tail, tail[1:]))


def test_rho_W_x_is_the_spectral_radius_of_the_recall_weight():
    m = small_model("external", "post")
    expected = np.abs(np.linalg.eigvals(m.W_x.numpy())).max()
    assert abs(float(rho_W_x(m).rho[0]) - expected) < 1e-12
    assert rho_W_x(small_model("none", "post")) is None
    assert recall_form(small_model("internal", "post")) == "M_int (App. A.7, with outer-norm Jacobians)"


def test_autonomous_contractive_model_has_one_fixed_point_for_every_input():
    """Prop. 2 at its extreme: a contraction has one fixed point, so every input selects the same x*; a recall
    model's fixed point moves with x0 (and in both, A.8: x* does not depend on e)."""
    auto = make_contractive(small_model("none", "gru", seed=4), 0.2)  # the GRU gate z ≈ σ(1) damps the state
    recall = make_contractive(small_model("external", "gru", seed=4), 0.2)
    for model, expected in ((auto, 1), (recall, 4)):
        x0 = model.embed(inputs(4, seed=5))
        r = solve(model.step, x0, x0, tol=1e-12, max_iter=500)
        assert r.status == ["converged"] * 4
        assert reachability(r).distinct_fixed_points == expected
        r0 = solve(model.step, torch.zeros_like(x0), x0, tol=1e-12, max_iter=500)
        assert float(fixed_point_distance([r.x_best, r0.x_best]).max()) < 1e-9


def test_accuracy_curve_follows_the_models_own_forward():
    from stability.tasks import make_task

    task = make_task(TaskConfig(name="prefix-sums", train_size=4, val_size=8, hard_size=4, train_length=L))
    m = small_model("external", "post", seed=6)
    xs, ys = task.dataset("val")
    x0 = m.embed(xs.double())
    curve = accuracy_vs_iteration(m, task, x0, x0, ys, T_max=7)
    with torch.no_grad():
        logits = m(xs.double(), 7)  # (T, B, L, C)
    expected = [float(task.score(logits[t], ys)[0].double().mean()) for t in range(7)]
    expected_pos = [float(task.score(logits[t], ys)[1].double().mean()) for t in range(7)]
    assert curve.iterations == list(range(1, 8))
    assert np.allclose(curve.accuracy, expected)
    assert np.allclose(curve.position_accuracy, expected_pos)


def test_the_accuracy_scored_during_the_picard_solve_is_the_curve_of_the_models_own_forward():
    """Stage accuracy reads the curve the reachability solve scored (Picard from e): it must be the curve of
    ``model(inputs, T)``, the release's forward, at every T, also past max_iter and after every sample stopped."""
    from stability.analysis.options import AnalysisOptions
    from stability.analysis.pipeline import run_stages
    from stability.analysis.report import split_table
    from stability.tasks import make_task

    task = make_task(TaskConfig(name="prefix-sums", train_size=4, val_size=8, hard_size=4, train_length=L))
    m = small_model("external", "post", seed=6)
    xs, ys = task.dataset("val")
    opts = AnalysisOptions(samples=8, max_iter=5, iterations=9, stages=("reachability", "accuracy"))
    out = run_stages(m, xs, ys, opts, score=task.score, split="val")
    with torch.no_grad():
        logits = m(xs.double(), 9)  # (T, B, L, C)
    expected = [float(task.score(logits[t], ys)[0].double().mean()) for t in range(9)]
    expected_pos = [float(task.score(logits[t], ys)[1].double().mean()) for t in range(9)]
    acc = out.results["accuracy"]
    assert acc.iterations == list(range(1, 10))
    assert acc.accuracy == expected and acc.position_accuracy == expected_pos
    assert out.timings["accuracy"] < out.timings["reachability"]  # its evaluations were the solve's
    assert acc.scored_in == "reachability"
    line = next(l for l in split_table(out.to_dict()).splitlines() if l.startswith("time"))
    assert "accuracy (in reachability)" in line
    # and the solve itself is the one without the curve
    x0 = m.embed(xs.double())
    alone = solve(m.step, m.initial_state(x0), x0, tol=opts.tol, max_iter=5)
    assert torch.equal(alone.x_best, out.x_star)
    reach = out.results["reachability"]
    assert reach.status == alone.status and reach.nfe == alone.nfe.tolist()


def test_analysis_of_a_split_agrees_with_per_sample_arpack():
    """analyze_split end to end on a tiny prefix-sums model; its routes (the dense one at this size, and the
    batched Krylov–Schur one with all three samples in one batch, as on CUDA) give the spectral radii and σ_max of
    per-sample ARPACK at the same x*."""
    from stability.analysis.options import AnalysisOptions
    from stability.analysis.pipeline import analyze_split
    from stability.tasks import make_task

    task = make_task(TaskConfig(name="prefix-sums", train_size=4, val_size=3, hard_size=2, train_length=L,
                                hard_length=8))
    m = make_contractive(small_model("external", "post", seed=7))
    opts = AnalysisOptions(samples=3, tol=1e-10, max_iter=80, iterations=5, probes=2, eig_tol=1e-10, eig_batch=3)
    split = analyze_split(m, task, "val", opts)
    cpu = split.to_dict()
    ops = [JacobianOperator(m.step, split.x_star[b], split.x0[b], mode="vjp") for b in range(3)]
    arpack = [arpack_rho(op, tol=1e-12, transpose=True).rho for op in ops]
    assert cpu["fixed_point"]["status"] == ["converged"] * 3
    assert np.allclose(cpu["jacobian"]["spectral_radius"], arpack, atol=1e-6)
    assert np.allclose(cpu["jacobian"]["sigma_max"], [arpack_sigma_max(op) for op in ops], atol=1e-6)
    with pytest.MonkeyPatch.context() as mp:  # the matrix-free route at the same size
        mp.setattr("stability.numerics.spectra.DENSE_MAX", 8)
        only_rho = AnalysisOptions(**{**opts.to_dict(), "stages": ("reachability", "rho")})
        krylov = analyze_split(m, task, "val", only_rho).to_dict()["jacobian"]
    assert krylov["method"].startswith("Krylov–Schur on Jᵀ (torch, 3 sample(s) per batch")
    assert np.allclose(krylov["spectral_radius"], arpack, atol=1e-6)
    assert np.allclose(cpu["prop4"]["rho_M"], cpu["jacobian"]["spectral_radius"], atol=1e-6)
    assert cpu["prop5"]["rel_error"][-1] < 1e-8
    assert cpu["initial_iterate"]["fixed_point_distance_max"] < 1e-8
    assert len(cpu["accuracy"]["accuracy"]) == 5


@pytest.mark.parametrize("recall", ["external", "internal"])
@pytest.mark.parametrize("variant", [dict(residual_scale=0.4), dict(conv=3), dict(damping=0.6),
                                     dict(residual_scale=0.3, conv=3, damping=0.5)])
def test_assembled_matrix_follows_the_fixed_point_reasoner_variants(recall, variant):
    """Residual scaling, the latent convolution and damping (FPRM) enter M exactly as ``step`` applies them."""
    torch.manual_seed(8)
    cfg = ModelConfig(recall=recall, norm="peri" if "residual_scale" in variant else "post", width=16, heads=2,
                      attention_window=5, **variant)
    m = analysis_model(build_model(cfg))
    x0 = m.embed(inputs(1, seed=8))
    x = torch.randn_like(x0)
    M = RecallMatrixOperator(m, x[:1], x0[:1]).linear_map().dense()[0]
    J = JacobianOperator(m.step, x[0], x0[0]).dense()
    assert (M - J).abs().max() < 1e-12
    assert all(k in recall_form(m) for k in variant)


def test_analysis_options_refuse_unknown_routes_naming_the_allowed_ones():
    from stability.analysis.options import AnalysisOptions
    from stability.errors import StabilityError

    for key, bad, allowed in (("eig_precision", "half", "mixed, float64"), ("eig_route", "arpack", "arnoldi"),
                              ("solver", "newton", "picard, anderson")):
        with pytest.raises(StabilityError, match=allowed):
            AnalysisOptions(**{key: bad})
