"""Checks of the Attractor Models excerpt: Corollary 1 (geometric convergence at the Lipschitz constant), the
implicit gradient of its eq. 8 and the barrier of its App. B.3.3 (‖(I - J)⁻¹‖ ~ dist(1, σ(J))⁻¹).
"""

from __future__ import annotations

import numpy as np

from .instances import TanhMap, newton_fixed_points, seeded_rng
from .registry import verifier


@verifier("attractor_corollary1", "Attractor Models, Corollary 1",
          "F with Lipschitz constant L < 1: ‖y_T - y*‖ ≤ L^T ‖E(x) - y*‖ for T = 0..: max ratio lhs/rhs",
          tolerance=1 + 1e-9, wrong="the spectral radius ρ(J_F(y*)) in place of L (non-normal J_F)")
def _attractor_cor1(seed, wrong):
    rng = seeded_rng(seed, 14)
    d = 6
    N = np.triu(rng.normal(size=(d, d)), 1)
    W = 0.3 * np.eye(d) + N  # non-normal: ρ(W) = 0.3, ‖W‖₂ larger
    W *= 0.9 / np.linalg.norm(W, 2)
    U, x, E = rng.normal(size=(d, d)), rng.normal(size=d), rng.normal(size=d)
    m = TanhMap(W, U @ x)
    y_star, res = newton_fixed_points(m, m.jac, E[None], iters=50)
    y_star = y_star[0]
    L = np.linalg.norm(W, 2)  # tanh is 1-Lipschitz, so Lip(F) ≤ ‖W‖₂
    rate = max(abs(np.linalg.eigvals(m.jac(y_star)))) if wrong else L
    y, worst = E.copy(), 0.0
    e0 = np.linalg.norm(E - y_star)
    for T in range(200):
        bound = rate ** T * e0
        if bound < 1e-12:
            break
        worst = max(worst, np.linalg.norm(y - y_star) / bound)
        y = m(y)
    return f"F(y) = tanh(Wy + Ux), d = {d}, L = ‖W‖₂ = {L:.2f}, ρ(J_F(y*)) = {rate if wrong else '<L'}", worst


@verifier("attractor_implicit_gradient_eq8", "Attractor Models eq. 8 / Prop. 3 (A.4)",
          "∂y*/∂θ = (I - J_F(y*))⁻¹ ∂f/∂θ matches central finite differences of re-solved fixed points: "
          "relative error", tolerance=1e-6, wrong="(I + J_F)⁻¹ in place of (I - J_F)⁻¹")
def _attractor_eq8(seed, wrong):
    rng = seeded_rng(seed, 15)
    d = 5
    W = rng.normal(size=(d, d))
    W *= 0.8 / max(abs(np.linalg.eigvals(W)))
    b, ux = 0.3 * rng.normal(size=d), rng.normal(size=d)

    def solve(W, b, y):
        m = TanhMap(W, b + ux)
        Y, res = newton_fixed_points(m, m.jac, y[None], iters=8 if y.any() else 40)
        if res[0] > 1e-13:
            raise ArithmeticError(f"Newton residual {res[0]:.1e}")
        return Y[0]

    y_star = solve(W, b, np.zeros(d))
    S = 1 - np.tanh(W @ y_star + b + ux) ** 2
    J = S[:, None] * W  # ∂f/∂y
    P = np.concatenate([np.kron(np.diag(S), y_star[None, :]), np.diag(S)], axis=1)  # ∂f/∂(vec_row W, b)
    eye = np.eye(d)
    implicit = np.linalg.solve(eye + J if wrong else eye - J, P)
    h = 1e-6
    fd = np.zeros_like(implicit)
    for k in range(d * d + d):
        cols = []
        for sign in (+1, -1):
            Wk, bk = W.copy(), b.copy()
            if k < d * d:
                Wk[k // d, k % d] += sign * h
            else:
                bk[k - d * d] += sign * h
            cols.append(solve(Wk, bk, y_star))
        fd[:, k] = (cols[0] - cols[1]) / (2 * h)
    err = np.linalg.norm(implicit - fd) / np.linalg.norm(fd)
    return f"f(y; θ) = tanh(Wy + b + Ux), θ = (W, b): {d * d + d} parameters, d = {d}, ρ(W) = 0.8, h = {h}", err


@verifier("attractor_inverse_blowup", "Attractor Models B.3.3",
          "‖(I - J)⁻¹‖₂ ~ dist(1, σ(J))⁻¹ as an eigenvalue of J → 1: |log-log slope - claimed exponent (-1)|",
          tolerance=0.05, wrong="the claimed exponent -2")
def _attractor_blowup(seed, wrong):
    rng = seeded_rng(seed, 16)
    gaps = np.array([1e-1, 1e-2, 1e-3, 1e-4, 1e-5])
    V = np.eye(6) + 0.5 * rng.normal(size=(6, 6)) / np.sqrt(6)
    Vi = np.linalg.inv(V)
    norms, lower_ok = [], True
    for s in gaps:
        J = np.real(V @ np.diag([1 - s, 0.5, -0.4, 0.2, -0.9, 0.1]) @ Vi)
        lam = np.linalg.eigvals(J)
        dist = float(np.min(np.abs(1 - lam)))
        n = np.linalg.norm(np.linalg.inv(np.eye(6) - J), 2)
        lower_ok &= n >= 1 / dist * (1 - 1e-9)  # ‖(I - J)⁻¹‖ ≥ ρ((I - J)⁻¹) = 1/dist always
        norms.append(n)
    slope = np.polyfit(np.log(gaps), np.log(norms), 1)[0]
    claimed = -2.0 if wrong else -1.0
    if not lower_ok:
        raise ArithmeticError("‖(I - J)⁻¹‖ < 1/dist(1, σ(J))")
    return (f"J = V diag(1 - s, …) V⁻¹, d = 6, s = 1e-1..1e-5; slope {slope:.3f}; ‖(I-J)⁻¹‖ ≥ 1/dist holds",
            abs(slope - claimed))
