"""Numerics on a batch of independent linear operators J_b: solves with I − J_b, and the spectral radius ρ(J_b).

Linear solves (I − J_b) w_b = b_b for every sample b at once:

The implicit derivatives of the fixed point all reduce to this one system: dx*/dx0 · u = (I − J)⁻¹ (∂f/∂x0) u
(Prop. 5, App. A.6), and the implicit-function gradient of a loss through x* solves the transposed system
(I − J)ᵀ y = ∂ℓ/∂x* (docs/methods.md). :func:`solve_I_minus_J` takes the map ``apply_J`` as a function on batched
tensors (B, *S) → (B, *S) whose samples are independent (``step`` guarantees it; pass a transposed product,
u ↦ J_bᵀ u_b, to solve the transposed system), and returns per sample the solution, the relative residual
‖b − (I − J) w‖ / ‖b‖ recomputed from the returned w by one more product, and the number of products spent.

Two methods:

* ``"gmres"``: restarted GMRES(m) (Saad & Schultz), Arnoldi with classical Gram–Schmidt applied twice, Givens
  rotations per sample; the restart cycle ends for a sample when its GMRES residual estimate reaches ``tol``
  (its later basis vectors are zero and ignored), and the true residual is recomputed at the end of every cycle.
  A sample leaves the solve when that true residual is ≤ ``tol``, when a whole cycle did not lower it (restarted
  GMRES from the same point would repeat the cycle exactly), or when its product budget ``max_iter`` is spent.
* ``"neumann"``: the fixed-point iteration w ← b + J w (the Neumann series Σ Jᵏ b), converging at the rate ρ(J)
  when ρ(J) < 1; its step w_{k+1} − w_k is exactly the residual of w_k, so no extra product is needed. It stops
  per sample at ``tol``, when the residual is not finite or grew 1e8-fold (ρ(J) > 1), or at ``max_iter``.

A sample that does not converge keeps its best iterate and its (large) residual: callers decide what a residual
above ``tol`` means; nothing here raises on it.

Spectral radius (App. A.4: x* attracts iff ρ(J*) < 1): :func:`batched_spectral_radius`, the Krylov–Schur method
on every sample at once; :func:`certified_spectral_radius`, the same on low-precision products certified by a
float64 Ritz residual; :class:`BatchedJacobian`, every sample's J_b = ∂f/∂x (x_b, x0_b) of a loop map (one jvp,
or the reused vjp for J_bᵀ); :func:`jacobian_rho`, ρ(J_b) by those reverse-mode products (what
:func:`stability.solvers.classify` uses; :mod:`stability.analysis.spectra` re-exports the core and adds the dense
and ARPACK routes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import numpy as np
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
                    x_init: Optional[torch.Tensor] = None) -> IJSolve:
    """Solve (I − J_b) x_b = b_b for every sample b of the batch, by GMRES(``restart``) or the Neumann series.

    apply_J: (B, *S) → (B, *S), V ↦ (J_b V_b)_b, samples independent (each row of the output depends on the same
    row of the input only). b: (B, *S). tol: relative residual per sample. max_iter: products with J per sample
    (the residual checks included; default 20·n, n = prod(S), for GMRES; 20·n or 10,000, whichever is smaller, for
    Neumann). x_init: a first
    guess (default 0). Returns :class:`IJSolve`; residuals above ``tol`` mark samples that did not converge.
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

    bnorm = torch.linalg.vector_norm(bf, dim=1).double()
    x = torch.zeros_like(bf) if x_init is None else x_init.reshape(B, n).to(bf).clone()
    if method == "gmres":
        budget = max_iter if max_iter is not None else max(restart, 20 * n)
        x, res, its = _gmres(A, bf, bnorm, x, x_init is not None, tol, budget, max(1, min(restart, n)))
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


def _gmres(A, b, bnorm, x, have_guess, tol, budget, m):
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
        active = active & (its < budget - 1)  # room for one Arnoldi step and the residual check
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
            if not bool(live.any()):
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


# ---- ρ of a batch of operators: the matrix-free Krylov–Schur core ---------------------------------------------

