"""Solves with I − J on a batch of independent linear operators J_b: restarted GMRES and the Neumann series.

The implicit derivatives of the fixed point all reduce to this one system: dx*/dx0 · u = (I − J)⁻¹ (∂f/∂x0) u
(Prop. 5, App. A.6), and the implicit-function gradient of a loss through x* solves the transposed system
(I − J)ᵀ y = ∂ℓ/∂x* (implicit training, docs/methods.md). :func:`solve_I_minus_J` takes the map ``apply_J`` as a
function on batched tensors (B, *S) → (B, *S) whose samples are independent (``step`` guarantees it; pass a
transposed product, u ↦ J_bᵀ u_b, to solve the transposed system), and returns per sample the solution, the
relative residual ‖b − (I − J) w‖ / ‖b‖ recomputed from the returned w by one more product, and the number of
products spent. It is the package's one (I − J) solver: the analysis (Prop. 5, ‖dx*/dx0‖_F), the training monitor
and implicit training call it.

Two methods:

* ``"gmres"``: restarted GMRES(m) (Saad & Schultz), its Krylov basis by classical Gram–Schmidt applied twice, Givens
  rotations per sample; the restart cycle ends for a sample when its GMRES residual estimate reaches ``tol``
  (its later basis vectors are zero and ignored), and the true residual is recomputed at the end of every cycle.
  A sample leaves the solve when that true residual is ≤ ``tol``, when a whole cycle did not lower it (restarted
  GMRES from the same point would repeat the cycle exactly), or when its product budget ``max_iter`` is spent.
* ``"neumann"``: the fixed-point iteration w ← b + J w (the Neumann series Σ Jᵏ b), converging at the rate ρ(J)
  when ρ(J) < 1; its step w_{k+1} − w_k is exactly the residual of w_k, so no extra product is needed. It stops
  per sample at ``tol``, when the residual is not finite or grew 1e8-fold (ρ(J) > 1), or at ``max_iter``.

A sample that does not converge keeps its best iterate and its (large) residual: callers decide what a residual
above ``tol`` means; nothing here raises on it. scipy's GMRES, one sample at a time, is the independent reference
the tests hold this one to (tests/reference_numerics.py).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import torch

from stability.errors import ConfigError

METHODS = ("gmres", "neumann")


class IJSolve(NamedTuple):
    """What :func:`solve_I_minus_J` returns (unpacks as ``x, residual, iterations``)."""

    x: torch.Tensor  # (B, *S): the solution w of (I − J_b) w_b = b_b
    residual: torch.Tensor  # (B,) float64: ‖b − (I − J) x‖ / ‖b‖, recomputed from x (0 where b = 0)
    iterations: torch.Tensor  # (B,) int64: products with J spent on the sample (the residual check included)


def solve_I_minus_J(apply_J: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor, *, method: str = "gmres",
                    tol: float = 1e-10, max_iter: Optional[int] = None, restart: int = 60,
                    x_init: Optional[torch.Tensor] = None, check_every: int = 1) -> IJSolve:
    """Solve (I − J_b) x_b = b_b for every sample b of the batch, by GMRES(``restart``) or the Neumann series.

    apply_J: (B, *S) → (B, *S), V ↦ (J_b V_b)_b, samples independent (each row of the output depends on the same
    row of the input only). b: (B, *S). tol: relative residual per sample. max_iter: products with J per sample
    (the residual checks included; default 20·n, n = prod(S), for GMRES; 20·n or 10,000, whichever is smaller, for
    Neumann). x_init: a first guess (default 0). check_every: GMRES's Krylov steps between the host's checks
    whether any sample is still stepping (each a sync with the device; a step after every sample stopped is a
    masked no-op, so the result is the same bits for any value, at up to ``check_every`` − 1 wasted products a
    cycle). Returns :class:`IJSolve`; residuals above ``tol`` mark samples
    that did not converge. The solve records no autograd graph (products with a model whose parameters require
    grad included): its result is a number, not a function to differentiate.
    """
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; allowed: {', '.join(METHODS)}")
    if not (tol > 0 and math.isfinite(tol)):
        raise ConfigError(f"tol must be a positive finite number, got {tol!r}")
    shape = b.shape
    B, n = shape[0], math.prod(shape[1:])
    bf = b.reshape(B, n)

    def A(v: torch.Tensor) -> torch.Tensor:  # (I − J) on flattened rows
        return v - apply_J(v.reshape(shape)).reshape(B, n).to(v.dtype)

    with torch.no_grad():
        bf = bf.detach()
        bnorm = torch.linalg.vector_norm(bf, dim=1).double()
        x = torch.zeros_like(bf) if x_init is None else x_init.reshape(B, n).to(bf).clone()
        if method == "gmres":
            budget = max_iter if max_iter is not None else max(restart, 20 * n)
            x, res, its = _gmres(A, bf, bnorm, x, x_init is not None, tol, budget, max(1, min(restart, n)),
                                 max(1, int(check_every)))
        else:
            budget = max_iter if max_iter is not None else min(20 * n, 10_000)
            x, res, its = _neumann(A, bf, bnorm, x, x_init is not None, tol, budget)
    return IJSolve(x.reshape(shape), res, its)


def relative_residual(apply_J: Callable, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """‖b − (I − J) x‖ / ‖b‖ per sample (0 where b = 0 and x solves it), one product with J; (B,) float64."""
    B = b.shape[0]
    r = (b - x + apply_J(x).to(x.dtype)).reshape(B, -1)
    bn = torch.linalg.vector_norm(b.reshape(B, -1), dim=1).double()
    rn = torch.linalg.vector_norm(r, dim=1).double()
    return torch.where(bn > 0, rn / bn.clamp_min(torch.finfo(torch.float64).tiny), rn)


def _rel(rn: torch.Tensor, bnorm: torch.Tensor) -> torch.Tensor:
    return torch.where(bnorm > 0, rn.double() / bnorm.clamp_min(torch.finfo(torch.float64).tiny), rn.double())


def _gmres(A, b, bnorm, x, have_guess, tol, budget, m, check_every=1):
    B, n = b.shape
    dev, dt = b.device, b.dtype
    its = torch.zeros(B, dtype=torch.int64, device=dev)
    r = b - A(x) if have_guess else b.clone()
    if have_guess:
        its += 1
    res = _rel(torch.linalg.vector_norm(r, dim=1), bnorm)
    active = (res > tol) & torch.isfinite(res)
    eps = torch.finfo(dt).eps
    V = torch.zeros(B, m + 1, n, dtype=dt, device=dev)  # the Krylov basis, sample-major for bmm
    while True:
        active = active & (its < budget - 1)  # room for one Krylov step and the residual check
        if not bool(active.any()):
            break
        beta = torch.linalg.vector_norm(r, dim=1)
        V.zero_()
        V[:, 0] = torch.where(active[:, None], r / beta.clamp_min(torch.finfo(dt).tiny)[:, None], 0)
        H = torch.zeros(B, m + 1, m, dtype=dt, device=dev)
        cs = torch.zeros(B, m, dtype=dt, device=dev)
        sn = torch.zeros(B, m, dtype=dt, device=dev)
        g = torch.zeros(B, m + 1, dtype=dt, device=dev)
        g[:, 0] = torch.where(active, beta, 0)
        k_used = torch.zeros(B, dtype=torch.int64, device=dev)
        live = active.clone()
        for j in range(m):
            # a step with no live sample changes nothing (every write is masked by live): checked every k steps
            if j % check_every == 0 and not bool(live.any()):
                break
            w = A(V[:, j])
            its += live.long()
            Vj = V[:, :j + 1]  # (B, j + 1, n)
            h = torch.bmm(Vj, w[:, :, None])[:, :, 0]
            w = w - torch.bmm(h[:, None, :], Vj)[:, 0]
            h2 = torch.bmm(Vj, w[:, :, None])[:, :, 0]  # second Gram–Schmidt pass
            w = w - torch.bmm(h2[:, None, :], Vj)[:, 0]
            h = h + h2
            hn = torch.linalg.vector_norm(w, dim=1)
            col = torch.cat([h, hn[:, None]], 1)  # (B, j + 2)
            for i in range(j):  # previous rotations
                a, c = col[:, i], col[:, i + 1]
                a, c = cs[:, i] * a + sn[:, i] * c, -sn[:, i] * a + cs[:, i] * c
                col[:, i], col[:, i + 1] = a, c
            d = torch.hypot(col[:, j], col[:, j + 1])
            safe = d > 0
            cs[:, j] = torch.where(safe, col[:, j] / d.clamp_min(torch.finfo(dt).tiny), 1)
            sn[:, j] = torch.where(safe, col[:, j + 1] / d.clamp_min(torch.finfo(dt).tiny), 0)
            col[:, j], col[:, j + 1] = d, 0
            H[:, :j + 2, j] = torch.where(live[:, None], col, 0)
            gj = g[:, j].clone()
            g[:, j + 1] = torch.where(live, -sn[:, j] * gj, 0)
            g[:, j] = torch.where(live, cs[:, j] * gj, gj)
            k_used = torch.where(live, j + 1, k_used)
            est = _rel(g[:, j + 1].abs(), bnorm)
            breakdown = hn <= 10 * eps * torch.linalg.vector_norm(col, dim=1).clamp_min(torch.finfo(dt).tiny)
            done = live & ((est <= tol) | breakdown | ~torch.isfinite(est) | (its >= budget - 1))
            live = live & ~done
            V[:, j + 1] = torch.where(live[:, None], w / hn.clamp_min(torch.finfo(dt).tiny)[:, None], 0)
        # y = R⁻¹ g on each sample's first k_used columns (identity padding beyond them gives y = 0 there)
        idx = torch.arange(m, device=dev)
        used = idx[None, :] < k_used[:, None]  # (B, m)
        R = H[:, :m, :m] * (used[:, :, None] & used[:, None, :])
        R = R + torch.diag_embed((~used).to(dt))
        y = torch.linalg.solve_triangular(R, torch.where(used, g[:, :m], 0)[:, :, None], upper=True)[:, :, 0]
        x = x + torch.where(active[:, None], torch.bmm(y[:, None, :], V[:, :m])[:, 0], 0)
        r = b - A(x)
        its += active.long()
        new = _rel(torch.linalg.vector_norm(r, dim=1), bnorm)
        stalled = ~(new < res)  # no progress in a whole cycle (or not finite): a repeat would do the same
        res = torch.where(active, new, res)
        active = active & (res > tol) & ~stalled
    return x, res, its


def _neumann(A, b, bnorm, x, have_guess, tol, budget):
    B, n = b.shape
    its = torch.zeros(B, dtype=torch.int64, device=b.device)
    if not have_guess:  # x_1 = b + J·0 = b, free
        x = b.clone()
    res = torch.full((B,), math.inf, dtype=torch.float64, device=b.device)
    first = None
    active = torch.ones(B, dtype=torch.bool, device=b.device)
    while bool(active.any()):
        r = b - A(x)  # = (b + J x) − x, the next step
        its += active.long()
        cur = _rel(torch.linalg.vector_norm(r, dim=1), bnorm)
        res = torch.where(active, cur, res)
        first = cur.clone() if first is None else first
        ok = res <= tol
        blown = ~torch.isfinite(cur) | (cur > 1e8 * first.clamp_min(tol))
        stop = active & (ok | blown | (its >= budget))
        go = active & ~stop
        x = torch.where(go[:, None], x + r, x)
        active = go
    return x, res, its
