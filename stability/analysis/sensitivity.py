"""Input-dependence of the fixed point: the implicit input-gradient of Prop. 5 and its numerical check, and the
independence of the initial iterate of App. A.8.

* Prop. 5: dx*/dx0 = (I − J)⁻¹ ∂f/∂x0 with J = ∂f/∂x at (x*, x0). Matrix-free: a direction u of x0 maps to
  w = dx*/dx0 · u by one GMRES solve of (I − J) w = (∂f/∂x0) u (:func:`implicit_input_jvp`); a cotangent v
  maps to vᵀ dx*/dx0 by GMRES on (I − J)ᵀ (:func:`implicit_input_vjp`). Both report their relative residual
  and raise :class:`KrylovError` when GMRES does not reach its tolerance.
* The proposition's limit: dx_T/dx0 · u, carried forward along the unrolled iteration x_{t+1} = f(x_t, x0) from
  e (:func:`unrolled_input_jvp`), approaches w as T grows; :func:`prop5_check` records the relative error
  ‖dx_T/dx0·u − w‖ / ‖w‖ against T. :func:`unrolled_input_vjp` is the reverse-mode counterpart (backprop
  through T iterations, memory ∝ T), the route the implicit one replaces.
* ‖dx*/dx0‖_F by Hutchinson's estimator E‖(dx*/dx0) u‖² = ‖dx*/dx0‖_F², u ~ N(0, I)
  (:func:`input_dependence_frobenius`).
* App. A.8: dx_T/de = Π_t J(x_t) · ∂x_1/∂e → 0 in the stable regime; :func:`initial_iterate_sensitivity`
  records ‖dx_T/de · u‖ against T.

All functions here take one sample (no batch dimension) unless they say otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from stability.analysis.operators import JacobianOperator
from stability.errors import StabilityError


class KrylovError(StabilityError):
    """GMRES did not solve (I − J) w = b to its tolerance (typically ρ(J) ≥ 1: x* is not attracting)."""


@dataclass
class GMRESInfo:
    residual: float  # ‖(I − J) w − b‖ / ‖b‖, recomputed after the solve
    iterations: int
    tol: float

    def to_dict(self) -> dict:
        return {"residual": self.residual, "iterations": self.iterations, "tol": self.tol}


def _gmres(apply_np: Callable, b: np.ndarray, tol: float, maxiter: Optional[int], restart: int) -> tuple:
    from scipy.sparse.linalg import LinearOperator, gmres

    n = b.shape[0]
    count = [0]

    def mv(v):
        count[0] += 1
        return apply_np(v)

    A = LinearOperator((n, n), matvec=mv, dtype=np.float64)
    bnorm = float(np.linalg.norm(b))
    if bnorm == 0.0:
        return np.zeros_like(b), GMRESInfo(0.0, 0, tol)
    restart = min(restart, n)
    maxiter = maxiter if maxiter is not None else max(1, (20 * n) // restart + 1)
    w, info = gmres(A, b, rtol=tol, atol=0.0, restart=restart, maxiter=maxiter)
    res = float(np.linalg.norm(apply_np(w) - b) / bnorm)
    out = GMRESInfo(residual=res, iterations=count[0], tol=tol)
    if info != 0 or not np.isfinite(res) or res > 10 * tol:
        raise KrylovError(f"GMRES did not converge: relative residual {res:.3g} > tol {tol:.3g} after "
                          f"{count[0]} products with I − J (is x* attracting, ρ(J) < 1?)")
    return w, out


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().reshape(-1).cpu().double().numpy()


def implicit_input_jvp(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, u: torch.Tensor, *, tol: float = 1e-10,
                       maxiter: Optional[int] = None, restart: int = 60) -> tuple[torch.Tensor, GMRESInfo]:
    """Prop. 5: w = dx*/dx0 · u = (I − J)⁻¹ (∂f/∂x0) u at one sample's (x*, x0), by GMRES.

    x_star: (*S), x0: (*S0), u: (*S0). Returns w shaped like x* and the GMRES record; raises KrylovError when
    GMRES does not converge.
    """
    J = JacobianOperator(f, x_star, x0, wrt="x", mode="vjp")  # J v reusing one forward pass
    Jx0 = JacobianOperator(f, x_star, x0, wrt="x0")
    b = _np(Jx0.mv(u))
    w, info = _gmres(lambda v: v - J.matvec(v).astype(np.float64), b, tol, maxiter, restart)
    return torch.as_tensor(w, dtype=x_star.dtype, device=x_star.device).reshape(x_star.shape), info


def implicit_input_vjp(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, v: torch.Tensor, *, tol: float = 1e-10,
                       maxiter: Optional[int] = None, restart: int = 60) -> tuple[torch.Tensor, GMRESInfo]:
    """Prop. 5 transposed: vᵀ dx*/dx0 = ((I − J)⁻ᵀ v)ᵀ ∂f/∂x0, by GMRES on (I − J)ᵀ (reverse mode: the
    memory of one step's graph, whatever the iteration count that found x*)."""
    J = JacobianOperator(f, x_star, x0, wrt="x")
    Jx0 = JacobianOperator(f, x_star, x0, wrt="x0")
    y, info = _gmres(lambda a: a - J.rmatvec(a).astype(np.float64), _np(v), tol, maxiter, restart)
    y_t = torch.as_tensor(y, dtype=x_star.dtype, device=x_star.device).reshape(x_star.shape)
    return Jx0.rmv(y_t), info


def unrolled_input_jvp(f: Callable, e: torch.Tensor, x0: torch.Tensor, u: torch.Tensor, Ts: Sequence[int], *,
                       e_tangent: Optional[torch.Tensor] = None) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """dx_T/dx0 · u along x_{t+1} = f(x_t, x0) from x_0 = e, forward mode, for every T in Ts.

    e_tangent is de/dx0 · u: u itself when e = x0 (the default initial state), zero for e = zeros or noise.
    Returns {T: (x_T, dx_T/dx0·u)} for one sample (no batch dimension). Memory does not grow with T.
    """
    Ts = sorted(set(int(t) for t in Ts))
    x = e.detach().unsqueeze(0)
    dx = (torch.zeros_like(x) if e_tangent is None else e_tangent.detach().unsqueeze(0).to(x.dtype))
    X0, U = x0.detach().unsqueeze(0), u.detach().unsqueeze(0).to(x0.dtype)
    out = {}
    for t in range(1, Ts[-1] + 1):
        x, dx = torch.func.jvp(f, (x, X0), (dx, U))
        x, dx = x.detach(), dx.detach()
        if t in Ts:
            out[t] = (x[0], dx[0])
    return out


def unrolled_input_vjp(f: Callable, e: torch.Tensor, x0: torch.Tensor, v: torch.Tensor, T: int, *,
                       e_from_x0: bool = True) -> torch.Tensor:
    """vᵀ dx_T/dx0 by backpropagation through T unrolled iterations (autograd keeps every iteration's graph:
    memory grows linearly in T). e_from_x0: e = x0 (the default), so the gradient also flows through e."""
    X0 = x0.detach().unsqueeze(0).clone().requires_grad_(True)
    with torch.enable_grad():
        x = X0 if e_from_x0 else e.detach().unsqueeze(0)
        for _ in range(T):
            x = f(x, X0)
        (grad,) = torch.autograd.grad(x, X0, grad_outputs=v.detach().unsqueeze(0).to(x.dtype))
    return grad[0]


@dataclass
class Prop5Check:
    """Relative error ‖dx_T/dx0·u − dx*/dx0·u‖ / ‖dx*/dx0·u‖ against T (Prop. 5), and the GMRES record."""

    T: list
    rel_error: list
    gmres_residual: float
    gmres_iterations: int
    gmres_tol: float
    fixed_point_distance: list = field(default_factory=list)  # ‖x_T − x*‖∞ / ‖x*‖∞ for the same T

    def to_dict(self) -> dict:
        return {"T": self.T, "rel_error": self.rel_error, "gmres_residual": self.gmres_residual,
                "gmres_iterations": self.gmres_iterations, "gmres_tol": self.gmres_tol,
                "fixed_point_distance": self.fixed_point_distance}


def default_T_grid(T_max: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, … up to T_max (inclusive)."""
    out, base = [], 1
    while base <= T_max:
        out += [t for t in (base, 2 * base, 5 * base) if t <= T_max]
        base *= 10
    if out[-1] != T_max:
        out.append(T_max)
    return out


def prop5_check(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, e: torch.Tensor, Ts: Sequence[int], *,
                u: Optional[torch.Tensor] = None, e_tangent: Optional[torch.Tensor] = None, tol: float = 1e-10,
                seed: int = 0) -> Prop5Check:
    """Numerical check of Prop. 5 on one sample: implicit w by GMRES against the unrolled dx_T/dx0·u.

    u defaults to a fixed random unit direction (seeded). e_tangent as in :func:`unrolled_input_jvp`.
    """
    if u is None:
        gen = torch.Generator().manual_seed(seed)
        u = torch.randn(x0.shape, generator=gen, dtype=torch.float64).to(x0)
        u = u / u.norm()
    w, info = implicit_input_jvp(f, x_star, x0, u, tol=tol)
    unrolled = unrolled_input_jvp(f, e, x0, u, Ts, e_tangent=e_tangent)
    wn = float(w.norm())
    xs_scale = float(x_star.abs().max())
    Ts = sorted(unrolled)
    errs = [float((unrolled[t][1] - w).norm()) / max(wn, 1e-300) for t in Ts]
    dist = [float((unrolled[t][0] - x_star).abs().max()) / max(xs_scale, 1e-300) for t in Ts]
    return Prop5Check(T=Ts, rel_error=errs, gmres_residual=info.residual, gmres_iterations=info.iterations,
                      gmres_tol=tol, fixed_point_distance=dist)


@dataclass
class FrobeniusEstimate:
    """‖dx*/dx0‖_F by Hutchinson's estimator with ``probes`` Gaussian probes; ``stderr`` of the squared mean
    propagated to the norm."""

    value: float
    stderr: float
    probes: int
    gmres_residual_max: float

    def to_dict(self) -> dict:
        return {"value": self.value, "stderr": self.stderr, "probes": self.probes,
                "gmres_residual_max": self.gmres_residual_max}


def input_dependence_frobenius(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, *, probes: int = 8,
                               tol: float = 1e-8, seed: int = 0) -> FrobeniusEstimate:
    """Stochastic estimate of ‖dx*/dx0‖_F (the input-dependence axis; Prop. 5) at one sample."""
    gen = torch.Generator().manual_seed(seed)
    sq, res = [], 0.0
    for _ in range(probes):
        u = torch.randn(x0.shape, generator=gen, dtype=torch.float64).to(x0)
        w, info = implicit_input_jvp(f, x_star, x0, u, tol=tol)
        sq.append(float(w.double().pow(2).sum()))
        res = max(res, info.residual)
    sq = np.asarray(sq)
    mean = float(sq.mean())
    value = float(np.sqrt(mean))
    se_sq = float(sq.std(ddof=1) / np.sqrt(len(sq))) if len(sq) > 1 else float("nan")
    stderr = se_sq / (2 * value) if value > 0 else 0.0
    return FrobeniusEstimate(value=value, stderr=stderr, probes=probes, gmres_residual_max=res)


def initial_iterate_sensitivity(f: Callable, e: torch.Tensor, x0: torch.Tensor, Ts: Sequence[int], *,
                                u: Optional[torch.Tensor] = None, seed: int = 0) -> dict:
    """App. A.8: ‖dx_T/de · u‖ for a unit direction u of the initial iterate e, against T (x0 held fixed)."""
    if u is None:
        gen = torch.Generator().manual_seed(seed + 1)
        u = torch.randn(e.shape, generator=gen, dtype=torch.float64).to(e)
        u = u / u.norm()
    Ts = sorted(set(int(t) for t in Ts))
    x, dx = e.detach().unsqueeze(0), u.detach().unsqueeze(0)
    X0 = x0.detach().unsqueeze(0)
    out = []
    for t in range(1, Ts[-1] + 1):
        x, dx = torch.func.jvp(lambda a: f(a, X0), (x,), (dx,))
        x, dx = x.detach(), dx.detach()
        if t in Ts:
            out.append(float(dx.norm()))
    return {"T": Ts, "norm": out}


def fixed_point_distance(xs: Sequence[torch.Tensor], eps: float = 1e-8) -> torch.Tensor:
    """Per sample, the largest relative L∞ distance between fixed points reached from different e (App. A.8).

    xs: fixed points (B, *S) reached from each initial iterate. Returns (B,).
    """
    B = xs[0].shape[0]
    out = torch.zeros(B, dtype=torch.float64)
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            a, b = xs[i].flatten(1).double().cpu(), xs[j].flatten(1).double().cpu()
            d = (a - b).abs().amax(1) / (torch.maximum(a.abs().amax(1), b.abs().amax(1)) + eps)
            out = torch.maximum(out, d)
    return out
