"""The Krylov–Schur eigensolver on a batch of independent linear operators A_b, in torch: the engine under every
matrix-free ρ and σ_max of the package (:func:`stability.numerics.spectra.spectral_radius`, route ``krylov``, is how
the package calls it).

:func:`krylov_schur` runs the method on every sample at once (one batched product per Krylov step; finished samples
leave the batch); :func:`certify` runs it on low-precision products and certifies every result with float64 Ritz
residuals. scipy's ARPACK, one sample at a time, is the independent reference the tests hold it to
(tests/reference_numerics.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from stability.numerics.eigen_batched import batched_krylov_schur, restart_mode

@dataclass
class Spectrum:
    """ρ and the leading eigenvalues of a batch of operators A_b, per sample in the batch's order: what
    :func:`stability.numerics.spectra.spectral_radius` returns on every route, and the one type the package keeps a
    spectrum in (stage rho's ρ(J*), Prop. 4's ρ(M), ρ(W_x): a batch of one).

    rho (B,) float64; eigenvalues (B, k) complex, descending modulus; ritz_residual (B,): ‖A u − θ u‖ / |θ| of the
    leading Ritz pair (u of unit norm), the accuracy indicator (0 on the dense route: exact to rounding); products
    (B,) int: operator products each sample used; matvecs: their total; vectors: the leading Ritz vector (B, n)
    complex, or None; route: how it was computed, ``(route, k)`` for LAPACK's dense eigenvalues or ``(route, k,
    tol, seed)`` to a Ritz tolerance (() when not said), so that a caller can tell whether it may take these
    values for its own.
    """

    rho: torch.Tensor
    eigenvalues: torch.Tensor
    ritz_residual: torch.Tensor
    matvecs: int
    products: Optional[torch.Tensor] = None
    vectors: Optional[torch.Tensor] = None
    route: tuple = ()

    def __len__(self) -> int:
        return int(self.rho.shape[0])

    def rows(self, index) -> "Spectrum":
        """The samples ``index`` (a slice or an index tensor), a copy on the CPU, in that order."""
        take = (lambda t: None if t is None else t.cpu()[index].clone())
        products = take(self.products)
        return Spectrum(rho=take(self.rho), eigenvalues=take(self.eigenvalues), ritz_residual=take(self.ritz_residual),
                        matvecs=int(products.sum()) if products is not None else 0, products=products,
                        vectors=take(self.vectors), route=self.route)

    @staticmethod
    def cat(parts: list) -> "Spectrum":
        """The spectra of ``parts`` (one route) as one batch, on the CPU, in order."""
        def joined(name):
            got = [getattr(p, name) for p in parts]
            return None if any(t is None for t in got) else torch.cat([t.cpu() for t in got])

        return Spectrum(rho=joined("rho"), eigenvalues=joined("eigenvalues"), ritz_residual=joined("ritz_residual"),
                        matvecs=sum(p.matvecs for p in parts), products=joined("products"),
                        vectors=joined("vectors"), route=parts[0].route if parts else ())

    def eigenvalue_lists(self) -> list:
        """Every sample's eigenvalues as the JSON writes them: [[re, im], ...] per sample."""
        return [[[float(z.real), float(z.imag)] for z in row] for row in self.eigenvalues.cpu().tolist()]


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


def _extend(V: torch.Tensor, H: torch.Tensor, W: torch.Tensor, pos: torch.Tensor, pos_d: torch.Tensor,
            arange_d: torch.Tensor) -> torch.Tensor:
    """One Krylov step of every sample: the product W = A v_pos orthogonalised against the basis by classical
    Gram–Schmidt applied twice (CGS2), its coefficients into H's column ``pos`` and the new unit vector into V
    (in place). Returns (a,) bool on the CPU: the basis holds an invariant subspace (the new vector is zero)."""
    device = V.device
    scale = W.norm(dim=1)
    top = int(pos.max()) + 1
    Vt = V[:, :top]  # rows beyond each sample's position are zero, so they drop out
    h = torch.bmm(Vt, W.unsqueeze(2)).squeeze(2)
    W = W - torch.bmm(h.unsqueeze(1), Vt).squeeze(1)
    h2 = torch.bmm(Vt, W.unsqueeze(2)).squeeze(2)  # the second pass (CGS2)
    W = W - torch.bmm(h2.unsqueeze(1), Vt).squeeze(1)
    h = h + h2
    beta = W.norm(dim=1)
    broke = (beta <= 1e-12 * scale.clamp_min(1e-300)).cpu()  # the basis holds an invariant subspace
    H[arange_d[:, None], torch.arange(top, device=device)[None, :], pos_d[:, None]] = h
    H[arange_d, pos_d + 1, pos_d] = torch.where(broke.to(device), torch.zeros_like(beta), beta)
    V[arange_d, pos_d + 1] = torch.where(broke.to(device)[:, None], torch.zeros_like(W),
                                         W / beta.clamp_min(1e-300)[:, None])
    return broke


