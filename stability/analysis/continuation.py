"""The continued Picard solves of the radius search (:mod:`stability.analysis.radii`): every open row of a
:class:`~stability.analysis.perturbation.Family` iterates at once, warm-started from the x* of the largest t known
to attract, and a row whose solve ends moves on to its next t at once, so no row waits for the slowest.

A continued solve fails as the toolkit's Picard solve does (:func:`stability.solvers.solve`: not below τ within the
budget, diverged, non-finite), and earlier where that outcome is already clear: a plateau in a period-k orbit or far
from any fixed point (:data:`STALL`), or a residual falling too slowly to reach τ in the budget (:data:`SLOW`).
"""

from __future__ import annotations

import math

import torch

from stability.analysis.perturbation import Family


#: a continued solve whose best residual has not improved by 1 % in STALL evaluations has failed if it sits in a
#: period-k orbit (k ≤ MAX_PERIOD, :func:`stability.solvers.detect_period`'s criterion at 10·τ, "cycle") or if its
#: best residual is still above STALL_FAR (relative L∞: nowhere near a fixed point, "stalled"); otherwise it goes
#: on to the budget (a residual near τ can plateau and then collapse). The toolkit's solver carries such samples on
#: to its budget and then reports them stalled; measured on the demo checkpoint, past the boundary the continued
#: solves plateau at residuals 0.07–0.7 from the first 25 evaluations and never improve by 1 % in the 500 of the
#: budget, so cutting them at the plateau changes no radius and makes the search affordable.
STALL, MAX_PERIOD, STALL_FAR = 50, 8, 1e-2


#: a continued solve whose best residual, at the rate it fell over the last STALL evaluations, would need more than
#: SLOW × the budget to reach τ has failed ("max-iterations", decided early; checked from 2·STALL evaluations on)
SLOW = 2.0


def _too_slow(it: int, best: float, before: float, tol: float, max_iter: int) -> bool:
    """Whether a solve at evaluation ``it`` (best residual ``best``, ``before`` STALL evaluations ago) is on course
    to miss τ by the budget: the geometric rate of the last STALL evaluations extrapolated."""
    if it < 2 * STALL or not (math.isfinite(best) and math.isfinite(before)) or best <= tol:
        return False
    if best >= before:
        return False  # no progress at all: the plateau check decides
    rate = math.log(best / before) / STALL  # < 0
    return it + math.log(tol / best) / rate > SLOW * max_iter


class _Orbits:
    """The last 2·MAX_PERIOD + 1 iterates of every row (a ring per row), so that a plateau can be checked for a
    period-k orbit with :func:`stability.solvers.detect_period`'s criterion without evaluating f again: the
    smallest k ≤ MAX_PERIOD with ‖y_{s+k} − y_s‖∞ / (‖y_{s+k}‖∞ + ε) < 10·τ for every s ∈ [0, MAX_PERIOD]."""

    L = 2 * MAX_PERIOD + 1

    def __init__(self, R: int, shape: tuple, dtype, device):
        self.buf = torch.empty((R, self.L, *shape), dtype=dtype, device=device)
        self.count = torch.zeros(R, dtype=torch.long)

    def reset(self, rows: list) -> None:
        self.count[rows] = 0

    def push(self, rows: list, y: torch.Tensor) -> None:
        r = torch.tensor(rows, dtype=torch.long)
        self.buf[r.to(self.buf.device), (self.count[r] % self.L).to(self.buf.device)] = y
        self.count[r] += 1

    def period(self, rows: list, tol: float, eps: float = 1e-8) -> list:
        """The period k ≥ 2 of an orbit through each row's last iterates, 0 where none (or too few iterates)."""
        out = []
        for r in rows:
            c = int(self.count[r])
            if c < self.L:
                out.append(0)
                continue
            order = [(c + j) % self.L for j in range(self.L)]  # oldest first
            Y = self.buf[r, order].flatten(1)
            found = 0
            for k in range(1, MAX_PERIOD + 1):
                d = (Y[k:k + MAX_PERIOD + 1] - Y[:MAX_PERIOD + 1]).abs().amax(1)
                if bool((d / (Y[k:k + MAX_PERIOD + 1].abs().amax(1) + eps) < 10 * tol).all()):
                    found = k
                    break
            out.append(found if found >= 2 else 0)
        return out


