"""Geometry, the third axis (Section 3.2): how far the parameters can move before the fixed point stops attracting.

The paper's framework judges a looped model on three axes: reachability, input-dependence and geometry. The first
two are properties of the trained θ*; geometry is the *shape of the stable regime around it*: "stability regions
that are highly direction-dependent — narrow slivers in parameter space rather than round, broad neighbourhoods —
force stable configurations into a narrow band", which the paper calls anisotropy (App. B.2 measures it on the toy
model of Figure 5; :mod:`stability.theory.regions`). The geometry stage (:func:`measure`) measures it on any looped
model through the :class:`~stability.protocols.LoopedModel` contract: radii of stability along random directions
in parameter space (:mod:`stability.analysis.radii`; the directions, the loop parameters and their groups:
:mod:`stability.analysis.perturbation`), in all loop parameters and per group of parameters (which parts are
narrow).

**Anisotropy** (App. B.2's log-range and balance, applied to the radii of one input): ``log_range`` = log(max r /
min r) over its directions (0 for a round region), its robust form ``log_iqr`` (the interquartile range of log r),
``balance`` = min r / max r (1 for a round region), the ``median_radius``, and ``unstable_t0`` (the share of
radii that are 0: already unstable at t → 0; an input whose x* does not attract at θ* has every radius 0).
Per-input values are summarised by their median over the inputs whose x* attracts.

**The plane picture.** ρ(J*) over the plane θ* + a·D1 + b·D2 of the first two directions, on a grid, continued
cell by cell (the column a = 0 outward from θ*, then every row outward from it), with the ρ = 1 contour and the
cells whose solve failed marked: the stability region of a trained checkpoint beside Figure 5.

**Memory.** A search holds every row's perturbed parameters (rows × the loop parameters) and its directions; when
that exceeds ``memory`` (:data:`GEOMETRY_BYTES`: a language model, whose loop is most of the model) the directions
are searched a chunk at a time, each chunk holding its own rows and directions only (the same draws). Each row's
search is its own, so a chunk's radii are those of the whole search up to the eigensolver's random starts (the
bracket's ``accuracy``); the toy models never chunk.

**Reference models** whose stable region is known in closed form (:class:`DiagonalRecall`, :class:`Figure5Model`)
check the search against exact radii.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from stability.analysis.continuation import solve_rows
from stability.analysis.perturbation import Family, loop_parameters, parameter_groups, random_directions
from stability.analysis.radii import (ESTIMATE_TOL, GROWTH, KRYLOV, RESTARTS, T_MAX, T_MIN, T_START, Radii,
                                      rho_estimate, search_radii)
from stability.stats import median


# ---- anisotropy -----------------------------------------------------------------------------------------------

def anisotropy(radii, *, t_min: float = T_MIN) -> dict:
    """App. B.2's measures on one input's radii: log_range = log(max/min), log_iqr (interquartile range of log r),
    balance = min/max, median_radius, unstable_t0 (the share of radii that are 0). Radii of 0 enter the logs as
    ``t_min`` (they are below it); censored radii as the censoring value (so log_range is then a lower bound)."""
    r = np.asarray([float(v) for v in radii], dtype=float)
    if r.size == 0:
        return {"median_radius": None, "log_range": None, "log_iqr": None, "balance": None, "unstable_t0": None}
    zero = r <= 0
    logs = np.log(np.maximum(r, t_min))
    q1, q3 = np.percentile(logs, [25, 75])
    return {"median_radius": float(np.median(r)), "log_range": float(logs.max() - logs.min()),
            "log_iqr": float(q3 - q1), "balance": float(r.min() / r.max()) if r.max() > 0 else None,
            "unstable_t0": float(zero.mean())}


# ---- the stage ------------------------------------------------------------------------------------------------

@dataclass
class Geometry:
    """The geometry stage's result (the ``geometry`` JSON block); see the module docstring."""

    samples: list
    attracting: list
    rho_at_theta: list
    directions: int
    accuracy: float
    radii: list  # per sample: 2·directions radii, (direction 0 +, direction 0 −, direction 1 +, …)
    reasons: list
    rho_inner: list
    certified: list
    per_sample: list
    groups: list
    outside_loop: list
    evaluation: str
    counts: dict
    plane: Optional[dict] = None
    certify: int = 0
    estimate_gap: Optional[float] = None
    t_range: tuple = (T_MIN, T_MAX)
    note: Optional[str] = None

    def summary(self) -> dict:
        """Medians over the inputs whose x* attracts at θ*; ``unstable_t0`` over every radius measured."""
        good = [p for p, a in zip(self.per_sample, self.attracting) if a]
        every = [r for rs in self.radii for r in rs]
        pooled = [r for rs, a in zip(self.radii, self.attracting) if a for r in rs]
        return {"median_radius": median(pooled) if pooled else (0.0 if every else None),
                "log_range": median([p["log_range"] for p in good]),
                "log_iqr": median([p["log_iqr"] for p in good]),
                "balance": median([p["balance"] for p in good]),
                "unstable_t0": float(np.mean([r <= 0 for r in every])) if every else None,
                "censored": float(np.mean([x == "t_max" for rs in self.reasons for x in rs])) if every else None,
                "attracting_samples": int(sum(bool(a) for a in self.attracting)), "samples": len(self.samples)}

    def to_dict(self) -> dict:
        lo, hi = self.t_range
        return {"definition": "r = smallest relative step t along θ* + t·D (each tensor's part of D scaled to that "
                              "tensor's norm) at which the continued Picard solve fails or ρ(J*) ≥ 1",
                "samples": self.samples, "attracting_at_theta": self.attracting, "rho_at_theta": self.rho_at_theta,
                "directions": self.directions, "signs": 2, "accuracy": self.accuracy,
                "t_min": lo, "t_max": hi, "t_start": T_START, "growth": GROWTH,
                "radii": self.radii, "reasons": self.reasons, "rho_inner": self.rho_inner,
                "certified": self.certified, "per_sample": self.per_sample, "summary": self.summary(),
                "groups": self.groups, "outside_loop": self.outside_loop,
                "rho_estimate": f"Krylov–Schur on Jᵀ, basis {KRYLOV}, ≤ {RESTARTS} restarts, Ritz residual "
                                f"{ESTIMATE_TOL:g}",
                "rho_certified": f"numerics.spectral_radius (route auto) at both ends of the first {self.certify} "
                                 f"brackets that ρ decided",
                "estimate_gap_max": self.estimate_gap, "evaluation": self.evaluation, "counts": self.counts,
                "plane": self.plane, "note": self.note}


