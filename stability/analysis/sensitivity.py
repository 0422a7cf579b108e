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
from stability.errors import ConfigError, StabilityError


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


# ==== Batched: every sample of a batch at once ======================================================================
#
# The functions below take a batch (B, *S) of independent samples (``step`` keeps samples independent) and return
# per-sample arrays shaped (B, …). The linear solves go through :func:`stability.linalg.solve_I_minus_J` (torch,
# batched GMRES, per-sample convergence and residual); the unrolled reference is one pass over the T grid for the
# whole batch, shared by Prop. 5 and App. A.8 (:func:`unroll_tangents_batched`). Each sample's result equals the
# per-sample function's above (same seeded directions) to the solver's tolerance.


class Linearisation:
    """J = ∂f/∂x and K = ∂f/∂x0 at a batch of points (x, x0), from one reverse-mode forward pass.

    ``JT(u)``, ``KT(u)`` are the vjps; ``J(v)`` and ``JK(v, w)`` = J v + K w are the transposes of that cached vjp
    map (the map u ↦ (Jᵀu, Kᵀu) is linear, so its own vjp is (v, w) ↦ Jv + Kw): forward-mode numbers without a
    new forward pass, and on the CPU several times cheaper than a jvp. Built once at x*, it serves the Prop. 5
    solve, the Hutchinson probes and any other product at the same points.
    """

    def __init__(self, f: Callable, x: torch.Tensor, x0: torch.Tensor):
        self.x, self.x0 = x.detach(), x0.detach()
        self.fx, self._vjp = torch.func.vjp(f, self.x, self.x0)
        self._tJ = self._tJK = None

    def JT(self, u: torch.Tensor) -> torch.Tensor:
        return self._vjp(u.to(self.x.dtype))[0]

    def KT(self, u: torch.Tensor) -> torch.Tensor:
        return self._vjp(u.to(self.x.dtype))[1]

    def J(self, v: torch.Tensor) -> torch.Tensor:
        if self._tJ is None:
            _, self._tJ = torch.func.vjp(lambda u: self._vjp(u)[0], torch.zeros_like(self.fx))
        return self._tJ(v.to(self.x.dtype))[0]

    def JK(self, v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self._tJK is None:
            _, self._tJK = torch.func.vjp(lambda u: self._vjp(u), torch.zeros_like(self.fx))
        return self._tJK((v.to(self.x.dtype), w.to(self.x0.dtype)))[0]

    def K(self, w: torch.Tensor) -> torch.Tensor:
        return self.JK(torch.zeros_like(self.x), w)


def _tangent_step(f: Callable, x: torch.Tensor, X0: torch.Tensor, dx: torch.Tensor, U: torch.Tensor):
    """(f(x, x0), J dx + K U) at the current point, by reverse mode twice (forward-mode products without the
    slow forward-mode kernels: on the CPU about a third of a ``torch.func.jvp``)."""
    with torch.enable_grad():
        a = x.detach().requires_grad_(True)
        c = X0.detach().requires_grad_(True)
        y = f(a, c)
        v = torch.zeros_like(y, requires_grad=True)
        # allow_unused: an autonomous map (recall none) ignores x0, a constant map its state
        ga, gc = torch.autograd.grad(y, (a, c), v, create_graph=True, allow_unused=True)
        terms = [(g * d).sum() for g, d in ((ga, dx), (gc, U)) if g is not None]
        jv = None
        if terms:
            (jv,) = torch.autograd.grad(sum(terms), v, allow_unused=True)
    return y.detach(), (torch.zeros_like(y) if jv is None else jv).detach()


@dataclass
class Unroll:
    """The unrolled iteration x_{t+1} = f(x_t, x0) from e and its tangents, at the T of a grid (one batch).

    x: (nT, B, *S) the iterates x_T; input_tangent: (nT, B, *S) dx_T/dx0 · u (None when not asked);
    initial_tangent: (nT, B, *S) dx_T/de · u_e (None when not asked); frozen_at: (B,) the step after which the
    linearisation was held (0: never, exact to the end).
    """

    T: list
    x: torch.Tensor
    input_tangent: Optional[torch.Tensor]
    initial_tangent: Optional[torch.Tensor]
    frozen_at: torch.Tensor
    freeze_tol: Optional[float]


def unroll_tangents_batched(f: Callable, e: torch.Tensor, x0: torch.Tensor, Ts: Sequence[int], *,
                            input_dir: Optional[torch.Tensor] = None, e_tangent: Optional[torch.Tensor] = None,
                            initial_dir: Optional[torch.Tensor] = None,
                            freeze_tol: Optional[float] = 1e-14, dense_max: int = 1024) -> Unroll:
    """dx_T/dx0 · u (Prop. 5) and dx_T/de · u_e (App. A.8) along one unrolled iteration from e, for every T in Ts
    and every sample of the batch, in one pass (the two tangents share the trajectory: their rows ride in one
    batch).

    e, x0: (B, *S), (B, *S0). input_dir: (B, *S0) directions u of x0 (with e_tangent = de/dx0 · u, default 0: e held
    fixed, as Prop. 5 states it). initial_dir: (B, *S) directions of e. Each step is a double reverse-mode product
    (:func:`_tangent_step`). freeze_tol: once a sample's step ‖x_{t+1} − x_t‖∞ / ‖x_{t+1}‖∞ is ≤ freeze_tol, its
    iterate has reached x* to rounding (the trajectory only wanders in the last bits) and the remaining steps use
    the linearisation at that iterate: the dense J (n × n, built once by n batched products) when the state has
    n ≤ ``dense_max`` entries and fewer than the steps left, else the cached :class:`Linearisation` (about a
    quarter of a step's cost); x_T is then held at that iterate. The change to dx_T is of the order
    freeze_tol · ‖∂²f‖ / (1 − ρ) (on the demo ≤ 5e-5 relative on a Prop. 5 error of 4e-11, see
    benchmarks/RESULTS.md). ``freeze_tol=None``: every step exact. The test is per sample, so a sample's result
    does not depend on its batch mates.
    """
    Ts = sorted(set(int(t) for t in Ts))
    if not Ts or Ts[0] < 1:
        raise ConfigError("Ts must be positive iteration counts")
    e, x0 = e.detach(), x0.detach()
    B = e.shape[0]
    rows_x, rows_x0, rows_dx, rows_U, kinds = [], [], [], [], []
    if input_dir is not None:
        rows_x.append(e)
        rows_x0.append(x0)
        rows_dx.append(torch.zeros_like(e) if e_tangent is None else e_tangent.detach().to(e.dtype))
        rows_U.append(input_dir.detach().to(x0.dtype))
        kinds.append("input")
    if initial_dir is not None:
        rows_x.append(e)
        rows_x0.append(x0)
        rows_dx.append(initial_dir.detach().to(e.dtype))
        rows_U.append(torch.zeros_like(x0))
        kinds.append("initial")
    if not kinds:
        raise ConfigError("ask for input_dir, initial_dir or both")
    x, X0, dx, U = (torch.cat(r) for r in (rows_x, rows_x0, rows_dx, rows_U))
    R = x.shape[0]
    moving = torch.ones(R, dtype=torch.bool, device=x.device)
    frozen_at = torch.zeros(R, dtype=torch.int64)
    groups = []  # (rows, affine map dx ↦ J dx + K u at the rows' frozen iterates)
    rec_x, rec_dx = [], []
    for t in range(1, Ts[-1] + 1):
        idx = moving.nonzero().flatten()
        new_x, new_dx = x.clone(), dx.clone()
        if idx.numel():
            y, dy = _tangent_step(f, x[idx], X0[idx], dx[idx], U[idx])
            new_x[idx], new_dx[idx] = y, dy
        for rows, affine in groups:
            new_dx[rows] = affine(dx[rows])
        if freeze_tol is not None and idx.numel():
            yf, xf = new_x[idx].flatten(1), x[idx].flatten(1)
            step = (yf - xf).abs().amax(1) / yf.abs().amax(1).clamp_min(1e-300)
            fr = idx[step <= freeze_tol]
            if fr.numel():
                moving[fr] = False
                frozen_at[fr.cpu()] = t
                groups.append((fr, _frozen_affine(f, new_x[fr], X0[fr], U[fr], min(dense_max, Ts[-1] - t))))
        x, dx = new_x, new_dx
        if t in Ts:
            rec_x.append(x)
            rec_dx.append(dx)
    Xs, DX = torch.stack(rec_x), torch.stack(rec_dx)
    parts = {k: DX[:, i * B:(i + 1) * B] for i, k in enumerate(kinds)}
    return Unroll(T=Ts, x=Xs[:, :B], input_tangent=parts.get("input"), initial_tangent=parts.get("initial"),
                  frozen_at=frozen_at[:B], freeze_tol=freeze_tol)


def _frozen_affine(f: Callable, x: torch.Tensor, X0: torch.Tensor, U: torch.Tensor, dense_max: int) -> Callable:
    """dx ↦ J dx + K U at the points (x, X0), J and K held: by dense per-row matrices when n ≤ dense_max."""
    lin = Linearisation(f, x, X0)
    c = lin.K(U)
    n, R = x[0].numel(), x.shape[0]
    if n > dense_max:
        return lambda d: lin.J(d) + c
    eye = torch.eye(n, dtype=x.dtype, device=x.device).reshape(n, *x.shape[1:])
    cols = Linearisation(f, x.repeat_interleave(n, 0), X0.repeat_interleave(n, 0)).J(
        eye.repeat(R, *([1] * (x.dim() - 1))))
    D = cols.reshape(R, n, n).transpose(1, 2).contiguous()  # D[r] = J at row r's point

    def affine(d: torch.Tensor) -> torch.Tensor:
        return torch.bmm(D, d.reshape(R, n, 1)).reshape(d.shape) + c

    return affine


def _seeded_direction(shape, seed: int, like: torch.Tensor, B: int) -> torch.Tensor:
    """The per-sample functions' seeded unit direction (one sample's shape), the same for every sample."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(tuple(shape), generator=gen, dtype=torch.float64).to(like)
    u = u / u.norm()
    return u.unsqueeze(0).expand(B, *u.shape).contiguous()


def _krylov_message(res: float, its: int, tol: float) -> str:
    return (f"GMRES did not converge: relative residual {res:.3g} > tol {tol:.3g} after {its} products with "
            f"I − J (is x* attracting, ρ(J) < 1?)")


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
            raise KrylovError(_krylov_message(float(self.gmres_residual[b]), int(self.gmres_iterations[b]),
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
    :func:`prop5_and_initial_iterate_batched`); linearisation: a :class:`Linearisation` at (x_star, x0).
    """
    B = x_star.shape[0]
    if u is None:
        u = _seeded_direction(x0.shape[1:], seed, x0, B)
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


@dataclass
class InitialIterateBatched:
    """App. A.8 on a batch: norm[b, i] = ‖dx_T/de · u‖ at T = T[i] for sample b (u a unit direction of e)."""

    T: list
    norm: np.ndarray  # (B, nT)
    frozen_at: np.ndarray

    def sample(self, b: int) -> dict:
        """Sample b as :func:`initial_iterate_sensitivity` returns it."""
        return {"T": list(self.T), "norm": self.norm[b].tolist()}


def initial_iterate_sensitivity_batched(f: Callable, e: torch.Tensor, x0: torch.Tensor, Ts: Sequence[int], *,
                                        u: Optional[torch.Tensor] = None, seed: int = 0,
                                        unroll: Optional[Unroll] = None,
                                        freeze_tol: Optional[float] = 1e-14) -> InitialIterateBatched:
    """:func:`initial_iterate_sensitivity` for every sample of a batch in one pass over the T grid.

    e: (B, *S), x0: (B, *S0). u: (B, *S), default the per-sample function's seeded unit direction (seed + 1) for
    every sample. unroll: a precomputed :class:`Unroll` with initial_tangent for the same u.
    """
    B = e.shape[0]
    if unroll is None:
        if u is None:
            u = _seeded_direction(e.shape[1:], seed + 1, e, B)
        unroll = unroll_tangents_batched(f, e, x0, Ts, initial_dir=u, freeze_tol=freeze_tol)
    elif unroll.initial_tangent is None:
        raise ConfigError("the unroll passed has no initial-iterate tangent")
    norms = unroll.initial_tangent.flatten(2).norm(dim=2).T  # (B, nT)
    return InitialIterateBatched(T=list(unroll.T), norm=norms.double().cpu().numpy(),
                                 frozen_at=unroll.frozen_at.numpy())


def prop5_and_initial_iterate_batched(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, e: torch.Tensor,
                                      Ts: Sequence[int], *, e_tangent: Optional[torch.Tensor] = None,
                                      tol: float = 1e-10, seed: int = 0, max_iter: Optional[int] = None,
                                      restart: int = 60, linearisation: Optional[Linearisation] = None,
                                      freeze_tol: Optional[float] = 1e-14) -> tuple:
    """Prop. 5 and App. A.8 on a batch from ONE unrolled pass: both tangents (dx_T/dx0·u and dx_T/de·u_e) follow
    the same trajectory from e. Returns (:class:`Prop5Batched`, :class:`InitialIterateBatched`), each equal to
    what :func:`prop5_check_batched` and :func:`initial_iterate_sensitivity_batched` return with the same seed."""
    B = x_star.shape[0]
    u = _seeded_direction(x0.shape[1:], seed, x0, B)
    u_e = _seeded_direction(e.shape[1:], seed + 1, e, B)
    unroll = unroll_tangents_batched(f, e, x0, Ts, input_dir=u, e_tangent=e_tangent, initial_dir=u_e,
                                     freeze_tol=freeze_tol)
    p5 = prop5_check_batched(f, x_star, x0, e, Ts, u=u, tol=tol, max_iter=max_iter, restart=restart,
                             unroll=unroll, linearisation=linearisation)
    a8 = initial_iterate_sensitivity_batched(f, e, x0, Ts, unroll=unroll)
    return p5, a8


@dataclass
class FrobeniusBatched:
    """‖dx*/dx0‖_F per sample by Hutchinson's estimator (see :class:`FrobeniusEstimate`); residual_max: the
    largest recomputed GMRES residual over the sample's probes; converged: residual_max ≤ 10·tol."""

    value: np.ndarray  # (B,)
    stderr: np.ndarray  # (B,)
    probes: int
    gmres_residual_max: np.ndarray  # (B,)
    gmres_iterations: np.ndarray  # (B, probes)
    tol: float
    converged: np.ndarray  # (B,) bool

    def sample(self, b: int) -> FrobeniusEstimate:
        """Sample b as :func:`input_dependence_frobenius` returns it; raises KrylovError if a probe's GMRES
        failed."""
        if not self.converged[b]:
            raise KrylovError(_krylov_message(float(self.gmres_residual_max[b]),
                                              int(self.gmres_iterations[b].max()), self.tol))
        return FrobeniusEstimate(value=float(self.value[b]), stderr=float(self.stderr[b]), probes=self.probes,
                                 gmres_residual_max=float(self.gmres_residual_max[b]))


def input_dependence_frobenius_batched(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, *, probes: int = 8,
                                       tol: float = 1e-8, seed: int = 0, max_iter: Optional[int] = None,
                                       restart: int = 60, batch: Optional[int] = None) -> FrobeniusBatched:
    """:func:`input_dependence_frobenius` for every sample of a batch: all B × probes systems (I − J_b) w = K_b u_p
    in one batched GMRES (``batch``: at most that many systems per solve; default: as many as keep the Krylov
    bases within about 512 MiB, all of them for the demo's states).

    The probes u_1 … u_P are the per-sample function's (seeded, the same for every sample), so sample b's value
    equals ``input_dependence_frobenius(f, x_star[b], x0[b], probes=P, seed=seed)`` to the GMRES tolerance.
    """
    from stability.linalg import solve_I_minus_J

    if probes < 1:
        raise ConfigError("probes must be ≥ 1")
    B = x_star.shape[0]
    gen = torch.Generator().manual_seed(seed)
    U = torch.stack([torch.randn(tuple(x0.shape[1:]), generator=gen, dtype=torch.float64) for _ in range(probes)])
    U = U.to(x0)
    # systems in sample-major order: row b·P + p is sample b, probe p
    Xs = x_star.detach().repeat_interleave(probes, 0)
    X0s = x0.detach().repeat_interleave(probes, 0)
    Us = U.repeat(B, *([1] * (U.dim() - 1)))
    n_sys = B * probes
    if batch is None:  # bound the Krylov basis, (restart + 1) vectors per system, to about 512 MiB
        n = max(1, x_star[0].numel())
        batch = max(1, (512 << 20) // ((restart + 2) * n * x_star.element_size()))
    step = max(1, int(batch))
    sq, res, its = [], [], []
    for i in range(0, n_sys, step):
        lin = Linearisation(f, Xs[i:i + step], X0s[i:i + step])
        sol = solve_I_minus_J(lin.J, lin.K(Us[i:i + step]), tol=tol, max_iter=max_iter, restart=restart)
        sq.append(sol.x.double().flatten(1).pow(2).sum(1))
        res.append(sol.residual)
        its.append(sol.iterations)
    sq = torch.cat(sq).reshape(B, probes).cpu().numpy()
    res = torch.cat(res).reshape(B, probes).cpu().numpy()
    its = torch.cat(its).reshape(B, probes).cpu().numpy()
    mean = sq.mean(1)
    value = np.sqrt(mean)
    se_sq = sq.std(1, ddof=1) / np.sqrt(probes) if probes > 1 else np.full(B, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        stderr = np.where(value > 0, se_sq / (2 * value), 0.0)
    rmax = res.max(1)
    return FrobeniusBatched(value=value, stderr=stderr, probes=probes, gmres_residual_max=rmax,
                            gmres_iterations=its, tol=tol, converged=np.isfinite(rmax) & (rmax <= 10 * tol))
