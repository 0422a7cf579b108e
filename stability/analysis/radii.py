"""The radius of stability (Section 3.2's geometry axis), searched along directions in parameter space.

**Radius of stability.** For a direction D in parameter space the radius r(D) is the smallest t > 0 at which the
fixed point of one input stops being attracting along θ* + t·D (:mod:`stability.analysis.perturbation`): the Picard
solve of the perturbed map fails (:func:`stability.solvers.solve`, the analysis' own τ and budget: any status but
``converged``), or ρ(J*) reaches 1 (Props. 3–4: x* attracts iff ρ(J*) < 1). The solve at each t is continued:
warm-started from the x* of the largest t known to be attracting, so the search follows the fixed point the model
reaches rather than jumping to another (:mod:`stability.analysis.continuation`). Both signs of each direction are
measured (±D are two radii).

**The search.** Each radius is bracketed on the grid T_START·GROWTH^k (0.1·√2^k: up while attracting, down towards
:data:`T_MIN` while not), then bisected in log t until the bracket [lo, hi] has hi/lo ≤ 1 + ``accuracy``; the
radius is √(lo·hi), within ``accuracy``/2 of the crossing. A window of instability narrower than one grid step is
stepped over, so the radius is the first crossing the grid sees. A radius past :data:`T_MAX` (1: a perturbation
as large as the weights) is censored there; one below T_MIN is 0 ("unstable at t → 0"). Inside the search ρ(J*) is
a cheap estimate: :func:`stability.numerics.spectra.spectral_radius`, route ``krylov`` on Jᵀ with a basis of
:data:`KRYLOV` vectors and at most :data:`RESTARTS` restarts (Ritz residual :data:`ESTIMATE_TOL`). The final ρ is
certified on a few radii (``certify``: the first ones, in sample then direction order, whose crossing ρ decided):
at both ends of their bracket by the same function with route ``auto`` (LAPACK on the dense J for n ≤ 256,
Krylov–Schur to Ritz residual ``eig_tol`` above); a certified value
that reverses a decision re-opens that bracket, searched again with certified ρ. Every open radius iterates at
once: the perturbed parameters of all rows are stacked and the map is vmapped over them (a loop over rows where the
model's code cannot be vmapped; the geometry block's ``evaluation`` says which), and a radius whose solve ends
moves on to its next t at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from stability.analysis.continuation import continuation, solve_rows
from stability.analysis.perturbation import Family
from stability.numerics import Linearisation, spectral_radius

#: first t tried (relative perturbation) and the factor between bracket steps
T_START, GROWTH = 0.1, math.sqrt(2.0)
#: a radius below T_MIN counts as 0 (unstable at t → 0); one at T_MAX or beyond is censored there
T_MIN, T_MAX = 1e-4, 1.0
#: the cheap ρ estimate inside the search: Krylov–Schur basis, restarts, Ritz-residual tolerance
KRYLOV, RESTARTS, ESTIMATE_TOL = 20, 2, 1e-3


def rho_estimate(fam: Family, x: torch.Tensor, rows: torch.Tensor, seed: int = 0) -> tuple:
    """The cheap ρ(J*) of the search for the rows ``rows`` at states ``x``: Krylov–Schur on Jᵀ with a basis of
    :data:`KRYLOV` vectors, at most :data:`RESTARTS` restarts, to Ritz residual :data:`ESTIMATE_TOL`. Returns
    (ρ (A,), Ritz residual (A,), products). The eigensolver's restart: the family's ``eig_restart``."""
    spec = spectral_radius(Linearisation(fam.step, x, rows), route="krylov", krylov=KRYLOV, restarts=RESTARTS,
                           tol=ESTIMATE_TOL, k=3, seed=seed, restart=fam.eig_restart)
    return spec.rho.double().cpu(), spec.ritz_residual.double().cpu(), int(spec.matvecs)


def rho_certified(fam: Family, x: torch.Tensor, rows: torch.Tensor, *, tol: float = 1e-6, k: int = 3,
                  seed: int = 0) -> torch.Tensor:
    """ρ(J*) of the rows by :func:`stability.numerics.spectra.spectral_radius`, route ``auto`` (dense LAPACK for
    n ≤ DENSE_MAX, Krylov–Schur to Ritz residual ``tol`` above)."""
    return spectral_radius(Linearisation(fam.step, x, rows), tol=tol, k=k, seed=seed,
                           restart=fam.eig_restart).rho.double().cpu()


@dataclass
class Radii:
    """The radii of a set of rows (one row: one input, one direction, one sign), with their brackets."""

    radius: list
    lo: list
    hi: list
    reason: list  # why hi does not attract: "rho", a solver status, "t_max" (censored), "not attracting at θ*"
    rho_lo: list  # ρ at lo: the estimate, or the certified value where ``certified``
    certified: list
    rho_hi: list = field(default_factory=list)
    evaluations: int = 0
    rounds: int = 0
    products: int = 0
    certified_rho: int = 0
    estimate_gap: Optional[float] = None  # the largest |estimate − certified| at the certified bracket ends
    reopened: int = 0


class _Brackets:
    """Every row's bracket [lo, hi] of the search, its decisions and the record ``out`` (:func:`search_radii`)."""

    def __init__(self, fam: Family, x_star: torch.Tensor, *, tol, max_iter, accuracy, eig_tol, eig_k, seed, t_start,
                 t_min, t_max, growth, skip):
        R = int(x_star.shape[0])
        self.fam, self.R, self.dev = fam, R, x_star.device
        self.tol, self.max_iter, self.accuracy, self.eig_tol, self.eig_k, self.seed = (tol, max_iter, accuracy,
                                                                                       eig_tol, eig_k, seed)
        self.t_start, self.t_min, self.t_max, self.growth = t_start, t_min, t_max, growth
        self.lo = [0.0] * R
        self.hi = [math.inf] * R
        self.x_lo = x_star.detach().clone()
        self.rho_lo: list = [None] * R
        self.rho_hi: list = [None] * R
        self.reason: list = [None] * R
        self.cert = [False] * R
        self.strict = [False] * R  # rows whose bracket a certified ρ re-opened: searched on with certified ρ
        self.history: list = [[(0.0, x_star[r].detach().clone(), None)] for r in range(R)]  # attracting (t, x*, ρ)
        self.done = [False] * R
        if skip is not None:
            for r in skip.nonzero().flatten().tolist():
                self.done[r], self.reason[r], self.hi[r] = True, "not attracting at θ*", 0.0
        self.out = Radii(radius=[], lo=[], hi=[], reason=[], rho_lo=[], certified=[])
        self.gaps: list = []

    def next_t(self, r: int) -> float:
        lo, hi = self.lo[r], self.hi[r]
        if math.isinf(hi):
            return min(self.t_max, self.t_start if lo == 0 else lo * self.growth)
        if lo == 0:
            return hi / self.growth
        return math.sqrt(lo * hi)

    def finished(self, r: int) -> bool:
        lo, hi = self.lo[r], self.hi[r]
        if math.isinf(hi):
            return lo >= self.t_max
        if lo == 0:
            return hi <= self.t_min
        return hi / lo <= 1 + self.accuracy

    def rho_of(self, xs, idx, certified: bool) -> list:
        if certified:
            self.out.certified_rho += int(idx.numel())
            return [float(v) for v in rho_certified(self.fam, xs, idx, tol=self.eig_tol, k=self.eig_k,
                                                    seed=self.seed)]
        est, _, prods = rho_estimate(self.fam, xs, idx, seed=self.seed)
        self.out.products += prods
        return [float(v) for v in est]

    def evaluate(self, rows: list, ts: list, x_init: torch.Tensor, certified: bool) -> tuple:
        """(x per row, converged flags, ρ per row (None where the solve failed)) at t = ts."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.dev)
        self.fam.set_t(idx, torch.tensor(ts, dtype=torch.float64))
        xr, st = solve_rows(self.fam, x_init, idx, self.tol, self.max_iter)
        conv = [v == "converged" for v in st]
        rho: list = [None] * len(rows)
        ok = [i for i, c in enumerate(conv) if c]
        if ok:
            sub = torch.tensor(ok, device=self.dev)
            for i, v in zip(ok, self.rho_of(xr[sub], idx[sub], certified)):
                rho[i] = v
        self.out.evaluations += len(rows)
        return xr, conv, rho

    def decide(self, r: int, t: float, good: bool, x_conv, rho, why: str, certified: bool) -> None:
        if good:
            self.lo[r], self.rho_lo[r], self.cert[r] = t, rho, certified
            self.x_lo[r] = x_conv
            self.history[r].append((t, x_conv.clone(), rho))
            if t >= self.t_max:
                self.reason[r] = "t_max"
        else:
            self.hi[r], self.rho_hi[r], self.reason[r] = t, rho, why

    def certify(self, picks: list) -> None:
        """ρ certified at both ends of the brackets ``picks``; a bracket the certified values reverse re-opens."""
        lo, hi, out = self.lo, self.hi, self.out
        idx = torch.tensor(picks, device=self.dev)
        self.fam.set_t(idx, torch.tensor([lo[r] for r in picks], dtype=torch.float64))
        c_lo = self.rho_of(self.x_lo[idx], idx, True)
        x_hi, conv, c_hi = self.evaluate(picks, [hi[r] for r in picks], self.x_lo[idx], True)
        for i, r in enumerate(picks):
            self.gaps += [abs(c_lo[i] - self.rho_lo[r])] if self.rho_lo[r] is not None else []
            self.gaps += [abs(c_hi[i] - self.rho_hi[r])] if c_hi[i] is not None and self.rho_hi[r] is not None else []
            self.rho_lo[r], self.rho_hi[r], self.cert[r] = c_lo[i], c_hi[i], True
            if not c_lo[i] < 1.0:  # ρ(lo) ≥ 1 after all: the crossing lies below lo
                hi[r] = lo[r]
                t, x, _ = max((h for h in self.history[r] if h[0] < lo[r]), key=lambda h: h[0])
                lo[r], self.rho_lo[r] = t, None
                self.x_lo[r] = x
            elif conv[i] and c_hi[i] < 1.0:  # attracting at hi after all: the crossing lies above it
                lo[r], hi[r] = hi[r], math.inf
                self.x_lo[r] = x_hi[i]
                self.history[r].append((lo[r], self.x_lo[r].clone(), c_hi[i]))
            else:
                continue
            self.strict[r], self.done[r], self.reason[r] = True, False, None
            out.reopened += 1

    def radii(self) -> Radii:
        """The record: every row's radius (√(lo·hi), lo where censored, 0 below T_MIN) and its bracket."""
        out, lo, hi, reason = self.out, self.lo, self.hi, self.reason
        for r in range(self.R):
            if reason[r] == "not attracting at θ*" or lo[r] == 0:
                out.radius.append(0.0)
            elif math.isinf(hi[r]):
                out.radius.append(float(lo[r]))
                reason[r] = "t_max"
            else:
                out.radius.append(math.sqrt(lo[r] * hi[r]))
            out.lo.append(float(lo[r]))
            out.hi.append(None if math.isinf(hi[r]) else float(hi[r]))
        out.reason, out.rho_lo, out.certified, out.rho_hi = reason, self.rho_lo, self.cert, self.rho_hi
        out.estimate_gap = max(self.gaps) if self.gaps else None
        return out