#: the bytes of one search's stacked parameter sets (rows × loop parameters) and directions above which the
#: directions are searched a chunk at a time, each chunk's rows only (a language model's loop: one row's parameters
#: are the whole loop); below it one search holds every row (the toy models: every committed number)
GEOMETRY_BYTES = 2 * 2 ** 30


def measure(model, inputs: torch.Tensor, x_star: torch.Tensor, x0: torch.Tensor, attracting, rho_at_theta, *,
            samples: list, directions: int = 8, accuracy: float = 0.1, group_directions: int = 1,
            certify: int = 4, plane: int = 0, tol: float = 1e-5, max_iter: int = 500, eig_tol: float = 1e-6,
            eig_k: int = 3, seed: int = 0, t_max: float = T_MAX, log=None, restart: str = "auto",
            memory: int = GEOMETRY_BYTES) -> Geometry:
    """The geometry stage on the inputs ``samples`` (indices into ``inputs`` / ``x_star`` / ``x0``): radii along
    ``directions`` directions in all loop parameters and ``group_directions`` per parameter group, both signs;
    anisotropy per input; with ``plane`` > 0 the ρ(J*) picture on a plane × plane grid around the first input
    whose x* attracts. ``attracting`` (per sample of the batch: x* converged and ρ(J*) < 1 at θ*) and
    ``rho_at_theta`` come from the stages before. ``restart``: the eigensolver's (``AnalysisOptions.eig_restart``).
    ``memory``: the bytes of stacked perturbed parameters one search may hold (:data:`GEOMETRY_BYTES`)."""
    say = log or (lambda msg: None)
    sel = torch.tensor(samples, dtype=torch.long, device=x_star.device)
    inp, xs, x0s = inputs[sel], x_star[sel], x0[sel]
    names, outside, in_embed = loop_parameters(model, inp[:1], xs[:1], x0s[:1])
    # the analysis precision (x*'s): a language model's float32-stored embedding perturbed in float64 too
    base = {k: v.detach().to(xs.dtype) if v.is_floating_point() else v.detach()
            for k, v in model.named_parameters() if k in names}
    groups = parameter_groups(model, names, inp[:1], xs[:1], x0s[:1]) if group_directions > 0 else {}
    specs = [("all", j, seed, None, directions) for j in range(directions)]
    for g_i, (label, members) in enumerate(groups.items()):
        specs += [(label, j, seed + 1000 * (g_i + 1), members, group_directions) for j in range(group_directions)]
    D, S = len(specs), len(samples)
    att = [bool(attracting[b]) for b in samples]
    say(f"geometry: {S} sample(s) × {D} directions × 2 signs = {S * 2 * D} radii ({directions} in all loop "
        f"parameters, {group_directions} in each of {len(groups)} groups)")
    search = _Search(model, base, specs, inp, xs, x0s, att, embed_moves=any(k in base for k in in_embed),
                     restart=restart, tol=tol, max_iter=max_iter, accuracy=accuracy, eig_tol=eig_tol, eig_k=eig_k,
                     seed=seed, t_max=t_max, log=say)
    found = search.all(_chunks(D, S, sum(v.numel() * v.element_size() for v in base.values()), memory), certify)
    if search.chunks > 1:
        say(f"geometry: {D} directions in {search.chunks} chunks (each search's stacked parameters ≤ {memory:,} B)")
    geo = _record(found, specs, groups, samples, att, directions, accuracy, certify, t_max)
    geo.rho_at_theta, geo.outside_loop = [rho_at_theta[b] for b in samples], outside
    geo.counts["map_calls"] = search.calls
    geo.evaluation = "vmap over rows" if search.vmap else "one row at a time (the model's code does not vmap)"
    if plane and any(att):
        i = att.index(True)
        say(f"geometry: the plane of directions 1 and 2, {plane} × {plane} cells")
        full = _draw(base, specs, list(range(min(2, directions))))
        geo.plane = plane_picture(model, base, full, inp[i:i + 1], xs[i:i + 1], x0s[i:i + 1], geo.radii[i],
                                  n=plane, tol=tol, max_iter=max_iter, seed=seed, t_max=t_max,
                                  embed_moves=search.embed_moves, restart=restart)
        geo.plane["sample"] = samples[i]
    return geo


