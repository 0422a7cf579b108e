"""The continued Picard solves of the radius search (:mod:`stability.analysis.radii`): every open row of a
:class:`~stability.analysis.perturbation.Family` iterates at once, warm-started from the x* of the largest t known
to attract, and a row whose solve ends moves on to its next t at once, so no row waits for the slowest.

A continued solve is the toolkit's Picard solve (:func:`stability.solvers.solve`, preset
:data:`~stability.solvers.CONTINUED`: its residual and τ, ``max_iter`` evaluations, divergence past
``diverge_ratio`` × the start's scale, non-finite images), row-wise (:class:`Search`: every row starts and ends at
its own pass, at its own parameters), with early stop rules where the outcome is already clear
(:class:`Plateau`): a plateau in a period-k orbit or far from any fixed point (:data:`STALL`), or a residual
falling too slowly to reach τ in the budget (:data:`SLOW`).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from stability.analysis.perturbation import Family
from stability.solvers import CONTINUED, Rows, Run, orbit_period, solve


#: a continued solve whose best residual has not improved by 1 % in STALL evaluations has failed if it sits in a
#: period-k orbit (k ≤ MAX_PERIOD, :func:`stability.solvers.orbit_period`'s criterion at 10·τ, "cycle") or if its
#: best residual is still above STALL_FAR (relative L∞: nowhere near a fixed point, "stalled"); otherwise it goes
#: on to the budget (a residual near τ can plateau and then collapse). The toolkit's solver carries such samples on
#: to its budget and then reports them stalled; measured on the demo checkpoint, past the boundary the continued
#: solves plateau at residuals 0.07–0.7 from the first 25 evaluations and never improve by 1 % in the 500 of the
#: budget, so cutting them at the plateau changes no radius and makes the search affordable.
STALL, MAX_PERIOD, STALL_FAR = 50, 8, 1e-2


#: a continued solve whose best residual, at the rate it fell over the last STALL evaluations, would need more than
#: SLOW × the budget to reach τ has failed ("max-iterations", decided early; checked from 2·STALL evaluations on)
SLOW = 2.0


def _too_slow(it: int, best: float, before: float, tol: float, max_iter: int, slow: float = SLOW) -> bool:
    """Whether a solve at evaluation ``it`` (best residual ``best``, ``before`` STALL evaluations ago) is on course
    to miss τ by ``slow`` × the budget: the geometric rate of the last STALL evaluations extrapolated."""
    if it < 2 * STALL or not (math.isfinite(best) and math.isfinite(before)) or best <= tol:
        return False
    if best >= before:
        return False  # no progress at all: the plateau check decides
    rate = math.log(best / before) / STALL  # < 0
    return it + math.log(tol / best) / rate > slow * max_iter


class Plateau(Rows):
    """The early stop rules of the continued solves, a row-wise option of :func:`stability.solvers.solve`: a row
    whose residual has not improved by 1 % in :data:`STALL` evaluations is checked for a period-k orbit on its last
    2·MAX_PERIOD + 1 iterates (kept here, a ring per row, so f is not evaluated again) and for a best residual
    above :data:`STALL_FAR`: either ends it (status stalled; ``period`` k ≥ 2 for a cycle), otherwise it goes on
    and is checked again STALL evaluations later. With ``slow`` (:data:`SLOW`) a row is also ended, as
    max-iterations, when its residual falls too slowly to reach τ within ``slow`` × the budget.

    ``far_from``: the residual compared with STALL_FAR, the best one (``"best"``) or the one of the last 1 %
    improvement (``"ref"``, ≥ the best by < 1 %): the single-t solves of the certification and of the plane
    picture (:data:`SINGLE_T`) always compared that one and never had the SLOW rule; kept so, their numbers are
    the same bits as before."""

    L = 2 * MAX_PERIOD + 1

    def __init__(self, R: int, shape: tuple, dtype, device, *, slow: Optional[float] = SLOW, far_from: str = "best"):
        self.ring = torch.zeros((R, self.L, *shape), dtype=dtype, device=device)
        self.count = torch.zeros(R, dtype=torch.long, device=device)
        self.mark = torch.full((R,), math.inf, dtype=torch.float64, device=device)  # best, STALL evaluations ago
        self.slow, self.far_from = slow, far_from
        self.slowed: list = []
        self.plateaued: list = []

    def reset(self, rows: torch.Tensor) -> None:
        """Rows that start a new solve."""
        self.count[rows] = 0
        self.mark[rows] = math.inf

    def stop(self, run: Run) -> None:
        self.slowed, self.plateaued = [], []
        if self.slow is not None:
            self._slow(run)
        if run.cur is None:
            return
        act = run.act
        self.ring[act, self.count[act] % self.L] = run.cur.fx
        self.count[act] += 1
        plateau = run.age[act] - run.last_improve[act] >= STALL
        if not bool(plateau.any()):
            return
        rows = act[plateau]
        per = self.period(rows, run.how.tol, run.how.eps)
        best = (run.best_r if self.far_from == "best" else run.ref_r)[rows]
        fail = (per > 0) | (best > STALL_FAR)
        again = rows[~fail]
        run.last_improve[again] = run.age[again]  # checked again STALL evaluations from now
        if bool(fail.any()):
            mask = torch.zeros_like(plateau)
            mask[plateau] = fail
            self.plateaued = rows[fail].tolist()
            run.stop(mask, "stalled", period=per[fail])

    def _slow(self, run: Run) -> None:
        """The SLOW rule on the rows due (every STALL evaluations of their own)."""
        due = run.age[run.act] % STALL == 0
        if not bool(due.any()):
            return
        rows = run.act[due]
        tol, max_iter = run.how.tol, run.how.max_iter
        ages, best, before = run.age[rows].tolist(), run.best_r[rows].tolist(), self.mark[rows].tolist()
        slow = torch.tensor([_too_slow(a, b, m, tol, max_iter, self.slow) for a, b, m in zip(ages, best, before)],
                            device=due.device)
        self.mark[rows] = run.best_r[rows]
        if bool(slow.any()):
            mask = torch.zeros_like(due)
            mask[due] = slow
            self.slowed = rows[slow].tolist()
            run.stop(mask, "max-iterations")

    def period(self, rows: torch.Tensor, tol: float, eps: float = 1e-8) -> torch.Tensor:
        """The period k ≥ 2 of an orbit through each row's last iterates (at 10·τ), 0 where none (or too few)."""
        c = self.count[rows]
        order = (c[:, None] + torch.arange(self.L, device=c.device)) % self.L  # oldest first
        per = orbit_period(self.ring[rows[:, None], order], MAX_PERIOD, 10 * tol, eps)
        return torch.where((c >= self.L) & (per >= 2), per, torch.zeros_like(per))