def picard_rows(fam: Family, x_init: torch.Tensor, rows: torch.Tensor, tol: float, max_iter: int,
                diverge_ratio: float = 1e6):
    """The continued Picard solve of the search for a batch of rows at their current parameters, with
    :func:`stability.solvers.solve`'s criteria (its residual and τ, ``max_iter`` evaluations, divergence past
    ``diverge_ratio`` × the start's scale, non-finite images) and the cycle check of :data:`STALL`. Returns
    (x (A, *S): x* where converged, else the last iterate; statuses: converged, cycle, diverged, non-finite,
    max-iterations)."""
    from stability.solvers import residual

    A = int(rows.numel())
    dev = x_init.device
    x = x_init.detach().clone()
    status: list = [None] * A
    best = [math.inf] * A
    last = [0] * A
    scale = [max(1.0, float(v)) for v in x.flatten(1).abs().amax(1).tolist()]
    act = list(range(A))
    it = 0
    orbits = _Orbits(A, tuple(x.shape[1:]), x.dtype, dev)
    with torch.no_grad():
        while act and it < max_iter:
            it += 1
            ia = torch.tensor(act, device=dev)
            xa = x[ia]
            fa = fam.step(xa, rows[ia])
            fin = torch.isfinite(fa.flatten(1)).all(1).tolist()
            r = residual(fa, xa).double().tolist()
            nrm = torch.maximum(fa.flatten(1).abs().amax(1), xa.flatten(1).abs().amax(1)).double().tolist()
            nxt, plateau = [], []
            for q, i in enumerate(act):
                if not fin[q]:
                    status[i] = "non-finite"
                elif r[q] < tol:
                    status[i] = "converged"
                elif nrm[q] > diverge_ratio * scale[i]:
                    status[i] = "diverged"
                else:
                    if r[q] < 0.99 * best[i]:
                        best[i], last[i] = r[q], it
                    x[i] = fa[q]
                    nxt.append(i)
                    if it - last[i] >= STALL:
                        plateau.append(i)
            if nxt:
                orbits.push(nxt, x[torch.tensor(nxt, device=dev)])
            if plateau:
                for i, per in zip(plateau, orbits.period(plateau, tol)):
                    if per or best[i] > STALL_FAR:
                        status[i] = "cycle" if per else "stalled"
                        nxt.remove(i)
                    else:
                        last[i] = it
            act = nxt
    for i in act:
        status[i] = "max-iterations"
    return x, status


