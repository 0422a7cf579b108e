"""The dense route for small states (n ≤ DENSE_MAX): every sample's Jacobian by batched forward-mode columns, ρ(J*),
σ_max and Prop. 4's ρ(M) by LAPACK, against per-sample autograd (``torch.func.jacrev``) and the Krylov routes."""

import copy

import numpy as np
import pytest
import torch

from stability.analysis.fixed_point import analysis_model
from stability.analysis.options import AnalysisOptions
from stability.analysis.pipeline import run_stages
from stability.analysis.recall import RecallMatrixOperator, prop4
from stability.config import ModelConfig
from stability.model import build_model
from stability.numerics import Linearisation, sigma_max, spectral_radius
from stability.numerics.spectra import DENSE_MAX
from stability.solvers import solve

L = 6  # tokens; state 6 × 8 = 48


def small_model(recall="external", norm="pre", width=8, seed=0):
    torch.manual_seed(seed)
    m = analysis_model(build_model(ModelConfig(recall=recall, norm=norm, width=width, heads=2, attention_window=5)))
    with torch.no_grad():  # shrink the sublayers so that the loop map contracts and x* exists
        m.block.attn.out.weight.mul_(0.3)
        m.block.mlp.proj.weight.mul_(0.3)
        if m.recall_map is not None:
            m.recall_map.x.weight.mul_(0.3)
    return m


