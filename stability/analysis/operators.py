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

from stability.errors import ConfigError
from stability.linalg import BatchedJacobian  # noqa: F401  (the batched products live in the numerics layer)

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
            raise ConfigError("wrt must be 'x' or 'x0'")
        if mode not in ("jvp", "vjp"):
            raise ConfigError("mode must be 'jvp' or 'vjp'")
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


#: memory budget of one chunk of :func:`batched_dense_jacobian` (bytes)
DENSE_BUDGET = 256 * 2 ** 20
#: bytes a chunk costs per (sample, column, state entry), the dense rows included: the vmapped backward pass keeps
#: a few state-sized intermediates per cotangent (attention, MLP hidden); measured on the demo model
DENSE_BYTES_PER_ENTRY = 8 * 24


def dense_chunk(B: int, n: int, budget: int = DENSE_BUDGET) -> int:
    """Columns per chunk of :func:`batched_dense_jacobian` so that one chunk stays within ``budget`` bytes."""
    return int(max(1, min(n, budget // max(1, B * n * DENSE_BYTES_PER_ENTRY))))


def _rows_by_reverse_mode(f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor], c: int) -> torch.Tensor:
    """J (B, n, n) row by row: one forward pass, then per chunk of c rows one vmapped backward pass (cotangent j
    is e_{i+j} in every sample: e_jᵀ J_b = (J_bᵀ e_j)ᵀ). The route for maps without forward-mode AD."""
    B, S = x.shape[0], tuple(x.shape[1:])
    n = math.prod(S)
    _, vjp_fn = torch.func.vjp(lambda p: f(p, x0), x)
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


def _jvps(f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor], T: torch.Tensor, c: int) -> torch.Tensor:
    """(J_b t_jb) for a stack T (k, B, *S) of tangents, c at a time through one vmapped forward-mode product; for
    a linear map (``x`` None) the map itself, vmapped."""
    if x is None:
        cols = torch.func.vmap(lambda t: f(t, None))
    else:
        cols = torch.func.vmap(lambda t: torch.func.jvp(lambda p: f(p, x0), (x,), (t,))[1])
    return torch.cat([cols(T[i:i + c]) for i in range(0, T.shape[0], c)])


def position_pattern(f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor], c: int,
                     linear: bool = False) -> torch.Tensor:
    """Which output positions each input position reaches, (P, P) bool, over the batch: a state (B, *pos, d)
    has P = prod(pos) positions of d features. One forward-mode product per position with a Gaussian tangent on
    that position only; an output position counts as reached where any sample's product is nonzero there (a
    structural zero: local attention, per-token MLPs and norms). Exact zeros of a reached position have
    probability zero; :func:`batched_dense_jacobian` certifies the result anyway."""
    B, S = x.shape[0], tuple(x.shape[1:])
    P, d = math.prod(S[:-1]), S[-1]
    g = torch.Generator(device="cpu").manual_seed(0)
    T = torch.zeros(P, B, P, d, dtype=x.dtype, device=x.device)
    T[torch.arange(P), :, torch.arange(P), :] = torch.randn(P, B, d, generator=g, dtype=x.dtype).to(x.device)
    Y = _jvps(f, None if linear else x, x0, T.reshape(P, B, *S), c).reshape(P, B, P, d)
    return (Y != 0).any(dim=3).any(dim=1)


def colour_positions(pattern: torch.Tensor) -> list:
    """Greedy colouring of the input positions: two positions share a colour only if no output position is
    reached by both (Curtis, Powell & Reid, 1974), so one product per colour and feature recovers their columns.
    ``pattern``: (P, P) bool, :func:`position_pattern`'s reach; returns one list of positions per colour."""
    reach = pattern.cpu()
    colours: list = []  # list of (members, union of their reached outputs)
    for p in range(reach.shape[0]):
        for members, seen in colours:
            if not (seen & reach[p]).any():
                members.append(p)
                seen |= reach[p]
                break
        else:
            colours.append(([p], reach[p].clone()))
    return [members for members, _ in colours]


