"""The input-dependence axis (Section 3.2): ‖dx*/dx0‖_F, the Frobenius norm of Prop. 5's implicit input-gradient,
by Hutchinson's estimator E‖(dx*/dx0) u‖² = ‖dx*/dx0‖_F², u ~ N(0, I), for a batch
(:func:`input_dependence_frobenius_batched`, every sample's probes in one batched solve). The per-sample reference
(scipy's GMRES, one probe at a time) is in the tests (tests/reference_numerics.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from stability.analysis.prop5 import KrylovError, krylov_message, precision_of
from stability.errors import ConfigError
from stability.numerics import Linearisation, solve_I_minus_J


@dataclass
class FrobeniusEstimate:
    """‖dx*/dx0‖_F by Hutchinson's estimator with ``probes`` Gaussian probes; ``stderr`` of the squared mean
    propagated to the norm."""

    value: float
    stderr: float
    probes: int
    gmres_residual_max: float

    def to_dict(self) -> dict:
        return {"value": self.value, "stderr": self.stderr, "probes": self.probes,
                "gmres_residual_max": self.gmres_residual_max}


@dataclass
class FrobeniusBatched:
    """‖dx*/dx0‖_F per sample by Hutchinson's estimator (see :class:`FrobeniusEstimate`); residual_max: the
    largest recomputed GMRES residual over the sample's probes; converged: residual_max ≤ 10·tol."""

    value: np.ndarray  # (B,)
    stderr: np.ndarray  # (B,)
    probes: int
    gmres_residual_max: np.ndarray  # (B,)
    gmres_iterations: np.ndarray  # (B, probes)
    tol: float
    converged: np.ndarray  # (B,) bool
    precision: str = "float64"  # of the products (a failed solve's message names it below float64)

    def sample(self, b: int) -> FrobeniusEstimate:
        """Sample b as one record (:class:`FrobeniusEstimate`); raises KrylovError if a probe's GMRES failed."""
        if not self.converged[b]:
            raise KrylovError(krylov_message(float(self.gmres_residual_max[b]),
                                             int(self.gmres_iterations[b].max()), self.tol, self.precision))
        return FrobeniusEstimate(value=float(self.value[b]), stderr=float(self.stderr[b]), probes=self.probes,
                                 gmres_residual_max=float(self.gmres_residual_max[b]))


def input_dependence_frobenius_batched(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, *, probes: int = 8,
                                       tol: float = 1e-8, seed: int = 0, max_iter: Optional[int] = None,
                                       restart: int = 60, batch: Optional[int] = None,
                                       check_every: int = 1) -> FrobeniusBatched:
    """‖dx*/dx0‖_F (Prop. 5) for every sample of a batch: all B × probes systems (I − J_b) w = K_b u_p in one
    batched GMRES (``batch``: at most that many systems per solve; default: as many as keep the Krylov
    bases within about 512 MiB, all of them for the demo's states; ``check_every``: GMRES's steps between host
    checks, :func:`~stability.numerics.gmres.solve_I_minus_J`).

    The probes u_1 … u_P are seeded Gaussians of one sample's shape, the same for every sample, so sample b's value
    equals a per-sample estimate with those probes to the GMRES tolerance.
    """
    if probes < 1:
        raise ConfigError("probes must be ≥ 1")
    B = x_star.shape[0]
    gen = torch.Generator().manual_seed(seed)
    U = torch.stack([torch.randn(tuple(x0.shape[1:]), generator=gen, dtype=torch.float64) for _ in range(probes)])
    U = U.to(x0)
    # systems in sample-major order: row b·P + p is sample b, probe p
    Xs = x_star.detach().repeat_interleave(probes, 0)
    X0s = x0.detach().repeat_interleave(probes, 0)
    Us = U.repeat(B, *([1] * (U.dim() - 1)))
    n_sys = B * probes
    if batch is None:  # bound the Krylov basis, (restart + 1) vectors per system, to about 512 MiB
        n = max(1, x_star[0].numel())
        batch = max(1, (512 << 20) // ((restart + 2) * n * x_star.element_size()))
    step = max(1, int(batch))
    sq, res, its = [], [], []
    for i in range(0, n_sys, step):
        lin = Linearisation(f, Xs[i:i + step], X0s[i:i + step], inputs=True)
        sol = solve_I_minus_J(lin.J, lin.K(Us[i:i + step]), tol=tol, max_iter=max_iter, restart=restart,
                              check_every=check_every)
        sq.append(sol.x.double().flatten(1).pow(2).sum(1))
        res.append(sol.residual)
        its.append(sol.iterations)
    sq = torch.cat(sq).reshape(B, probes).cpu().numpy()
    res = torch.cat(res).reshape(B, probes).cpu().numpy()
    its = torch.cat(its).reshape(B, probes).cpu().numpy()
    mean = sq.mean(1)
    value = np.sqrt(mean)
    se_sq = sq.std(1, ddof=1) / np.sqrt(probes) if probes > 1 else np.full(B, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        stderr = np.where(value > 0, se_sq / (2 * value), 0.0)
    rmax = res.max(1)
    return FrobeniusBatched(value=value, stderr=stderr, probes=probes, gmres_residual_max=rmax,
                            gmres_iterations=its, tol=tol, converged=np.isfinite(rmax) & (rmax <= 10 * tol),
                            precision=precision_of(x_star))