def point(m, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x0 = m.embed(torch.randint(0, 2, (n, L, 1), generator=g).double() - 0.5)
    return solve(m.step, x0, x0, tol=1e-12, max_iter=300).x_best, x0


def jacrev(m, x, x0, b):
    n = x[b].numel()
    return torch.func.jacrev(lambda p: m.step(p.unsqueeze(0), x0[b:b + 1])[0])(x[b]).reshape(n, n)


@pytest.mark.parametrize("chunk", [None, 7])
def test_batched_dense_jacobian_equals_jacrev_per_sample(chunk):
    m = small_model()
    x, x0 = point(m)
    J = Linearisation(m.step, x, x0).dense(chunk=chunk)
    assert J.shape == (3, 48, 48)
    for b in range(3):
        assert (J[b] - jacrev(m, x, x0, b)).abs().max() <= 1e-12


def test_dense_jacobian_of_a_sample_does_not_depend_on_its_batch_mates():
    m = small_model()
    x, x0 = point(m, n=4)
    alone = Linearisation(m.step, x[2:3], x0[2:3]).dense()[0]
    other = point(m, n=4, seed=5)
    mixed_x, mixed_x0 = other[0].clone(), other[1].clone()
    mixed_x[1], mixed_x0[1] = x[2], x0[2]
    assert (Linearisation(m.step, mixed_x, mixed_x0).dense()[1] - alone).abs().max() <= 1e-12
    M_alone = RecallMatrixOperator(m, x[2:3], x0[2:3]).linear_map().dense()[0]
    M_mixed = RecallMatrixOperator(m, mixed_x, mixed_x0).linear_map().dense()[1]
    assert (M_mixed - M_alone).abs().max() <= 1e-12


def test_dense_rho_and_sigma_max_equal_the_krylov_route_on_either_side_of_the_threshold():
    for width in (8, 16):  # n = 48 and 96: with dense_max = 64 the first is below the threshold, the second above
        m = small_model(width=width)
        x, x0 = point(m)
        n = x[0].numel()
        lin = Linearisation(m.step, x, x0)
        routed = spectral_radius(lin, k=3, tol=1e-12, dense_max=64)
        dense, sig = spectral_radius(lin, route="dense", k=3), sigma_max(lin, route="dense")
        krylov = spectral_radius(lin, route="krylov", k=3, tol=1e-12)
        sig_k = sigma_max(lin, route="krylov", tol=1e-12)
        assert (dense.rho - krylov.rho).abs().max() <= 1e-8
        assert (sig - sig_k).abs().max() <= 1e-8
        assert (routed.rho - krylov.rho).abs().max() <= 1e-8
        assert bool((routed.ritz_residual == 0).all()) == (n <= 64)  # the dense route reports residual 0
        ref = [np.abs(np.linalg.eigvals(jacrev(m, x, x0, b).numpy())).max() for b in range(3)]
        assert np.allclose(dense.rho.numpy(), ref, rtol=0, atol=1e-12)
        assert np.allclose(sig.numpy(), [np.linalg.norm(jacrev(m, x, x0, b).numpy(), 2) for b in range(3)],
                           rtol=0, atol=1e-12)


@pytest.mark.parametrize("recall,norm", [("external", "pre"), ("internal", "post"), ("external", "gru")])
def test_prop4_dense_M_is_the_operator_and_its_rho_equals_the_krylov_rho(recall, norm):
    m = small_model(recall, norm)
    x, x0 = point(m)
    M = RecallMatrixOperator(m, x, x0).linear_map().dense()
    g = torch.Generator().manual_seed(1)
    for b in range(3):
        v = torch.randn(5, *x.shape[1:], generator=g, dtype=torch.float64)
        Mv = RecallMatrixOperator(m, x[b:b + 1], x0[b:b + 1]).apply_M(v).reshape(5, -1)  # 5 vectors, one sample
        assert (Mv - v.reshape(5, -1) @ M[b].T).abs().max() <= 1e-12
    dense = prop4(m, x, x0, k=3)
    free = prop4(m, x, x0, k=3, tol=1e-12, dense_max=0)  # the matrix-free route: Krylov–Schur on M, probes
    assert dense.columns_checked == x[0].numel() and free.columns_checked == 0 and free.probes_checked == 4
    assert dense.spectra.route == ("dense", 3) and len(dense.spectra) == 3
    assert np.allclose(dense.rho_M, free.rho_M, rtol=0, atol=1e-8)
    assert dense.max_abs_diff_vs_autograd <= 1e-12
    # the dense Jacobian handed over (stage rho's) gives the same check
    J = Linearisation(m.step, x, x0).dense()
    assert prop4(m, x, x0, k=3, J=J).max_abs_diff_vs_autograd == dense.max_abs_diff_vs_autograd


def test_pipeline_takes_the_dense_route_and_prop4_reuses_stage_rhos_jacobians(monkeypatch):
    m = small_model()
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 2, (3, L, 1), generator=g).double() - 0.5
    assert 48 <= DENSE_MAX
    import stability.numerics.jacobian as jac
    calls = []
    real = jac.batched_dense_jacobian

    def counting(*a, **k):
        calls.append(a[1].shape)
        return real(*a, **k)

    monkeypatch.setattr(jac, "batched_dense_jacobian", counting)
    out = run_stages(m, inputs, None, AnalysisOptions(samples=3, stages=("rho", "prop4")))
    js = out.to_dict()
    assert js["jacobian"]["method"].startswith("dense")
    assert js["prop4"]["columns_checked"] == 48
    # one dense J for stage rho; stage prop4 built only M (a Jacobian of the linear map at 0), not J again
    assert len(calls) == 2
    x = out.x_star
    ref = [np.abs(np.linalg.eigvals(jacrev(m, x, out.x0, b).numpy())).max() for b in range(3)]
    assert np.allclose(js["jacobian"]["spectral_radius"], ref, rtol=0, atol=1e-12)
    assert np.allclose(js["prop4"]["rho_M"], ref, rtol=0, atol=1e-10)
    only = run_stages(copy.deepcopy(m), inputs, None, AnalysisOptions(samples=3, stages=("prop4",))).to_dict()
    assert np.allclose(only["prop4"]["rho_M"], js["prop4"]["rho_M"], rtol=0, atol=1e-12)
    assert only["prop4"]["max_abs_diff_vs_autograd"] <= 1e-12


