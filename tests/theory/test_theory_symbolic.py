"""Sympy derivations: App. A.7's Jacobians, Prop. 4's M, Figure 5's conditions, the regions, FPRM's damping bound."""

import numpy as np
import pytest
import sympy as sp

from stability.theory import regions, symbolic as S


def test_a7_forms_derived_from_the_definitions_match_the_paper_except_internal_dx0():
    assert S.compare_a7(S.paper_a7()) == {"external_dx": 0, "external_dx0": 0, "internal_dx": 0,
                                          "internal_dx0": 2}
    assert set(S.compare_a7(S.corrected_a7()).values()) == {0}


def test_the_printed_internal_dx0_differs_exactly_by_h1_in_place_of_h2_at_g_z():
    derived = S.derive_a7()["internal_dx0"]
    printed = S.paper_a7()["internal_dx0"]
    assert sp.expand(derived - printed - S.P2 * (S.H2_gz - S.H1_gz) * S.G_z0) == 0


def test_order_of_factors_matters_in_the_non_commutative_algebra():
    derived = S.derive_a7()["external_dx"]
    swapped = S.P1 * (1 + S.H2_z) * S.P2 * (1 + S.H1) * S.G_x
    assert S.difference_terms(derived, swapped) > 0
    assert S.difference_terms(S.H1 * S.G_x, S.G_x * S.H1) == 2


def test_prop4_M_is_the_a7_jacobian_without_outer_norm():
    derived, paper = S.derive_prop4(), S.paper_prop4()
    assert all(S.difference_terms(derived[k], paper[k]) == 0 for k in paper)


@pytest.mark.parametrize("placement", ["external", "internal"])
def test_derived_jacobians_evaluated_on_a_toy_model_equal_autograd(placement):
    """The symbolic forms, evaluated with a concrete model's part Jacobians, reproduce torch's Jacobian of f."""
    import torch

    from stability.theory.checks.recall import ToyRecall, batched_jacobian

    gen = torch.Generator().manual_seed(3)
    n, d = 1, 4
    model = ToyRecall.random(gen, n, d, wx_scale=torch.ones(1), h_scale=torch.ones(1), norm=True,
                             placement=placement)
    p = model.p
    x, x0 = (torch.randn(n, d, generator=gen, dtype=torch.float64) for _ in range(2))
    pr = model.parts(p, x, x0)
    values = {S.P1: batched_jacobian(model.phi1, 1, p, pr["zt"]), S.P2: batched_jacobian(model.phi2, 1, p, pr["xt"]),
              S.H1: batched_jacobian(model.h1, 1, p, pr["h1_arg"]), S.G_x: batched_jacobian(model.g, 1, p, x, x0),
              S.G_x0: batched_jacobian(model.g, 2, p, x, x0)}
    if placement == "external":
        values[S.H2_z] = batched_jacobian(model.h2, 1, p, pr["h2_arg"])
    else:
        values.update({S.H2_gz: batched_jacobian(model.h2, 1, p, pr["h2_arg"]),
                       S.G_z: batched_jacobian(model.g, 1, p, pr["z"], x0),
                       S.G_z0: batched_jacobian(model.g, 2, p, pr["z"], x0)})
    values = {k: v[0].numpy() for k, v in values.items()}
    derived = S.derive_a7()
    for wrt, argnum in (("dx", 1), ("dx0", 2)):
        auto = batched_jacobian(model.step_p, argnum, p, x, x0)[0].numpy()
        assert np.allclose(S.evaluate(derived[f"{placement}_{wrt}"], values, d), auto, rtol=1e-12, atol=1e-12)


def test_single_layer_shared_eigenvectors_give_figure5_conditions():
    derived, claims = S.single_layer_conditions(), S.figure5_claims()
    for k in ("external", "internal"):
        assert sp.simplify(derived[k] - claims[k]) == 0
    assert sp.simplify(derived["external"] - claims["internal"]) != 0


def test_two_sublayers_with_shared_eigenvectors_multiply_the_factors():
    g, h1, h2 = sp.symbols("lambda_g1 lambda_h11 lambda_h21")
    ext = S.shared_eigenvector_eigenvalues("external", 2)[0]
    internal = S.shared_eigenvector_eigenvalues("internal", 2)[0]
    assert sp.expand(ext - (1 + h2) * (1 + h1) * g) == 0
    assert sp.expand(internal - (1 + h2 * g) * (1 + h1 * g)) == 0


def test_shared_eigenvector_eigenvalues_agree_with_numerical_eigenvalues():
    rng = np.random.default_rng(0)
    V = rng.normal(size=(2, 2))
    lg, lh = rng.normal(size=2), rng.normal(size=2)
    Jg, Jh = V @ np.diag(lg) @ np.linalg.inv(V), V @ np.diag(lh) @ np.linalg.inv(V)
    numeric = np.sort(np.linalg.eigvals((np.eye(2) + Jh) @ Jg).real)
    assert np.allclose(numeric, np.sort(regions.external_eigenvalue(lg, lh)))
    numeric = np.sort(np.linalg.eigvals(np.eye(2) + Jh @ Jg).real)
    assert np.allclose(numeric, np.sort(regions.internal_eigenvalue(lg, lh)))


def test_region_intervals_are_the_bands_projected_onto():
    assert S.region_intervals() == {"internal": (regions.INTERNAL_LO, regions.INTERNAL_HI),
                                    "external": (regions.EXTERNAL_LO, regions.EXTERNAL_HI)}


def test_damping_bound_is_fprms_and_is_sharp():
    d = S.damping_bound()
    assert sp.simplify(d["eta_max"] - S.fprm_eta_bound()) == 0
    bound = sp.lambdify((d["a"], d["b"]), d["eta_max"])
    rng = np.random.default_rng(1)
    for a, b in zip(rng.uniform(-3, 0.99, 50), rng.normal(0, 2, 50)):
        lam, eta = complex(a, b), bound(a, b)
        assert abs(1 + 0.999 * eta * (lam - 1)) < 1 < abs(1 + 1.001 * eta * (lam - 1))


def test_evaluate_multiplies_in_the_written_order_and_handles_powers():
    A, B = np.random.default_rng(2).normal(size=(2, 3, 3))
    assert np.allclose(S.evaluate((1 + S.H1) * S.G_x, {S.H1: A, S.G_x: B}, 3), (np.eye(3) + A) @ B)
    assert np.allclose(S.evaluate(2 * S.H1 * S.H1, {S.H1: A}, 3), 2 * A @ A)
