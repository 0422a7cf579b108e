"""Symbolic derivations (sympy) of the paper's Jacobian forms, the Figure 5 conditions and the damping bound.

- :func:`derive_a7` linearises the recall maps of Defs. 5.1 / 5.2 from their definitions: every function is replaced
  by its Jacobian at the point where it is evaluated, a non-commuting symbol, and differentials are pushed through
  the composition (the chain rule, nothing else). The results are compared with the forms App. A.7 prints
  (:func:`paper_a7`): they agree, except the printed internal-recall ∂x_t/∂x0, whose first term reads
  dh1(g(z, x0))/dg where the definition gives dh2(g(z, x0))/dg (h1 is never evaluated at g(z, x0)).
- :func:`shared_eigenvector_eigenvalues` diagonalises the one- and two-sublayer recall Jacobians whose parts share
  eigenvectors (Figure 5): external (1 + λ_h) λ_g, internal 1 + λ_g λ_h.
- :func:`region_intervals` solves |1 + t| ≤ 1 and |s| ≤ 1 over the reals: the bands of :mod:`.regions`.
- :func:`damping_bound` derives η₀ of Fixed-Point Reasoners App. A.3 from |1 + η(λ - 1)|² < 1.
"""

from __future__ import annotations

from functools import lru_cache

import sympy as sp

# Non-commuting Jacobians, named as the paper writes them (1 stands for the identity).
P1, P2 = sp.symbols("dphi1 dphi2", commutative=False)  # dφ1(z̃)/dz̃, dφ2(x̃)/dx̃
H1 = sp.Symbol("dh1_gx", commutative=False)  # dh1(g(x, x0))/dg
H2_z = sp.Symbol("dh2_z", commutative=False)  # dh2(z)/dz              (external recall)
H2_gz = sp.Symbol("dh2_gz", commutative=False)  # dh2(g(z, x0))/dg     (internal recall)
H1_gz = sp.Symbol("dh1_gz", commutative=False)  # dh1(g(z, x0))/dg     (only in the paper's printed A.7.1 form)
G_x, G_x0 = sp.symbols("dg_dx dg_dx0", commutative=False)  # ∂g(x, x0)/∂x, ∂g(x, x0)/∂x0
G_z, G_z0 = sp.symbols("dgz_dz dgz_dx0", commutative=False)  # ∂g(z, x0)/∂z, ∂g(z, x0)/∂x0

Differential = dict  # {"x": coefficient of dx, "x0": coefficient of dx0}


def _d(x: sp.Expr = 0, x0: sp.Expr = 0) -> Differential:
    return {"x": sp.sympify(x), "x0": sp.sympify(x0)}


def _apply(jac: sp.Expr, d: Differential) -> Differential:
    """The differential of u ↦ F(u) at u: jac · du (left multiplication, never commuted)."""
    return {k: jac * v for k, v in d.items()}


def _add(*ds: Differential) -> Differential:
    return {k: sp.Add(*(d[k] for d in ds)) for k in ds[0]}


def _expand(d: Differential) -> Differential:
    return {k: sp.expand(v) for k, v in d.items()}


@lru_cache(maxsize=None)
def derive_a7() -> dict[str, sp.Expr]:
    """∂x_{t+1}/∂x_t and ∂x_{t+1}/∂x0 of both recall placements, derived from Defs. 5.1 / 5.2 (App. A.7).

    External: z = φ1(g(x, x0) + h1(g(x, x0))), x' = φ2(z + h2(z)).
    Internal: z = φ1(x + h1(g(x, x0))),        x' = φ2(z + h2(g(z, x0))).
    """
    dx, dx0 = _d(x=1), _d(x0=1)
    # external recall
    d_g = _add(_apply(G_x, dx), _apply(G_x0, dx0))
    d_z = _apply(P1, _add(d_g, _apply(H1, d_g)))
    d_next = _apply(P2, _add(d_z, _apply(H2_z, d_z)))
    ext = _expand(d_next)
    # internal recall
    d_gx = _add(_apply(G_x, dx), _apply(G_x0, dx0))
    d_z = _apply(P1, _add(dx, _apply(H1, d_gx)))
    d_gz = _add(_apply(G_z, d_z), _apply(G_z0, dx0))
    d_next = _apply(P2, _add(d_z, _apply(H2_gz, d_gz)))
    internal = _expand(d_next)
    return {"external_dx": ext["x"], "external_dx0": ext["x0"],
            "internal_dx": internal["x"], "internal_dx0": internal["x0"]}