def test_mid_size_states_reuse_the_dense_J_with_krylov_on_the_dense_matrices(monkeypatch):
    import stability.numerics.spectra as spectra

    m = small_model()  # n = 48: made mid-size by moving both thresholds below and above it
    monkeypatch.setattr(spectra, "DENSE_MAX", 32)
    monkeypatch.setattr(spectra, "DENSE_KRYLOV_MAX", 64)
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 2, (3, L, 1), generator=g).double() - 0.5
    out = run_stages(m, inputs, None, AnalysisOptions(samples=3, stages=("rho", "prop4"), eig_tol=1e-10))
    js = out.to_dict()
    assert js["jacobian"]["method"].startswith("dense Jacobian")
    assert all(js["jacobian"]["eigen_converged"])
    ref = [jacrev(m, out.x_star, out.x0, b).numpy() for b in range(3)]
    assert np.allclose(js["jacobian"]["spectral_radius"], [np.abs(np.linalg.eigvals(J)).max() for J in ref],
                       rtol=0, atol=1e-8)
    assert np.allclose(js["jacobian"]["sigma_max"], [np.linalg.norm(J, 2) for J in ref], rtol=0, atol=1e-12)
    assert np.allclose(js["prop4"]["rho_M"], js["jacobian"]["spectral_radius"], rtol=0, atol=1e-8)
    assert js["prop4"]["columns_checked"] == 48 and js["prop4"]["max_abs_diff_vs_autograd"] <= 1e-12
    # without stage rho there is no dense J to reuse: Prop. 4 keeps the matrix-free route (Gaussian probes)
    alone = run_stages(m, inputs, None, AnalysisOptions(samples=3, stages=("prop4",), eig_tol=1e-10,
                                                        prop4_probes=2)).to_dict()
    assert alone["prop4"]["columns_checked"] == 0 and alone["prop4"]["probes_checked"] == 2
    assert np.allclose(alone["prop4"]["rho_M"], js["prop4"]["rho_M"], rtol=0, atol=1e-8)


@pytest.mark.parametrize("mid", [False, True])
def test_prop4_takes_stage_rhos_spectra_only_where_M_equals_J_entry_by_entry(mid):
    from dataclasses import replace

    from stability.analysis.recall import prop4_dense

    m = small_model()
    x, x0 = point(m)
    J = Linearisation(m.step, x, x0).dense()
    tol = 1e-8 if mid else None
    # stage rho's spectrum of J, which says the route that computed it
    given = spectral_radius(J, route="dense-krylov", k=3, tol=1e-8) if mid else spectral_radius(J, route="dense", k=3)
    own = prop4_dense(m, x, x0, k=3, J=J, krylov_tol=tol)
    taken = prop4_dense(m, x, x0, k=3, J=J, krylov_tol=tol, J_spectra=given)
    assert own.spectra_of_J == 0 and taken.spectra_of_J == 3
    assert taken.rho_M == own.rho_M and taken.to_dict()["eigenvalues"] == own.to_dict()["eigenvalues"]
    ref = np.abs(np.linalg.eigvals(J.numpy())).max(axis=1)  # independent reference: LAPACK on each J
    np.testing.assert_allclose(taken.rho_M, ref, rtol=1e-7)
    # a J that is not M (one entry moved) is not trusted: M's own spectra are computed
    J2 = J.clone()
    J2[0, 0, 0] += 1e-3
    moved = prop4_dense(m, x, x0, k=3, J=J2, krylov_tol=tol, J_spectra=given)
    assert moved.spectra_of_J == 2 and moved.rho_M[0] == own.rho_M[0]
    assert moved.max_abs_diff_vs_autograd == pytest.approx(1e-3, rel=1e-6)
    # spectra of another route are not taken
    other = replace(given, route=("dense-krylov", 3, 1e-6, 1))
    assert prop4_dense(m, x, x0, k=3, J=J, krylov_tol=tol, J_spectra=other).spectra_of_J == 0


