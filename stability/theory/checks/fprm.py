"""Checks of the Fixed-Point Reasoners excerpt (FPRM): the contraction residual bound, the damping bound η₀ of
its App. A.3 and the truncated-Neumann (truncated BPTT) error of its App. A.4.
"""

from __future__ import annotations

import numpy as np

from .instances import TanhMap, real_matrix_with_spectrum, seeded_rng
from .registry import verifier


def _contraction_instances(seed: int, salt: int, d: int = 8):
    """A tight instance (W = L·orthogonal, near the linear regime of tanh) and a generic random one."""
    rng = seeded_rng(seed, salt)
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    W_rand = rng.normal(size=(d, d))
    return rng, [("tight", Q, 1e-3), ("random", W_rand / np.linalg.norm(W_rand, 2), 0.5)]


@verifier("fprm_residual_bound", "FPRM (contraction residual bound)",
          "f(z; x) = F(α₂z + β₂x) with Lip(F) = λ_f, α₂λ_f < 1: ‖f(z_i) - z_i‖ ≤ (α₂λ_f)^i ‖f(z_0) - z_0‖: "
          "max ratio lhs/rhs", tolerance=1 + 1e-9, wrong="the faster rate (α₂λ_f)^(2i)")
def _fprm_residual(seed, wrong):
    rng, instances = _contraction_instances(seed, 11)
    alpha2, beta2, lam_f = 0.9, 1.0, 1.0
    q = alpha2 * lam_f
    worst = 0.0
    for _, W, scale in instances:
        x = scale * rng.normal(size=W.shape[0])
        c = scale * rng.normal(size=W.shape[0])

        def f(z, W=W, x=x, c=c):
            return np.tanh(W @ (alpha2 * z + beta2 * x) + c)  # ‖W‖₂ = λ_f = 1, tanh is 1-Lipschitz

        z = scale * rng.normal(size=W.shape[0])
        r0 = np.linalg.norm(f(z) - z)
        for i in range(60):
            bound = (q ** (2 * i) if wrong else q ** i) * r0
            if bound < 1e-12 * max(1.0, r0):
                break
            worst = max(worst, np.linalg.norm(f(z) - z) / bound)
            z = f(z)
    return f"F = tanh(W·+c), ‖W‖₂ = 1, α₂ = {alpha2}, β₂ = {beta2}, d = 8; tight and random instances", worst


@verifier("fprm_damping_eta0", "FPRM App. A.3 (damping)",
          "Re λ_i < 1: the damped map (1-η)z + ηf(z) attracts for η < η₀ = min{1, min_i 2(1-Re λ_i)/|λ_i-1|²} and "
          "not for η slightly above η₀ (when η₀ < 1): mismatches over η/η₀ ∈ {0.5, 0.9, 0.97, 1.03, 1.1, 1.5}",
          tolerance=0, wrong="η₀ without the factor 2")
def _fprm_damping(seed, wrong):
    rng = seeded_rng(seed, 12)
    d = 4
    spectrum = [-1.5, 0.5 + 1.2j, 0.3]  # Re λ < 1 but ρ > 1: the undamped iteration is repelled
    J = real_matrix_with_spectrum(rng, spectrum)
    lam = np.linalg.eigvals(J)
    eta0 = min(1.0, float(np.min((1 if wrong else 2) * (1 - lam.real) / np.abs(lam - 1) ** 2)))
    m, x_star = TanhMap.around(rng.uniform(-0.5, 0.5, size=d), J)
    factors = np.array([0.5, 0.9, 0.97, 1.03, 1.1, 1.5])
    etas = np.repeat(factors * eta0, 20)[:, None]
    delta = rng.normal(size=(len(etas), d))
    Z = x_star + 1e-7 * delta / np.linalg.norm(delta, axis=1, keepdims=True)
    escaped = np.zeros(len(etas), bool)
    for _ in range(4000):
        Z = (1 - etas) * Z + etas * m(Z)
        dist = np.linalg.norm(Z - x_star, axis=1)
        escaped |= dist > 1e-3
        Z = np.where((dist > 1e-2)[:, None], x_star + 1e-2 * (Z - x_star) / dist[:, None], Z)
    attracted = ~escaped & (np.linalg.norm(Z - x_star, axis=1) < 1e-9)
    predicted = np.repeat(factors < 1, 20)
    mismatches = int(np.sum(predicted != attracted))
    return (f"tanh map with J* spectrum {spectrum} (+conj), d = {d}, η₀ = {eta0:.4f}; 20 starts at 1e-7 per η, "
            "4000 steps", mismatches)


@verifier("fprm_neumann_truncation", "FPRM App. A.4 (truncated BPTT)",
          "‖J‖₂ = σ < 1: ‖(I - J)⁻¹ - Σ_{j<k} J^j‖_F ≤ √D σ^k/(1 - σ) for k = 1..30: max ratio lhs/rhs",
          tolerance=1 + 1e-9, wrong="the bound without √D")
def _fprm_neumann(seed, wrong):
    rng = seeded_rng(seed, 13)
    D, sigma = 16, 0.8
    A = rng.normal(size=(D, D))
    Js = [sigma * np.eye(D), sigma * A / np.linalg.norm(A, 2)]
    worst = 0.0
    for J in Js:
        exact = np.linalg.inv(np.eye(D) - J)
        partial, power = np.zeros((D, D)), np.eye(D)
        for k in range(1, 31):
            partial += power
            power = power @ J
            bound = (1 if wrong else np.sqrt(D)) * sigma ** k / (1 - sigma)
            worst = max(worst, np.linalg.norm(exact - partial) / bound)
    return f"D = {D}, σ = {sigma}: J = σI (the bound is tight) and a random J scaled to ‖J‖₂ = σ", worst