def search_radii(fam: Family, x_star: torch.Tensor, *, tol: float, max_iter: int, accuracy: float,
                 certify: int = 0, eig_tol: float = 1e-6, eig_k: int = 3, seed: int = 0,
                 t_start: float = T_START, t_min: float = T_MIN, t_max: float = T_MAX, growth: float = GROWTH,
                 skip: Optional[torch.Tensor] = None, log=None) -> Radii:
    """The radius of every row of ``fam`` (module docstring). ``x_star`` (R, *S): each row's x* at θ*; rows with
    ``skip`` set (x* does not attract at θ*) get radius 0 without a search. Every open row iterates at once
    (:func:`~stability.analysis.continuation.continuation`); then the certification of the first ``certify``
    brackets that ρ decided."""
    b = _Brackets(fam, x_star, tol=tol, max_iter=max_iter, accuracy=accuracy, eig_tol=eig_tol, eig_k=eig_k,
                  seed=seed, t_start=t_start, t_min=t_min, t_max=t_max, growth=growth, skip=skip)
    while True:
        # the search: every open row iterates its own continued Picard solve; a row whose solve ends (converged
        # and ρ decided, or failed) moves on to its next t at once, so no row waits for the slowest
        continuation(fam, x_star, b.x_lo, b.done, b.finished, b.next_t, b.decide, b.strict, b.rho_of, b.out,
                     tol=tol, max_iter=max_iter, log=log)
        if not all(b.done):
            continue
        # the final ρ: certified at both ends of the first ``certify`` brackets that ρ decided
        picks = [r for r in range(b.R) if b.reason[r] == "rho" and b.lo[r] > 0 and not b.cert[r]][:certify]
        if not picks:
            break
        certify -= len(picks)
        b.certify(picks)
    return b.radii()
