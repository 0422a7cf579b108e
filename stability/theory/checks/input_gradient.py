"""The input gradient in the stable regime: Prop. 5 / App. A.6 (dx_T/dx0 → (I - J*)⁻¹ ∂f/∂x0, at rate ρ(J*)),
App. A.8 (the initial iterate is forgotten) and Lemma 1, the telescoping identity App. A.6's proof rests on.

The instances are :class:`.recall.ToyRecall` models with RMSNorm outer norms, drawn until the orbit from the
start e converges to a fixed point with ρ(J*) < ``RHO_MAX``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .instances import seeded_rng
from .recall import ToyRecall
from .registry import verifier


@dataclass
class StableToy:
    """A toy recall model in its stable regime: the orbit from e converges to x* with ρ(J*) < ``RHO_MAX``."""

    model: ToyRecall
    p: dict
    x0: object
    e: object
    x_star: object
    J: object  # ∂f/∂x at x*
    B: object  # ∂f/∂x0 at x*
    rho: float


RHO_MAX = 0.8


def _stable_toy(seed: int, placement: str, norm: bool = True, tries: int = 20) -> StableToy:
    """Draw toy recall models until one meets the hypothesis of Prop. 5 / App. A.8: the orbit from e converges
    (residual < 1e-10 after 300 steps) to a fixed point with ρ(J*) < 0.8."""
    import torch
    from torch.func import jacrev

    gen = torch.Generator().manual_seed(seed * 1000 + (11 if placement == "external" else 12))
    d = 5
    eye = torch.eye(d, dtype=torch.float64)
    for _ in range(tries):
        model = ToyRecall.random(gen, 1, d, wx_scale=torch.tensor([0.5]), h_scale=torch.tensor([0.3]), norm=norm,
                                 placement=placement)
        if placement == "internal":  # near-linear tanh and h_i' ∂g/∂x ≈ -0.5 I: a contractive internal model
            for i in ("1", "2"):
                model.p["A" + i] = 0.1 * model.p["A" + i]
            model.align_sublayers(gen, 0.5, 0.3)
        p = model.single(0)
        x0 = torch.randn(d, generator=gen, dtype=torch.float64)
        e = torch.randn(d, generator=gen, dtype=torch.float64)
        x = _unrolled(model, p, 300)(e, x0)
        if not torch.isfinite(x).all() or (model.step_p(p, x, x0) - x).norm() > 1e-10:
            continue
        for _ in range(3):  # Newton polish
            J = jacrev(model.step_p, argnums=1)(p, x, x0)
            x = x - torch.linalg.solve(J - eye, model.step_p(p, x, x0) - x)
        J = jacrev(model.step_p, argnums=1)(p, x, x0)
        rho = torch.linalg.eigvals(J).abs().max().item()
        if rho < RHO_MAX:
            return StableToy(model, p, x0, e, x, J, jacrev(model.step_p, argnums=2)(p, x, x0), rho)
    raise ArithmeticError(f"no stable {placement} toy model in {tries} draws")


def _unrolled(model, p, T):
    def run(e, x0):
        x = e
        for _ in range(T):
            x = model.step_p(p, x, x0)
        return x

    return run


def _prop5_errors(seed, wrong, Ts, placement):
    """Relative errors of dx_T/dx0 (autograd through T steps from the fixed start e) against the claimed limit."""
    import torch
    from torch.func import jacrev

    t = _stable_toy(seed, placement)
    eye = torch.eye(len(t.x_star), dtype=t.x_star.dtype)
    limit = t.B if wrong else torch.linalg.solve(eye - t.J, t.B)
    errs = []
    for T in Ts:
        dxT = jacrev(_unrolled(t.model, t.p, T), argnums=1)(t.e, t.x0)
        errs.append(((dxT - limit).norm() / limit.norm()).item())
    return errs, t.rho


@verifier("prop5_input_gradient_limit", "Prop. 5 / App. A.6",
          "ρ(J*) < 1: lim_T dx_T/dx0 = (I - J*)⁻¹ ∂f/∂x0 (external and internal recall): max relative error at "
          "T = 150", tolerance=1e-10, wrong="the limit claimed to be ∂f/∂x0 alone (no (I - J*)⁻¹)")
def _prop5_limit(seed, wrong):
    errs, rhos = zip(*(_prop5_errors(seed, wrong, [150], placement) for placement in ("external", "internal")))
    return (f"toy external / internal recall with RMSNorm φ, d = 5, ρ(J*) = {rhos[0]:.3f} / {rhos[1]:.3f}, "
            f"fixed start e", max(e[0] for e in errs))


@verifier("prop5_error_decays_with_T", "Prop. 5 / App. A.6",
          "the error ‖dx_T/dx0 - (I - J*)⁻¹∂f/∂x0‖ decays geometrically at about ρ(J*): (rate fitted over T = 2..40, "
          "errors above 1e-12) - ρ(J*)", tolerance=0.1, wrong="the limit claimed to be ∂f/∂x0 alone")
def _prop5_decay(seed, wrong):
    Ts = np.array([2, 4, 8, 12, 16, 24, 32, 40])
    errs, rho = _prop5_errors(seed, wrong, Ts.tolist(), "external")
    errs = np.array(errs)
    keep = errs > 1e-12
    if keep.sum() < 3:
        raise ArithmeticError("fewer than three errors above the floating-point floor")
    rate = float(np.exp(np.polyfit(Ts[keep], np.log(errs[keep]), 1)[0]))
    return (f"toy external recall with RMSNorm φ, d = 5, ρ(J*) = {rho:.3f}, fitted rate {rate:.3f}; errors "
            f"{', '.join(f'{v:.1e}' for v in errs)} at T = {Ts.tolist()}", rate - rho)


@verifier("a8_initial_iterate_forgotten", "App. A.8",
          "in the stable regime dx_T/de → 0 (both recall placements, RMSNorm φ): max ‖dx_T/de‖_F at T = 100",
          tolerance=1e-8, wrong="the same claim for dx_T/dx0, which Prop. 5 says stays finite and non-zero")
def _a8(seed, wrong):
    from torch.func import jacrev

    worst, rhos = [], []
    for placement in ("external", "internal"):
        t = _stable_toy(seed, placement)
        rhos.append(t.rho)
        dxT = jacrev(_unrolled(t.model, t.p, 100), argnums=1 if wrong else 0)(t.e, t.x0)
        worst.append(dxT.norm().item())  # Frobenius norm
    return (f"toy external / internal recall with RMSNorm φ, d = 5, ρ(J*) = {rhos[0]:.2f} / {rhos[1]:.2f}, T = 100; "
            f"‖·‖_F = {', '.join(f'{v:.1e}' for v in worst)}", max(worst))


# Lemma 1 (App. A.6): the telescoping identity that bounds dx_T/dx0 - dx*/dx0 in Prop. 5's proof
@verifier("lemma1_telescoping_product", "Lemma 1 (App. A.6)",
          "∏A_i - B^K = Σ_i (∏_{j<i} A_j)(A_i - B)B^(K-i) for random matrices: max relative error",
          tolerance=1e-12, wrong="the B-power on the left, Σ_i B^(K-i)(A_i - B)∏_{j<i} A_j")
def _lemma1(seed, wrong):
    rng = seeded_rng(seed, 10)
    worst = 0.0
    for K in range(1, 7):
        d = 4
        A = rng.normal(size=(K, d, d))
        B = rng.normal(size=(d, d))
        lhs = np.linalg.multi_dot([*A, np.eye(d)]) - np.linalg.matrix_power(B, K)
        rhs = np.zeros((d, d))
        prefix = np.eye(d)
        for i in range(K):
            tail = np.linalg.matrix_power(B, K - 1 - i)
            rhs += (tail @ (A[i] - B) @ prefix) if wrong else (prefix @ (A[i] - B) @ tail)
            prefix = prefix @ A[i]
        worst = max(worst, np.linalg.norm(lhs - rhs) / np.linalg.norm(lhs))
    return "K = 1..6, d = 4, Gaussian A_i, B", worst
