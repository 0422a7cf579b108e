"""The loop map's Jacobians at a batch of points, the one operator type of the package: :class:`Linearisation`.

J_b = ∂f/∂x (x_b, x0_b) (Props. 1–5) and K_b = ∂f/∂x0 (Prop. 5) of every sample b at once, for a map
f(x, x0): (B, *S) → (B, *S) whose samples are independent (``step`` guarantees it; tested): matrix-free products
J·v and Jᵀ·v (and K·w, Kᵀ·u), and every sample's dense n × n matrix when the state is small
(:meth:`Linearisation.dense`, by :func:`batched_dense_jacobian`). ρ(J), σ_max(J) (:mod:`stability.numerics.spectra`)
and the (I − J) solves (:mod:`stability.numerics.gmres`) take their products from it.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from stability.errors import ConfigError


class Linearisation:
    """J_b = ∂f/∂x at every sample's (x_b, x0_b), and K_b = ∂f/∂x0 with ``inputs=True``.

    Products, each on the whole batch (B, *S), sample b by its own matrix:

    * ``JT(U)`` = (J_bᵀ U_b)_b (and ``KT(U)``) by one vjp whose forward pass is taken once, on first use, and
      reused by every later call (with ``inputs=True`` the vjp is taken in x and x0 together);
    * ``J(V)`` = (J_b V_b)_b as the transpose of that cached vjp map (u ↦ Jᵀu is linear, so its own vjp is
      v ↦ Jv): forward-mode numbers without a new forward pass, on the CPU several times cheaper than a jvp;
      ``K(W)`` and ``JK(V, W)`` = J V + K W likewise;
    * ``jvp(V)``: J V by forward mode (``torch.func.jvp``), the forward pass recomputed each call;
    * ``dense()``: every sample's matrix J_b, (B, n, n) with n = prod(S), for small states.

    ``restrict(index)``: the same Jacobians for the samples ``index`` only (a new forward pass on those).
    ``linear=True``: f(·, x0) is itself linear, so J = f: ``J`` and ``jvp`` are f, ``JT`` its vjp at x (x only
    gives the shape, e.g. zeros), ``dense`` f on the basis vectors; a linear map cannot be restricted (f may
    close over the batch). Nothing is computed before the first product.
    """

    def __init__(self, f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor] = None, *, inputs: bool = False,
                 linear: bool = False):
        if inputs and x0 is None:
            raise ConfigError("K = ∂f/∂x0 needs x0")
        self.f, self.x, self.x0 = f, x.detach(), None if x0 is None else x0.detach()
        self.inputs, self.linear = inputs, linear
        self._out = self._vjp = self._tJ = self._tJK = None

    @property
    def shape(self) -> tuple:
        """(B, *S): the batch of states the matrices act on."""
        return tuple(self.x.shape)

    def _pullback(self):
        if self._vjp is None:  # the forward pass of the vjp, taken once and kept
            if self.inputs:
                self._out, self._vjp = torch.func.vjp(self.f, self.x, self.x0)
            else:
                self._out, self._vjp = torch.func.vjp(lambda p: self.f(p, self.x0), self.x)
        return self._vjp

    def JT(self, U: torch.Tensor) -> torch.Tensor:
        """(J_bᵀ U_b)_b by the cached vjp."""
        return self._pullback()(U.to(self.x.dtype))[0]

    def KT(self, U: torch.Tensor) -> torch.Tensor:
        """(K_bᵀ U_b)_b by the cached vjp (``inputs=True``)."""
        self._need_inputs()
        return self._pullback()(U.to(self.x.dtype))[1]

    def J(self, V: torch.Tensor) -> torch.Tensor:
        """(J_b V_b)_b as the transpose of the cached vjp map (f itself for a linear map)."""
        if self.linear:
            return self.f(V, self.x0)
        if self._tJ is None:
            vjp_fn = self._pullback()
            _, self._tJ = torch.func.vjp(lambda u: vjp_fn(u)[0], torch.zeros_like(self._out))
        return self._tJ(V.to(self.x.dtype))[0]

    def JK(self, V: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        """(J_b V_b + K_b W_b)_b as the transpose of the cached vjp map (``inputs=True``)."""
        self._need_inputs()
        if self._tJK is None:
            vjp_fn = self._pullback()
            _, self._tJK = torch.func.vjp(lambda u: vjp_fn(u), torch.zeros_like(self._out))
        return self._tJK((V.to(self.x.dtype), W.to(self.x0.dtype)))[0]

    def K(self, W: torch.Tensor) -> torch.Tensor:
        """(K_b W_b)_b (``inputs=True``)."""
        return self.JK(torch.zeros_like(self.x), W)

    def jvp(self, V: torch.Tensor) -> torch.Tensor:
        """(J_b V_b)_b by forward mode: one jvp of f on the batch (f itself for a linear map)."""
        if self.linear:
            return self.f(V, self.x0)
        return torch.func.jvp(lambda p: self.f(p, self.x0), (self.x,), (V.to(self.x.dtype),))[1]

    def restrict(self, index: torch.Tensor) -> "Linearisation":
        """The same Jacobians for the samples ``index`` only (a new forward pass on those)."""
        if self.linear:
            raise ConfigError("a linear map given as a function cannot be restricted to some of its samples")
        return Linearisation(self.f, self.x[index], None if self.x0 is None else self.x0[index], inputs=self.inputs)

    def dense(self, *, chunk: Optional[int] = None, budget: Optional[int] = None, route: str = "auto"
              ) -> torch.Tensor:
        """Every sample's dense J_b, (B, n, n): :func:`batched_dense_jacobian`."""
        return batched_dense_jacobian(self.f, self.x, self.x0, chunk=chunk, route=route, linear=self.linear,
                                      budget=DENSE_BUDGET if budget is None else budget)

    def _need_inputs(self):
        if not self.inputs:
            raise ConfigError("K = ∂f/∂x0: build the Linearisation with inputs=True")


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
