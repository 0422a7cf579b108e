"""Spectral radius ρ(J), the leading eigenvalues, and the largest singular value σ_max of a linear operator.

ρ(J) decides reachability (Props. 3–4, App. A.4: x* attracts iff ρ < 1); σ_max = ‖J‖₂ ≥ ρ(J) bounds the
one-step contraction and is kept separate from ρ (a non-normal J can have σ_max > 1 > ρ).

* CPU, one sample: ARPACK's implicitly restarted Arnoldi (:func:`scipy.sparse.linalg.eigs`, ``which="LM"``)
  on the matrix-free operator; complex eigenvalues come back as such. σ_max by ARPACK's SVD
  (:func:`scipy.sparse.linalg.svds`), using matvec and rmatvec.
* GPU or many samples: :func:`batched_spectral_radius`, a thick-restarted Arnoldi iteration run on every
  sample at once in torch (one batched product per Krylov step), and :func:`batched_sigma_max`, the same on JᵀJ.
* Small states: :func:`dense_spectrum` (LAPACK on the dense matrix), the reference the others are tested against.
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
    """Per-sample results of the batched Arnoldi iteration: rho (B,), eigenvalues (B, k) complex, and the
    relative Ritz residual of the leading eigenvalue (B,) (its accuracy indicator)."""

    rho: torch.Tensor
    eigenvalues: torch.Tensor
    ritz_residual: torch.Tensor
    matvecs: int


def batched_spectral_radius(apply: Callable[[torch.Tensor], torch.Tensor], shape: tuple, *, dtype=torch.float64,
                            device="cpu", krylov: int = 60, restarts: int = 30, k: int = 6, tol: float = 1e-8,
                            keep: Optional[int] = None, seed: int = 0) -> BatchedSpectrum:
    """ρ of B independent operators at once: thick-restarted Arnoldi (Krylov–Schur style) in torch.

    ``apply(V)`` maps (B, *S) to (B, *S), sample b by its own operator (a batched jvp or vjp of ``step``). Each
    cycle extends an orthonormal basis V to ``krylov`` vectors per sample, keeping the images A V, and takes
    the Ritz values of G = Vᵀ A V (batched ``torch.linalg.eig``). The restart keeps the ``keep`` leading Ritz
    vectors (real and imaginary parts, orthonormalised, so complex pairs keep their invariant plane) together with
    their images — no extra products — and continues from the Arnoldi residual direction. Stops when every
    sample's leading Ritz residual ‖A V y − θ V y‖ / |θ| is below ``tol``.
    """
    B = shape[0]
    n = int(np.prod(shape[1:]))
    m = min(krylov, n)
    keep = min(keep if keep is not None else max(k, m // 4), max(1, (m - 1) // 2))
    gen = torch.Generator(device="cpu").manual_seed(seed)
    V = torch.zeros(B, m + 1, n, dtype=dtype, device=device)
    AV = torch.zeros(B, m, n, dtype=dtype, device=device)
    v = torch.randn(B, n, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
    V[:, 0] = v / v.norm(dim=1, keepdim=True)
    start, matvecs = 0, 0
    for cycle in range(restarts):
        for j in range(start, m):
            w = apply(V[:, j].reshape(shape)).reshape(B, n)
            matvecs += 1
            AV[:, j] = w
            for _ in range(2):  # classical Gram–Schmidt, twice
                h = torch.einsum("bkn,bn->bk", V[:, :j + 1], w)
                w = w - torch.einsum("bkn,bk->bn", V[:, :j + 1], h)
            beta = w.norm(dim=1)
            scale = AV[:, j].norm(dim=1).clamp_min(1e-300)
            safe = beta > 1e-12 * scale  # breakdown: the basis already holds an invariant subspace
            V[:, j + 1] = torch.where(safe[:, None], w / beta.clamp_min(1e-300)[:, None], torch.zeros_like(w))
        G = torch.einsum("bin,bjn->bij", V[:, :m], AV)  # Vᵀ A V
        theta, Y = torch.linalg.eig(G)
        order = theta.abs().argsort(dim=1, descending=True)
        theta = torch.gather(theta, 1, order)
        Y = torch.gather(Y, 2, order[:, None, :].expand(-1, m, -1))
        lead = theta[:, 0]
        y0 = Y[:, :, 0]
        r = torch.einsum("bkn,bk->bn", AV.to(Y.dtype), y0) - lead[:, None] * torch.einsum("bkn,bk->bn",
                                                                                          V[:, :m].to(Y.dtype), y0)
        res = r.norm(dim=1) / (lead.abs() * torch.einsum("bkn,bk->bn", V[:, :m].to(Y.dtype), y0).norm(dim=1)
                               ).clamp_min(1e-300)
        if bool((res < tol).all()) or cycle == restarts - 1:
            break
        # thick restart: an orthonormal real basis Q of the leading Ritz vectors' span (in coefficients of V)
        R = torch.cat([Y[:, :, :keep].real, Y[:, :, :keep].imag], dim=2).to(dtype)  # (B, m, 2·keep)
        U, S, _ = torch.linalg.svd(R, full_matrices=False)
        Q = U * (S > 1e-10 * S[:, :1]).to(dtype)[:, None, :]  # rank-deficient directions become zero vectors
        p = Q.shape[2]
        cont = V[:, m].clone()  # the Arnoldi residual direction, orthogonal to all of V
        W = torch.einsum("bkn,bkp->bpn", V[:, :m], Q)
        AW = torch.einsum("bkn,bkp->bpn", AV, Q)
        V.zero_()
        AV.zero_()
        V[:, :p], AV[:, :p] = W, AW
        V[:, p] = cont
        start = p
    kk = min(k, m)
    return BatchedSpectrum(rho=theta[:, 0].abs(), eigenvalues=theta[:, :kk], ritz_residual=res, matvecs=matvecs)


def batched_sigma_max(apply: Callable, rapply: Callable, shape: tuple, **kwargs) -> torch.Tensor:
    """σ_max per sample: sqrt of ρ(JᵀJ) by the batched Arnoldi iteration (JᵀJ is symmetric, so it is Lanczos)."""
    res = batched_spectral_radius(lambda V: rapply(apply(V)), shape, **kwargs)
    return res.rho.sqrt()
