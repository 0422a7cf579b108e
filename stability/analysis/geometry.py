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
that exceeds ``memory`` (:data:`GEOMETRY_BYTES`) the directions are searched a chunk at a time, each chunk holding
its own rows and directions only (the same draws). When even one direction's three parameter sets (the direction
and its two signs' rows) exceed it, or one parameter set alone exceeds :data:`IN_PLACE_BYTES` (a language model,
whose loop is most of the model), the directions are applied in place (:class:`~stability.analysis.perturbation.InPlace`): one row at a time, its parameters written
into the model's own, θ* kept once in its stored precision and put back bit for bit after, the directions
regenerated from their draws. Each row's search is its own, so a chunk's radii are those of the whole search up to
the eigensolver's random starts (the bracket's ``accuracy``); the toy models never chunk.

**Reference models** whose stable region is known in closed form (:mod:`stability.analysis.closed_form_regions`)
check the search against exact radii.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from stability.analysis.continuation import solve_rows
from stability.analysis.in_place import InPlace, Theta
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
#: the bytes of one loop parameter set above which the directions are applied in place whatever ``memory`` allows:
#: a map this large keeps the hardware busy one row at a time, so stacking rows buys no speed, only copies of the
#: model (a language model's loop; the paper's width-256 model's is ≈ 8 MB, the toy models' ≈ 0.1 MB: stacked)
IN_PLACE_BYTES = 64 * 2 ** 20


def measure(model, inputs: torch.Tensor, x_star: torch.Tensor, x0: torch.Tensor, attracting, rho_at_theta, *,
            samples: list, directions: int = 8, accuracy: float = 0.1, group_directions: int = 1,
            certify: int = 4, plane: int = 0, tol: float = 1e-5, max_iter: int = 500, eig_tol: float = 1e-6,
            eig_k: int = 3, seed: int = 0, t_max: float = T_MAX, log=None, restart: str = "auto",
            memory: Optional[int] = None) -> Geometry:
    """The geometry stage on the inputs ``samples`` (indices into ``inputs`` / ``x_star`` / ``x0``): radii along
    ``directions`` directions in all loop parameters and ``group_directions`` per parameter group, both signs;
    anisotropy per input; with ``plane`` > 0 the ρ(J*) picture on a plane × plane grid around the first input
    whose x* attracts. ``attracting`` (per sample of the batch: x* converged and ρ(J*) < 1 at θ*) and
    ``rho_at_theta`` come from the stages before. ``restart``: the eigensolver's (``AnalysisOptions.eig_restart``).
    ``memory``: the bytes of stacked perturbed parameters one search may hold (default :data:`GEOMETRY_BYTES`;
    below three loop parameter sets, or with a loop set above :data:`IN_PLACE_BYTES`, the directions are applied in
    place)."""
    memory = GEOMETRY_BYTES if memory is None else int(memory)
    say = log or (lambda msg: None)
    sel = torch.tensor(samples, dtype=torch.long, device=x_star.device)
    inp, xs, x0s = inputs[sel], x_star[sel], x0[sel]
    names, outside, in_embed = loop_parameters(model, inp[:1], xs[:1], x0s[:1])
    loop = {k: v.detach() for k, v in model.named_parameters() if k in names}
    groups = parameter_groups(model, names, inp[:1], xs[:1], x0s[:1]) if group_directions > 0 else {}
    specs = [("all", j, seed, None, directions) for j in range(directions)]
    for g_i, (label, members) in enumerate(groups.items()):
        specs += [(label, j, seed + 1000 * (g_i + 1), members, group_directions) for j in range(group_directions)]
    D, S = len(specs), len(samples)
    att = [bool(attracting[b]) for b in samples]
    say(f"geometry: {S} sample(s) × {D} directions × 2 signs = {S * 2 * D} radii ({directions} in all loop "
        f"parameters, {group_directions} in each of {len(groups)} groups)")
    loop_bytes = sum(v.numel() * xs.element_size() for v in loop.values())
    chunks, in_place = _chunks(D, S, loop_bytes, memory)
    # the analysis precision (x*'s): a language model's float32-stored embedding perturbed in float64 too
    theta = Theta(model, names, xs.dtype) if in_place else None
    base = {} if in_place else {k: v.to(xs.dtype) if v.is_floating_point() else v for k, v in loop.items()}
    search = _Search(model, base, specs, inp, xs, x0s, att, embed_moves=any(k in names for k in in_embed),
                     restart=restart, tol=tol, max_iter=max_iter, accuracy=accuracy, eig_tol=eig_tol, eig_k=eig_k,
                     seed=seed, t_max=t_max, log=say, theta=theta)
    found = search.all(chunks, certify)
    if in_place:
        say(f"geometry: {D} directions applied in place, {S * 2 * D} rows one at a time (θ* kept: "
            f"{theta.nbytes():,} B)")
    elif search.chunks > 1:
        say(f"geometry: {D} directions in {search.chunks} chunks (each search's stacked parameters ≤ {memory:,} B)")
    geo = _record(found, specs, groups, samples, att, directions, accuracy, certify, t_max)
    geo.rho_at_theta, geo.outside_loop = [rho_at_theta[b] for b in samples], outside
    geo.counts["map_calls"] = search.calls
    geo.evaluation = ("in place, one row at a time (the model's own parameters moved and put back)" if in_place
                      else "vmap over rows" if search.vmap else "one row at a time (the model's code does not vmap)")
    if plane and any(att):
        i = att.index(True)
        say(f"geometry: the plane of directions 1 and 2, {plane} × {plane} cells")
        two = list(range(min(2, directions)))
        geo.plane = plane_picture(model, base, None if in_place else _draw(base, specs, two), inp[i:i + 1],
                                  xs[i:i + 1], x0s[i:i + 1], geo.radii[i], n=plane, tol=tol, max_iter=max_iter,
                                  seed=seed, t_max=t_max, embed_moves=search.embed_moves, restart=restart,
                                  in_place=(theta, [specs[w] for w in two]) if in_place else None)
        geo.plane["sample"] = samples[i]
    return geo


