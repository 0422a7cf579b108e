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

from stability.linalg import (MIXED_MIN_TOL, NEV, NEV_SLACK, BatchedSpectrum,  # noqa: F401
                              batched_spectral_radius, certified_spectral_radius)


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


def serial_blas():
    """A context in which numpy's and scipy's OpenBLAS run on one thread (threadpoolctl). ARPACK's own work
    (the Hessenberg updates of ``dnaupd``, the Ritz vectors of ``dneupd``) and the products with matrices of
    n ≤ 512 are far too small to split: with OpenBLAS's default of a thread a core, the ρ and σ_max of the demo's
    32 hard-split Jacobians took 1.09 s against 0.74 s on one thread on a free machine, 5.2 s against 1.0 s beside
    other work, the same numbers bit for bit (benchmarks/RESULTS.md, "Analysis speed")."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


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
        with serial_blas():
            vals = eigs(wrapped, k=k, which="LM", tol=tol, maxiter=maxiter, ncv=ncv, v0=v0,
                        return_eigenvectors=False)
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
    with serial_blas():
        s = svds(op, k=1, tol=tol, v0=v0, return_singular_vectors=False, solver="arpack")
    return float(s[0])


# ---- batched (torch) routes ------------------------------------------------------------------------

# The matrix-free Krylov–Schur core (BatchedSpectrum, batched_spectral_radius, certified_spectral_radius and
# their helpers) lives in the numerics layer, stability/linalg.py, imported above.


def jacobian_spectral_radius(f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor], *,
                             fast_f: Optional[Callable] = None, tol: float = 1e-6, dense_max: Optional[int] = None,
                             **kwargs) -> BatchedSpectrum:
    """ρ(J_b) of J_b = ∂f/∂x (x_b, x0_b) for every sample of a batch, by :func:`batched_spectral_radius` on Jᵀ
    (reused vjp; finished samples leave the batch). With ``fast_f`` (the same map in float32, e.g. ``step`` of the
    model's float32 copy) its products run in float32 and every result is certified in float64
    (:func:`certified_spectral_radius`). States of n ≤ ``dense_max`` (default :data:`DENSE_MAX`) take the dense
    route instead (:func:`~stability.analysis.operators.batched_dense_jacobian` and LAPACK, exact to rounding)."""
    from stability.analysis.operators import batched_dense_jacobian
    from stability.linalg import jacobian_rho

    n = int(np.prod(tuple(x.shape)[1:]))
    if n <= (DENSE_MAX if dense_max is None else dense_max):
        return dense_batched_spectra(batched_dense_jacobian(f, x, x0), k=kwargs.get("k", 6))[0]
    return jacobian_rho(f, x, x0, fast_f=fast_f, tol=tol, **kwargs)


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
    with serial_blas():
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
    with serial_blas():
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


def dense_krylov_spectra(J: torch.Tensor, *, k: int = 6, tol: float = 1e-6, seed: int = 0, sigma: bool = True
                         ) -> tuple:
    """ρ and the k leading eigenvalues of dense matrices J: (B, n, n) to a leading Ritz residual below ``tol``:
    on the CPU by ARPACK one matrix at a time (:func:`_arpack_dense`; 0.7 s for 32 matrices of n = 512 against
    6 s for the batched route, whose products stream all B matrices through memory at every step), elsewhere by
    :func:`batched_spectral_radius` with batched matrix products (float64). σ_max by :func:`dense_sigma_max`.
    Returns (:class:`BatchedSpectrum`, σ_max (B,)), σ_max None with ``sigma=False``."""
    B, n = J.shape[0], J.shape[-1]
    Jd = J.detach().double()
    if J.device.type == "cpu" and n > k + 2:
        return _arpack_dense(Jd, k, tol, seed), dense_sigma_max(Jd) if sigma else None

    def restrict(idx):
        Ji = Jd[idx]
        return lambda V: torch.bmm(Ji, V.reshape(Ji.shape[0], n, 1)).reshape(V.shape)

    spec = batched_spectral_radius(restrict(torch.arange(B, device=J.device)), (B, n), k=k, tol=tol, seed=seed,
                                   restrict=restrict, dtype=torch.float64, device=J.device)
    return spec, dense_sigma_max(Jd) if sigma else None


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