def _columns_compressed(f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor], c: int,
                        linear: bool) -> Optional[torch.Tensor]:
    """J (B, n, n) from one forward-mode product per (colour, feature) of the position colouring
    (:func:`colour_positions`), or None where colouring would not save products (every position reaches every
    other: full attention)."""
    B, S = x.shape[0], tuple(x.shape[1:])
    P, d = math.prod(S[:-1]), S[-1]
    pattern = position_pattern(f, x, x0, c, linear)
    colours = colour_positions(pattern)
    if len(colours) * d + P >= P * d:
        return None
    C = len(colours)
    T = torch.zeros(C, d, B, P, d, dtype=x.dtype, device=x.device)
    colour_of = torch.empty(P, dtype=torch.long)
    for k, members in enumerate(colours):
        colour_of[members] = k
        idx = torch.tensor(members)
        for a in range(d):
            T[k, a, :, idx, a] = 1.0
    Y = _jvps(f, None if linear else x, x0, T.reshape(C * d, B, *S), c).reshape(C, d, B, P, d)
    # column (p, a) of J_b is Y[colour(p), a, b] on the output positions p reaches, zero elsewhere
    cols = Y[colour_of.to(x.device)] * pattern.to(Y.dtype)[:, None, None, :, None]  # (P, d_in, B, P_out, d_out)
    return cols.permute(2, 3, 4, 0, 1).reshape(B, P * d, P * d)


def _certified(f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor], J: torch.Tensor, linear: bool) -> bool:
    """J_b v_b against a forward-mode product for one Gaussian v per sample: a missed entry shows at the size of
    that entry (it is a sum over every column), rounding at the dtype's precision."""
    B = x.shape[0]
    g = torch.Generator(device="cpu").manual_seed(1)
    v = torch.randn(x.shape, generator=g, dtype=x.dtype).to(x.device)
    ref = (f(v, None) if linear else torch.func.jvp(lambda p: f(p, x0), (x,), (v,))[1]).reshape(B, -1)
    got = torch.bmm(J, v.reshape(B, -1, 1)).squeeze(-1)
    tol = 1e3 * torch.finfo(x.dtype).eps * math.sqrt(J.shape[-1])
    return bool(((got - ref).norm(dim=1) <= tol * ref.norm(dim=1).clamp_min(torch.finfo(x.dtype).tiny)).all())


def batched_dense_jacobian(f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor], *,
                           budget: int = DENSE_BUDGET, chunk: Optional[int] = None,
                           route: str = "auto", linear: bool = False) -> torch.Tensor:
    """Every sample's dense J_b = ∂f/∂x (x_b, x0_b), (B, n, n) with n = prod(S), for small states.

    Columns by forward-mode products (``torch.func.vmap`` of ``torch.func.jvp``, c tangents per pass, c from a
    memory budget: :func:`dense_chunk`). A state (B, *pos, d) whose positions reach only some others (local
    attention) is compressed: positions that reach disjoint outputs share one product per feature
    (:func:`position_pattern`, :func:`colour_positions`; 5 colours instead of 16 positions for a window of 5), and
    the result is certified by one extra product (J_b v_b against the map's own jvp; the full set of columns is taken
    where it fails). Maps without forward-mode AD take the rows by reverse mode. Relies on the samples of f being
    independent, as ``step`` guarantees (tested). Exact to rounding: the entries are the same products autograd's
    ``jacfwd`` / ``jacrev`` take. ``route``: auto, columns (no compression) or rows, for tests and benchmarks.
    ``linear``: f(·, x0) is linear (x only gives the shape): its columns are f applied to the basis, no jvp.
    """
    x = x.detach()
    x0 = None if x0 is None else x0.detach()
    B, S = x.shape[0], tuple(x.shape[1:])
    n = math.prod(S)
    c = chunk or dense_chunk(B, n, budget)
    if route == "rows":
        return _rows_by_reverse_mode(f, x, x0, c)
    try:
        if route == "auto" and len(S) >= 2:
            J = _columns_compressed(f, x, x0, c, linear)
            if J is not None and _certified(f, x, x0, J, linear):
                return J
        E = torch.zeros(n, B, n, dtype=x.dtype, device=x.device)
        E[torch.arange(n), :, torch.arange(n)] = 1.0
        return _jvps(f, None if linear else x, x0, E.reshape(n, B, *S), c).reshape(n, B, n).permute(1, 2, 0).contiguous()
    except (RuntimeError, NotImplementedError):  # no forward-mode rule for an operation (fused attention)
        if route != "auto":
            raise
        return _rows_by_reverse_mode(f, x, x0, c)