def _chunks(D: int, S: int, loop_bytes: int, memory: int) -> tuple:
    """(chunks, in place): the (samples, directions) searched together — everything at once when every row's
    parameters and every direction fit ``memory``; else runs of k directions over every sample (2·S·k + k parameter
    sets); else one direction over runs of s samples (2·s + 1), s ≥ 1; else (not even 3 sets fit, or one set is
    above :data:`IN_PLACE_BYTES`) every (sample, direction) in place, one row at a time."""
    one_at_a_time = [([i], [j]) for j in range(D) for i in range(S)], True
    if loop_bytes > IN_PLACE_BYTES:
        return one_at_a_time
    if (2 * S * D + D) * loop_bytes <= memory:
        return [(list(range(S)), list(range(D)))], False
    k = memory // max(1, (2 * S + 1) * loop_bytes)
    if k >= 1:
        return [(list(range(S)), list(range(j, min(D, j + k)))) for j in range(0, D, k)], False
    s = (memory // max(1, loop_bytes) - 1) // 2
    if s >= 1:
        return [(list(range(i, min(S, i + s))), [j]) for j in range(D) for i in range(0, S, s)], False
    return one_at_a_time


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


def _joined(parts: list) -> Radii:
    """The :class:`Radii` of several searches, their rows one after the other."""
    if len(parts) == 1:
        return parts[0]
    out = Radii(radius=[], lo=[], hi=[], reason=[], rho_lo=[], certified=[], rho_hi=[])
    for f in parts:
        for name in ("radius", "lo", "hi", "reason", "rho_lo", "certified", "rho_hi"):
            getattr(out, name).extend(getattr(f, name))
        for name in ("evaluations", "rounds", "products", "certified_rho", "reopened"):
            setattr(out, name, getattr(out, name) + getattr(f, name))
    gaps = [f.estimate_gap for f in parts if f.estimate_gap is not None]
    out.estimate_gap = max(gaps) if gaps else None
    return out


class _Search:
    """The radius search of the geometry stage over chunks of directions (:func:`measure`): each chunk one
    :class:`Family` of its rows (sample-major, then direction, then sign (+, −)) and one :func:`search_radii`."""

    def __init__(self, model, base, specs, inp, xs, x0s, att, *, embed_moves, restart, log, theta=None, **kw):
        self.model, self.base, self.specs, self.inp, self.xs, self.x0s, self.att = model, base, specs, inp, xs, x0s, att
        self.embed_moves, self.restart, self.log, self.kw, self.theta = embed_moves, restart, log, kw, theta
        self.vmap, self.calls, self.chunks = True, 0, 0

    def family(self, row_sample, row_dir, row_sign, which):
        """The chunk's rows: a :class:`Family` of stacked parameter sets, or (``theta``) the model moved in place."""
        if self.theta is not None:
            return InPlace(self.model, self.theta, [self.specs[w] for w in which], self.inp[row_sample],
                           self.x0s[row_sample], row_dir=row_dir, row_sign=row_sign, embed_moves=self.embed_moves)
        return Family(self.model, self.base, _draw(self.base, self.specs, which), self.inp[row_sample],
                      self.x0s[row_sample], row_dir=row_dir, row_sign=row_sign, embed_moves=self.embed_moves)

    def chunk(self, samples: list, which: list, certify: int):
        """(the rows' global indices, their :class:`Radii`) of the inputs ``samples`` (indices into the searched
        ones) along the directions ``which``."""
        dev = self.xs.device
        S, K, per = len(samples), len(which), 2 * len(self.specs)
        row_sample = torch.tensor(samples, device=dev).repeat_interleave(2 * K)
        row_dir = torch.arange(K, device=dev).repeat_interleave(2).repeat(S)
        row_sign = torch.tensor([1.0, -1.0], dtype=torch.float64, device=dev).repeat(S * K)
        rows = [i * per + 2 * which[j] + g for i in samples for j in range(K) for g in (0, 1)]
        # in place: each row its own search (one parameter set in the model at a time)
        parts = [slice(q, q + 1) for q in range(len(rows))] if self.theta is not None else [slice(None)]
        found = []
        for part in parts:
            fam = self.family(row_sample[part], row_dir[part], row_sign[part], which)
            fam.eig_restart = self.restart
            skip = torch.tensor([not self.att[int(s)] for s in row_sample[part].cpu()])
            try:
                found.append(search_radii(fam, self.xs[row_sample[part]], certify=certify, skip=skip,
                                          log=self.log, **self.kw))
            finally:
                if self.theta is not None:
                    fam.close()
            certify = max(0, certify - sum(1 for c in found[-1].certified if c))
            self.vmap, self.calls = self.vmap and fam.vmap, self.calls + fam.calls
        return rows, _joined(found)

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


def plane_picture(model, base: dict, full: Optional[dict], inputs, x_star, x0, radii, *, n: int = 21,
                  tol: float = 1e-5, max_iter: int = 500, seed: int = 0, t_max: float = T_MAX,
                  embed_moves: bool = True, restart: str = "auto", in_place: Optional[tuple] = None) -> dict:
    """ρ(J*) (the search's estimate) over θ* + a·D1 + b·D2 on an n × n grid of a, b ∈ [−s, s], s = 1.5 × the
    largest of the four radii along ±D1, ±D2 (at most ``t_max``): the column a = 0 continued outward from θ*,
    then every row outward from it (each cell warm-started from its neighbour towards θ*). ``full``: the
    directions (name → (≥ 2, *shape)); or ``in_place`` = (θ*, the two directions' draws): the cells one at a time
    in the model's own parameters (:class:`~stability.analysis.perturbation.InPlace`), θ* put back after. Returns
    the axes, ρ (None where the solve failed or ρ is not finite) and every cell's solver status."""
    n = max(3, int(n) | 1)  # odd: θ* is a grid point
    pos = [r for r in radii[:4] if r is not None and r > 0]
    s = min(t_max, 1.5 * max(pos or [T_START]))
    axis = np.linspace(-s, s, n)
    c = n // 2
    dev = x_star.device
    cells = [(i, j) for i in range(n) for j in range(n)]  # (row i: b = axis[i], column j: a = axis[j])
    coef = torch.tensor([[axis[j], axis[i]] for i, j in cells], dtype=torch.float64, device=dev)
    R = len(cells)
    rows_in, rows_x0 = inputs.expand(R, *inputs.shape[1:]), x0.expand(R, *x0.shape[1:])
    if in_place is None:
        fam = Family(model, base, {k: v[:2] for k, v in full.items()}, rows_in, rows_x0, coef=coef,
                     embed_moves=embed_moves)
    else:
        fam = InPlace(model, in_place[0], in_place[1], rows_in, rows_x0, coef=coef, embed_moves=embed_moves)
    fam.eig_restart = restart
    X = x_star.expand(R, *x_star.shape[1:]).clone()
    rho = [[None] * n for _ in range(n)]
    status = [[None] * n for _ in range(n)]

    def run(batch, starts):
        if in_place is not None and len(batch) > 1:  # in place: one cell (one parameter set) at a time
            for cell, start in zip(batch, starts):
                run([cell], [start])
            return
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

    try:
        run([(c, c)], [c * n + c])
        for d in range(1, c + 1):  # the column a = 0, outward from θ*
            run([(c - d, c), (c + d, c)], [(c - d + 1) * n + c, (c + d - 1) * n + c])
        for d in range(1, c + 1):  # every row, outward from that column
            run([(i, c - d) for i in range(n)] + [(i, c + d) for i in range(n)],
                [i * n + c - d + 1 for i in range(n)] + [i * n + c + d - 1 for i in range(n)])
    finally:
        if in_place is not None:
            fam.close()
    return {"a": axis.tolist(), "b": axis.tolist(), "rho": rho, "status": status, "extent": float(s),
            "radii_D1": [radii[0], radii[1]], "radii_D2": [radii[2], radii[3]],
            "rho_source": f"the search's estimate (Krylov–Schur, basis {KRYLOV})"}


__all__ = ["Geometry", "anisotropy", "measure", "plane_picture"]
