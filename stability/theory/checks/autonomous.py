"""Autonomous maps x ↦ f(x): generic fixed points (Props. 1, 2) and the behaviour near one (Prop. 3, App. A.3–A.4).

The maps are f(x) = tanh(W x + b) (:class:`.instances.TanhMap`), built with a prescribed fixed point and Jacobian
or drawn at random, d ≤ 4, float64.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .instances import TanhMap, distinct_points, newton_fixed_points, real_matrix_with_spectrum, seeded_rng
from .registry import verifier


@lru_cache(maxsize=8)
def _prop12_maps(seed: int, wrong: bool, n_maps: int = 4, d: int = 3):
    """Random smooth autonomous maps f(x) = tanh(W x + b) (strong symmetric W: several fixed points each), or,
    for the wrong variant, the non-generic f(x) = x - u tanh(uᵀx), whose fixed points fill the plane uᵀx = 0."""
    rng = seeded_rng(seed, 1)
    maps = []
    for _ in range(n_maps):
        if wrong:
            u = rng.normal(size=d)
            u /= np.linalg.norm(u)
            f = (lambda X, u=u: X - np.tanh(X @ u)[..., None] * u)
            jac = (lambda X, u=u: np.eye(d) - (1 - np.tanh(X @ u) ** 2)[..., None, None] * np.outer(u, u))
        else:
            A = rng.normal(size=(d, d))
            m = TanhMap(3.0 * (A + A.T) / np.sqrt(2 * d), 0.2 * rng.normal(size=d))
            f, jac = m, m.jac
        starts = rng.uniform(-1.2, 1.2, size=(300, d))
        X, res = newton_fixed_points(f, jac, starts)
        ok = res < 1e-12
        maps.append((X[ok], jac(X[ok]), int(ok.sum())))
    return maps


@verifier("prop1_no_unit_eigenvalue", "Prop. 1",
          "for almost all θ, J_f(x*) has no eigenvalue 1 at any fixed point: min over fixed points of min_i |λ_i - 1|",
          relation=">=", tolerance=1e-6,
          wrong="the non-generic map f(x) = x - u tanh(uᵀx) (θ in the null set Prop. 1 excludes)")
def _prop1(seed, wrong):
    maps = _prop12_maps(seed, wrong)
    gap = min(float(np.min(np.abs(np.linalg.eigvals(J) - 1))) for _, J, n in maps if n)
    counts = [distinct_points(X) for X, _, _ in maps]
    kind = "x - u tanh(uᵀx)" if wrong else "tanh(Wx + b), symmetric W, ‖W‖≈2-4"
    return f"f(x) = {kind}, d = 3, 4 maps × 300 Newton starts; distinct fixed points per map {counts}", gap


@verifier("prop2_isolated_fixed_points", "Prop. 2",
          "fixed points form a 0-dimensional set: distinct fixed points found / converged Newton starts stays small",
          tolerance=0.1, wrong="the non-generic map f(x) = x - u tanh(uᵀx), whose fixed points form a plane")
def _prop2(seed, wrong):
    maps = _prop12_maps(seed, wrong)
    ratios = [distinct_points(X) / n for X, _, n in maps if n]
    counts = [distinct_points(X) for X, _, _ in maps]
    return (f"4 maps, d = 3, 300 starts each; distinct {counts} of converged {[n for _, _, n in maps]} "
            "(clusters at 1e-7)", max(ratios))


def _orbit_jacobian(m: TanhMap, x0: np.ndarray, T: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """x_T and the products dx_t/dx0 (t = 0..T) along the orbit of an autonomous map (chain rule)."""
    x, P = x0, np.eye(len(x0))
    products = [P]
    for _ in range(T):
        P = m.jac(x) @ P
        x = m(x)
        products.append(P)
    return x, products


@verifier("prop3_chain_rule", "Prop. 3 / App. A.3",
          "after convergence at K, dx_T/dx0 = J_f(x*)^(T-K) A with A = dx_K/dx0: relative error vs autograd",
          tolerance=1e-9, wrong="the factors in the other order, A J^(T-K)")
def _prop3(seed, wrong):
    import torch

    rng = seeded_rng(seed, 3)
    d, T = 4, 160
    m, x_star = TanhMap.around(rng.uniform(-0.6, 0.6, size=d), real_matrix_with_spectrum(rng, [0.7, -0.5, 0.3 + 0.4j]))
    x0 = x_star + 0.01 * rng.normal(size=d)
    W, b = torch.tensor(m.W), torch.tensor(m.b)

    def unrolled(x, steps):
        for _ in range(steps):
            x = torch.tanh(W @ x + b)
        return x

    x, K = x0.copy(), 0
    while np.linalg.norm(x - x_star) > 1e-15 and K < T - 20:
        x, K = m(x), K + 1
    if K >= T - 20:
        raise ArithmeticError("no convergence to 1e-15 before T - 20")
    from torch.func import jacrev

    lhs = jacrev(lambda v: unrolled(v, T))(torch.tensor(x0)).numpy()
    A = jacrev(lambda v: unrolled(v, K))(torch.tensor(x0)).numpy()
    Jp = np.linalg.matrix_power(m.jac(x_star), T - K)
    rhs = A @ Jp if wrong else Jp @ A
    err = np.linalg.norm(lhs - rhs) / np.linalg.norm(lhs)
    return f"f = tanh(Wx + b), d = {d}, ρ(J*) = 0.7, converged at K = {K}, T = {T}", err


@verifier("a4_case1_vanishing_input_gradient", "Prop. 3 / App. A.4 case 1",
          "ρ(J*) < 1: ‖dx_T/dx0‖ decays at rate ρ(J*) (Gelfand); |(‖P_400‖/‖P_200‖)^(1/200) - claimed rate|",
          tolerance=0.02, wrong="claimed rate ‖J*‖₂ instead of ρ(J*) (non-normal J*)")
def _a4_case1(seed, wrong):
    rng = seeded_rng(seed, 4)
    d = 4
    J = real_matrix_with_spectrum(rng, [0.8, -0.6, 0.5j + 0.2], spread=0.8)
    m, x_star = TanhMap.around(rng.uniform(-0.6, 0.6, size=d), J)
    _, P = _orbit_jacobian(m, x_star + 1e-4 * rng.normal(size=d), 400)
    rate = (np.linalg.norm(P[400], 2) / np.linalg.norm(P[200], 2)) ** (1 / 200)
    rho, norm = max(abs(np.linalg.eigvals(J))), np.linalg.norm(J, 2)
    claimed = norm if wrong else rho
    return (f"f = tanh(Wx + b), d = {d}, ρ(J*) = {rho:.3f}, ‖J*‖₂ = {norm:.3f}; measured rate {rate:.4f}, "
            f"‖dx_400/dx0‖ = {np.linalg.norm(P[400], 2):.1e}", abs(rate - claimed))


@verifier("a4_case2_unreachable", "Prop. 3 / App. A.4 case 2",
          "ρ(J*) > 1: almost every start near x* leaves its neighbourhood; share of 200 starts at 1e-8 that escape",
          relation=">=", tolerance=0.99, wrong="the same claim for a fixed point with ρ(J*) < 1")
def _a4_case2(seed, wrong):
    rng = seeded_rng(seed, 5)
    d = 4
    spectrum = [0.9, 0.5, -0.3, 0.2] if wrong else [1.25, 0.5, -0.3, 0.2]
    m, x_star = TanhMap.around(rng.uniform(-0.6, 0.6, size=d), real_matrix_with_spectrum(rng, spectrum))
    delta = rng.normal(size=(200, d))
    X = x_star + 1e-8 * delta / np.linalg.norm(delta, axis=1, keepdims=True)
    escaped = np.zeros(200, bool)
    for _ in range(300):
        X = m(X)
        escaped |= np.linalg.norm(X - x_star, axis=1) > 1e-3
    return f"f = tanh(Wx + b), d = {d}, spectrum of J* {spectrum}, 300 steps, escape radius 1e-3", escaped.mean()


def _fixed_point_sensitivity(m: TanhMap, x_star: np.ndarray, h: float) -> np.ndarray:
    """dx*/db by central differences: re-solve the fixed point of tanh(W x + b ± h e_k) by Newton from x*."""
    d = len(x_star)
    cols = []
    for k in range(d):
        sols = []
        for s in (+1, -1):
            b = m.b.copy()
            b[k] += s * h
            mk = TanhMap(m.W, b)
            X, res = newton_fixed_points(mk, mk.jac, x_star[None], iters=30)
            if res[0] > 1e-13:
                raise ArithmeticError(f"Newton residual {res[0]:.1e}")
            sols.append(X[0])
        cols.append((sols[0] - sols[1]) / (2 * h))
    return np.stack(cols, axis=1)


@verifier("a4_case3_exploding_parameter_gradient", "Prop. 3 / App. A.4 case 3",
          "ρ(J*) → 1⁻ through an eigenvalue → +1: ‖dx*/db‖ ∝ 1/(1 - ρ); |log-log slope - 1| (dx*/db by finite "
          "differences of re-solved fixed points)", tolerance=0.1,
          wrong="ρ(J*) → 1⁻ through an eigenvalue → -1 (the paper's case 3 does not separate the two)")
def _a4_case3(seed, wrong):
    rng = seeded_rng(seed, 6)
    d = 3
    x_star = rng.uniform(-0.5, 0.5, size=d)
    V = np.eye(d) + 0.4 * rng.normal(size=(d, d)) / np.sqrt(d)
    gaps = np.array([1e-1, 1e-2, 1e-3, 1e-4])
    norms = []
    for gap in gaps:
        lead = -(1 - gap) if wrong else 1 - gap
        m = TanhMap.with_fixed_point(x_star, V @ np.diag([lead, 0.4, -0.2]) @ np.linalg.inv(V))
        norms.append(np.linalg.norm(_fixed_point_sensitivity(m, x_star, h=1e-5 * gap), 2))
    slope = np.polyfit(np.log(1 / gaps), np.log(norms), 1)[0]
    lead = "-(1 - s)" if wrong else "1 - s"
    return (f"tanh map, d = {d}, eigenvalues ({lead}, 0.4, -0.2), s = 1e-1..1e-4; ‖dx*/db‖ = "
            f"{', '.join(f'{v:.3g}' for v in norms)}; slope {slope:.3f}", abs(slope - 1))
