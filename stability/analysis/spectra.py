"""Spectral radius ρ(J), the leading eigenvalues, and the largest singular value σ_max of a linear operator.

ρ(J) decides reachability (Props. 3–4, App. A.4: x* attracts iff ρ < 1); σ_max = ‖J‖₂ ≥ ρ(J) bounds the
one-step contraction and is kept separate from ρ (a non-normal J can have σ_max > 1 > ρ).

* CPU, one sample: ARPACK's implicitly restarted Arnoldi (:func:`scipy.sparse.linalg.eigs`, ``which="LM"``)
  on the matrix-free operator; complex eigenvalues come back as such. σ_max by ARPACK's SVD
  (:func:`scipy.sparse.linalg.svds`), using matvec and rmatvec.
* What ``stability analyze`` uses, CPU and GPU: :func:`batched_spectral_radius`, the Krylov–Schur method
  (Arnoldi with thick restarts on ordered Schur vectors) run on every sample at once in torch (one batched
  product per Krylov step; finished samples leave the batch), and :func:`batched_sigma_max`, the same on JᵀJ.
  :func:`certified_spectral_radius` runs it on float32 products and certifies every result with a float64
  residual (re-solving in float64 where that misses the tolerance).
* Small states (n ≤ :data:`DENSE_MAX`, chosen by measurement): :func:`dense_batched_spectra`, LAPACK on every
  sample's dense Jacobian built by batched reverse-mode products
  (:func:`~stability.analysis.operators.batched_dense_jacobian`); exact to rounding. :func:`dense_spectrum` is the
  one-matrix form, the reference the others are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch


@dataclass
class Spectrum:
    """ρ and the leading eigenvalues (descending modulus) of one operator."""

    rho: float
    eigenvalues: list = field(default_factory=list)  # complex
    method: str = "arpack"
    converged: bool = True
    matvecs: Optional[int] = None

    def to_dict(self) -> dict:
        return {"rho": self.rho, "eigenvalues": [[float(z.real), float(z.imag)] for z in self.eigenvalues],
                "method": self.method, "converged": self.converged, "matvecs": self.matvecs}


def _sorted(vals) -> list:
    vals = np.asarray(vals, dtype=complex)
    return [complex(z) for z in vals[np.argsort(-np.abs(vals), kind="stable")]]


def dense_spectrum(J, k: int = 6) -> Spectrum:
    """All eigenvalues of a dense matrix (numpy or torch); keeps the k of largest modulus."""
    if isinstance(J, torch.Tensor):
        J = J.detach().cpu().double().numpy()
    vals = _sorted(np.linalg.eigvals(np.asarray(J, dtype=np.float64)))
    return Spectrum(rho=float(abs(vals[0])) if vals else 0.0, eigenvalues=vals[:k], method="dense")


class _Counting:
    """Wraps a LinearOperator to count matvecs."""

    def __init__(self, op):
        self.op, self.count = op, 0

    def __call__(self, v):
        self.count += 1
        return self.op.matvec(v)


def spectral_radius(op, *, k: int = 3, tol: float = 1e-10, maxiter: Optional[int] = None, ncv: Optional[int] = None,
                    seed: int = 0, transpose: bool = False) -> Spectrum:
    """ρ(op) and the k leading eigenvalues by ARPACK (scipy ``eigs``, which="LM").

    ``transpose``: run ARPACK on opᵀ (its rmatvec), which has the same eigenvalues; for a
    :class:`~stability.analysis.operators.JacobianOperator` that is the reused-vjp product, the cheap one on
    the CPU. Falls back to the dense route when the operator is too small for ARPACK (n ≤ k + 2). When ARPACK
    stops before converging, the Ritz values it has are returned with ``converged=False``.
    """
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigs

    n = op.shape[0]
    if n <= k + 2:
        return dense_spectrum(op.dense() if hasattr(op, "dense") else op @ np.eye(n), k)
    counter = _Counting(op.T if transpose else op)
    wrapped = LinearOperator(op.shape, matvec=counter, dtype=op.dtype)
    v0 = np.random.default_rng(seed).standard_normal(n)
    ncv = ncv or min(n, max(2 * k + 1, 40))  # a wide basis: J* spectra cluster near ρ, and restarts cost more
    try:
        vals = eigs(wrapped, k=k, which="LM", tol=tol, maxiter=maxiter, ncv=ncv, v0=v0, return_eigenvectors=False)
        converged = True
    except ArpackNoConvergence as exc:
        vals, converged = exc.eigenvalues, False
    vals = _sorted(vals)
    rho = float(abs(vals[0])) if len(vals) else float("nan")
    return Spectrum(rho=rho, eigenvalues=vals, method="arpack", converged=converged, matvecs=counter.count)


def sigma_max(op, *, tol: float = 1e-8, seed: int = 0) -> float:
    """Largest singular value ‖J‖₂ by ARPACK's SVD (matvec and rmatvec); dense SVD for tiny operators."""
    from scipy.sparse.linalg import svds

    n = min(op.shape)
    if n <= 3:
        M = op.dense().cpu().numpy() if hasattr(op, "dense") else op @ np.eye(op.shape[1])
        return float(np.linalg.svd(M, compute_uv=False)[0])
    v0 = np.random.default_rng(seed).standard_normal(n)
    s = svds(op, k=1, tol=tol, v0=v0, return_singular_vectors=False, solver="arpack")
    return float(s[0])