def paper_a7() -> dict[str, sp.Expr]:
    """The forms App. A.7 prints, transcribed factor by factor (``internal_dx0`` as printed, with dh1 at g(z, x0))."""
    return {
        "external_dx": P2 * (1 + H2_z) * P1 * (1 + H1) * G_x,
        "external_dx0": P2 * (1 + H2_z) * P1 * (1 + H1) * G_x0,
        "internal_dx": P2 * (1 + H2_gz * G_z) * P1 * (1 + H1 * G_x),
        "internal_dx0": P2 * (H1_gz * G_z0 + (1 + H2_gz * G_z) * P1 * H1 * G_x0),
    }


def corrected_a7() -> dict[str, sp.Expr]:
    """App. A.7 with the one correction the derivation requires: dh2(g(z, x0))/dg in internal ∂x_{t+1}/∂x0."""
    forms = paper_a7()
    forms["internal_dx0"] = P2 * (H2_gz * G_z0 + (1 + H2_gz * G_z) * P1 * H1 * G_x0)
    return forms


def paper_prop4() -> dict[str, sp.Expr]:
    """M_ext and M_int of Prop. 4 / App. A.5 (no outer normalisation)."""
    return {"M_ext": (1 + H2_z) * (1 + H1) * G_x, "M_int": (1 + H2_gz * G_z) * (1 + H1 * G_x)}


def derive_prop4() -> dict[str, sp.Expr]:
    """Prop. 4's M from :func:`derive_a7` with φ1 = φ2 = identity (their Jacobians replaced by 1)."""
    a7 = derive_a7()
    return {"M_ext": sp.expand(a7["external_dx"].subs({P1: 1, P2: 1})),
            "M_int": sp.expand(a7["internal_dx"].subs({P1: 1, P2: 1}))}


def evaluate(expr: sp.Expr, values: dict, dim: int):
    """Evaluate a polynomial in the non-commuting symbols with numpy matrices (1 ↦ I): ``values`` maps symbol → array.

    Lets the derived forms be checked against autograd Jacobians of a concrete model.
    """
    import numpy as np

    def ev(e):
        if e.is_Add:
            return sum((ev(a) for a in e.args), np.zeros((dim, dim)))
        if e.is_Mul:
            out = np.eye(dim)
            for a in e.args:
                out = out @ ev(a)
            return out
        if e.is_Pow and e.exp.is_Integer and e.exp >= 0:
            return np.linalg.matrix_power(ev(e.base), int(e.exp))
        if e.is_Number:
            return float(e) * np.eye(dim)
        if e.is_Symbol:
            return np.asarray(values[e], dtype=float)
        raise TypeError(f"cannot evaluate {e!r}")

    return ev(sp.expand(expr))


def difference_terms(a: sp.Expr, b: sp.Expr) -> int:
    """Number of terms of expand(a - b) in the free non-commutative algebra: 0 iff the two forms are equal."""
    diff = sp.expand(a - b)
    return 0 if diff == 0 else len(sp.Add.make_args(diff))


def compare_a7(forms: dict[str, sp.Expr] | None = None) -> dict[str, int]:
    """Terms left in derived - paper for each App. A.7 form (0 = the paper's form is right)."""
    derived, forms = derive_a7(), forms if forms is not None else paper_a7()
    return {k: difference_terms(derived[k], forms[k]) for k in derived}


