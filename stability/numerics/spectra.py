"""ρ and σ_max of a batch of operators: the package's one :func:`spectral_radius` and one :func:`sigma_max`.

ρ(J) decides reachability (Props. 3–4, App. A.4: x* attracts iff ρ(J*) < 1); σ_max = ‖J‖₂ ≥ ρ(J) bounds the
one-step contraction and is kept separate from ρ (a non-normal J can have σ_max > 1 > ρ). Both take a
:class:`~stability.numerics.jacobian.Linearisation` (every sample's J at a batch of points, or a linear map's own
matrix) or dense matrices (B, n, n), and a route:

* ``"dense"``: LAPACK on every sample's dense matrix (batched ``torch.linalg.eigvals``; σ_max by λ_max(JᵀJ)),
  exact to rounding; for a Linearisation the matrices are built first (:meth:`Linearisation.dense`). One matrix
  (n, n) alone goes to numpy's LAPACK (ρ(W_x)).
* ``"dense-krylov"``: the dense matrices, ρ to a Ritz-residual tolerance: on the CPU by ARPACK one matrix at a
  time (it stays in cache; 0.7 s for 32 matrices of n = 512 against 6 s for batched products, which stream all B
  matrices through memory at every step), elsewhere by the Krylov–Schur method on batched matrix products.
* ``"krylov"``: matrix-free, the batched Krylov–Schur method (:mod:`stability.numerics.eigen`) on the
  Linearisation's products: Jᵀ by the reused vjp (``product="transpose"``, the same eigenvalues, the cheap
  product) or J by forward mode (``product="forward"``); with ``fast`` (the same Linearisation in float32) the
  products run in float32 and every result is certified in float64. σ_max: the same method on JᵀJ.
* ``"auto"``: ``dense`` for n ≤ ``dense_max`` (:data:`DENSE_MAX`), else ``krylov``.

Callers differ only in their presets (route, point, Krylov size, restarts, seed): stage ``rho`` at x_best, the
training monitor at x_last by forward products on a short basis, the solvers' ``repelling`` check, the geometry
stage's cheap estimate. scipy's ARPACK on one sample's matrix-free operator is the tests' independent reference
(tests/reference_numerics.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np
import torch

from stability.errors import ConfigError
from stability.numerics import exact
from stability.numerics.eigen import Spectrum, certify, krylov_schur
from stability.numerics.jacobian import Linearisation

ROUTES = ("auto", "dense", "dense-krylov", "krylov")
PRODUCTS = ("transpose", "forward")
#: States up to this size take the dense route for ρ(J*), σ_max and Prop. 4's ρ(M): the batched dense Jacobian
#: and LAPACK, exact to rounding. Chosen by measurement on the demo model (width 32; ``python
#: benchmarks/analyze_speed.py --crossover``, benchmarks/RESULTS.md "Analysis speed"): per sample, dense vs the
#: Krylov route, 1 CPU thread.
DENSE_MAX = 256
#: Up to this size (above DENSE_MAX) the dense Jacobians are still built (batched vjps) when Prop. 4 can reuse them:
#: ρ by the ``dense-krylov`` route (certified to the Ritz tolerance as the matrix-free route), σ_max by LAPACK.
#: Measured on the demo's hard split (n = 512, 32 samples, one thread): ρ/σ_max 8.1 s against 9.5 s matrix-free,
#: and Prop. 4 5.5 s against 11.3 s; at n = 1024 building J costs more than Krylov.
DENSE_KRYLOV_MAX = 512


def serial_blas():
    """A context in which numpy's and scipy's OpenBLAS run on one thread (threadpoolctl). ARPACK's own work and
    the products with matrices of n ≤ 512 are far too small to split: with OpenBLAS's default of a thread a core,
    the ρ and σ_max of the demo's 32 hard-split Jacobians took 1.09 s against 0.74 s on one thread on a free
    machine, 5.2 s against 1.0 s beside other work, the same numbers bit for bit (benchmarks/RESULTS.md, "Analysis
    speed")."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def _size(A) -> int:
    return int(np.prod(A.shape[1:])) if isinstance(A, Linearisation) else int(A.shape[-1])


def route_for(n: int, *, dense_kept: bool = False, dense_max: Optional[int] = None) -> str:
    """The route ``auto`` takes for operators of size ``n``: ``dense`` for n ≤ :data:`DENSE_MAX` (``dense_max``),
    else ``krylov``; with ``dense_kept`` (the caller keeps the dense matrices for a later use, Prop. 4's check) also
    ``dense-krylov`` for n ≤ :data:`DENSE_KRYLOV_MAX`, where building them pays."""
    if n <= (DENSE_MAX if dense_max is None else dense_max):
        return "dense"
    return "dense-krylov" if dense_kept and n <= DENSE_KRYLOV_MAX else "krylov"


def _route(A, route: str, dense_max: Optional[int]) -> str:
    if route not in ROUTES:
        raise ConfigError(f"unknown route {route!r}; allowed: {', '.join(ROUTES)}")
    if route == "auto":
        return "dense" if not isinstance(A, Linearisation) else route_for(_size(A), dense_max=dense_max)
    if route == "krylov" and not isinstance(A, Linearisation):
        raise ConfigError("route 'krylov' needs a Linearisation (dense matrices: route 'dense' or 'dense-krylov')")
    return route


def spectral_radius(A, *, route: str = "auto", k: int = 6, tol: float = 1e-6, seed: int = 0,
                    product: str = "transpose", fast: Optional[Linearisation] = None, shrink: Optional[bool] = None,
                    dense_max: Optional[int] = None, **krylov) -> Spectrum:
    """ρ and the ``k`` leading eigenvalues of every sample's operator (module docstring for ``A`` and ``route``).

    ``tol``: the leading Ritz residual ‖A u − θ u‖ / |θ| the Krylov routes reach (the dense route is exact to
    rounding: ``ritz_residual`` 0). ``seed``: their random start. ``product``, ``fast``: the ``krylov`` route's
    products (module docstring). ``shrink``: finished samples leave the batch by a new Linearisation of the samples
    left (True; the default where the operator allows it) or ride along as zero vectors (False; a linear map's
    samples cannot be separated). ``krylov``: the Krylov–Schur settings (``krylov``, ``restarts``, ``keep``,
    ``nev``, ``start``, ``return_vectors``, ``dtype``, ``device``, ``restart``;
    :func:`~stability.numerics.eigen.krylov_schur`). Returns a :class:`~stability.numerics.eigen.Spectrum`.
    """
    route = _route(A, route, dense_max)
    if route in ("dense", "dense-krylov"):
        J = A.dense() if isinstance(A, Linearisation) else A
        if isinstance(J, np.ndarray) or J.dim() == 2:
            return replace(_one_matrix(J, k), route=("dense", k))
        if route == "dense":
            return replace(_dense(J, k), route=("dense", k))
        return replace(_dense_krylov(J, k, tol, seed), route=(route, k, tol, seed))
    if product not in PRODUCTS:
        raise ConfigError(f"unknown product {product!r}; allowed: {', '.join(PRODUCTS)}")
    if shrink and A.linear:
        raise ConfigError("a linear map's samples cannot leave the batch: shrink=False")
    shrink = not A.linear if shrink is None else shrink
    krylov.setdefault("dtype", A.x.dtype)
    krylov.setdefault("device", A.x.device)

    def products(L: Linearisation):
        return L.JT if product == "transpose" else L.jvp

    def restricted(L: Linearisation):
        return (lambda idx: products(L.restrict(idx))) if shrink else None

    if fast is None:
        spec = krylov_schur(products(A), A.shape, k=k, tol=tol, seed=seed, restrict=restricted(A), **krylov)
    else:
        spec = certify(products(fast), products(A), A.shape, k=k, tol=tol, seed=seed, fast_restrict=restricted(fast),
                       exact_restrict=restricted(A), **krylov)
    return replace(spec, route=(route, k, tol, seed))


def sigma_max(A, *, route: str = "auto", tol: float = 1e-6, seed: int = 0, dense_max: Optional[int] = None,
              **krylov) -> torch.Tensor:
    """σ_max = ‖A_b‖₂ of every sample's operator, (B,) float64 (module docstring for ``A`` and ``route``).

    Dense: sqrt λ_max(A_bᵀ A_b); on the CPU above n = 64 by one Lanczos run per sample (ARPACK ``eigsh``, which="LA",
    tol 1e-14: the matrix stays in cache; 0.33 s for 32 matrices of n = 512 against 1.45 s for LAPACK
    ``eigvalsh``, agreeing to 8e-16, benchmarks/RESULTS.md), otherwise LAPACK's symmetric eigensolver on every
    AᵀA. An eigenvalue of a symmetric matrix is perfectly conditioned, so beyond rounding the error is forming
    AᵀA, ≤ n · eps relative on σ_max². Route ``dense`` takes the matrices to the CPU (as its eigenvalues),
    ``dense-krylov`` keeps them where they are. ``krylov``: sqrt ρ(AᵀA) by the Krylov–Schur method (AᵀA is
    symmetric, so it is Lanczos) on the products A.JT(A.J(v)), finished samples riding along, to ``tol``.
    """
    route = _route(A, route, dense_max)
    if route == "krylov":
        krylov.setdefault("dtype", A.x.dtype)
        krylov.setdefault("device", A.x.device)
        return exact.sqrt(krylov_schur(lambda V: A.JT(A.J(V)), A.shape, tol=tol, seed=seed, **krylov).rho)
    J = A.dense() if isinstance(A, Linearisation) else A
    return _dense_sigma_max(J.cpu()).to(J.device) if route == "dense" else _dense_sigma_max(J)


# ---- the dense routes ----------------------------------------------------------------------------------------

def _one_matrix(J, k: int) -> Spectrum:
    """All eigenvalues of one dense matrix (numpy's LAPACK), the k of largest modulus kept; a batch of one."""
    if isinstance(J, torch.Tensor):
        J = J.detach().cpu().double().numpy()
    vals = np.linalg.eigvals(np.asarray(J, dtype=np.float64)).astype(complex)
    vals = [complex(z) for z in vals[np.argsort(-np.abs(vals), kind="stable")]]
    rho = float(abs(vals[0])) if vals else 0.0
    n = len(vals)
    return Spectrum(rho=torch.tensor([rho], dtype=torch.float64),
                           eigenvalues=torch.tensor([vals[:k]], dtype=torch.complex128).reshape(1, min(k, n)),
                           ritz_residual=torch.zeros(1, dtype=torch.float64), matvecs=n,
                           products=torch.tensor([n]))


def _dense(J: torch.Tensor, k: int) -> Spectrum:
    """ρ and the k leading eigenvalues of dense matrices J: (B, n, n) by LAPACK on the CPU (batched
    ``torch.linalg.eigvals``): exact to rounding, so ``ritz_residual`` is 0."""
    B, n = J.shape[0], J.shape[-1]
    vals = torch.linalg.eigvals(J.detach().double().cpu())  # (B, n) complex
    vals = torch.gather(vals, 1, torch.argsort(-vals.abs(), dim=1, stable=True))
    dev = J.device
    return Spectrum(rho=vals[:, 0].abs().to(dev), eigenvalues=vals[:, :min(k, n)].to(dev),
                           ritz_residual=torch.zeros(B, dtype=torch.float64, device=dev), matvecs=B * n,
                           products=torch.full((B,), n, dtype=torch.long))


def _dense_krylov(J: torch.Tensor, k: int, tol: float, seed: int) -> Spectrum:
    """ρ and the k leading eigenvalues of dense matrices J: (B, n, n) to a leading Ritz residual below ``tol``:
    on the CPU by ARPACK one matrix at a time (:func:`_arpack_dense`), elsewhere by :func:`krylov_schur` with
    batched matrix products (float64)."""
    B, n = J.shape[0], J.shape[-1]
    Jd = J.detach().double()
    if J.device.type == "cpu" and n > k + 2:
        return _arpack_dense(Jd, k, tol, seed)

    def restrict(idx):
        Ji = Jd[idx]
        return lambda V: torch.bmm(Ji, V.reshape(Ji.shape[0], n, 1)).reshape(V.shape)

    return krylov_schur(restrict(torch.arange(B, device=J.device)), (B, n), k=k, tol=tol, seed=seed,
                        restrict=restrict, dtype=torch.float64, device=J.device)


def _arpack_dense(Jd: torch.Tensor, k: int, tol: float, seed: int) -> Spectrum:
    """ρ and the k leading eigenvalues of every dense J_b by ARPACK (``eigs``, which="LM", to ``tol``), one
    matrix at a time so that it stays in cache (a batched product over all B matrices is memory-bound: 20 ms a
    step at B = 32, n = 512). ritz_residual is recomputed here: ‖J u − θ u‖ / |θ| of the leading pair."""
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigs

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
    return Spectrum(rho=torch.tensor(rho, dtype=torch.float64),
                           eigenvalues=torch.tensor(np.array(vals_out), dtype=torch.complex128),
                           ritz_residual=torch.tensor(res, dtype=torch.float64), matvecs=int(sum(prods)),
                           products=torch.tensor(prods, dtype=torch.long))


def _dense_sigma_max(J: torch.Tensor) -> torch.Tensor:
    """σ_max of dense matrices J: (B, n, n) as sqrt λ_max(J_bᵀ J_b) (:func:`sigma_max`)."""
    Jd = J.detach().double()
    G = Jd.transpose(1, 2) @ Jd
    n = J.shape[-1]
    if J.device.type != "cpu" or n <= 64:
        return exact.sqrt(torch.linalg.eigvalsh(G)[:, -1].clamp_min(0.0))
    from scipy.sparse.linalg import eigsh

    v0 = np.random.default_rng(0).standard_normal(n)
    with serial_blas():
        top = [eigsh(g, k=1, which="LA", tol=1e-14, v0=v0, return_eigenvectors=False)[0] for g in G.numpy()]
    return exact.sqrt(torch.tensor(top, dtype=torch.float64).clamp_min(0.0))
