"""The sympy derivations (:mod:`stability.theory.symbolic`) and the exact projection of App. B.2
(:mod:`stability.theory.regions`) as rows of the same table.
"""

from __future__ import annotations

import numpy as np

from .instances import seeded_rng
from .registry import verifier
from stability.theory import regions


@verifier("sym_a7_jacobians", "App. A.7 (sympy)",
          "the four Jacobian forms derived from Defs. 5.1/5.2 (non-commuting symbols) equal App. A.7's, with "
          "internal ∂x_t/∂x0 read as dh2(g(z, x0))/dg: terms left in derived - paper", tolerance=0,
          wrong="App. A.7.1's internal ∂x_t/∂x0 exactly as printed (dh1(g(z, x0))/dg)", needs="sympy")
def _sym_a7(seed, wrong):
    # lazy: sympy; this module imports without it
    from stability.theory import symbolic

    counts = symbolic.compare_a7(symbolic.paper_a7() if wrong else symbolic.corrected_a7())
    return "chain rule on φ2∘(id + h2)∘φ1∘(id + h1)∘g and the internal composition; " + str(counts), \
        sum(counts.values())


@verifier("sym_prop4_M", "Prop. 4 / App. A.5 (sympy)",
          "with φ1 = φ2 = I the derived Jacobians reduce to M_ext = (I + h2')(I + h1')g_x and "
          "M_int = (I + h2'g_z)(I + h1'g_x): terms left", tolerance=0, wrong="M_ext with the factors reversed",
          needs="sympy")
def _sym_prop4(seed, wrong):
    # lazy: sympy; this module imports without it
    from stability.theory import symbolic

    paper = symbolic.paper_prop4()
    if wrong:
        paper["M_ext"] = symbolic.G_x * (1 + symbolic.H1) * (1 + symbolic.H2_z)
    derived = symbolic.derive_prop4()
    counts = {k: symbolic.difference_terms(derived[k], paper[k]) for k in paper}
    return f"non-commuting symbols; {counts}", sum(counts.values())


@verifier("sym_fig5_single_layer", "Figure 5 (sympy)",
          "single layer, J_g and J_h sharing a generic eigenbasis: V⁻¹MV is diagonal with (1 + λ_h)λ_g (external) "
          "and 1 + λ_gλ_h (internal): forms that differ from Fig. 5's labels", tolerance=0,
          wrong="the labels swapped between external and internal", needs="sympy")
def _sym_fig5(seed, wrong):
    # lazy: sympy; this module imports without it
    import sympy as sp

    from stability.theory import symbolic

    derived, claims = symbolic.single_layer_conditions(), symbolic.figure5_claims()
    if wrong:
        claims = {"external": claims["internal"], "internal": claims["external"]}
    bad = sum(sp.simplify(derived[k] - claims[k]) != 0 for k in derived)
    two = {k: symbolic.shared_eigenvector_eigenvalues(k, 2)[0] for k in ("external", "internal")}
    return f"2×2 generic V; two sublayers give {two}", bad


@verifier("sym_fig5_regions", "Figure 5 / App. B.2 (sympy)",
          "over the reals |1 + t| ≤ 1 ⟺ t ∈ [-2, 0] and |s| ≤ 1 ⟺ s ∈ [-1, 1], the bands regions.py projects "
          "onto: largest endpoint discrepancy", tolerance=0, wrong="the internal band taken as [-1, 1]",
          needs="sympy")
def _sym_regions(seed, wrong):
    # lazy: sympy; this module imports without it
    from stability.theory import regions, symbolic

    derived = symbolic.region_intervals()
    used = {"internal": (regions.INTERNAL_LO, regions.INTERNAL_HI),
            "external": (regions.EXTERNAL_LO, regions.EXTERNAL_HI)}
    if wrong:
        used["internal"] = (-1.0, 1.0)
    gap = max(abs(a - b) for k in derived for a, b in zip(derived[k], used[k]))
    return f"solveset over ℝ: {derived}", gap


@verifier("sym_damping_eta0", "FPRM App. A.3 (sympy)",
          "|1 + η(λ-1)|² - 1 = η(|λ-1|²η - 2(1-Re λ)): stable iff 0 < η < 2(1-Re λ)/|λ-1|²: terms left in "
          "derived - FPRM bound", tolerance=0, wrong="the bound (1 - Re λ)/|λ - 1|²", needs="sympy")
def _sym_damping(seed, wrong):
    # lazy: sympy; this module imports without it
    import sympy as sp

    from stability.theory import symbolic

    d = symbolic.damping_bound()
    claim = symbolic.fprm_eta_bound() / (2 if wrong else 1)
    left = sp.simplify(d["eta_max"] - claim)
    positive_leading = sp.simplify(d["leading"] - ((d["a"] - 1) ** 2 + d["b"] ** 2)) == 0
    if not positive_leading:
        raise ArithmeticError("leading coefficient is not |λ - 1|²")
    return f"λ = a + ib, η > 0; factored excess {d['excess']}", 0 if left == 0 else len(sp.Add.make_args(left))


@verifier("b2_exact_projection", "App. B.2 (Table 3)",
          "the exact projection onto each closed region is never farther than a dense search over its boundary "
          "(2×10⁵ points per curve) and lies in the region: max(d_exact - d_dense, violation)", tolerance=1e-9,
          wrong="internal points with x·y > 0 sent to the x-axis only (a boundary parametrised as y = f(x))")
def _b2_projection(seed, wrong):
    rng = seeded_rng(seed, 17)
    P = rng.normal(0, 3, size=(400, 2))
    u = np.geomspace(1e-3, 1e3, 100_000)
    u = np.concatenate([-u[::-1], u])
    axis = np.linspace(-40, 40, 200_001)
    curves = {
        "internal": [np.c_[axis, 0 * axis], np.c_[0 * axis, axis], np.c_[u, -2 / u]],
        "external": [np.c_[u, 1 / u - 1], np.c_[u, -1 / u - 1]],
    }
    worst = -np.inf
    for name, project in regions.PROJECTIONS.items():
        px, py = project(P[:, 0], P[:, 1])
        if wrong and name == "internal":
            above = P[:, 0] * P[:, 1] > 0
            px, py = np.where(above, P[:, 0], px), np.where(above, 0.0, py)
        d_exact = np.hypot(px - P[:, 0], py - P[:, 1])
        from scipy.spatial import cKDTree

        tree = cKDTree(np.concatenate(curves[name]))
        d_dense, _ = tree.query(P)
        outside = ~(regions.stable_internal(P[:, 0], P[:, 1], closed=True) if name == "internal"
                    else regions.stable_external(P[:, 0], P[:, 1], closed=True))
        eig = regions.internal_eigenvalue(px, py) if name == "internal" else regions.external_eigenvalue(px, py)
        violation = float(np.max(np.abs(eig)) - 1)
        worst = max(worst, float(np.max((d_exact - d_dense)[outside])), violation)
    return "400 points of N(0, 3²I₂); quartic roots by batched companion eigenvalues", worst
