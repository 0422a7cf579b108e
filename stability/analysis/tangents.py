"""The unrolled iteration x_{t+1} = f(x_t, x0) from e with its tangents dx_T/dx0 · u (Prop. 5) and dx_T/de · u_e
(App. A.8) at the T of a grid, both in one pass, on a batch of independent samples (``step`` keeps samples
independent): :func:`unroll_tangents_batched`. Once a sample has reached x*, its remaining steps use the
linearisation there (:class:`~stability.numerics.jacobian.Linearisation`). :mod:`stability.analysis.prop5`,
:mod:`stability.analysis.input_dependence` and :mod:`stability.analysis.initial_iterate` are built on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from stability.errors import ConfigError
from stability.numerics import Linearisation


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
    lin = Linearisation(f, x, X0, inputs=True)
    c = lin.K(U)
    n, R = x[0].numel(), x.shape[0]
    if n > dense_max:
        return lambda d: lin.J(d) + c
    eye = torch.eye(n, dtype=x.dtype, device=x.device).reshape(n, *x.shape[1:])
    cols = Linearisation(f, x.repeat_interleave(n, 0), X0.repeat_interleave(n, 0), inputs=True).J(
        eye.repeat(R, *([1] * (x.dim() - 1))))
    D = cols.reshape(R, n, n).transpose(1, 2).contiguous()  # D[r] = J at row r's point

    def affine(d: torch.Tensor) -> torch.Tensor:
        return torch.bmm(D, d.reshape(R, n, 1)).reshape(d.shape) + c

    return affine


def seeded_direction(shape, seed: int, like: torch.Tensor, B: int) -> torch.Tensor:
    """One seeded unit direction of one sample's shape (``torch.randn`` from ``Generator().manual_seed(seed)``,
    normalised), repeated for the B samples of a batch (the tests' per-sample references draw the same)."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(tuple(shape), generator=gen, dtype=torch.float64).to(like)
    u = u / u.norm()
    return u.unsqueeze(0).expand(B, *u.shape).contiguous()
