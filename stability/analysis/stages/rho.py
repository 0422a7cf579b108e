"""Stage ``rho`` (Props. 3–4, App. A.4): ρ(J*), σ_max(J*) and the leading eigenvalues of J = ∂step/∂x at x_best, by
:func:`stability.numerics.spectra.spectral_radius` and :func:`~stability.numerics.spectra.sigma_max`: the dense
routes for small states, ``krylov`` on Jᵀ above. It leaves ρ and the eigenvalues per sample for later stages
(``AtFixedPoint.jacobian_spectra``) and, on the dense route, the dense J for stage prop4.

A torch-free module (:mod:`stability.analysis.stages.base`): the numerics are imported where the stage runs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from stability.analysis.stages import prop4
from stability.analysis.stages.base import Cost, Stage, fmt, spread
from stability.stats import median

if TYPE_CHECKING:
    from stability.analysis.fixed_point import AtFixedPoint

NAME = "rho"
KEY = "jacobian"


@dataclass
class JacobianSpectra:
    """ρ(J*), σ_max(J*) and the leading eigenvalues per sample (Props. 3–4, App. A.4), at x_best."""

    method: str
    spectral_radius: list
    sigma_max: list
    eigenvalues: list
    eigen_converged: list
    converged: list  # the solver's converged mask, for the medians

    def to_dict(self) -> dict:
        c = self.converged
        return {
            "evaluated_at": "x_best: the fixed point where status is converged, else the lowest-residual iterate",
            "method": self.method,
            "spectral_radius": self.spectral_radius,
            "spectral_radius_median": median([r for r, ok in zip(self.spectral_radius, c) if ok]),
            "spectral_radius_median_all": median(self.spectral_radius),
            "sigma_max": self.sigma_max,
            "sigma_max_median": median([s for s, ok in zip(self.sigma_max, c) if ok]),
            "eigenvalues": self.eigenvalues,
            "eigen_converged": self.eigen_converged,
        }


def _pairs(spec) -> list:
    """The eigenvalues of a batch as [[re, im], ...] per sample (the JSON's form)."""
    return [[[float(z.real), float(z.imag)] for z in row] for row in spec.eigenvalues.cpu()]


def _dense_route(at: AtFixedPoint, n: int, mid: bool, keep: bool, out: dict) -> str:
    """Small states: every sample's dense J (forward-mode columns, compressed where positions reach only their
    neighbours, chunked by memory) and LAPACK, exact to rounding; the dense J go to stage prop4 (its check against
    autograd) when they fit 4 × the chunk budget. Mid-size states (``mid``): the same J, ρ by the dense-krylov
    route, for Prop. 4 to reuse. Fills ``out``'s lists; returns the method's description."""
    import torch  # a torch-free module: the numerics where the stage runs

    from stability.analysis.fixed_point import DenseJacobians
    from stability.analysis.recall import DenseSpectra
    from stability.numerics import Linearisation, sigma_max, spectral_radius
    from stability.numerics.jacobian import DENSE_BUDGET
    from stability.numerics.spectra import DENSE_KRYLOV_MAX, DENSE_MAX

    o, x_star, x0 = at.options, at.x_star, at.x0
    route = "dense-krylov" if mid else "dense"
    group = max(1, (DENSE_BUDGET // 4) // (8 * n * n))
    Js, specs = [], []
    for i in range(0, x_star.shape[0], group):
        J = Linearisation(at.f, x_star[i:i + group], x0[i:i + group]).dense()
        spec = spectral_radius(J, route=route, k=o.eig_k, tol=o.eig_tol, seed=o.seed)
        sig = sigma_max(J, route=route)
        specs.append(spec)
        out["rho"] += spec.rho.cpu().tolist()
        out["sigma"] += sig.cpu().tolist()
        out["eigs"] += _pairs(spec)
        out["flags"] += (spec.ritz_residual < o.eig_tol).cpu().tolist() if mid else [True] * J.shape[0]
        if keep:
            Js.append(J)
    if keep:
        route = DenseSpectra.route_for(o.eig_k, o.eig_tol if mid else None, o.seed)
        at.dense_jacobians = DenseJacobians(torch.cat(Js), DenseSpectra(
            torch.cat([sp.eigenvalues for sp in specs]), torch.cat([sp.ritz_residual for sp in specs]),
            torch.cat([sp.products for sp in specs]), route))
    return (f"dense (n = {n} ≤ {DENSE_MAX}: every sample's Jacobian by batched forward-mode columns, "
            f"eigenvalues by LAPACK, σ_max by λ_max(JᵀJ); exact to rounding, ritz_residual 0)" if not mid else
            f"dense Jacobian (n = {n} ≤ {DENSE_KRYLOV_MAX}: every sample's J by batched forward-mode columns), "
            f"ρ by ARPACK on each dense J (leading Ritz residual < {o.eig_tol:g}), σ_max by λ_max(JᵀJ)")


def _matrix_free(at: AtFixedPoint, n: int, out: dict) -> str:
    """Large states: Krylov–Schur on Jᵀ on the first K samples (all, but on large states a few:
    ``AnalysisOptions.few_samples``), the rest None. Fills ``out``'s lists; returns the method's description."""
    import torch  # a torch-free module: the numerics where the stage runs

    from stability.numerics import Linearisation, sigma_max, spectral_radius

    o, f, x_star, x0 = at.options, at.f, at.x_star, at.x0
    N, K = x_star.shape[0], at.few
    chunk = o.eig_batch or (K if x_star.device.type == "cuda" else 1)
    mixed = o.eig_precision == "mixed" and x_star.dtype == torch.float64
    fast_model = copy.deepcopy(at.model).float() if mixed else None
    for i in range(0, K, chunk):
        xs, xb = x_star[i:min(i + chunk, K)], x0[i:min(i + chunk, K)]
        J = Linearisation(f, xs, xb)
        fast = Linearisation(fast_model.step, xs.float(), xb.float()) if mixed else None
        spec = spectral_radius(J, route="krylov", fast=fast, k=o.eig_k, tol=o.eig_tol, seed=o.seed)
        sig = sigma_max(J, route="krylov", tol=o.eig_tol, seed=o.seed)
        out["rho"] += spec.rho.cpu().tolist()
        out["sigma"] += sig.cpu().tolist()
        out["eigs"] += _pairs(spec)
        out["flags"] += (spec.ritz_residual < o.eig_tol).cpu().tolist()
        at.tick(min(i + chunk, K), K)
    method = (f"Krylov–Schur on Jᵀ (torch, {chunk} sample(s) per batch; "
              + ("float32 products, each leading Ritz pair certified by float64 products)" if mixed
                 else "float64 products)"))
    if K < N:  # the rest are not measured (None), said in the method and the split's measured_samples
        for v in out.values():
            v += [None] * (N - K)
        method += f"; the first {K} of {N} samples (n = {n:,} > {o.few_samples_above:,})"
    return method


def run(at: AtFixedPoint) -> JacobianSpectra:
    """ρ(J*), σ_max and the leading eigenvalues of J = ∂step/∂x at x_best (Props. 3–4): the dense routes for small
    states (and mid-size ones whose dense J stage prop4 reuses), ``krylov`` on Jᵀ above."""
    from stability.analysis.fixed_point import JacobianRho  # a torch-free module: torch's where the stage runs
    from stability.numerics.jacobian import DENSE_BUDGET
    from stability.numerics.spectra import DENSE_KRYLOV_MAX, DENSE_MAX

    x_star = at.x_star
    N, n = x_star.shape[0], int(x_star[0].numel())
    out = {"rho": [], "sigma": [], "eigs": [], "flags": []}
    keep = N * n * n * 8 <= 4 * DENSE_BUDGET
    mid = n > DENSE_MAX and n <= DENSE_KRYLOV_MAX and keep and prop4.NAME in at.options.stages
    method = _dense_route(at, n, mid, keep, out) if n <= DENSE_MAX or mid else _matrix_free(at, n, out)
    at.jacobian_spectra = JacobianRho(out["rho"], out["eigs"])
    return JacobianSpectra(method=method, spectral_radius=out["rho"], sigma_max=out["sigma"],
                           eigenvalues=out["eigs"], eigen_converged=out["flags"], converged=at.converged.tolist())


def rows(block: Optional[dict], split: dict) -> list:
    if block is None:
        return []
    return [("ρ(J*) median", fmt(block["spectral_radius_median"]),
             f"converged samples; all: {spread(block['spectral_radius'])}"),
            ("σ_max(J*) median", fmt(block["sigma_max_median"]), "‖J*‖₂, converged samples")]


def headline(block: Optional[dict], split: dict) -> dict:
    b = block or {}
    return {"rho_J_median": b.get("spectral_radius_median"), "rho_J_median_all": b.get("spectral_radius_median_all"),
            "sigma_max_median": b.get("sigma_max_median")}


@dataclass(frozen=True)
class Evidence:
    """What the verdict reads of the stage: the median ρ(J*) over the converged samples, and ρ per sample."""

    rho_median: Optional[float]
    rho: list

    @classmethod
    def from_block(cls, block: Optional[dict]) -> Optional[Evidence]:
        if block is None:
            return None
        return cls(rho_median=block.get("spectral_radius_median"), rho=block.get("spectral_radius") or [])


STAGE = Stage(NAME, KEY, per_sample=True, cost=Cost(1.1, 0.60, "sample"), run=run, rows=rows, headline=headline,
              what="ρ(J*), σ_max and the leading eigenvalues of J at x* (Props. 3–4)")