#: the single-t solves of the search (the certification's, at hi) and of the plane picture: the stop rules of
#: :class:`Plateau` as these solves always had them (no SLOW rule; STALL_FAR on the reference residual)
SINGLE_T = {"slow": None, "far_from": "ref"}


def solve_rows(fam: Family, x_init: torch.Tensor, rows: torch.Tensor, tol: float, max_iter: int,
               diverge_ratio: float = 1e6) -> tuple:
    """The continued Picard solve of a batch of rows at their current parameters (:func:`stability.solvers.solve`,
    preset CONTINUED, with the :data:`SINGLE_T` stop rules). Returns (x (A, *S): x* where converged, else the
    last image before the solve ended; statuses: those of the solver, a stalled row in a period-k orbit ``cycle``)."""
    stop = Plateau(int(rows.numel()), tuple(x_init.shape[1:]), x_init.dtype, x_init.device, **SINGLE_T)
    res = solve(fam.step, x_init, rows, CONTINUED.replace(tol=tol, max_iter=max_iter, diverge_ratio=diverge_ratio),
                rows=stop)
    conv = res.converged.to(x_init.device).view(-1, *[1] * (x_init.dim() - 1))
    status = ["cycle" if s == "stalled" and p >= 2 else s for s, p in zip(res.status, res.period.tolist())]
    return torch.where(conv, res.x_best, res.x_last), status


