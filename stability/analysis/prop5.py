"""Prop. 5: the implicit input-gradient of the fixed point, dx*/dx0 = (I − J)⁻¹ ∂f/∂x0 with J = ∂f/∂x at (x*, x0),
and its numerical check against the unrolled iteration.

* Matrix-free: a direction u of x0 maps to w = dx*/dx0 · u by one GMRES solve of (I − J) w = (∂f/∂x0) u
  (:func:`implicit_input_jvp`); a cotangent v maps to vᵀ dx*/dx0 by GMRES on (I − J)ᵀ (:func:`implicit_input_vjp`).
  Both report their relative residual and raise :class:`KrylovError` when GMRES does not reach its tolerance.
* The proposition's limit: dx_T/dx0 · u, carried forward along the unrolled iteration x_{t+1} = f(x_t, x0) from
  e (:func:`unrolled_input_jvp`), approaches w as T grows; :func:`prop5_check` records the relative error
  ‖dx_T/dx0·u − w‖ / ‖w‖ against T. :func:`unrolled_input_vjp` is the reverse-mode counterpart (backprop
  through T iterations, memory ∝ T), the route the implicit one replaces.

The functions without ``_batched`` take one sample (no batch dimension). The batched ones take a batch (B, *S) of
independent samples and return per-sample arrays: the linear solve by :func:`stability.linalg.solve_I_minus_J`
(torch, batched GMRES, per-sample convergence and residual), the unrolled reference by one pass over the T grid
for the whole batch (:func:`stability.analysis.tangents.unroll_tangents_batched`). Each sample's result equals the
per-sample function's (same seeded directions) to the solver's tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from stability.analysis.operators import JacobianOperator
from stability.analysis.tangents import Linearisation, Unroll, seeded_direction, unroll_tangents_batched
from stability.errors import ConfigError, StabilityError


class KrylovError(StabilityError):
    """GMRES did not solve (I − J) w = b to its tolerance (typically ρ(J) ≥ 1: x* is not attracting)."""


def krylov_message(res: float, its: int, tol: float) -> str:
    """The one-line message of a :class:`KrylovError`: the relative residual reached after ``its`` products."""
    return (f"GMRES did not converge: relative residual {res:.3g} > tol {tol:.3g} after {its} products with "
            f"I − J (is x* attracting, ρ(J) < 1?)")


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
        raise KrylovError(krylov_message(res, count[0], tol))
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


# ---- batched: every sample of a batch at once --------------------------------------------------------------

@dataclass
class Prop5Batched:
    """Prop. 5 on a batch: rel_error[b, i] = ‖dx_T/dx0·u − dx*/dx0·u‖ / ‖dx*/dx0·u‖ at T = T[i] for sample b,
    fixed_point_distance[b, i] = ‖x_T − x*‖∞ / ‖x*‖∞, and each sample's GMRES record (residual recomputed from
    the returned w; ``converged``: residual ≤ 10·tol, the per-sample function's acceptance)."""

    T: list
    rel_error: np.ndarray  # (B, nT)
    fixed_point_distance: np.ndarray  # (B, nT)
    gmres_residual: np.ndarray  # (B,)
    gmres_iterations: np.ndarray  # (B,)
    gmres_tol: float
    converged: np.ndarray  # (B,) bool
    w: torch.Tensor  # (B, *S) dx*/dx0 · u
    frozen_at: np.ndarray  # (B,) see Unroll

    def sample(self, b: int) -> Prop5Check:
        """Sample b as the per-sample record (:class:`Prop5Check`); raises KrylovError if its GMRES failed."""
        if not self.converged[b]:
            raise KrylovError(krylov_message(float(self.gmres_residual[b]), int(self.gmres_iterations[b]),
                                             self.gmres_tol))
        return Prop5Check(T=list(self.T), rel_error=self.rel_error[b].tolist(),
                          gmres_residual=float(self.gmres_residual[b]),
                          gmres_iterations=int(self.gmres_iterations[b]), gmres_tol=self.gmres_tol,
                          fixed_point_distance=self.fixed_point_distance[b].tolist())


def implicit_input_jvp_batched(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, u: torch.Tensor, *,
                               tol: float = 1e-10, max_iter: Optional[int] = None, restart: int = 60,
                               method: str = "gmres", linearisation: Optional[Linearisation] = None):
    """Prop. 5 on a batch: w_b = (I − J_b)⁻¹ K_b u_b for every sample (J, K = ∂f/∂x, ∂f/∂x0 at (x*_b, x0_b)),
    by one batched solve. Returns :class:`stability.linalg.IJSolve` (w, residual per sample, products)."""
    from stability.linalg import solve_I_minus_J

    lin = linearisation or Linearisation(f, x_star, x0)
    return solve_I_minus_J(lin.J, lin.K(u), method=method, tol=tol, max_iter=max_iter, restart=restart)


def prop5_check_batched(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, e: torch.Tensor, Ts: Sequence[int], *,
                        u: Optional[torch.Tensor] = None, e_tangent: Optional[torch.Tensor] = None,
                        tol: float = 1e-10, seed: int = 0, max_iter: Optional[int] = None, restart: int = 60,
                        unroll: Optional[Unroll] = None, linearisation: Optional[Linearisation] = None,
                        freeze_tol: Optional[float] = 1e-14) -> Prop5Batched:
    """:func:`prop5_check` for every sample of a batch at once: the implicit w by one batched GMRES, the
    unrolled dx_T/dx0·u by one pass over the T grid (:func:`unroll_tangents_batched`).

    x_star, e: (B, *S); x0: (B, *S0). u: (B, *S0), default the per-sample function's seeded unit direction for
    every sample. unroll: a precomputed :class:`Unroll` with input_tangent for the same u (see
    :func:`stability.analysis.initial_iterate.prop5_and_initial_iterate_batched`); linearisation: a
    :class:`Linearisation` at (x_star, x0).
    """
    B = x_star.shape[0]
    if u is None:
        u = seeded_direction(x0.shape[1:], seed, x0, B)
    sol = implicit_input_jvp_batched(f, x_star, x0, u, tol=tol, max_iter=max_iter, restart=restart,
                                     linearisation=linearisation)
    if unroll is None:
        unroll = unroll_tangents_batched(f, e, x0, Ts, input_dir=u, e_tangent=e_tangent, freeze_tol=freeze_tol)
    elif unroll.input_tangent is None:
        raise ConfigError("the unroll passed has no input tangent")
    w = sol.x
    wn = w.flatten(1).norm(dim=1).clamp_min(1e-300)
    err = (unroll.input_tangent - w.unsqueeze(0)).flatten(2).norm(dim=2) / wn  # (nT, B)
    xs_scale = x_star.flatten(1).abs().amax(1).clamp_min(1e-300)
    dist = (unroll.x - x_star.unsqueeze(0)).flatten(2).abs().amax(2) / xs_scale
    res = sol.residual.cpu().numpy()
    return Prop5Batched(T=list(unroll.T), rel_error=err.T.double().cpu().numpy(),
                        fixed_point_distance=dist.T.double().cpu().numpy(), gmres_residual=res,
                        gmres_iterations=sol.iterations.cpu().numpy(), gmres_tol=tol,
                        converged=np.isfinite(res) & (res <= 10 * tol), w=w, frozen_at=unroll.frozen_at.numpy())
