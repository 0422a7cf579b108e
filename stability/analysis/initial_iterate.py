"""App. A.8: the fixed point does not depend on the initial iterate e.

dx_T/de = Π_t J(x_t) · ∂x_1/∂e → 0 in the stable regime: :func:`initial_iterate_sensitivity` records ‖dx_T/de · u‖
against T for one sample, :func:`initial_iterate_sensitivity_batched` for a batch (one unrolled pass,
:func:`stability.analysis.tangents.unroll_tangents_batched`), and :func:`prop5_and_initial_iterate_batched` gives it
with Prop. 5's check from the same unroll. :func:`fixed_point_distance` compares the fixed points reached from
different e.

Two questions, reported apart (stage ``a8``):

* **local** (App. A.8, :func:`local_dependence`): does the reached x* move when e moves a little? The measure is
  A.8's own, ‖dx_T/de · u‖ for a unit direction u of e at the largest T of the grid (x0 held fixed), per sample
  whose solve converged; A.8 proves it → 0 where ρ(J*) < 1. Counted: samples above a stated threshold.
* **global** (basins, :func:`global_dependence`): do different initial iterates (the model's e, x0, zeros,
  Gaussian noise) end in different fixed points? Per sample, the largest relative L∞ distance between the x*
  reached from two starts *whose solves both converged* (a start that did not converge is no basin), against a
  stated tolerance relative to ‖x*‖∞. A difference here is basin selection, not a failure of A.8's local claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from stability.analysis.prop5 import prop5_check_batched
from stability.analysis.tangents import Unroll, seeded_direction, unroll_tangents_batched
from stability.errors import ConfigError
from stability.numerics import Linearisation
from stability.stats import linked_clusters, median


def initial_iterate_sensitivity(f: Callable, e: torch.Tensor, x0: torch.Tensor, Ts: Sequence[int], *,
                                u: Optional[torch.Tensor] = None, seed: int = 0) -> dict:
    """App. A.8: ‖dx_T/de · u‖ for a unit direction u of the initial iterate e, against T (x0 held fixed)."""
    if u is None:
        gen = torch.Generator().manual_seed(seed + 1)
        u = torch.randn(e.shape, generator=gen, dtype=torch.float64).to(e)
        u = u / u.norm()
    Ts = sorted(set(int(t) for t in Ts))
    x, dx = e.detach().unsqueeze(0), u.detach().unsqueeze(0)
    X0 = x0.detach().unsqueeze(0)
    out = []
    for t in range(1, Ts[-1] + 1):
        x, dx = torch.func.jvp(lambda a: f(a, X0), (x,), (dx,))
        x, dx = x.detach(), dx.detach()
        if t in Ts:
            out.append(float(dx.norm()))
    return {"T": Ts, "norm": out}


def fixed_point_distance(xs: Sequence[torch.Tensor], eps: float = 1e-8) -> torch.Tensor:
    """Per sample, the largest relative L∞ distance between fixed points reached from different e (App. A.8).

    xs: fixed points (B, *S) reached from each initial iterate. Returns (B,).
    """
    B = xs[0].shape[0]
    out = torch.zeros(B, dtype=torch.float64)
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            a, b = xs[i].flatten(1).double().cpu(), xs[j].flatten(1).double().cpu()
            d = (a - b).abs().amax(1) / (torch.maximum(a.abs().amax(1), b.abs().amax(1)) + eps)
            out = torch.maximum(out, d)
    return out


@dataclass
class InitialIterateBatched:
    """App. A.8 on a batch: norm[b, i] = ‖dx_T/de · u‖ at T = T[i] for sample b (u a unit direction of e)."""

    T: list
    norm: np.ndarray  # (B, nT)
    frozen_at: np.ndarray

    def sample(self, b: int) -> dict:
        """Sample b as :func:`initial_iterate_sensitivity` returns it."""
        return {"T": list(self.T), "norm": self.norm[b].tolist()}


def initial_iterate_sensitivity_batched(f: Callable, e: torch.Tensor, x0: torch.Tensor, Ts: Sequence[int], *,
                                        u: Optional[torch.Tensor] = None, seed: int = 0,
                                        unroll: Optional[Unroll] = None,
                                        freeze_tol: Optional[float] = 1e-14) -> InitialIterateBatched:
    """:func:`initial_iterate_sensitivity` for every sample of a batch in one pass over the T grid.

    e: (B, *S), x0: (B, *S0). u: (B, *S), default the per-sample function's seeded unit direction (seed + 1) for
    every sample. unroll: a precomputed :class:`Unroll` with initial_tangent for the same u.
    """
    B = e.shape[0]
    if unroll is None:
        if u is None:
            u = seeded_direction(e.shape[1:], seed + 1, e, B)
        unroll = unroll_tangents_batched(f, e, x0, Ts, initial_dir=u, freeze_tol=freeze_tol)
    elif unroll.initial_tangent is None:
        raise ConfigError("the unroll passed has no initial-iterate tangent")
    norms = unroll.initial_tangent.flatten(2).norm(dim=2).T  # (B, nT)
    return InitialIterateBatched(T=list(unroll.T), norm=norms.detach().double().cpu().numpy(),
                                 frozen_at=unroll.frozen_at.numpy())


def prop5_and_initial_iterate_batched(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, e: torch.Tensor,
                                      Ts: Sequence[int], *, e_tangent: Optional[torch.Tensor] = None,
                                      tol: float = 1e-10, seed: int = 0, max_iter: Optional[int] = None,
                                      restart: int = 60, linearisation: Optional[Linearisation] = None,
                                      freeze_tol: Optional[float] = 1e-14) -> tuple:
    """Prop. 5 and App. A.8 on a batch from ONE unrolled pass: both tangents (dx_T/dx0·u and dx_T/de·u_e) follow
    the same trajectory from e. Returns (:class:`Prop5Batched`, :class:`InitialIterateBatched`), each equal to
    what :func:`prop5_check_batched` and :func:`initial_iterate_sensitivity_batched` return with the same seed."""
    B = x_star.shape[0]
    u = seeded_direction(x0.shape[1:], seed, x0, B)
    u_e = seeded_direction(e.shape[1:], seed + 1, e, B)
    unroll = unroll_tangents_batched(f, e, x0, Ts, input_dir=u, e_tangent=e_tangent, initial_dir=u_e,
                                     freeze_tol=freeze_tol)
    p5 = prop5_check_batched(f, x_star, x0, e, Ts, u=u, tol=tol, max_iter=max_iter, restart=restart,
                             unroll=unroll, linearisation=linearisation)
    a8 = initial_iterate_sensitivity_batched(f, e, x0, Ts, unroll=unroll)
    return p5, a8


def local_dependence(norms: Sequence[Optional[float]], T: int, threshold: float) -> dict:
    """App. A.8's local question as a JSON block: ``norms`` is ‖dx_T/de · u‖ at T per sample (None where the solve
    did not converge: no x* to be sensitive); ``exceed`` counts the measured samples above ``threshold``."""
    got = [v for v in norms if v is not None]
    return {"quantity": "‖dx_T/de · u‖ at the largest T, u a unit direction of e, x0 held fixed (App. A.8: → 0 "
                        "where ρ(J*) < 1); per converged sample", "T": T, "sensitivity": list(norms),
            "threshold": threshold, "measured": len(got), "exceed": sum(1 for v in got if v > threshold),
            "max": max(got, default=None), "median": median(got)}


def global_dependence(starts: Sequence[str], xs: Sequence[torch.Tensor], converged: Sequence[torch.Tensor],
                      tol: float, eps: float = 1e-8) -> dict:
    """The global question (basins) as a JSON block. ``xs``: the x_best (B, *S) reached from each start,
    ``converged``: (B,) bool per start. Per sample: ``distance`` = the largest ‖a − b‖∞ / (max(‖a‖∞, ‖b‖∞) + ε)
    over pairs of starts that both converged (None with fewer than two), ``basins`` = the distinct fixed points
    among its converged starts (linked within ``tol`` relative, :func:`stability.stats.distinct_clusters`);
    ``compared`` counts samples with two or more converged starts, ``differ`` those whose distance > ``tol``."""
    B, S = xs[0].shape[0], len(xs)
    flat = [x.detach().flatten(1).double() for x in xs]
    scale = [x.abs().amax(1) for x in flat]
    finite = [torch.isfinite(x).all(1) for x in flat]
    rel, link = {}, {}
    for i in range(S):  # a pair of starts at a time, every sample at once; one transfer to the host below
        for j in range(i + 1, S):
            d = (flat[i] - flat[j]).abs().amax(1)
            big = torch.maximum(scale[i], scale[j])
            rel[i, j] = d / (big + eps)
            link[i, j] = (d <= eps + tol * big) & finite[i] & finite[j]  # stats.distinct_clusters' link
    pairs = list(rel)
    rel = torch.stack([rel[p] for p in pairs]).cpu().tolist() if pairs else []
    link = torch.stack([link[p] for p in pairs]).cpu().tolist() if pairs else []
    conv = torch.stack([c.bool() for c in converged]).cpu().tolist()
    dist, n_conv, basins = [], [], []
    for b in range(B):
        ok = [k for k in range(S) if conv[k][b]]
        n_conv.append(len(ok))
        got = [rel[q][b] for q, (i, j) in enumerate(pairs) if conv[i][b] and conv[j][b]]
        dist.append(max(got) if got else None)
        linked = {p: link[q][b] for q, p in enumerate(pairs)}
        basins.append(linked_clusters([[i != j and linked[min(i, j), max(i, j)] for j in ok] for i in ok])[0]
                      if ok else 0)
    compared = [d for d in dist if d is not None]
    return {"quantity": "largest relative L∞ distance between the x* reached from two starts whose solves both "
                        "converged (basins; a start that did not converge is not compared)", "starts": list(starts),
            "tol": tol, "distance": dist, "converged_starts": n_conv, "basins": basins, "compared": len(compared),
            "differ": sum(1 for d in compared if d > tol), "max": max(compared, default=None)}
