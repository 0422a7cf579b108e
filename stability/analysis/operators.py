"""The Jacobians of the loop map at a point, as matrix-free linear operators (one sample at a time).

J = ∂f/∂x (x*, x0) (Props. 1–5) and ∂f/∂x0 (Prop. 5) act on one sample's state flattened to a vector of length
n = prod(S). ``matvec`` is a forward-mode product (``torch.func.jvp``); ``rmatvec`` is a reverse-mode product
whose forward pass is computed once, on first use, and reused by every later call (``torch.func.vjp``); with
``mode="vjp"`` matvec is the transpose of that cached vjp map instead (same numbers, one forward pass for all
products: on the CPU several times cheaper than a jvp, whose forward-mode kernels are slow). Both are exposed
as a :class:`scipy.sparse.linalg.LinearOperator`, so ARPACK, GMRES and SVDS take them directly;
``dense()`` builds the n × n matrix for small states by pushing the identity's columns through the batch
dimension of f (which ``step`` keeps independent per sample), in chunks.

:class:`BatchedJacobian` is the batched counterpart used on the GPU, where scipy cannot batch: one jvp of f on
the whole batch gives every sample's J_b v_b at once, one vjp every J_bᵀ u_b.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np
import torch
from scipy.sparse.linalg import LinearOperator

_TORCH_TO_NP = {torch.float64: np.float64, torch.float32: np.float32}


class TorchLinearOperator(LinearOperator):
    """A linear map on one sample's state given by a batched torch function.

    ``apply(V)`` maps k vectors shaped like the state, V: (k, *S_in), to (k, *S_out). ``rapply`` is the
    transpose (optional; when absent it is derived once by a vjp of the linear map ``apply``).
    """

    def __init__(self, apply: Callable[[torch.Tensor], torch.Tensor], in_shape: tuple, out_shape: tuple,
                 dtype: torch.dtype, device, rapply: Optional[Callable] = None):
        self.apply = apply
        self.in_shape, self.out_shape = tuple(in_shape), tuple(out_shape)
        self.torch_dtype, self.device = dtype, device
        self._rapply = rapply
        super().__init__(dtype=np.dtype(_TORCH_TO_NP.get(dtype, np.float64)),
                         shape=(math.prod(self.out_shape), math.prod(self.in_shape)))

    # ---- torch side ---------------------------------------------------------------------------
    def mv(self, v: torch.Tensor) -> torch.Tensor:
        """J v for one vector shaped like the input state."""
        return self.apply(v.reshape(1, *self.in_shape))[0]

    def rmv(self, u: torch.Tensor) -> torch.Tensor:
        """Jᵀ u for one vector shaped like the output state."""
        if self._rapply is None:
            zero = torch.zeros(1, *self.in_shape, dtype=self.torch_dtype, device=self.device)
            _, vjp_fn = torch.func.vjp(self.apply, zero)  # the map is linear: its vjp at 0 is its transpose
            self._rapply = lambda U: vjp_fn(U)[0]
        return self._rapply(u.reshape(1, *self.out_shape))[0]

    def dense(self, chunk: int = 256) -> torch.Tensor:
        """The matrix (n_out, n_in), column blocks of the identity pushed through ``apply``."""
        n_in = self.shape[1]
        cols = []
        eye = torch.eye(n_in, dtype=self.torch_dtype, device=self.device)
        for i in range(0, n_in, chunk):
            block = eye[i:i + chunk].reshape(-1, *self.in_shape)
            cols.append(getattr(self, "apply_jvp", self.apply)(block).reshape(block.shape[0], -1))
        return torch.cat(cols).T

    # ---- scipy side ---------------------------------------------------------------------------
    def _to_torch(self, v: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(v), dtype=self.torch_dtype, device=self.device)

    def _np(self, fn, v: np.ndarray, shape_in) -> np.ndarray:
        v = np.asarray(v).reshape(-1)
        if np.iscomplexobj(v):  # the operator is real: act on the real and imaginary parts
            return self._np(fn, v.real, shape_in) + 1j * self._np(fn, v.imag, shape_in)
        out = fn(self._to_torch(v).reshape(shape_in))
        return out.detach().reshape(-1).cpu().numpy().astype(self.dtype, copy=False)

    def _matvec(self, v):
        return self._np(self.mv, v, self.in_shape)

    def _rmatvec(self, u):
        return self._np(self.rmv, u, self.out_shape)

    def _matmat(self, V):
        V = np.asarray(V)
        if np.iscomplexobj(V):
            return self._matmat(V.real) + 1j * self._matmat(V.imag)
        T = self._to_torch(V.T).reshape(V.shape[1], *self.in_shape)
        return self.apply(T).reshape(V.shape[1], -1).T.detach().cpu().numpy()


class JacobianOperator(TorchLinearOperator):
    """J = ∂f/∂x (``wrt="x"``) or ∂f/∂x0 (``wrt="x0"``) of ``f(x, x0)`` at one sample's (x, x0).

    x: (*S) and x0: (*S0), without the batch dimension. ``rmatvec`` is a vjp whose forward pass is taken once
    (on first use) and reused. ``matvec`` is a jvp (``mode="jvp"``, the forward pass recomputed each time, as
    forward mode requires) or, with ``mode="vjp"``, the transpose of that cached vjp map (u ↦ Jᵀu is linear, so
    its own vjp is v ↦ Jv): the same numbers, reusing the one forward pass; on the CPU it costs about one
    backward pass against a jvp's several (see benchmarks/results-analysis.md).
    """

    def __init__(self, f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor], *, wrt: str = "x",
                 mode: str = "jvp"):
        if wrt not in ("x", "x0"):
            raise ValueError("wrt must be 'x' or 'x0'")
        if mode not in ("jvp", "vjp"):
            raise ValueError("mode must be 'jvp' or 'vjp'")
        self.f, self.x, self.x0, self.wrt = f, x.detach(), None if x0 is None else x0.detach(), wrt
        point = self.x if wrt == "x" else self.x0
        self.point, self.mode = point, mode

        def fn_batched(p: torch.Tensor) -> torch.Tensor:
            k = p.shape[0]
            xs = p if wrt == "x" else self.x.expand(k, *self.x.shape)
            x0s = None if self.x0 is None else (p if wrt == "x0" else self.x0.expand(k, *self.x0.shape))
            return f(xs, x0s)

        self._fn = fn_batched
        self._vjp_fn = None
        self._vjp_T = None

        def apply_jvp(V: torch.Tensor) -> torch.Tensor:
            P = point.unsqueeze(0) if V.shape[0] == 1 else point.expand(V.shape[0], *point.shape).contiguous()
            return torch.func.jvp(fn_batched, (P,), (V.to(point.dtype),))[1]

        self.apply_jvp = apply_jvp
        apply = apply_jvp if mode == "jvp" else self._apply_vjp_transpose
        super().__init__(apply, point.shape, x.shape, point.dtype, point.device, rapply=self._rapply_once)

    def _vjp(self):
        if self._vjp_fn is None:  # the forward pass of the vjp, computed once and kept
            _, self._vjp_fn = torch.func.vjp(self._fn, self.point.unsqueeze(0))
        return self._vjp_fn

    def _rapply_once(self, U: torch.Tensor) -> torch.Tensor:
        vjp_fn = self._vjp()
        return torch.cat([vjp_fn(U[i:i + 1].to(self.point.dtype))[0] for i in range(U.shape[0])])

    def _apply_vjp_transpose(self, V: torch.Tensor) -> torch.Tensor:
        if self._vjp_T is None:
            vjp_fn = self._vjp()
            zero = torch.zeros(1, *self.out_shape, dtype=self.point.dtype, device=self.point.device)
            _, self._vjp_T = torch.func.vjp(lambda u: vjp_fn(u)[0], zero)
        return torch.cat([self._vjp_T(V[i:i + 1].to(self.point.dtype))[0] for i in range(V.shape[0])])

    def value(self) -> torch.Tensor:
        """f(x, x0) at the operator's point, (*S)."""
        with torch.no_grad():
            return self._fn(self.point.unsqueeze(0))[0]