def continuation(fam: Family, x_star, x_lo, done, finished, next_t, decide, strict, rho_of, out, *, tol: float,
                 max_iter: int, log=None, diverge_ratio: float = 1e6) -> None:
    """Run every open row's search until each one's bracket is finished (``finished``, ``next_t``, ``decide``,
    ``rho_of`` and the record ``out``: those of :func:`stability.analysis.radii.search_radii`): one batched step of
    all iterating rows per pass; converged rows wait for one batched ρ (estimate, or certified for ``strict`` rows)
    while the others iterate on; a decided row starts its next t from its x_lo. The solve's criteria are
    :func:`stability.solvers.solve`'s Picard ones (its residual and τ, ``max_iter`` evaluations, ‖f‖ past
    ``diverge_ratio`` × the start's scale is divergence, a non-finite image fails), plus :data:`STALL`."""
    from stability.solvers import residual

    R = int(x_star.shape[0])
    dev = x_star.device
    x = x_lo.clone()
    t_cur = [0.0] * R
    it = [0] * R
    best = [math.inf] * R
    ref = [math.inf] * R
    last = [0] * R
    scale = [1.0] * R
    state = ["idle"] * R  # idle (needs a t) | iterating | waiting (converged, needs ρ) | done
    mark = [math.inf] * R  # the best residual STALL evaluations ago (for _too_slow)
    waiting_x: dict = {}
    passes = 0
    orbits = _Orbits(R, tuple(x_star.shape[1:]), x_star.dtype, dev)

    def start(rows: list) -> None:
        go = []
        for r in rows:
            if done[r] or finished(r):
                done[r], state[r] = True, "done"
                continue
            go.append(r)
        if not go:
            return
        ts = [next_t(r) for r in go]
        idx = torch.tensor(go, dtype=torch.long, device=dev)
        fam.set_t(idx, torch.tensor(ts, dtype=torch.float64))
        x[idx] = x_lo[idx]
        orbits.reset(go)
        for r, t in zip(go, ts):
            t_cur[r], it[r], best[r], ref[r], last[r], state[r] = t, 0, math.inf, math.inf, 0, "iterating"
            mark[r] = math.inf
            scale[r] = max(1.0, float(x_lo[r].abs().max()))
        out.evaluations += len(go)

    start(list(range(R)))
    while True:
        run = [r for r in range(R) if state[r] == "iterating"]
        wait = [r for r in range(R) if state[r] == "waiting"]
        if wait and (not run or len(wait) >= max(1, len(run))):
            for flag in (False, True):
                rows = [r for r in wait if strict[r] == flag]
                if not rows:
                    continue
                idx = torch.tensor(rows, dtype=torch.long, device=dev)
                xs = torch.stack([waiting_x.pop(r) for r in rows])
                rho = rho_of(xs, idx, flag)
                for i, r in enumerate(rows):
                    good = math.isfinite(rho[i]) and rho[i] < 1.0
                    decide(r, t_cur[r], good, xs[i], rho[i], "rho", flag)
                    state[r] = "idle"
            start([r for r in wait])
            continue
        if not run:
            break
        passes += 1
        idx = torch.tensor(run, dtype=torch.long, device=dev)
        with torch.no_grad():
            xa = x[idx]
            fa = fam.step(xa, idx)
        finite = torch.isfinite(fa.flatten(1)).all(1)
        r_all = residual(fa, xa).double().cpu().tolist()
        norm = torch.maximum(fa.flatten(1).abs().amax(1), xa.flatten(1).abs().amax(1)).double().cpu().tolist()
        finite = finite.cpu().tolist()
        ended, plateau = [], []
        for i, r in enumerate(run):
            it[r] += 1
            res_r = r_all[i] if finite[i] else math.nan
            if finite[i] and res_r < tol:
                state[r] = "waiting"
                waiting_x[r] = xa[i].clone()
                continue
            why = None
            if not finite[i]:
                why = "non-finite"
            elif norm[i] > diverge_ratio * scale[r]:
                why = "diverged"
            else:
                if res_r < best[r]:
                    best[r] = res_r
                if res_r < 0.99 * ref[r]:
                    ref[r], last[r] = res_r, it[r]
                if it[r] % STALL == 0:
                    if _too_slow(it[r], best[r], mark[r], tol, max_iter):
                        why = "max-iterations"
                    mark[r] = best[r]
                if it[r] >= max_iter:
                    why = "max-iterations"
                elif why is None and it[r] - last[r] >= STALL:
                    plateau.append(r)
            if why is not None:
                decide(r, t_cur[r], False, None, None, why, strict[r])
                state[r] = "idle"
                ended.append(r)
        keep = [i for i, r in enumerate(run) if state[r] == "iterating"]
        if keep:
            k = torch.tensor(keep, device=dev)
            x[idx[k]] = fa[k]
            orbits.push([run[i] for i in keep], fa[k])
        if plateau:  # a plateau: a period-k orbit ends the solve as failed, otherwise it goes on
            for r, per in zip(plateau, orbits.period(plateau, tol)):
                if per or best[r] > STALL_FAR:
                    decide(r, t_cur[r], False, None, None, "cycle" if per else "stalled", strict[r])
                    state[r] = "idle"
                    ended.append(r)
                else:
                    last[r] = it[r]
        if ended:
            start(ended)
        if log is not None and passes % 200 == 0:
            log(f"geometry: {sum(1 for d in done if not d)} of {R} radii open")
    out.rounds += passes