# ---- the matrix-free route (states above DENSE_KRYLOV_MAX): M checked against J by Gaussian probes ---------------
def marker_spectrum(rho):
    """A spectrum of J with the markers ``rho`` as ρ and leading eigenvalue (the numerics' one type)."""
    from stability.numerics import Spectrum

    B = len(rho)
    eig = torch.zeros(B, 3, dtype=torch.complex128)
    eig[:, 0] = torch.tensor(rho, dtype=torch.float64)
    return Spectrum(rho=torch.tensor(rho, dtype=torch.float64), eigenvalues=eig, ritz_residual=torch.zeros(B),
                    matvecs=0, products=torch.zeros(B, dtype=torch.long), route=("krylov", 3, 1e-6, 0))


def _numpy_rho(m, x, x0):
    """ρ of each sample's dense autograd Jacobian by numpy (the independent reference)."""
    return [float(np.abs(np.linalg.eigvals(jacrev(m, x, x0, b).numpy())).max()) for b in range(x.shape[0])]


@pytest.mark.parametrize("recall,norm", [("external", "pre"), ("internal", "post"), ("external", "gru")])
@pytest.mark.parametrize("mixed", [False, True])
def test_matrix_free_rho_M_equals_the_dense_eigenvalues(recall, norm, mixed):
    import copy

    m = small_model(recall, norm)
    x, x0 = point(m)
    fast = copy.deepcopy(m).float() if mixed else None
    res = prop4(m, x, x0, k=3, tol=1e-6 if mixed else 1e-10, dense_max=0, fast_model=fast)
    assert res.spectra_of_J == 0  # no stage-rho spectra given: M's own
    assert np.allclose(res.rho_M, _numpy_rho(m, x, x0), rtol=0, atol=1e-5 if mixed else 1e-8)
    assert res.max_abs_diff_vs_autograd <= 1e-12
    assert bool((res.spectra.ritz_residual < (1e-6 if mixed else 1e-10)).all())


def test_matrix_free_prop4_takes_stage_rhos_spectra_exactly_where_every_probe_agrees_bit_for_bit():
    from stability.analysis.recall import probe_check

    m = small_model("external", "pre")
    x, x0 = point(m)
    diff, equal = probe_check(m, x, x0, probes=3)
    rho_J = [0.123, 0.456, 0.789]  # markers: taken over only where M = J (to rounding) on every probe
    res = prop4(m, x, x0, k=3, dense_max=0, J_spectra=marker_spectrum(rho_J), probes=3)
    assert res.spectra_of_J == int(equal.sum())
    for b in range(3):
        if bool(equal[b]):
            assert res.rho_M[b] == rho_J[b] and int(res.spectra.products[b]) == 0 and float(diff[b]) <= 1e-12
            assert res.to_dict()["eigenvalues"][b] == [[rho_J[b], 0.0], [0.0, 0.0], [0.0, 0.0]]
        else:
            assert abs(res.rho_M[b] - _numpy_rho(m, x, x0)[b]) < 1e-8
    assert bool(equal.all())  # the toolkit's M is J to rounding


def test_probe_check_finds_a_difference_confined_to_one_entry_of_M(monkeypatch):
    from stability.analysis import recall as R

    m = small_model("external", "pre")
    x, x0 = point(m)
    original = R.RecallMatrixOperator.apply_M

    def off_by_one_entry(self, V):
        out = original(self, V).clone()
        if out.shape[0] == 3:  # the whole batch (the probe check): (M − J)_{7,3} = 1e-9 on sample 1
            out.view(3, -1)[1, 7] += 1e-9 * V.reshape(3, -1)[1, 3]
        return out

    monkeypatch.setattr(R.RecallMatrixOperator, "apply_M", off_by_one_entry)
    diff, equal = R.probe_check(m, x, x0, probes=2)
    assert bool(equal[0]) and not bool(equal[1]) and bool(equal[2])
    assert 0 < float(diff[1]) <= 1e-9 * 5  # |1e-9 · v_3| for Gaussian v
    res = R.prop4(m, x, x0, k=3, dense_max=0, J_spectra=marker_spectrum([0.5] * 3), probes=2)
    assert res.spectra_of_J == 2 and res.rho_M[1] != 0.5  # sample 1's spectra are M's own