def _chunks(D: int, S: int, loop_bytes: int, memory: int) -> list:
    """(samples, directions) searched together: everything at once when every row's parameters and every direction
    fit ``memory``; else runs of k directions over every sample (2·S·k + k parameter sets); else one direction over
    runs of s samples (2·s + 1), s ≥ 1."""
    if (2 * S * D + D) * loop_bytes <= memory:
        return [(list(range(S)), list(range(D)))]
    k = memory // max(1, (2 * S + 1) * loop_bytes)
    if k >= 1:
        return [(list(range(S)), list(range(j, min(D, j + k)))) for j in range(0, D, k)]
    s = max(1, (memory // max(1, loop_bytes) - 1) // 2)
    return [(list(range(i, min(S, i + s))), [j]) for j in range(D) for i in range(0, S, s)]


def _draw(base: dict, specs: list, which: list) -> dict:
    """The directions ``which`` (indices into ``specs``: (label, j, seed, members, count)), name → (len(which),
    *shape): :func:`random_directions`' draws, each draw holding only the directions asked for."""
    parts, by = [], {}
    for w in which:
        label, j, sd, members, count = specs[w]
        by.setdefault((label, sd), (members, count, []))[2].append(j)
    for (label, sd), (members, count, js) in by.items():
        parts.append(random_directions(base, count, sd, members, keep=js))
    return {k: torch.cat([p[k] for p in parts]) for k in base}


class _Search:
    """The radius search of the geometry stage over chunks of directions (:func:`measure`): each chunk one
    :class:`Family` of its rows (sample-major, then direction, then sign (+, −)) and one :func:`search_radii`."""

    def __init__(self, model, base, specs, inp, xs, x0s, att, *, embed_moves, restart, log, **kw):
        self.model, self.base, self.specs, self.inp, self.xs, self.x0s, self.att = model, base, specs, inp, xs, x0s, att
        self.embed_moves, self.restart, self.log, self.kw = embed_moves, restart, log, kw
        self.vmap, self.calls, self.chunks = True, 0, 0

    def chunk(self, samples: list, which: list, certify: int):
        """(the rows' global indices, their :class:`Radii`) of the inputs ``samples`` (indices into the searched
        ones) along the directions ``which``."""
        dev = self.xs.device
        S, K, per = len(samples), len(which), 2 * len(self.specs)
        row_sample = torch.tensor(samples, device=dev).repeat_interleave(2 * K)
        row_dir = torch.arange(K, device=dev).repeat_interleave(2).repeat(S)
        row_sign = torch.tensor([1.0, -1.0], dtype=torch.float64, device=dev).repeat(S * K)
        fam = Family(self.model, self.base, _draw(self.base, self.specs, which), self.inp[row_sample],
                     self.x0s[row_sample], row_dir=row_dir, row_sign=row_sign, embed_moves=self.embed_moves)
        fam.eig_restart = self.restart
        skip = torch.tensor([not self.att[int(s)] for s in row_sample.cpu()])
        found = search_radii(fam, self.xs[row_sample], certify=certify, skip=skip, log=self.log, **self.kw)
        self.vmap, self.calls = self.vmap and fam.vmap, self.calls + fam.calls
        rows = [i * per + 2 * which[j] + g for i in samples for j in range(K) for g in (0, 1)]
        return rows, found

    def all(self, chunks: list, certify: int) -> Radii:
        """Every row's radius, chunk by chunk (the certifications in chunk order, ``certify`` in all)."""
        R = 2 * len(self.specs) * len(self.att)
        out = Radii(radius=[None] * R, lo=[None] * R, hi=[None] * R, reason=[None] * R, rho_lo=[None] * R,
                    certified=[None] * R, rho_hi=[None] * R)
        gaps = []
        for samples, which in chunks:
            rows, f = self.chunk(samples, which, certify)
            certify = max(0, certify - sum(1 for c in f.certified if c))
            for q, r in enumerate(rows):
                for name in ("radius", "lo", "hi", "reason", "rho_lo", "certified", "rho_hi"):
                    getattr(out, name)[r] = getattr(f, name)[q]
            for name in ("evaluations", "rounds", "products", "certified_rho", "reopened"):
                setattr(out, name, getattr(out, name) + getattr(f, name))
            gaps += [] if f.estimate_gap is None else [f.estimate_gap]
        out.estimate_gap, self.chunks = (max(gaps) if gaps else None), len(chunks)
        return out


def _record(found: Radii, specs: list, groups: dict, samples: list, att: list, directions: int, accuracy: float,
            certify: int, t_max: float) -> Geometry:
    """The :class:`Geometry` of the search's radii: per input (its ``directions`` radii in all loop parameters and
    their anisotropy) and per group (the radii of its directions over the attracting inputs)."""
    S, per = len(samples), 2 * len(specs)
    radii, reasons, rho_in, certs, per_sample = [], [], [], [], []
    for i in range(S):
        sl = slice(i * per, i * per + 2 * directions)
        radii.append(found.radius[sl])
        reasons.append(found.reason[sl])
        rho_in.append(found.rho_lo[sl])
        certs.append(found.certified[sl])
        an = anisotropy(found.radius[sl])
        if not att[i]:
            an.update(log_range=None, log_iqr=None, balance=None)
        per_sample.append(an)
    group_out = []
    for label, members in groups.items():
        js = [j for j, spec in enumerate(specs) if spec[0] == label]
        at = [i * per + 2 * j + s for i in range(S) if att[i] for j in js for s in (0, 1)]
        rs, why = [found.radius[q] for q in at], [found.reason[q] for q in at]
        group_out.append({"name": label, "parameters": members, "radii": rs, "reasons": why,
                          "median_radius": median(rs) if rs else None, "min_radius": min(rs) if rs else None,
                          "censored": float(np.mean([w == "t_max" for w in why])) if why else None})
    counts = {"radii": S * per, "rounds": found.rounds, "evaluations": found.evaluations,
              "rho_products": found.products, "certified_rho": found.certified_rho, "map_calls": None,
              "reopened": found.reopened}
    return Geometry(samples=list(samples), attracting=att, rho_at_theta=[], directions=directions,
                    accuracy=accuracy, radii=radii, reasons=reasons, rho_inner=rho_in, certified=certs,
                    per_sample=per_sample, groups=group_out, outside_loop=[], evaluation="", counts=counts,
                    certify=certify, estimate_gap=found.estimate_gap, t_range=(T_MIN, t_max))


def plane_picture(model, base: dict, full: dict, inputs, x_star, x0, radii, *, n: int = 21, tol: float = 1e-5,
                  max_iter: int = 500, seed: int = 0, t_max: float = T_MAX, embed_moves: bool = True,
                  restart: str = "auto") -> dict:
    """ρ(J*) (the search's estimate) over θ* + a·D1 + b·D2 on an n × n grid of a, b ∈ [−s, s], s = 1.5 × the
    largest of the four radii along ±D1, ±D2 (at most ``t_max``): the column a = 0 continued outward from θ*,
    then every row outward from it (each cell warm-started from its neighbour towards θ*). Returns the axes, ρ
    (None where the solve failed or ρ is not finite) and every cell's solver status."""
    n = max(3, int(n) | 1)  # odd: θ* is a grid point
    pos = [r for r in radii[:4] if r is not None and r > 0]
    s = min(t_max, 1.5 * max(pos or [T_START]))
    axis = np.linspace(-s, s, n)
    c = n // 2
    dev = x_star.device
    cells = [(i, j) for i in range(n) for j in range(n)]  # (row i: b = axis[i], column j: a = axis[j])
    coef = torch.tensor([[axis[j], axis[i]] for i, j in cells], dtype=torch.float64, device=dev)
    two = {k: v[:2] for k, v in full.items()}
    R = len(cells)
    fam = Family(model, base, two, inputs.expand(R, *inputs.shape[1:]), x0.expand(R, *x0.shape[1:]), coef=coef,
                 embed_moves=embed_moves)
    fam.eig_restart = restart
    X = x_star.expand(R, *x_star.shape[1:]).clone()
    rho = [[None] * n for _ in range(n)]
    status = [[None] * n for _ in range(n)]

    def run(batch, starts):
        idx = torch.tensor([i * n + j for i, j in batch], device=dev)
        xr, st = solve_rows(fam, X[torch.tensor(starts, device=dev)], idx, tol, max_iter)
        ok = [q for q, v in enumerate(st) if v == "converged"]
        vals = {}
        if ok:
            sub = torch.tensor(ok, device=dev)
            vals = dict(zip(ok, rho_estimate(fam, xr[sub], idx[sub], seed=seed)[0].tolist()))
        for q, (i, j) in enumerate(batch):
            X[i * n + j] = xr[q]
            status[i][j] = st[q]
            v = vals.get(q)
            rho[i][j] = v if v is not None and math.isfinite(v) else None

    run([(c, c)], [c * n + c])
    for d in range(1, c + 1):  # the column a = 0, outward from θ*
        run([(c - d, c), (c + d, c)], [(c - d + 1) * n + c, (c + d - 1) * n + c])
    for d in range(1, c + 1):  # every row, outward from that column
        run([(i, c - d) for i in range(n)] + [(i, c + d) for i in range(n)],
            [i * n + c - d + 1 for i in range(n)] + [i * n + c + d - 1 for i in range(n)])
    return {"a": axis.tolist(), "b": axis.tolist(), "rho": rho, "status": status, "extent": float(s),
            "radii_D1": [radii[0], radii[1]], "radii_D2": [radii[2], radii[3]],
            "rho_source": f"the search's estimate (Krylov–Schur, basis {KRYLOV})"}


# ---- reference models whose stable region is known in closed form ------------------------------------------------

class DiagonalRecall(torch.nn.Module):
    """A linear recall map with a diagonal weight, x ↦ a ⊙ x + x0, as a :class:`~stability.protocols.LoopedModel`
    (embed: the inputs themselves; readout: (x, −x) as two logits per position). J* = diag(a): x* attracts iff
    every |a_i| < 1, so the radius along D is min_i of the smallest t > 0 with |a_i + t·D_i| = 1
    (:func:`diagonal_radius`). With inputs 0 the fixed point is x* = 0 for every a (the solve converges at once),
    so the radius is decided by ρ alone."""

    def __init__(self, a):
        super().__init__()
        self.a = torch.nn.Parameter(torch.as_tensor(a, dtype=torch.float64).clone())

    def embed(self, inputs):
        return inputs

    def initial_state(self, x0, generator=None):
        return x0

    def step(self, x, x0):
        return self.a * x + x0

    def readout(self, x):
        return torch.stack([x, -x], dim=-1)


def diagonal_radius(a, d) -> float:
    """The closed-form radius of :class:`DiagonalRecall` along the parameter direction ``d`` (∞ if none)."""
    a, d = np.asarray(a, dtype=float), np.asarray(d, dtype=float)
    best = math.inf
    for ai, di in zip(a, d):
        if di != 0:
            best = min(best, ((1.0 if di > 0 else -1.0) - ai) / di)
    return best


class Figure5Model(torch.nn.Module):
    """The single-layer model of Figure 5 with one eigen-pair, θ = (λ_g, λ_h) one parameter tensor: external
    recall x ↦ g(x) + h(g(x)) = (1 + λ_h)(λ_g x + x0), internal x ↦ x + h(g(x)) = x + λ_h(λ_g x + x0); J* is
    (1 + λ_h)λ_g or 1 + λ_gλ_h (:mod:`stability.theory.regions`), x* = 0 for inputs 0. The radius along a
    direction has a closed form (:func:`figure5_radius`)."""

    def __init__(self, placement: str, lam_g: float, lam_h: float):
        super().__init__()
        if placement not in ("external", "internal"):
            raise ValueError(f"placement must be external or internal, got {placement!r}")
        self.placement = placement
        self.theta = torch.nn.Parameter(torch.tensor([lam_g, lam_h], dtype=torch.float64))

    def embed(self, inputs):
        return inputs

    def initial_state(self, x0, generator=None):
        return x0

    def step(self, x, x0):
        lg, lh = self.theta[0], self.theta[1]
        u = lg * x + x0
        return (1 + lh) * u if self.placement == "external" else x + lh * u

    def readout(self, x):
        return torch.stack([x, -x], dim=-1)


def figure5_radius(placement: str, theta, d) -> float:
    """The smallest t > 0 at which θ + t·d leaves the open region of Figure 5: external |x(1 + y)| < 1, internal
    −2 < x·y < 0 (the roots of a quadratic in t on each boundary level); ∞ if the ray never leaves it."""
    (x, y), (u, v) = np.asarray(theta, dtype=float), np.asarray(d, dtype=float)
    if placement == "external":  # (x + u t)(1 + y + v t) = ±1
        quad = [(u * v, u * (1 + y) + v * x, x * (1 + y) - c) for c in (1.0, -1.0)]
    else:  # (x + u t)(y + v t) = 0 or −2
        quad = [(u * v, u * y + v * x, x * y - c) for c in (0.0, -2.0)]
    best = math.inf
    for A, B, C in quad:
        roots = np.roots([A, B, C]) if abs(A) > 1e-300 else ([-C / B] if B != 0 else [])
        for t in np.atleast_1d(roots):
            if abs(complex(t).imag) < 1e-12 and complex(t).real > 1e-12:
                best = min(best, float(complex(t).real))
    return best


__all__ = ["DiagonalRecall", "Figure5Model", "Geometry", "anisotropy", "diagonal_radius", "figure5_radius", "measure",
           "plane_picture"]
