"""Independent references for the numerics wing (``stability.numerics``), one sample at a time, by scipy.

The package computes ρ(J*), σ_max and the (I − J) solves in torch on a batch of samples
(:mod:`stability.numerics`). These are the same quantities by a different road, for the tests to hold the package
to: J at one sample's point as a matrix-free :class:`scipy.sparse.linalg.LinearOperator` (:class:`JacobianOperator`:
matvec a forward-mode jvp, rmatvec a vjp), ARPACK's implicitly restarted Arnoldi for ρ (:func:`arpack_rho`) and
its SVD for σ_max (:func:`arpack_sigma_max`), scipy's GMRES for Prop. 5's w = (I − J)⁻¹ ∂f/∂x0 u
(:func:`implicit_input_jvp`, :func:`implicit_input_vjp`), the unrolled iteration forward and backward
(:func:`unrolled_input_jvp`, :func:`unrolled_input_vjp`), and what the analysis builds from them per sample
(:func:`prop5_check`, :func:`input_dependence_frobenius`). Nothing here imports ``stability.numerics``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from scipy.sparse.linalg import LinearOperator

from stability.analysis.input_dependence import FrobeniusEstimate
from stability.analysis.prop5 import KrylovError, Prop5Check, krylov_message

_TORCH_TO_NP = {torch.float64: np.float64, torch.float32: np.float32}


# ---- J at one sample's point as a scipy LinearOperator ---------------------------------------------------------

class TorchLinearOperator(LinearOperator):
    """A linear map on one sample's state given by a batched torch function ``apply(V)``: (k, *S_in) → (k, *S_out).
    ``rapply`` is the transpose (when absent, derived once by a vjp of the linear map ``apply``)."""

    def __init__(self, apply: Callable, in_shape: tuple, out_shape: tuple, dtype: torch.dtype, device,
                 rapply: Optional[Callable] = None):
        self.apply = apply
        self.in_shape, self.out_shape = tuple(in_shape), tuple(out_shape)
        self.torch_dtype, self.device = dtype, device
        self._rapply = rapply
        super().__init__(dtype=np.dtype(_TORCH_TO_NP.get(dtype, np.float64)),
                         shape=(math.prod(self.out_shape), math.prod(self.in_shape)))

    def mv(self, v: torch.Tensor) -> torch.Tensor:
        return self.apply(v.reshape(1, *self.in_shape))[0]

    def rmv(self, u: torch.Tensor) -> torch.Tensor:
        if self._rapply is None:
            zero = torch.zeros(1, *self.in_shape, dtype=self.torch_dtype, device=self.device)
            _, vjp_fn = torch.func.vjp(self.apply, zero)  # the map is linear: its vjp at 0 is its transpose
            self._rapply = lambda U: vjp_fn(U)[0]
        return self._rapply(u.reshape(1, *self.out_shape))[0]

    def dense(self, chunk: int = 256) -> torch.Tensor:
        """The matrix (n_out, n_in), column blocks of the identity pushed through the forward-mode product."""
        n_in = self.shape[1]
        cols = []
        eye = torch.eye(n_in, dtype=self.torch_dtype, device=self.device)
        for i in range(0, n_in, chunk):
            block = eye[i:i + chunk].reshape(-1, *self.in_shape)
            cols.append(getattr(self, "apply_jvp", self.apply)(block).reshape(block.shape[0], -1))
        return torch.cat(cols).T

    def _np(self, fn, v: np.ndarray, shape_in) -> np.ndarray:
        v = np.asarray(v).reshape(-1)
        if np.iscomplexobj(v):  # the operator is real: act on the real and imaginary parts
            return self._np(fn, v.real, shape_in) + 1j * self._np(fn, v.imag, shape_in)
        t = torch.as_tensor(np.ascontiguousarray(v), dtype=self.torch_dtype, device=self.device)
        return fn(t.reshape(shape_in)).detach().reshape(-1).cpu().numpy().astype(self.dtype, copy=False)

    def _matvec(self, v):
        return self._np(self.mv, v, self.in_shape)

    def _rmatvec(self, u):
        return self._np(self.rmv, u, self.out_shape)


class JacobianOperator(TorchLinearOperator):
    """J = ∂f/∂x (``wrt="x"``) or ∂f/∂x0 (``wrt="x0"``) of ``f(x, x0)`` at one sample's (x, x0), without the batch
    dimension. matvec: a jvp (``mode="jvp"``) or the transpose of the cached vjp (``mode="vjp"``); rmatvec: the vjp,
    its forward pass taken once."""

    def __init__(self, f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor], *, wrt: str = "x",
                 mode: str = "jvp"):
        self.x, self.x0 = x.detach(), None if x0 is None else x0.detach()
        point = self.x if wrt == "x" else self.x0

        def fn(p: torch.Tensor) -> torch.Tensor:
            k = p.shape[0]
            xs = p if wrt == "x" else self.x.expand(k, *self.x.shape)
            x0s = None if self.x0 is None else (p if wrt == "x0" else self.x0.expand(k, *self.x0.shape))
            return f(xs, x0s)

        def apply_jvp(V: torch.Tensor) -> torch.Tensor:
            P = point.expand(V.shape[0], *point.shape).contiguous()
            return torch.func.jvp(fn, (P,), (V.to(point.dtype),))[1]

        _, vjp_fn = torch.func.vjp(fn, point.unsqueeze(0))

        def rapply(U: torch.Tensor) -> torch.Tensor:
            return torch.cat([vjp_fn(U[i:i + 1].to(point.dtype))[0] for i in range(U.shape[0])])

        def apply_vjp_transpose(V: torch.Tensor) -> torch.Tensor:
            zero = torch.zeros(1, *x.shape, dtype=point.dtype, device=point.device)
            _, vjp_T = torch.func.vjp(lambda u: vjp_fn(u)[0], zero)
            return torch.cat([vjp_T(V[i:i + 1].to(point.dtype))[0] for i in range(V.shape[0])])

        self.apply_jvp = apply_jvp
        super().__init__(apply_jvp if mode == "jvp" else apply_vjp_transpose, point.shape, x.shape, point.dtype,
                         point.device, rapply=rapply)


# ---- ρ and σ_max by ARPACK, one sample at a time ----------------------------------------------------------------

@dataclass
class ArpackSpectrum:
    """ρ and the leading eigenvalues of one operator (descending modulus)."""

    rho: float
    eigenvalues: list = field(default_factory=list)  # complex, descending modulus
    converged: bool = True
    matvecs: int = 0


def _sorted(vals) -> list:
    vals = np.asarray(vals, dtype=complex)
    return [complex(z) for z in vals[np.argsort(-np.abs(vals), kind="stable")]]


def dense_spectrum(J, k: int = 6) -> ArpackSpectrum:
    """All eigenvalues of one dense matrix by numpy's LAPACK, the k of largest modulus kept."""
    J = J.detach().cpu().double().numpy() if isinstance(J, torch.Tensor) else np.asarray(J, dtype=np.float64)
    vals = _sorted(np.linalg.eigvals(J))
    return ArpackSpectrum(rho=float(abs(vals[0])), eigenvalues=vals[:k], matvecs=J.shape[0])