class BatchedJacobian:
    """Every sample's J_b = ∂f/∂x (x_b, x0_b) at once: ``apply(V)`` (B, *S) → (J_b V_b)_b, ``rapply`` the
    transposes. Relies on the samples of f being independent, as ``step`` guarantees; the vjp's forward
    pass is computed once and reused."""

    def __init__(self, f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor]):
        self.f, self.x, self.x0 = f, x.detach(), None if x0 is None else x0.detach()
        self._vjp_fn = None
        self._vjp_T = None

    def apply(self, V: torch.Tensor) -> torch.Tensor:
        """(J_b V_b)_b by one jvp of f on the batch."""
        return torch.func.jvp(lambda p: self.f(p, self.x0), (self.x,), (V.to(self.x.dtype),))[1]

    def rapply(self, U: torch.Tensor) -> torch.Tensor:
        """(J_bᵀ U_b)_b by the vjp, whose forward pass is taken once."""
        if self._vjp_fn is None:
            _, self._vjp_fn = torch.func.vjp(lambda p: self.f(p, self.x0), self.x)
        return self._vjp_fn(U.to(self.x.dtype))[0]

    def restrict(self, index: torch.Tensor) -> "BatchedJacobian":
        """The same Jacobians for the samples ``index`` only (a new forward pass on those samples)."""
        return BatchedJacobian(self.f, self.x[index], None if self.x0 is None else self.x0[index])

    def apply_reuse(self, V: torch.Tensor) -> torch.Tensor:
        """(J_b V_b)_b as the transpose of the cached vjp map (same numbers as :meth:`apply`, no new forward)."""
        if self._vjp_T is None:
            self.rapply(torch.zeros_like(self.x))
            vjp_fn = self._vjp_fn
            _, self._vjp_T = torch.func.vjp(lambda u: vjp_fn(u)[0], torch.zeros_like(self.x))
        return self._vjp_T(V.to(self.x.dtype))[0]