def _restart(V: torch.Tensor, H: torch.Tensor, r: int, s_: int, T, Z, p: int, bvec) -> None:
    """Row ``r``'s restart (in place): its basis of ``s_`` vectors replaced by the ``p`` leading Schur vectors
    (T, Z of :func:`_schur_restart`) and the continuation vector, H by the leading block of T and its last row."""
    device, dtype = V.device, V.dtype
    Zp = torch.from_numpy(np.ascontiguousarray(Z[:, :p])).to(device=device, dtype=dtype)
    cont = V[r, s_].clone()
    V[r, :p] = Zp.T @ V[r, :s_]
    V[r, p] = cont
    V[r, p + 1:] = 0
    H[r] = 0
    H[r, :p, :p] = torch.from_numpy(np.ascontiguousarray(T[:p, :p])).to(device=device, dtype=dtype)
    H[r, p, :p] = torch.from_numpy(bvec @ Z[:, :p]).to(device=device, dtype=dtype)


class _Found:
    """The results of the samples the Krylov–Schur method has finished, in the batch's order (on the CPU)."""

    def __init__(self, B: int, kk: int, n: int, vectors: bool):
        self.kk = kk
        self.rho = torch.full((B,), float("nan"), dtype=torch.float64)
        self.eigs = torch.full((B, kk), complex("nan"), dtype=torch.complex128)
        self.resid = torch.full((B,), float("inf"), dtype=torch.float64)
        self.vecs = torch.zeros(B, n, dtype=torch.complex128) if vectors else None

    def record(self, b: int, theta, res: float, y, basis: torch.Tensor) -> None:
        """Sample ``b``: its Ritz values ``theta`` (descending modulus), leading residual, leading Ritz vector
        (coefficients ``y`` in ``basis``)."""
        kk = self.kk
        self.rho[b] = float(abs(theta[0]))
        self.eigs[b, :min(kk, len(theta))] = torch.from_numpy(theta[:kk].astype(np.complex128))
        self.resid[b] = res
        if self.vecs is not None:
            yc = torch.from_numpy(y.astype(np.complex128)).to(basis.device)
            self.vecs[b] = (yc @ basis.to(torch.complex128)).cpu()