def dense_rho(J) -> float:
    """ρ of one dense matrix by numpy's LAPACK."""
    return dense_spectrum(J).rho


def arpack_rho(op: LinearOperator, *, k: int = 3, tol: float = 1e-10, seed: int = 0, transpose: bool = False,
               ncv: Optional[int] = None) -> ArpackSpectrum:
    """ρ(op) and its k leading eigenvalues by ARPACK (``eigs``, which="LM"), on opᵀ with ``transpose``."""
    from scipy.sparse.linalg import ArpackNoConvergence, eigs

    n = op.shape[0]
    count = [0]
    inner = op.T if transpose else op

    def mv(v):
        count[0] += 1
        return inner.matvec(v)

    wrapped = LinearOperator(op.shape, matvec=mv, dtype=op.dtype)
    v0 = np.random.default_rng(seed).standard_normal(n)
    try:
        vals = eigs(wrapped, k=k, which="LM", tol=tol, ncv=ncv or min(n, max(2 * k + 1, 40)), v0=v0,
                    return_eigenvectors=False)
        converged = True
    except ArpackNoConvergence as exc:
        vals, converged = exc.eigenvalues, False
    vals = _sorted(vals)
    return ArpackSpectrum(rho=float(abs(vals[0])), eigenvalues=vals, converged=converged, matvecs=count[0])