#: memory budget of one chunk of :func:`batched_dense_jacobian` (bytes)
DENSE_BUDGET = 256 * 2 ** 20
#: bytes a chunk costs per (sample, column, state entry), the dense rows included: the vmapped backward pass keeps
#: a few state-sized intermediates per cotangent (attention, MLP hidden); measured on the demo model
DENSE_BYTES_PER_ENTRY = 8 * 24


def dense_chunk(B: int, n: int, budget: int = DENSE_BUDGET) -> int:
    """Columns per chunk of :func:`batched_dense_jacobian` so that one chunk stays within ``budget`` bytes."""
    return int(max(1, min(n, budget // max(1, B * n * DENSE_BYTES_PER_ENTRY))))


def batched_dense_jacobian(f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor], *,
                           budget: int = DENSE_BUDGET, chunk: Optional[int] = None) -> torch.Tensor:
    """Every sample's dense J_b = ∂f/∂x (x_b, x0_b), (B, n, n) with n = prod(S), for small states.

    One forward pass of ``torch.func.vjp`` on the whole batch; then, per chunk of c rows, ONE batched backward pass
    over c stacked cotangents (``torch.func.vmap`` of the vjp map; cotangent j is e_{i+j} in every sample), which
    gives rows i..i+c of every J_b (e_jᵀ J_b = (J_bᵀ e_j)ᵀ). The chunk is chosen from a memory budget
    (:func:`dense_chunk`). Relies on the samples of f being independent, as ``step`` guarantees (tested). Exact
    to rounding: these are the same reverse-mode products autograd's ``jacrev`` takes.
    """
    x = x.detach()
    B, S = x.shape[0], tuple(x.shape[1:])
    n = math.prod(S)
    c = chunk or dense_chunk(B, n, budget)
    _, vjp_fn = torch.func.vjp(lambda p: f(p, None if x0 is None else x0.detach()), x)
    rows = torch.func.vmap(lambda U: vjp_fn(U)[0])
    J = torch.empty(B, n, n, dtype=x.dtype, device=x.device)
    for i in range(0, n, c):
        k = min(c, n - i)
        U = torch.zeros(k, B, n, dtype=x.dtype, device=x.device)
        U[torch.arange(k), :, torch.arange(i, i + k)] = 1.0
        try:
            R = rows(U.reshape(k, B, *S))
        except RuntimeError:  # an operation vmap cannot batch: the same rows one backward pass at a time
            R = torch.stack([vjp_fn(U[j].reshape(B, *S))[0] for j in range(k)])
        J[:, i:i + k, :] = R.reshape(k, B, n).transpose(0, 1)
    return J