def krylov_schur(apply: Callable[[torch.Tensor], torch.Tensor], shape: tuple, *, dtype=torch.float64,
                 device="cpu", krylov: int = 60, restarts: int = 60, k: int = 6, tol: float = 1e-8,
                 keep: Optional[int] = None, seed: int = 0,
                 restrict: Optional[Callable[[torch.Tensor], Callable]] = None,
                 start: Optional[torch.Tensor] = None, return_vectors: bool = False,
                 nev: Optional[int] = None, restart: str = "auto") -> Spectrum:
    """ρ of B independent operators A_b at once by the Krylov–Schur method (Stewart 2002) in torch.

    ``apply(V)`` maps (B, *S) to (B, *S), sample b by its own operator (a batched vjp or jvp of ``step``).
    Every sample extends its own orthonormal Krylov basis V_b (classical Gram–Schmidt applied twice) to
    ``krylov`` vectors, with A V = V H + v bᵀ; its Ritz values are the eigenvalues of H. Its restart keeps the
    ``keep`` leading Schur vectors of H (scipy's ordered real Schur form: complex pairs stay together, the kept
    space is invariant for H, so the decomposition stays a Krylov one) and continues from v. A sample stops
    when its leading Ritz residual |bᵀy| / |θ| is below ``tol`` and those of the next ``nev`` − 1 Ritz pairs are
    below 100 · tol (with batched restarts, only the pairs within 5 % of |θ₁|; those farther below to
    1e4 · tol: :data:`~stability.numerics.eigen_batched.NEAR`) (or after ``restarts`` restarts) and leaves the batch. The second condition is not
    decoration: on a clustered spectrum the leading pair alone can converge to the cluster's second member
    while the largest eigenvalue is not yet in the basis (measured: |Δρ| = 2e-3 on a sudoku-size J*). With
    ``restrict(idx)`` (a product for the samples ``idx`` only) the remaining samples are multiplied
    alone, otherwise finished samples ride along with zero vectors. Products may run in a lower precision than
    ``dtype`` (the basis and H stay in ``dtype``). ``start``: (B, n) start vectors (default random).
    The second Gram–Schmidt pass runs on every vector (CGS2; ARPACK's DGKS test, which skips it when the first
    pass kept most of the norm, would move ρ in its last digits, benchmarks/RESULTS.md).
    ``restart``: ``per-sample`` (each due sample's ordered Schur form by scipy, in turn; the CPU's default),
    ``batched`` (every sample's restart at once, the host seen once per restart and per check between restarts:
    :mod:`stability.numerics.eigen_batched`) or ``auto`` (per-sample on the CPU, batched elsewhere).
    """
    B = shape[0]
    S = tuple(shape[1:])
    n = int(np.prod(S))
    m = max(2, min(krylov, n))
    keep = min(keep if keep is not None else max(k, m // 2), max(1, m - 2))
    nev = min(nev if nev is not None else NEV, max(1, m - 3))
    gen = torch.Generator(device="cpu").manual_seed(seed)
    v = start.reshape(B, n).to(device=device, dtype=dtype) if start is not None else \
        torch.randn(B, n, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
    v = v / v.norm(dim=1, keepdim=True).clamp_min(1e-300)
    common = dict(m=m, keep=keep, nev=nev, kk=min(k, m), tol=tol, restarts=restarts, dtype=dtype, device=device,
                  restrict=restrict, return_vectors=return_vectors)
    if restart_mode(restart, device) == "batched":
        rho, eigs, resid, products, vecs = batched_krylov_schur(apply, shape, v, padded=_padded, schur=_schur_restart,
                                                                slack=NEV_SLACK, **common)
    else:
        rho, eigs, resid, products, vecs = _per_sample_iteration(apply, shape, v, **common)
    return Spectrum(rho=rho, eigenvalues=eigs, ritz_residual=resid, matvecs=int(products.sum()),
                    products=products, vectors=vecs)


def _per_sample_iteration(apply: Callable, shape: tuple, v: torch.Tensor, *, m: int, keep: int, nev: int, kk: int,
                          tol: float, restarts: int, dtype, device, restrict: Optional[Callable], return_vectors: bool):
    """:func:`krylov_schur`'s iteration with per-sample restarts (each due sample's ordered Schur form by scipy, in
    turn) from the unit start vectors ``v`` (B, n). Returns (rho, eigenvalues, ritz_residual, products, vectors)."""
    B, S, n = shape[0], tuple(shape[1:]), v.shape[1]
    V = torch.zeros(B, m + 1, n, dtype=dtype, device=device)
    H = torch.zeros(B, m + 1, m, dtype=dtype, device=device)
    V[:, 0] = v
    pos = torch.zeros(B, dtype=torch.long)  # the basis index each sample multiplies next (CPU bookkeeping)
    cycles = torch.zeros(B, dtype=torch.long)
    products = torch.zeros(B, dtype=torch.long)
    ids = torch.arange(B)  # original batch index of each row of the (compacted) state
    found = _Found(B, kk, n, return_vectors)
    op = apply
    while ids.numel():
        a = ids.numel()
        ar = torch.arange(a)
        arange_d = torch.arange(a, device=device)
        pos_d = pos.to(device)
        X = V[arange_d, pos_d]
        W = op(X.reshape(a, *S)).detach().reshape(a, n).to(dtype)
        products[ids] += 1
        broke = _extend(V, H, W, pos, pos_d, arange_d)
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
                found.record(b, theta, res, y, V[r, :s_])
                finished.append(r)
                continue
            _restart(V, H, r, s_, T, Z, p, bvec)
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
    return (found.rho.to(device), found.eigs.to(device), found.resid.to(device), products,
            None if found.vecs is None else found.vecs.to(device))


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


def certify(fast: Callable, exact: Callable, shape: tuple, *, tol: float = 1e-8,
            fast_restrict: Optional[Callable] = None, exact_restrict: Optional[Callable] = None,
            dtype=torch.float64, device="cpu", **kwargs) -> Spectrum:
    """Mixed precision: ρ by :func:`krylov_schur` on ``fast`` products (e.g. the float32 copy of the
    model; basis and Rayleigh quotient stay in ``dtype``), then every sample's leading Ritz pair checked by two
    products with ``exact`` (float64): the reported ``ritz_residual`` is that exact one. Samples whose exact
    residual misses ``tol`` are iterated again on ``exact`` products, started from their Ritz vector, so a
    low-precision product can cost time but never accuracy. Float32 products certify residuals down to about
    3e-7 (measured on sudoku-size transformer Jacobians), so the fast phase aims at ``tol / 3`` and a ``tol`` below
    :data:`MIXED_MIN_TOL` goes to ``exact`` products directly."""
    if tol < MIXED_MIN_TOL:
        return krylov_schur(exact, shape, tol=tol, restrict=exact_restrict, dtype=dtype, device=device, **kwargs)
    first = krylov_schur(fast, shape, tol=max(tol / 3, 1e-7), restrict=fast_restrict, dtype=dtype, device=device,
                         return_vectors=True, **kwargs)
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
        again = krylov_schur(op, sub_shape, tol=tol, dtype=dtype, device=device, start=start,
                             restrict=None if exact_restrict is None else
                             (lambda idx: exact_restrict(redo.to(device)[idx])), **kwargs)
        rho[redo], eigs[redo], res[redo] = again.rho, again.eigenvalues, again.ritz_residual.to(res)
        products[redo] += again.products
    return Spectrum(rho=rho, eigenvalues=eigs, ritz_residual=res, matvecs=int(products.sum()), products=products)


def _padded(apply: Callable, shape: tuple, index: torch.Tensor) -> Callable:
    """A product for the samples ``index`` from a product on the whole batch (others multiplied by zeros)."""
    def op(V: torch.Tensor) -> torch.Tensor:
        full = torch.zeros((shape[0], *V.shape[1:]), dtype=V.dtype, device=V.device)
        full[index.to(V.device)] = V
        return apply(full)[index.to(V.device)]
    return op