def arpack_sigma_max(op: LinearOperator, *, tol: float = 1e-10, seed: int = 0) -> float:
    """‖op‖₂ by ARPACK's SVD (matvec and rmatvec)."""
    from scipy.sparse.linalg import svds

    v0 = np.random.default_rng(seed).standard_normal(min(op.shape))
    return float(svds(op, k=1, tol=tol, v0=v0, return_singular_vectors=False, solver="arpack")[0])


# ---- Prop. 5 by scipy's GMRES, one sample at a time --------------------------------------------------------------

@dataclass
class GMRESInfo:
    residual: float  # ‖(I − J) w − b‖ / ‖b‖, recomputed after the solve
    iterations: int
    tol: float


def scipy_gmres(apply_np: Callable, b: np.ndarray, tol: float, maxiter: Optional[int] = None,
                restart: int = 60) -> tuple:
    """w with apply_np(w) = b by scipy's restarted GMRES; raises KrylovError when it misses 10 · tol."""
    from scipy.sparse.linalg import gmres

    n = b.shape[0]
    count = [0]

    def mv(v):
        count[0] += 1
        return apply_np(v)

    bnorm = float(np.linalg.norm(b))
    if bnorm == 0.0:
        return np.zeros_like(b), GMRESInfo(0.0, 0, tol)
    restart = min(restart, n)
    maxiter = maxiter if maxiter is not None else max(1, (20 * n) // restart + 1)
    w, info = gmres(LinearOperator((n, n), matvec=mv, dtype=np.float64), b, rtol=tol, atol=0.0, restart=restart,
                    maxiter=maxiter)
    res = float(np.linalg.norm(apply_np(w) - b) / bnorm)
    if info != 0 or not np.isfinite(res) or res > 10 * tol:
        raise KrylovError(krylov_message(res, count[0], tol))
    return w, GMRESInfo(residual=res, iterations=count[0], tol=tol)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().reshape(-1).cpu().double().numpy()


def implicit_input_jvp(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, u: torch.Tensor, *, tol: float = 1e-10,
                       maxiter: Optional[int] = None, restart: int = 60) -> tuple:
    """Prop. 5 at one sample: w = dx*/dx0 · u = (I − J)⁻¹ (∂f/∂x0) u by scipy's GMRES; (w, GMRESInfo)."""
    J = JacobianOperator(f, x_star, x0, wrt="x", mode="vjp")
    Jx0 = JacobianOperator(f, x_star, x0, wrt="x0")
    w, info = scipy_gmres(lambda v: v - J.matvec(v).astype(np.float64), _np(Jx0.mv(u)), tol, maxiter, restart)
    return torch.as_tensor(w, dtype=x_star.dtype, device=x_star.device).reshape(x_star.shape), info


def implicit_input_vjp(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, v: torch.Tensor, *, tol: float = 1e-10,
                       maxiter: Optional[int] = None, restart: int = 60) -> tuple:
    """Prop. 5 transposed at one sample: vᵀ dx*/dx0 = ((I − J)⁻ᵀ v)ᵀ ∂f/∂x0 by scipy's GMRES on (I − J)ᵀ."""
    J = JacobianOperator(f, x_star, x0, wrt="x")
    Jx0 = JacobianOperator(f, x_star, x0, wrt="x0")
    y, info = scipy_gmres(lambda a: a - J.rmatvec(a).astype(np.float64), _np(v), tol, maxiter, restart)
    y_t = torch.as_tensor(y, dtype=x_star.dtype, device=x_star.device).reshape(x_star.shape)
    return Jx0.rmv(y_t), info


def unrolled_input_jvp(f: Callable, e: torch.Tensor, x0: torch.Tensor, u: torch.Tensor, Ts: Sequence[int], *,
                       e_tangent: Optional[torch.Tensor] = None) -> dict:
    """dx_T/dx0 · u along x_{t+1} = f(x_t, x0) from e at one sample, forward mode: {T: (x_T, dx_T/dx0 · u)}."""
    Ts = sorted(set(int(t) for t in Ts))
    x = e.detach().unsqueeze(0)
    dx = torch.zeros_like(x) if e_tangent is None else e_tangent.detach().unsqueeze(0).to(x.dtype)
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
    """vᵀ dx_T/dx0 by backpropagation through T unrolled iterations at one sample (e = x0 with ``e_from_x0``)."""
    X0 = x0.detach().unsqueeze(0).clone().requires_grad_(True)
    with torch.enable_grad():
        x = X0 if e_from_x0 else e.detach().unsqueeze(0)
        for _ in range(T):
            x = f(x, X0)
        (grad,) = torch.autograd.grad(x, X0, grad_outputs=v.detach().unsqueeze(0).to(x.dtype))
    return grad[0]


def prop5_check(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, e: torch.Tensor, Ts: Sequence[int], *,
                u: Optional[torch.Tensor] = None, e_tangent: Optional[torch.Tensor] = None, tol: float = 1e-10,
                seed: int = 0) -> Prop5Check:
    """Prop. 5 at one sample: the implicit w by scipy's GMRES against the unrolled dx_T/dx0 · u (u: the seeded unit
    direction the package's batched check draws)."""
    if u is None:
        u = torch.randn(x0.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(x0)
        u = u / u.norm()
    w, info = implicit_input_jvp(f, x_star, x0, u, tol=tol)
    unrolled = unrolled_input_jvp(f, e, x0, u, Ts, e_tangent=e_tangent)
    wn, scale = float(w.norm()), float(x_star.abs().max())
    Ts = sorted(unrolled)
    return Prop5Check(T=Ts, rel_error=[float((unrolled[t][1] - w).norm()) / max(wn, 1e-300) for t in Ts],
                      gmres_residual=info.residual, gmres_iterations=info.iterations, gmres_tol=tol,
                      fixed_point_distance=[float((unrolled[t][0] - x_star).abs().max()) / max(scale, 1e-300)
                                            for t in Ts])


def input_dependence_frobenius(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, *, probes: int = 8,
                               tol: float = 1e-8, seed: int = 0) -> FrobeniusEstimate:
    """‖dx*/dx0‖_F at one sample by Hutchinson's estimator, each probe's w by scipy's GMRES (the package's batched
    estimate draws the same probes)."""
    gen = torch.Generator().manual_seed(seed)
    sq, res = [], 0.0
    for _ in range(probes):
        u = torch.randn(x0.shape, generator=gen, dtype=torch.float64).to(x0)
        w, info = implicit_input_jvp(f, x_star, x0, u, tol=tol)
        sq.append(float(w.double().pow(2).sum()))
        res = max(res, info.residual)
    sq = np.asarray(sq)
    value = float(np.sqrt(sq.mean()))
    se_sq = float(sq.std(ddof=1) / np.sqrt(len(sq))) if len(sq) > 1 else float("nan")
    return FrobeniusEstimate(value=value, stderr=se_sq / (2 * value) if value > 0 else 0.0, probes=probes,
                             gmres_residual_max=res)
