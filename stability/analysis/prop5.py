"""Prop. 5: the implicit input-gradient of the fixed point, dx*/dx0 = (I − J)⁻¹ ∂f/∂x0 with J = ∂f/∂x at (x*, x0),
and its numerical check against the unrolled iteration, on a batch (B, *S) of independent samples.

* Implicit: a direction u of x0 maps to w = dx*/dx0 · u by one batched solve of (I − J) w = (∂f/∂x0) u
  (:func:`implicit_input_jvp_batched`: :func:`stability.numerics.gmres.solve_I_minus_J` on the products of a
  :class:`~stability.numerics.jacobian.Linearisation`, per-sample convergence and residual).
* The proposition's limit: dx_T/dx0 · u, carried forward along the unrolled iteration x_{t+1} = f(x_t, x0) from
  e (:func:`stability.analysis.tangents.unroll_tangents_batched`, one pass over the T grid for the whole batch),
  approaches w as T grows; :func:`prop5_check_batched` records the relative error ‖dx_T/dx0·u − w‖ / ‖w‖ against
  T per sample, and reports a GMRES that did not reach its tolerance as :class:`KrylovError`.

The per-sample references (scipy's GMRES on a matrix-free operator, the unrolled jvp and vjp of one sample) live
in the tests (tests/reference_numerics.py); each sample's result here equals theirs to the solver's tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from stability.analysis.tangents import Unroll, seeded_direction, unroll_tangents_batched
from stability.errors import ConfigError, StabilityError
from stability.numerics import Linearisation, solve_I_minus_J


class KrylovError(StabilityError):
    """GMRES did not solve (I − J) w = b to its tolerance (typically ρ(J) ≥ 1: x* is not attracting)."""


def krylov_message(res: float, its: int, tol: float, precision: str = "float64") -> str:
    """The one-line message of a :class:`KrylovError`: the relative residual reached after ``its`` products, and
    its likelier cause: x* not attracting, or, where the products ran below float64 (``precision``), rounding."""
    head = f"GMRES did not converge: relative residual {res:.3g} > tol {tol:.3g} after {its} products with I − J"
    if precision != "float64":
        return (f"{head} (cause: precision, not the model: the products are {precision}, whose rounding "
                f"(ε ≈ {torch.finfo(getattr(torch, precision)).eps:.1g}) no Krylov solve gets far below; "
                "analyse in float64)")
    return f"{head} (is x* attracting, ρ(J) < 1?)"


def precision_of(x: torch.Tensor) -> str:
    """``float64``, ``float32``, ...: the precision of the products at the state ``x``."""
    return str(x.dtype).replace("torch.", "")


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
    precision: str = "float64"  # of the products (a failed solve's message names it below float64)

    def sample(self, b: int) -> Prop5Check:
        """Sample b as one record (:class:`Prop5Check`); raises KrylovError if its GMRES failed."""
        if not self.converged[b]:
            raise KrylovError(krylov_message(float(self.gmres_residual[b]), int(self.gmres_iterations[b]),
                                             self.gmres_tol, self.precision))
        return Prop5Check(T=list(self.T), rel_error=self.rel_error[b].tolist(),
                          gmres_residual=float(self.gmres_residual[b]),
                          gmres_iterations=int(self.gmres_iterations[b]), gmres_tol=self.gmres_tol,
                          fixed_point_distance=self.fixed_point_distance[b].tolist())


def implicit_input_jvp_batched(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, u: torch.Tensor, *,
                               tol: float = 1e-10, max_iter: Optional[int] = None, restart: int = 60,
                               method: str = "gmres", linearisation: Optional[Linearisation] = None):
    """Prop. 5 on a batch: w_b = (I − J_b)⁻¹ K_b u_b for every sample (J, K = ∂f/∂x, ∂f/∂x0 at (x*_b, x0_b)),
    by one batched solve. ``linearisation``: J and K at (x_star, x0) when already built (``inputs=True``). Returns
    :class:`stability.numerics.gmres.IJSolve` (w, residual per sample, products)."""
    lin = linearisation or Linearisation(f, x_star, x0, inputs=True)
    return solve_I_minus_J(lin.J, lin.K(u), method=method, tol=tol, max_iter=max_iter, restart=restart)


def prop5_check_batched(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, e: torch.Tensor, Ts: Sequence[int], *,
                        u: Optional[torch.Tensor] = None, e_tangent: Optional[torch.Tensor] = None,
                        tol: float = 1e-10, seed: int = 0, max_iter: Optional[int] = None, restart: int = 60,
                        unroll: Optional[Unroll] = None, linearisation: Optional[Linearisation] = None,
                        freeze_tol: Optional[float] = 1e-14) -> Prop5Batched:
    """Prop. 5's check for every sample of a batch at once: the implicit w by one batched GMRES, the unrolled
    dx_T/dx0·u by one pass over the T grid (:func:`unroll_tangents_batched`).

    x_star, e: (B, *S); x0: (B, *S0). u: (B, *S0), default one seeded unit direction (:func:`seeded_direction`)
    for every sample. unroll: a precomputed :class:`Unroll` with input_tangent for the same u (see
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
    return Prop5Batched(T=list(unroll.T), rel_error=err.T.detach().double().cpu().numpy(),
                        fixed_point_distance=dist.T.detach().double().cpu().numpy(), gmres_residual=res,
                        gmres_iterations=sol.iterations.cpu().numpy(), gmres_tol=tol,
                        converged=np.isfinite(res) & (res <= 10 * tol), w=w, frozen_at=unroll.frozen_at.numpy(),
                        precision=precision_of(x_star))