@dataclass
class BatchedSpectrum:
    """Per-sample results of :func:`batched_spectral_radius`, all of length B in the batch's order.

    rho (B,); eigenvalues (B, k) complex, descending modulus; ritz_residual (B,): ‖A u − θ u‖ / |θ| of the
    leading Ritz pair (u of unit norm), the accuracy indicator; products (B,) int: operator products each
    sample used; matvecs: their total; vectors: the leading Ritz vector (B, n) complex, or None.
    """

    rho: torch.Tensor
    eigenvalues: torch.Tensor
    ritz_residual: torch.Tensor
    matvecs: int
    products: Optional[torch.Tensor] = None
    vectors: Optional[torch.Tensor] = None


NEV = 3  # Ritz pairs that must converge before a sample stops (the leading one to tol, the others to 100 · tol)
NEV_SLACK = 100.0


def _schur_restart(G: np.ndarray, keep: int, limit: int):
    """Real Schur form G = Z T Zᵀ ordered so that the eigenvalues of largest modulus lead (at least ``keep`` of
    them; a complex pair is never split). Returns T, Z, p (the size of the leading block) and every eigenvalue
    of G, descending modulus."""
    import scipy.linalg as sla

    theta = np.linalg.eigvals(G)
    theta = theta[np.argsort(-np.abs(theta), kind="stable")]
    mods = np.abs(theta)
    for want in (keep, max(1, keep // 2), 1):
        thr = mods[min(want, len(mods)) - 1] * (1 - 1e-9)
        T, Z, p = sla.schur(G, output="real", sort=lambda re, im: np.hypot(re, im) >= thr)
        if 1 <= p <= limit:
            return T, Z, p, theta
    return T, Z, min(p, limit), theta


def _rayleigh_ritz(Hr: np.ndarray, s_: int, keep: int, nev: int):
    """One sample's Ritz values from its (s+1) × s matrix H: the ordered Schur form of H[:s, :s], the leading
    Ritz vector y (coefficients in the basis, unit norm) and the largest residual estimate |bᵀyᵢ| / |θᵢ|
    (b = H[s, :s]) among the ``nev`` leading Ritz pairs."""
    G, bvec = Hr[:s_, :s_], Hr[s_, :s_]
    if not (np.isfinite(G).all() and np.isfinite(bvec).all()):  # a non-finite state (a diverged sample)
        return None, None, 0, np.full(s_, np.nan, dtype=complex), np.zeros(s_), float("nan"), bvec
    T, Z, p, theta = _schur_restart(G, max(keep, nev + 1), max(1, s_ - 1))  # s_ = 1: an invariant vector
    lam, Y = np.linalg.eig(T[:p, :p])
    order = np.argsort(-np.abs(lam), kind="stable")
    Yc = Z[:, :p] @ Y[:, order[:max(1, min(nev, p))]]
    Yc = Yc / np.linalg.norm(Yc, axis=0, keepdims=True)
    res = np.abs(bvec @ Yc) / np.maximum(np.abs(lam[order[:Yc.shape[1]]]), 1e-300)
    # the leading pair to tol, the others to NEV_SLACK · tol (their job is to show nothing larger is missing)
    return T, Z, p, theta, Yc[:, 0], float(max(res[0], res[1:].max(initial=0.0) / NEV_SLACK)), bvec


def _map(fn, items):
    """``map`` for the per-sample LAPACK work of a restart: threads when many samples restart at once (LAPACK
    releases the GIL; a GPU batch of hundreds of samples would otherwise wait on one CPU core)."""
    items = list(items)
    if len(items) < 8:
        return [fn(i) for i in items]
    from concurrent.futures import ThreadPoolExecutor
    import os

    with ThreadPoolExecutor(max_workers=min(len(items), os.cpu_count() or 1, 16)) as pool:
        return list(pool.map(fn, items))


def batched_spectral_radius(apply: Callable[[torch.Tensor], torch.Tensor], shape: tuple, *, dtype=torch.float64,
                            device="cpu", krylov: int = 60, restarts: int = 60, k: int = 6, tol: float = 1e-8,
                            keep: Optional[int] = None, seed: int = 0,
                            restrict: Optional[Callable[[torch.Tensor], Callable]] = None,
                            start: Optional[torch.Tensor] = None, return_vectors: bool = False,
                            nev: Optional[int] = None, reorth: str = "always") -> BatchedSpectrum:
    """ρ of B independent operators A_b at once by the Krylov–Schur method (Stewart 2002) in torch.

    ``apply(V)`` maps (B, *S) to (B, *S), sample b by its own operator (a batched vjp or jvp of ``step``).
    Every sample extends its own orthonormal Krylov basis V_b (Arnoldi, classical Gram–Schmidt twice) to
    ``krylov`` vectors, with A V = V H + v bᵀ; its Ritz values are the eigenvalues of H. Its restart keeps the
    ``keep`` leading Schur vectors of H (scipy's ordered real Schur form: complex pairs stay together, the kept
    space is invariant for H, so the decomposition stays a Krylov one) and continues from v. A sample stops
    when its leading Ritz residual |bᵀy| / |θ| is below ``tol`` and those of the next ``nev`` − 1 Ritz pairs are
    below 100 · tol (or after ``restarts`` restarts) and leaves the batch. The second condition is not
    decoration: on a clustered spectrum the leading pair alone can converge to the cluster's second member
    while the largest eigenvalue is not yet in the basis (measured: |Δρ| = 2e-3 on a sudoku-size J*). With
    ``restrict(idx)`` (a product for the samples ``idx`` only) the remaining samples are multiplied
    alone, otherwise finished samples ride along with zero vectors. Products may run in a lower precision than
    ``dtype`` (the basis and H stay in ``dtype``). ``start``: (B, n) start vectors (default random).
    ``reorth``: ``"always"`` (the default) runs the second Gram–Schmidt pass on every vector (CGS2);
    ``"adaptive"`` only when the first removed more than 1 − 1/√2 of the new vector's norm (the DGKS test, Daniel
    et al. 1976, as ARPACK does; measured on sudoku-size Jᵀ it never fires: the first pass keeps > 97 % of the
    norm, the basis stays orthonormal to 1e-14, the products are the same and the time outside them 22 % less).
    Not the default because it moves ρ in its last digits (3.2e-15 relative on the replication grid's n = 1024
    hard split), and the committed replication records are reproduced bit for bit (benchmarks/RESULTS.md).
    """
    B = shape[0]
    S = tuple(shape[1:])
    n = int(np.prod(S))
    m = max(2, min(krylov, n))
    keep = min(keep if keep is not None else max(k, m // 2), max(1, m - 2))
    nev = min(nev if nev is not None else NEV, max(1, m - 3))
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if reorth not in ("always", "adaptive"):
        raise ConfigError(f"reorth must be 'always' or 'adaptive', got {reorth!r}")
    V = torch.zeros(B, m + 1, n, dtype=dtype, device=device)
    H = torch.zeros(B, m + 1, m, dtype=dtype, device=device)
    v = start.reshape(B, n).to(device=device, dtype=dtype) if start is not None else \
        torch.randn(B, n, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
    V[:, 0] = v / v.norm(dim=1, keepdim=True).clamp_min(1e-300)
    pos = torch.zeros(B, dtype=torch.long)  # the basis index each sample multiplies next (CPU bookkeeping)
    cycles = torch.zeros(B, dtype=torch.long)
    products = torch.zeros(B, dtype=torch.long)
    ids = torch.arange(B)  # original batch index of each row of the (compacted) state
    kk = min(k, m)
    rho = torch.full((B,), float("nan"), dtype=torch.float64)
    eigs = torch.full((B, kk), complex("nan"), dtype=torch.complex128)
    resid = torch.full((B,), float("inf"), dtype=torch.float64)
    vecs = torch.zeros(B, n, dtype=torch.complex128) if return_vectors else None
    op = apply
    while ids.numel():
        a = ids.numel()
        ar = torch.arange(a)
        arange_d = torch.arange(a, device=device)
        pos_d = pos.to(device)
        X = V[arange_d, pos_d]
        W = op(X.reshape(a, *S)).detach().reshape(a, n).to(dtype)
        products[ids] += 1
        scale = W.norm(dim=1)
        top = int(pos.max()) + 1
        Vt = V[:, :top]  # rows beyond each sample's position are zero, so they drop out
        h = torch.bmm(Vt, W.unsqueeze(2)).squeeze(2)
        W = W - torch.bmm(h.unsqueeze(1), Vt).squeeze(1)
        beta = W.norm(dim=1)
        # the second pass where cancellation may have left W off orthogonal (the DGKS test; any sample of the
        # batch that needs it takes every sample through it, which only repeats a harmless projection)
        if reorth == "always" or bool((beta < scale * 0.7071067811865476).any()):
            h2 = torch.bmm(Vt, W.unsqueeze(2)).squeeze(2)
            W = W - torch.bmm(h2.unsqueeze(1), Vt).squeeze(1)
            h = h + h2
            beta = W.norm(dim=1)
        broke = (beta <= 1e-12 * scale.clamp_min(1e-300)).cpu()  # the basis holds an invariant subspace
        H[arange_d[:, None], torch.arange(top, device=device)[None, :], pos_d[:, None]] = h
        H[arange_d, pos_d + 1, pos_d] = torch.where(broke.to(device), torch.zeros_like(beta), beta)
        V[arange_d, pos_d + 1] = torch.where(broke.to(device)[:, None], torch.zeros_like(W),
                                             W / beta.clamp_min(1e-300)[:, None])
        pos += 1
        due = (pos >= m) | broke
        if not bool(due.any()):
            continue
        finished = []
        rows = ar[due].tolist()
        Hc = H[torch.tensor(rows, device=device)].double().cpu().numpy()  # one transfer for all due samples
        sizes = [int(pos[r]) for r in rows]
        plans = _map(lambda i: _rayleigh_ritz(Hc[i], sizes[i], keep, nev), range(len(rows)))
        for r, s_, (T, Z, p, theta, y, res, bvec) in zip(rows, sizes, plans):
            b = int(ids[r])
            done = res < tol or bool(broke[r]) or int(cycles[r]) + 1 >= restarts or T is None
            if done:
                rho[b] = float(abs(theta[0]))
                eigs[b, :min(kk, len(theta))] = torch.from_numpy(theta[:kk].astype(np.complex128))
                resid[b] = res
                if vecs is not None:
                    yc = torch.from_numpy(y.astype(np.complex128)).to(device)
                    vecs[b] = (yc @ V[r, :s_].to(torch.complex128)).cpu()
                finished.append(r)
                continue
            Zp = torch.from_numpy(np.ascontiguousarray(Z[:, :p])).to(device=device, dtype=dtype)
            cont = V[r, s_].clone()
            V[r, :p] = Zp.T @ V[r, :s_]
            V[r, p] = cont
            V[r, p + 1:] = 0
            H[r] = 0
            H[r, :p, :p] = torch.from_numpy(np.ascontiguousarray(T[:p, :p])).to(device=device, dtype=dtype)
            H[r, p, :p] = torch.from_numpy(bvec @ Z[:, :p]).to(device=device, dtype=dtype)
            pos[r] = p
            cycles[r] += 1
        if finished:
            stay = torch.ones(a, dtype=torch.bool)
            stay[finished] = False
            stay_d = stay.to(device)
            V, H = V[stay_d], H[stay_d]
            pos, cycles, ids = pos[stay], cycles[stay], ids[stay]
            if ids.numel():
                op = restrict(ids.to(device)) if restrict is not None else _padded(apply, shape, ids)
    return BatchedSpectrum(rho=rho.to(device), eigenvalues=eigs.to(device), ritz_residual=resid.to(device),
                           matvecs=int(products.sum()), products=products,
                           vectors=None if vecs is None else vecs.to(device))


def _ritz_residual(apply: Callable, shape: tuple, theta: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """‖A u − θ u‖ / (|θ| ‖u‖) per sample for complex Ritz pairs (θ, u = p + i q) of real operators A_b, by two
    real products: A p − (a p − b q) and A q − (b p + a q) for θ = a + i b."""
    B = shape[0]
    p, q = u.real.reshape(B, -1), u.imag.reshape(B, -1)
    dt = p.dtype
    Ap = apply(p.reshape(shape)).detach().reshape(B, -1).to(dt)
    Aq = apply(q.reshape(shape)).detach().reshape(B, -1).to(dt)
    a, b = theta.real.to(dt)[:, None], theta.imag.to(dt)[:, None]
    r = torch.cat([Ap - (a * p - b * q), Aq - (b * p + a * q)], dim=1)
    return r.norm(dim=1).double() / (theta.abs().double() * u.reshape(B, -1).norm(dim=1).double()).clamp_min(1e-300)


MIXED_MIN_TOL = 5e-7  # below this Ritz-residual tolerance float32 products cannot certify: float64 only


def certified_spectral_radius(fast: Callable, exact: Callable, shape: tuple, *, tol: float = 1e-8,
                              fast_restrict: Optional[Callable] = None,
                              exact_restrict: Optional[Callable] = None, dtype=torch.float64, device="cpu",
                              **kwargs) -> BatchedSpectrum:
    """Mixed precision: ρ by :func:`batched_spectral_radius` on ``fast`` products (e.g. the float32 copy of the
    model; basis and Rayleigh quotient stay in ``dtype``), then every sample's leading Ritz pair checked by two
    products with ``exact`` (float64): the reported ``ritz_residual`` is that exact one. Samples whose exact
    residual misses ``tol`` are iterated again on ``exact`` products, started from their Ritz vector, so a
    low-precision product can cost time but never accuracy. Float32 products certify residuals down to about
    3e-7 (measured on sudoku-size transformer Jacobians), so the fast phase aims at ``tol / 3`` and a ``tol`` below
    :data:`MIXED_MIN_TOL` goes to ``exact`` products directly."""
    if tol < MIXED_MIN_TOL:
        return batched_spectral_radius(exact, shape, tol=tol, restrict=exact_restrict, dtype=dtype, device=device,
                                       **kwargs)
    first = batched_spectral_radius(fast, shape, tol=max(tol / 3, 1e-7), restrict=fast_restrict, dtype=dtype,
                                    device=device, return_vectors=True, **kwargs)
    lead = first.eigenvalues[:, 0]
    u = first.vectors.to(device=device, dtype=torch.complex128 if dtype == torch.float64 else torch.complex64)
    res = _ritz_residual(exact, shape, lead, u)
    products = first.products.clone() + 2
    redo = torch.nonzero(~(res <= tol)).flatten()  # NaN residuals are redone too
    rho, eigs = first.rho.clone(), first.eigenvalues.clone()
    if redo.numel():
        sub_shape = (redo.numel(), *shape[1:])
        start = (u[redo].real + u[redo].imag).reshape(sub_shape)
        op = exact_restrict(redo.to(device)) if exact_restrict is not None else _padded(exact, shape, redo)
        again = batched_spectral_radius(op, sub_shape, tol=tol, dtype=dtype, device=device, start=start,
                                        restrict=None if exact_restrict is None else
                                        (lambda idx: exact_restrict(redo.to(device)[idx])), **kwargs)
        rho[redo], eigs[redo], res[redo] = again.rho, again.eigenvalues, again.ritz_residual.to(res)
        products[redo] += again.products
    return BatchedSpectrum(rho=rho, eigenvalues=eigs, ritz_residual=res, matvecs=int(products.sum()),
                           products=products)


def _padded(apply: Callable, shape: tuple, index: torch.Tensor) -> Callable:
    """A product for the samples ``index`` from a product on the whole batch (others multiplied by zeros)."""
    def op(V: torch.Tensor) -> torch.Tensor:
        full = torch.zeros((shape[0], *V.shape[1:]), dtype=V.dtype, device=V.device)
        full[index.to(V.device)] = V
        return apply(full)[index.to(V.device)]
    return op


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



def jacobian_rho(f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor], *, fast_f: Optional[Callable] = None,
                 tol: float = 1e-6, **kwargs) -> BatchedSpectrum:
    """ρ(J_b) of J_b = ∂f/∂x (x_b, x0_b) for every sample, matrix-free: :func:`batched_spectral_radius` on Jᵀ
    (same eigenvalues; the reused vjp is the cheap product), to leading Ritz residual ``tol``; with ``fast_f``
    (the same map in float32) its products run in float32 and every result is certified in float64
    (:func:`certified_spectral_radius`). For n ≤ ``krylov`` (60) the basis spans the whole space and the result
    is exact to rounding. :func:`stability.analysis.spectra.jacobian_spectral_radius` is this plus a dense route
    for small states."""
    shape = tuple(x.shape)
    kwargs.setdefault("dtype", x.dtype)
    kwargs.setdefault("device", x.device)
    exact = BatchedJacobian(f, x, x0)
    if fast_f is None:
        return batched_spectral_radius(exact.rapply, shape, tol=tol, restrict=lambda i: exact.restrict(i).rapply,
                                       **kwargs)
    fast = BatchedJacobian(fast_f, x.float(), None if x0 is None else x0.float())
    return certified_spectral_radius(fast.rapply, exact.rapply, shape, tol=tol,
                                     fast_restrict=lambda i: fast.restrict(i).rapply,
                                     exact_restrict=lambda i: exact.restrict(i).rapply, **kwargs)