@lru_cache(maxsize=None)
def shared_eigenvector_eigenvalues(placement: str, sublayers: int = 1) -> tuple[sp.Expr, ...]:
    """Eigenvalues of the recall Jacobian when J_g and every J_h share a generic 2×2 eigenbasis V (Figure 5).

    One sublayer: external x ↦ g + h(g) has (I + J_h) J_g, internal x ↦ x + h(g) has I + J_h J_g. Two sublayers
    (Prop. 4, φ = I): (I + J_h2)(I + J_h1) J_g and (I + J_h2 J_g)(I + J_h1 J_g). V⁻¹ M V is computed in exact
    rational-function arithmetic; a non-diagonal result raises (the eigenvalues would not separate per eigenvector).
    """
    from sympy.polys.matrices import DomainMatrix

    vs = sp.symbols("v11 v12 v21 v22")
    lg = sp.symbols("lambda_g1 lambda_g2")
    lh = [sp.symbols(f"lambda_h{s}1 lambda_h{s}2") if sublayers > 1 else sp.symbols("lambda_h1 lambda_h2")
          for s in range(1, sublayers + 1)]
    field = sp.QQ.frac_field(*vs, *lg, *(lam for pair in lh for lam in pair))  # exact rational functions

    def dm(matrix: sp.Matrix) -> DomainMatrix:
        return DomainMatrix.from_Matrix(matrix).convert_to(field)

    v = dm(sp.Matrix(2, 2, vs))
    vi = v.inv()
    J_g = v * dm(sp.diag(*lg)) * vi
    J_h = [v * dm(sp.diag(*lam)) * vi for lam in lh]
    eye = dm(sp.eye(2))
    M = eye
    if placement == "external":
        for J in J_h:
            M = (eye + J) * M
        M = M * J_g
    elif placement == "internal":
        for J in J_h:
            M = (eye + J * J_g) * M
    else:
        raise ValueError(f"placement must be 'external' or 'internal', not {placement!r}")
    D = (vi * M * v).to_Matrix()
    if D[0, 1] != 0 or D[1, 0] != 0:
        raise ArithmeticError("V⁻¹ M V is not diagonal")
    return tuple(sp.factor(D[i, i]) for i in range(2))


def single_layer_conditions() -> dict[str, sp.Expr]:
    """Figure 5's eigenvalue of one eigen-pair (λ_g, λ_h): the stability condition is |eigenvalue| < 1."""
    lam_g, lam_h = sp.symbols("lambda_g lambda_h")
    out = {}
    for placement in ("external", "internal"):
        first = shared_eigenvector_eigenvalues(placement, 1)[0]
        out[placement] = first.subs({sp.Symbol("lambda_g1"): lam_g, sp.Symbol("lambda_h1"): lam_h})
    return out


def figure5_claims() -> dict[str, sp.Expr]:
    """The eigenvalues inside Figure 5's labels: external |(1 + λ_h) λ_g| < 1, internal |1 + λ_g λ_h| < 1."""
    lam_g, lam_h = sp.symbols("lambda_g lambda_h")
    return {"external": (1 + lam_h) * lam_g, "internal": 1 + lam_g * lam_h}


@lru_cache(maxsize=None)
def region_intervals() -> dict[str, tuple[float, float]]:
    """The closed real regions as intervals of one product: internal λ_gλ_h ∈ [-2, 0], external λ_g(1+λ_h) ∈ [-1, 1]."""
    t = sp.Symbol("t", real=True)
    out = {}
    for name, expr in (("internal", sp.Abs(1 + t)), ("external", sp.Abs(t))):
        interval = sp.solveset(expr <= 1, t, sp.S.Reals)
        if not isinstance(interval, sp.Interval):
            raise ArithmeticError(f"{name}: the region is not one interval: {interval}")
        out[name] = (float(interval.start), float(interval.end))
    return out


@lru_cache(maxsize=None)
def damping_bound() -> dict[str, sp.Expr]:
    """η₀ of FPRM App. A.3: for λ = a + ib, |1 + η(λ - 1)|² - 1 = η(|λ - 1|² η - 2(1 - a)).

    Its roots in η are 0 and η_max = 2(1 - a)/|λ - 1|²; the leading coefficient |λ - 1|² is positive, so the damped
    eigenvalue lies inside the unit disc exactly for 0 < η < η_max, an interval that is non-empty iff a = Re λ < 1.
    """
    eta, a, b = sp.symbols("eta a b", real=True)
    lam = a + sp.I * b
    mu = 1 + eta * (lam - 1)
    excess = sp.expand(mu * sp.conjugate(mu) - 1)
    roots = sp.solve(excess, eta)
    positive = [r for r in roots if r != 0]
    if len(roots) != 2 or len(positive) != 1:
        raise ArithmeticError(f"unexpected roots {roots}")
    leading = sp.Poly(excess, eta).LC()
    return {"excess": sp.factor(excess), "eta_max": sp.simplify(positive[0]), "leading": sp.simplify(leading),
            "a": a, "b": b, "eta": eta}


def fprm_eta_bound() -> sp.Expr:
    """The per-eigenvalue bound as FPRM App. A.3 writes it: 2(1 - Re λ)/|λ - 1|²."""
    d = damping_bound()
    a, b = d["a"], d["b"]
    return 2 * (1 - a) / ((a - 1) ** 2 + b ** 2)