class Search(Plateau):
    """The radius search's schedule of continued solves, row-wise (:class:`~stability.solvers.Rows`): every row
    that is not finished starts at its next t from its x_lo; a row that converges waits for one batched ρ
    (estimate, or certified for ``strict`` rows), taken when the waiting rows are at least as many as the
    iterating ones (or none iterates), while the others iterate on; a decided or failed row moves on to its next
    t at once. ``finished``, ``next_t``, ``decide``, ``rho_of`` and the record ``out``: those of
    :func:`stability.analysis.radii.search_radii`."""

    rowwise = True

    def __init__(self, fam: Family, x_lo, done, finished, next_t, decide, strict, rho_of, out, log=None):
        super().__init__(int(x_lo.shape[0]), tuple(x_lo.shape[1:]), x_lo.dtype, x_lo.device, slow=SLOW)
        self.fam, self.x_lo, self.done, self.strict, self.out, self.log = fam, x_lo, done, strict, out, log
        self.finished, self.next_t, self.decide, self.rho_of = finished, next_t, decide, rho_of
        R = len(done)
        self.t = [0.0] * R
        self.state = ["idle"] * R  # idle (needs a t) | iterating | waiting (converged, needs ρ) | done
        self.passes = 0
        self.begun = False

    def start(self, run: Run, rows: list) -> None:
        """Rows not finished start their next t from their x_lo; the others are done."""
        go = []
        for r in rows:
            if self.done[r] or self.finished(r):
                self.done[r], self.state[r] = True, "done"
                continue
            go.append(r)
        if not go:
            return
        ts = [self.next_t(r) for r in go]
        idx = torch.tensor(go, dtype=torch.long, device=self.x_lo.device)
        self.fam.set_t(idx, torch.tensor(ts, dtype=torch.float64))
        run.restart(idx, self.x_lo[idx])
        self.reset(idx)
        for r, t in zip(go, ts):
            self.t[r], self.state[r] = t, "iterating"
        self.out.evaluations += len(go)

    def before(self, run: Run) -> None:
        if not self.begun:
            self.begun = True
            self.start(run, list(range(len(self.done))))
        wait = [r for r, s in enumerate(self.state) if s == "waiting"]
        iterating = int(run.act.numel())
        if not wait or (iterating and len(wait) < iterating):
            return
        for flag in (False, True):  # one batched ρ for the waiting rows (estimates, then certified ones)
            rows = [r for r in wait if self.strict[r] == flag]
            if not rows:
                continue
            idx = torch.tensor(rows, dtype=torch.long, device=self.x_lo.device)
            xs = run.x_best[idx]  # x* of the converged solve: the iterate whose residual was below τ
            rho = self.rho_of(xs, idx, flag)
            for i, r in enumerate(rows):
                good = math.isfinite(rho[i]) and rho[i] < 1.0
                self.decide(r, self.t[r], good, xs[i], rho[i], "rho", flag)
                self.state[r] = "idle"
        self.start(run, wait)

    def after(self, run: Run) -> None:
        self.passes += 1
        first = run.ended[0]  # the rows the evaluation ended (converged, non-finite, diverged, out of budget)
        ended = first.tolist() if first.numel() else []
        why = dict(zip(ended, run.status(first))) if ended else {}
        for r in ended:
            if why[r] == "converged":
                self.state[r] = "waiting"
        failed = sorted([r for r in ended if why[r] != "converged"] + self.slowed)
        periods = run.period[torch.tensor(self.plateaued, dtype=torch.long, device=run.period.device)].tolist() \
            if self.plateaued else []
        why.update({r: "max-iterations" for r in self.slowed})
        why.update({r: "cycle" if p >= 2 else "stalled" for r, p in zip(self.plateaued, periods)})
        for r in failed + self.plateaued:
            self.decide(r, self.t[r], False, None, None, why[r], self.strict[r])
            self.state[r] = "idle"
        self.start(run, failed + self.plateaued)
        if self.log is not None and self.passes % 200 == 0:
            self.log(f"geometry: {sum(1 for d in self.done if not d)} of {len(self.done)} radii open")


def continuation(fam: Family, x_star, x_lo, done, finished, next_t, decide, strict, rho_of, out, *, tol: float,
                 max_iter: int, log=None, diverge_ratio: float = 1e6) -> None:
    """Run every open row's search until each one's bracket is finished (``finished``, ``next_t``, ``decide``,
    ``rho_of`` and the record ``out``: those of :func:`stability.analysis.radii.search_radii`): one solve
    (:func:`stability.solvers.solve`, preset CONTINUED, row-wise by :class:`Search`) in which every iterating row
    takes one batched step per pass."""
    search = Search(fam, x_lo, done, finished, next_t, decide, strict, rho_of, out, log)
    rows = torch.arange(int(x_star.shape[0]), device=x_star.device)
    solve(fam.step, x_lo, rows, CONTINUED.replace(tol=tol, max_iter=max_iter, diverge_ratio=diverge_ratio),
          rows=search)
    out.rounds += search.passes
