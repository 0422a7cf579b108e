"""What stage ``path_independence`` (:mod:`stability.analysis.stages.path_independence`) computes: the asymptotic
alignment (AA) score of Anil et al. 2022 ("Path Independent Equilibrium Models Can Better Exploit Test-Time
Computation", NeurIPS 2022, Sec. 3 and their Algorithm 1).

For an input x0 with the state x* reached from the standard start e, the same map f(·, x0) is run again from a
different start s with the same solver and budget, to a state x*_s; the AA score of the sample is the cosine of the
two final states, flattened:

    AA(x0, s) = ⟨x*, x*_s⟩ / (‖x*‖₂ ‖x*_s‖₂)

(1: the same steady state, whatever the path; a path-dependent map lands elsewhere). The two starts are theirs:
``other``, the final state of *another input* (sample b restarts from the x* of sample σ(b), σ a seeded
permutation with no fixed point), and ``noise``, a Gaussian state of std ``noise_std`` (seeded). Variant, and why:
the final state of every run is the solver's lowest-residual iterate (x_best, the state every other stage calls
x*), not the iterate after a fixed number of steps, so that a run which converged is compared at its certified x*;
the score is kept per sample (a run that did not converge is scored too, as in the paper, whose AA is over every
test input) and summarised by its median with the order-statistic interval (:func:`~stability.analysis.intervals.
median_interval`; the paper reports the mean, also kept).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from stability.analysis.intervals import median_interval
from stability.solvers import Solve, solve

__all__ = ["STARTS", "derangement", "cosine", "alignment"]

#: the restarts, in the order the JSON lists them
STARTS = ("other", "noise")


def derangement(n: int, generator: torch.Generator) -> torch.Tensor:
    """A seeded permutation σ of 0..n−1 with σ(b) ≠ b for every b (n ≥ 2): a random cyclic order π, each sample
    mapped to its successor, σ(π_i) = π_{i+1 mod n}."""
    pi = torch.randperm(n, generator=generator)
    sigma = torch.empty(n, dtype=torch.long)
    sigma[pi] = pi.roll(-1)
    return sigma


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-sample cosine of the flattened states, ⟨a, b⟩ / (‖a‖₂ ‖b‖₂), shape (B,); NaN where a norm is 0 or not
    finite."""
    a, b = a.flatten(1), b.flatten(1)
    return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))


def _summary(cos: torch.Tensor, converged: torch.Tensor) -> dict:
    """One start's block: the per-sample cosines (None where not finite), its median with the interval, the mean,
    and which restarts converged."""
    values = [v if math.isfinite(v) else None for v in cos.cpu().tolist()]
    finite = [v for v in values if v is not None]
    ci = median_interval(finite)
    return {"cosine": values, "median": None if ci is None else ci["median"], "interval": ci,
            "mean": sum(finite) / len(finite) if finite else None,
            "converged": converged.cpu().tolist(),
            "converged_fraction": float(converged.double().mean()) if converged.numel() else 0.0}


def alignment(f, x_star: torch.Tensor, x0: torch.Tensor, how: Solve, *, noise_std: float,
              seed: int) -> tuple[dict, Optional[list]]:
    """The AA score of every sample against the restarts of :data:`STARTS` (module docstring), both solved as one
    batch of 2B samples (each sample's iteration independent of its batch mates). ``x_star``: the states from e
    (B, *S); ``how``: the solve from e's options. Returns ({start: block}, σ as a list; None for one sample, which
    has no other input: then only ``noise`` is run)."""
    B = x_star.shape[0]
    gen = torch.Generator().manual_seed(seed)
    sigma = derangement(B, gen) if B >= 2 else None
    noise = torch.randn(x_star.shape, generator=gen, dtype=torch.float64).to(x_star) * noise_std
    names = [s for s in STARTS if s != "other" or sigma is not None]
    starts = {"other": None if sigma is None else x_star[sigma.to(x_star.device)], "noise": noise}
    sol = solve(f, torch.cat([starts[k] for k in names]), torch.cat([x0] * len(names)), how)
    out = {}
    for i, k in enumerate(names):
        rows = slice(i * B, (i + 1) * B)
        out[k] = _summary(cosine(x_star, sol.x_best[rows]), sol.converged[rows])
    return out, None if sigma is None else sigma.tolist()