# ---- batched (torch) routes ------------------------------------------------------------------------

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
                            nev: Optional[int] = None) -> BatchedSpectrum:
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
    """
    B = shape[0]
    S = tuple(shape[1:])
    n = int(np.prod(S))
    m = max(2, min(krylov, n))
    keep = min(keep if keep is not None else max(k, m // 2), max(1, m - 2))
    nev = min(nev if nev is not None else NEV, max(1, m - 3))
    gen = torch.Generator(device="cpu").manual_seed(seed)
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


def jacobian_spectral_radius(f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor], *,
                             fast_f: Optional[Callable] = None, tol: float = 1e-6, dense_max: Optional[int] = None,
                             **kwargs) -> BatchedSpectrum:
    """ρ(J_b) of J_b = ∂f/∂x (x_b, x0_b) for every sample of a batch, by :func:`batched_spectral_radius` on Jᵀ
    (reused vjp; finished samples leave the batch). With ``fast_f`` (the same map in float32, e.g. ``step`` of the
    model's float32 copy) its products run in float32 and every result is certified in float64
    (:func:`certified_spectral_radius`). States of n ≤ ``dense_max`` (default :data:`DENSE_MAX`) take the dense
    route instead (:func:`~stability.analysis.operators.batched_dense_jacobian` and LAPACK, exact to rounding)."""
    from stability.analysis.operators import BatchedJacobian, batched_dense_jacobian

    exact = BatchedJacobian(f, x, x0)
    shape = tuple(x.shape)
    n = int(np.prod(shape[1:]))
    if n <= (DENSE_MAX if dense_max is None else dense_max):
        return dense_batched_spectra(batched_dense_jacobian(f, x, x0), k=kwargs.get("k", 6))[0]
    kwargs.setdefault("dtype", x.dtype)
    kwargs.setdefault("device", x.device)
    if fast_f is None:
        return batched_spectral_radius(exact.rapply, shape, tol=tol, restrict=lambda i: exact.restrict(i).rapply,
                                       **kwargs)
    fast = BatchedJacobian(fast_f, x.float(), None if x0 is None else x0.float())
    return certified_spectral_radius(fast.rapply, exact.rapply, shape, tol=tol,
                                     fast_restrict=lambda i: fast.restrict(i).rapply,
                                     exact_restrict=lambda i: exact.restrict(i).rapply, **kwargs)


#: States up to this size take the dense route for ρ(J*), σ_max and Prop. 4's ρ(M): the batched dense Jacobian
#: and LAPACK, exact to rounding. Chosen by measurement on the demo model (width 32; ``python
#: benchmarks/analyze_speed.py --crossover``, benchmarks/RESULTS.md "Analysis speed"): per sample, dense vs the
#: Krylov route, 1 CPU thread.
DENSE_MAX = 256
#: Up to this size (above DENSE_MAX) the dense Jacobians are still built (batched vjps) when Prop. 4 can reuse them:
#: ρ by Krylov–Schur on the dense matrices (float64 products, certified to the Ritz tolerance as the matrix-free
#: route), σ_max by LAPACK. Measured on the demo's hard split (n = 512, 32 samples, one thread): ρ/σ_max 8.1 s
#: against 9.5 s matrix-free, and Prop. 4 5.5 s against 11.3 s; at n = 1024 building J costs more than Krylov.
DENSE_KRYLOV_MAX = 512


def dense_sigma_max(J: torch.Tensor) -> torch.Tensor:
    """σ_max = ‖J_b‖₂ of dense matrices J: (B, n, n), as sqrt λ_max(J_bᵀ J_b). On the CPU above n = 64, one
    Lanczos run per sample (ARPACK ``eigsh``, which="LA", tol 1e-14: the matrix stays in cache; 0.33 s for 32
    matrices of n = 512 against 1.45 s for LAPACK ``eigvalsh``, agreeing to 8e-16, benchmarks/RESULTS.md);
    otherwise LAPACK's symmetric eigensolver on every JᵀJ. An eigenvalue of a symmetric matrix is perfectly
    conditioned, so beyond ``svdvals``' rounding the error is forming JᵀJ, ≤ n · eps relative on σ_max²."""
    Jd = J.detach().double()
    G = Jd.transpose(1, 2) @ Jd
    n = J.shape[-1]
    if J.device.type != "cpu" or n <= 64:
        return torch.linalg.eigvalsh(G)[:, -1].clamp_min(0.0).sqrt()
    from scipy.sparse.linalg import eigsh

    v0 = np.random.default_rng(0).standard_normal(n)
    top = [eigsh(g, k=1, which="LA", tol=1e-14, v0=v0, return_eigenvectors=False)[0] for g in G.numpy()]
    return torch.tensor(top, dtype=torch.float64).clamp_min(0.0).sqrt()


def _arpack_dense(Jd: torch.Tensor, k: int, tol: float, seed: int) -> BatchedSpectrum:
    """ρ and the k leading eigenvalues of every dense J_b by ARPACK (``eigs``, which="LM", to ``tol``), one
    matrix at a time so that it stays in cache (a batched product over all B matrices is memory-bound: 20 ms a
    step at B = 32, n = 512). ritz_residual is recomputed here: ‖J u − θ u‖ / |θ| of the leading pair."""
    from scipy.sparse.linalg import ArpackNoConvergence, eigs

    B, n = Jd.shape[0], Jd.shape[-1]
    kk = min(k, n - 2)
    v0 = np.random.default_rng(seed).standard_normal(n)
    rho, vals_out, res, prods = [], [], [], []
    for A in Jd.numpy():
        count = [0]

        def mv(v, A=A, count=count):
            count[0] += 1
            return A @ v

        from scipy.sparse.linalg import LinearOperator

        op = LinearOperator((n, n), matvec=mv, dtype=np.float64)
        try:
            vals, vecs = eigs(op, k=kk, which="LM", tol=tol, ncv=min(n, max(2 * kk + 1, 40)), v0=v0)
        except ArpackNoConvergence as exc:
            vals, vecs = exc.eigenvalues, exc.eigenvectors
        order = np.argsort(-np.abs(vals), kind="stable")
        vals, vecs = vals[order], vecs[:, order]
        u = vecs[:, 0] / np.linalg.norm(vecs[:, 0])
        rho.append(abs(vals[0]))
        res.append(np.linalg.norm(A @ u - vals[0] * u) / max(abs(vals[0]), np.finfo(float).tiny))
        row = np.zeros(k, dtype=complex)
        row[:len(vals)] = vals[:k]
        vals_out.append(row)
        prods.append(count[0])
    return BatchedSpectrum(rho=torch.tensor(rho, dtype=torch.float64),
                           eigenvalues=torch.tensor(np.array(vals_out), dtype=torch.complex128),
                           ritz_residual=torch.tensor(res, dtype=torch.float64), matvecs=int(sum(prods)),
                           products=torch.tensor(prods, dtype=torch.long))


def dense_krylov_spectra(J: torch.Tensor, *, k: int = 6, tol: float = 1e-6, seed: int = 0) -> tuple:
    """ρ and the k leading eigenvalues of dense matrices J: (B, n, n) to a leading Ritz residual below ``tol``:
    on the CPU by ARPACK one matrix at a time (:func:`_arpack_dense`; 0.7 s for 32 matrices of n = 512 against
    6 s for the batched route, whose products stream all B matrices through memory at every step), elsewhere by
    :func:`batched_spectral_radius` with batched matrix products (float64). σ_max by :func:`dense_sigma_max`.
    Returns (:class:`BatchedSpectrum`, σ_max (B,))."""
    B, n = J.shape[0], J.shape[-1]
    Jd = J.detach().double()
    if J.device.type == "cpu" and n > k + 2:
        return _arpack_dense(Jd, k, tol, seed), dense_sigma_max(Jd)

    def restrict(idx):
        Ji = Jd[idx]
        return lambda V: torch.bmm(Ji, V.reshape(Ji.shape[0], n, 1)).reshape(V.shape)

    spec = batched_spectral_radius(restrict(torch.arange(B, device=J.device)), (B, n), k=k, tol=tol, seed=seed,
                                   restrict=restrict, dtype=torch.float64, device=J.device)
    return spec, dense_sigma_max(Jd)


def dense_batched_spectra(J: torch.Tensor, k: int = 6) -> tuple:
    """ρ, the k leading eigenvalues and σ_max = ‖J_b‖₂ of dense matrices J: (B, n, n), by LAPACK (batched
    ``torch.linalg.eigvals``; σ_max by :func:`dense_sigma_max`): exact to rounding, so ``ritz_residual`` is 0. Returns
    (:class:`BatchedSpectrum`, σ_max (B,))."""
    B, n = J.shape[0], J.shape[-1]
    Jc = J.detach().double().cpu()
    vals = torch.linalg.eigvals(Jc)  # (B, n) complex
    order = torch.argsort(-vals.abs(), dim=1, stable=True)
    vals = torch.gather(vals, 1, order)
    kk = min(k, n)
    sig = dense_sigma_max(Jc)
    dev = J.device
    spec = BatchedSpectrum(rho=vals[:, 0].abs().to(dev), eigenvalues=vals[:, :kk].to(dev),
                           ritz_residual=torch.zeros(B, dtype=torch.float64, device=dev), matvecs=B * n,
                           products=torch.full((B,), n, dtype=torch.long))
    return spec, sig.to(dev)


def batched_sigma_max(apply: Callable, rapply: Callable, shape: tuple, **kwargs) -> torch.Tensor:
    """σ_max per sample: sqrt of ρ(JᵀJ) by the batched Arnoldi iteration (JᵀJ is symmetric, so it is Lanczos)."""
    res = batched_spectral_radius(lambda V: rapply(apply(V)), shape, **kwargs)
    return res.rho.sqrt()
