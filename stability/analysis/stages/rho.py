"""Stage ``rho`` (Props. 3–4, App. A.4): ρ(J*), σ_max(J*) and the leading eigenvalues of J = ∂step/∂x at x_best, by
:func:`stability.numerics.spectra.spectral_radius` and :func:`~stability.numerics.spectra.sigma_max`: the dense
routes for small states, ``krylov`` on Jᵀ above (:func:`~stability.numerics.spectra.route_for`). It leaves its
result, the spectrum per sample in the numerics' one type, for later stages (``AtFixedPoint.jacobian_spectra``)
and, on the dense routes, the dense J for stage prop4.

A torch-free module (:mod:`stability.analysis.stages.base`): the numerics are imported where the stage runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from stability.analysis.stages import prop4
from stability.analysis.stages.base import Cost, Stage, fmt, spread
from stability.stats import median

if TYPE_CHECKING:
    import torch

    from stability.analysis.fixed_point import AtFixedPoint
    from stability.numerics import Spectrum

NAME = "rho"
KEY = "jacobian"


@dataclass
class JacobianSpectra:
    """Stage rho's result (Props. 3–4, App. A.4) at x_best: ``spectrum``, the spectrum of J* = ∂f/∂x of the first
    ``len(spectrum)`` samples (all, or a few on large states) in the numerics' one type, σ_max(J*) of the same
    samples (``sigma``), which reached the Ritz tolerance (``eigen_flags``), and the solver's converged mask of
    every sample (for the medians). The JSON lists have None for the samples not measured."""

    method: str
    spectrum: Spectrum
    sigma: torch.Tensor
    eigen_flags: torch.Tensor
    converged: list

    def _padded(self, values: list) -> list:
        return list(values) + [None] * (len(self.converged) - len(values))

    @property
    def rhos(self) -> list:
        """ρ(J*) per sample (None where not measured)."""
        return self._padded(self.spectrum.rho.cpu().tolist())

    @property
    def sigmas(self) -> list:
        """σ_max(J*) per sample (None where not measured)."""
        return self._padded(self.sigma.cpu().tolist())

    @property
    def eigenvalues(self) -> list:
        return self._padded(self.spectrum.eigenvalue_lists())

    @property
    def eigen_converged(self) -> list:
        return self._padded(self.eigen_flags.cpu().tolist())

    def to_dict(self) -> dict:
        c, rho, sigma = self.converged, self.rhos, self.sigmas
        return {
            "evaluated_at": "x_best: the fixed point where status is converged, else the lowest-residual iterate",
            "method": self.method,
            "spectral_radius": rho,
            "spectral_radius_median": median([r for r, ok in zip(rho, c) if ok]),
            "spectral_radius_median_all": median(rho),
            "sigma_max": sigma,
            "sigma_max_median": median([s for s, ok in zip(sigma, c) if ok]),
            "eigenvalues": self.eigenvalues,
            "eigen_converged": self.eigen_converged,
        }


def run(at: AtFixedPoint) -> JacobianSpectra:
    """ρ(J*), σ_max and the leading eigenvalues of J = ∂step/∂x at x_best (Props. 3–4), by
    :func:`stability.numerics.spectra.spectral_radius` and :func:`~stability.numerics.spectra.sigma_max` on the
    route :func:`~stability.numerics.spectra.route_for` gives: the dense routes for small states (the dense J kept
    for stage prop4 where they fit), ``krylov`` on Jᵀ above."""
    # a torch-free module: the numerics where the stage runs
    from stability.numerics.jacobian import DENSE_BUDGET
    from stability.numerics.spectra import route_for

    N, n = at.x_star.shape[0], int(at.x_star[0].numel())
    keep = N * n * n * 8 <= 4 * DENSE_BUDGET  # the dense J fit 4 × the chunk budget: kept for stage prop4
    route = route_for(n, dense_kept=keep and prop4.NAME in at.options.stages)
    spectrum, sigma, flags, method = (_dense_route if route != "krylov" else _matrix_free)(at, route, keep)
    at.jacobian_spectra = JacobianSpectra(method=method, spectrum=spectrum, sigma=sigma, eigen_flags=flags,
                                          converged=at.converged.tolist())
    return at.jacobian_spectra


def _dense_route(at: AtFixedPoint, route: str, keep: bool) -> tuple:
    """Stage rho on small states: every sample's dense J (forward-mode columns, compressed where positions reach
    only their neighbours, chunked by memory) and LAPACK, exact to rounding (route ``dense``); mid-size states
    (``dense-krylov``): the same J, ρ by ARPACK on each, for stage prop4 to reuse. The dense J go to stage prop4
    (its check against autograd) where ``keep``."""
    import torch  # a torch-free module: the numerics where the stage runs

    from stability.analysis.fixed_point import DenseJacobians
    from stability.numerics import Linearisation, Spectrum, sigma_max, spectral_radius
    from stability.numerics.jacobian import DENSE_BUDGET
    from stability.numerics.spectra import DENSE_KRYLOV_MAX, DENSE_MAX

    o, f, x_star, x0 = at.options, at.f, at.x_star, at.x0
    N, n = x_star.shape[0], int(x_star[0].numel())
    group = max(1, (DENSE_BUDGET // 4) // (8 * n * n))
    Js, specs, sigmas = [], [], []
    for i in range(0, N, group):
        J = Linearisation(f, x_star[i:i + group], x0[i:i + group]).dense()
        specs.append(spectral_radius(J, route=route, k=o.eig_k, tol=o.eig_tol, seed=o.seed))
        sigmas.append(sigma_max(J, route=route).cpu())
        if keep:
            Js.append(J)
    spectrum = Spectrum.cat(specs)
    if keep:
        at.dense_jacobians = DenseJacobians(torch.cat(Js))
    if route == "dense":
        flags = torch.ones(N, dtype=torch.bool)  # exact to rounding
        method = (f"dense (n = {n} ≤ {DENSE_MAX}: every sample's Jacobian by batched forward-mode columns, "
                  f"eigenvalues by LAPACK, σ_max by λ_max(JᵀJ); exact to rounding, ritz_residual 0)")
    else:
        flags = spectrum.ritz_residual < o.eig_tol
        method = (f"dense Jacobian (n = {n} ≤ {DENSE_KRYLOV_MAX}: every sample's J by batched forward-mode columns), "
                  f"ρ by ARPACK on each dense J (leading Ritz residual < {o.eig_tol:g}), σ_max by λ_max(JᵀJ)")
    return spectrum, torch.cat(sigmas), flags, method


def _matrix_free(at: AtFixedPoint, route: str, keep: bool) -> tuple:
    """Stage rho on large states: the Krylov–Schur method on Jᵀ (float32 products certified in float64 with
    ``eig_precision`` mixed), ``eig_batch`` samples a batch, on the first ``at.few`` samples (all, but on large
    states a few: ``AnalysisOptions.few_samples``); the rest are not measured (None in the JSON)."""
    import torch  # a torch-free module: the numerics where the stage runs

    from stability.analysis.fixed_point import step_copy
    from stability.numerics import Linearisation, Spectrum, sigma_max, spectral_radius

    o, f, x_star, x0 = at.options, at.f, at.x_star, at.x0
    N = x_star.shape[0]
    K = at.few
    chunk = o.eig_chunk(K, x_star.device.type)
    mixed = o.eig_precision == "mixed" and x_star.dtype == torch.float64
    # the float32 copy for the products: what step reaches only (a language model's embedding and head left out)
    fast_model = step_copy(at.model, torch.float32, x_star, x0) if mixed else None
    specs, sigmas = [], []
    for i in range(0, K, chunk):
        xs, xb = x_star[i:min(i + chunk, K)], x0[i:min(i + chunk, K)]
        J = Linearisation(f, xs, xb)
        fast = Linearisation(fast_model.step, xs.float(), xb.float()) if mixed else None
        specs.append(spectral_radius(J, route=route, fast=fast, k=o.eig_k, tol=o.eig_tol, seed=o.seed,
                                     restart=o.eig_restart))
        sigmas.append(sigma_max(J, route=route, tol=o.eig_tol, seed=o.seed, restart=o.eig_restart).cpu())
        at.tick(min(i + chunk, K), K)
    spectrum = Spectrum.cat(specs)
    batched = o.batch == "all" or x_star.device.type != "cpu"  # krylov_schur's restart: batched, or auto on a GPU
    method = (f"Krylov–Schur on Jᵀ (torch, {chunk} sample(s) per batch{', restarts batched' if batched else ''}; "
              + ("float32 products, each leading Ritz pair certified by float64 products)" if mixed
                 else f"{str(x_star.dtype).replace('torch.', '')} products)"))
    if K < N:  # the rest are not measured (None), said in the method and the split's measured_samples
        method += f"; the first {K} of {N} samples (n = {int(x_star[0].numel()):,} > {o.few_samples_above:,})"
    sigma = torch.cat(sigmas) if sigmas else torch.zeros(0, dtype=torch.float64)
    return spectrum, sigma, spectrum.ritz_residual < o.eig_tol, method


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


STAGE = Stage(NAME, KEY, per_sample=True,
              cost=Cost(0.355, 0.72, "sample", "eig", batched=(0.202, 0.72)),
              run=run, rows=rows, headline=headline,
              what="ρ(J*), σ_max and the leading eigenvalues of J at x* (Props. 3–4)")
