"""Stage ``geometry`` (Section 3.2's third axis, App. B.2): radii of stability along random directions in parameter
space, their anisotropy, per parameter group, and (``geometry_plane``) the ρ(J*) picture over a plane, on the
samples of :func:`pick_geometry_samples` (:func:`stability.analysis.geometry.measure`, whose
:class:`~stability.analysis.geometry.Geometry` is the stage's result). Not among the default stages: it perturbs
the parameters and re-solves (``config.DEFAULT_STAGES``). The verdict's geometry axis is decided on it alone.

A torch-free module (:mod:`stability.analysis.stages.base`): the measurement is imported where the stage runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from stability.analysis.stages.base import Cost, Stage, fmt, spread

if TYPE_CHECKING:
    from stability.analysis.fixed_point import AtFixedPoint
    from stability.analysis.geometry import Geometry

NAME = "geometry"
KEY = "geometry"


def _attracts(status: str, rho) -> bool:
    return status == "converged" and rho is not None and math.isfinite(rho) and rho < 1.0


def pick_geometry_samples(o, n: int, status: list, rho: list, fill) -> list:
    """The samples the geometry stage measures (``AnalysisOptions.geometry_pick``): the first
    ``geometry_count(n, N)`` samples whose x* attracts at θ* (converged, ρ(J*) < 1), in order, or the first sample
    where none does ("attracting"); the first ``geometry_count`` samples ("first"). ``rho`` holds ρ(J*) per sample
    (None where not measured), ``fill(samples)`` measures the missing ones in place, a chunk at a time."""
    N = len(status)
    k = o.geometry_count(n, N)
    if o.geometry_pick == "first":
        fill([b for b in range(k) if rho[b] is None])
        return list(range(k))
    candidates, picked = [b for b in range(N) if status[b] == "converged"], []
    for i in range(0, len(candidates), k):
        chunk = candidates[i:i + k]
        fill([b for b in chunk if rho[b] is None])
        picked += [b for b in chunk if rho[b] is not None and math.isfinite(rho[b]) and rho[b] < 1.0]
        if len(picked) >= k:
            break
    if not picked:
        fill([0] if rho[0] is None else [])
    return picked[:k] or [0]


def run(at: AtFixedPoint) -> Geometry:
    """Radii of stability, anisotropy, groups and the plane picture on the picked samples; ρ(J*) at θ* from stage
    rho where it measured it, else by its routine."""
    from stability.analysis.geometry import measure  # a torch-free module: the measurement where the stage runs

    o = at.options
    N = at.x_star.shape[0]
    rho = [None] * N if at.jacobian_spectra is None else list(at.jacobian_spectra.rhos)

    def fill(missing):  # ρ(J*) at θ* of samples stage rho did not measure, by its routine
        if not missing:
            return
        import torch  # a torch-free module: torch and the numerics where ρ is filled in

        from stability.numerics import Linearisation, spectral_radius

        sel = torch.tensor(missing, device=at.x_star.device)
        got = spectral_radius(Linearisation(at.f, at.x_star[sel], at.x0[sel]), tol=o.eig_tol, k=o.eig_k,
                              seed=o.seed, restart=o.eig_restart)
        for b, v in zip(missing, got.rho.tolist()):
            rho[b] = float(v)

    status = at.solution.status
    samples = pick_geometry_samples(o, int(at.x_star[0].numel()), list(status), rho, fill)
    attracting = [_attracts(status[b], rho[b]) for b in range(N)]
    return measure(at.model, at.inputs, at.x_star, at.x0, attracting, rho, samples=samples,
                   directions=o.geometry_directions, accuracy=o.geometry_accuracy,
                   group_directions=o.geometry_group_directions, certify=o.geometry_certify,
                   plane=o.geometry_plane if o.geometry_directions >= 2 else 0, tol=o.tol, max_iter=o.max_iter,
                   eig_tol=o.eig_tol, eig_k=o.eig_k, seed=o.seed,
                   log=lambda m: at.log(f"{at.split}: {m}"), restart=o.eig_restart)


def _percent(v) -> str:
    return fmt(v, ".0%") if v is not None else "—"


def rows(block: Optional[dict], split: dict) -> list:
    """The radius of stability, the anisotropy, the radius by parameter group and what set the radii."""
    if block is None:
        return []
    summ = block.get("summary") or {}
    K, n = block.get("directions"), len(block.get("samples", []))
    att = summ.get("attracting_samples", 0)
    radii = [r for rs in block.get("radii", []) for r in rs]
    out = [("radius of stability", fmt(summ.get("median_radius"), ".3g") + " (median)",
            f"relative step along ±{K} random directions, {n} sample(s) ({att} attracting at θ*), bracket "
            f"hi/lo ≤ {1 + block.get('accuracy', 0):g}; all: {spread(radii)}"),
           ("anisotropy", f"IQR log r {fmt(summ.get('log_iqr'), '.2g')} · log max/min "
            f"{fmt(summ.get('log_range'), '.2g')} · balance {fmt(summ.get('balance'), '.2g')}",
            f"App. B.2's measures on the radii; {_percent(summ.get('unstable_t0'))} unstable at t → 0, "
            f"{_percent(summ.get('censored'))} censored at {block.get('t_max', 0):g}")]
    groups = [g for g in block.get("groups") or [] if g.get("median_radius") is not None]
    if groups:
        t_max = block.get("t_max", 0)
        parts = [f"{g['name'].split(' (')[0]} {'≥' if g['median_radius'] >= t_max else ''}{g['median_radius']:.2g}"
                 for g in sorted(groups, key=lambda g: g["median_radius"])]
        out.append(("radius by part", " · ".join(parts), "directions within one parameter group (median)"))
    reasons = [x for rs in block.get("reasons", []) for x in rs if x]
    if reasons:
        counts = {}
        for x in reasons:
            counts[x] = counts.get(x, 0) + 1
        gap = block.get("estimate_gap_max")
        out.append(("radius set by", ", ".join(f"{k} {v}" for k, v in counts.items()),
                    "what failed at the outer end (rho: ρ(J*) ≥ 1; a status: the continued solve)"
                    + (f"; certified ρ within {gap:.2g} of the estimate" if gap is not None else "")))
    return out


#: the summary's numbers the headline carries, each as ``geometry_<name>``
SUMMARY = ("median_radius", "log_iqr", "log_range", "balance", "unstable_t0")


def headline(block: Optional[dict], split: dict) -> dict:
    summ = (block or {}).get("summary")
    if not summ:  # only where the stage ran: an analysis without it keeps its headline's shape
        return {}
    return {f"geometry_{k}": summ.get(k) for k in SUMMARY}


@dataclass(frozen=True)
class Evidence:
    """What the verdict's geometry axis reads: the summary over the samples whose x* attracts at θ*, the radii
    pooled over them, the number of directions and the narrowest parameter group (name, median radius)."""

    median_radius: Optional[float]
    log_iqr: Optional[float]
    log_range: Optional[float]
    balance: Optional[float]
    unstable_t0: Optional[float]
    attracting: int
    samples: int
    directions: Optional[int]
    pooled: list
    narrowest: Optional[tuple]

    @classmethod
    def from_block(cls, block: Optional[dict]) -> Optional[Evidence]:
        if block is None:
            return None
        summ = block.get("summary") or {}
        groups = [g for g in block.get("groups") or [] if g.get("median_radius") is not None]
        narrow = min(groups, key=lambda g: g["median_radius"]) if groups else None
        pooled = [v for rs, a in zip(block.get("radii", []), block.get("attracting_at_theta", [])) if a for v in rs]
        return cls(median_radius=summ.get("median_radius"), log_iqr=summ.get("log_iqr"),
                   log_range=summ.get("log_range"), balance=summ.get("balance"), unstable_t0=summ.get("unstable_t0"),
                   attracting=summ.get("attracting_samples", 0),
                   samples=summ.get("samples", len(block.get("samples", []))), directions=block.get("directions"),
                   pooled=pooled, narrowest=None if narrow is None else (narrow["name"], narrow["median_radius"]))


STAGE = Stage(NAME, KEY, per_sample=False,
              cost=Cost(5.14, 1.14, "geometry sample", "one", batched=(5.1, 1.31)),
              run=run, rows=rows,
              headline=headline, what="radii of stability in parameter space and their anisotropy (Section 3.2, "
                                      "App. B.2; opt-in)")
