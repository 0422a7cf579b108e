"""A state that drifts: the iterates of a sample that neither converged nor closed an orbit, tested for a norm that
grows without bound (issue 38: internal pre-norm runs, ‖x_t‖ = 186 at t = 10, 3.0e3 at 100, 6.2e4 at 2,000, have
no finite fixed point to converge to). Stage ``reachability`` names such a sample :data:`~stability.stats.DRIFTING`
where ``AnalysisOptions.drift`` asks for it (off by default, so every analysis and record written without it keeps
its statuses).

The test, fixed before it was run on any record. A sample whose solve from e spent its budget of T evaluations
(status max-iterations, or stalled with no orbit found: period 0) is iterated W = T further Picard steps from its
last state x_T, so t runs over [T, 2T] (a window one octave wide in t, whatever the budget); its growth rate is the
least-squares slope p of log ‖x_t‖₂ against log t over the W + 1 states (‖x_t‖ ∝ t^p: p = 1 for a state that
moves by a constant step, p ≈ 0 for a bounded orbit, p ≫ 1 for exponential growth). The sample drifts when
p ≥ :data:`DRIFT_POWER` = 1/2 (growth at least like √t over the octave), or when the norm turns non-finite inside the
window. Limits: a bounded orbit whose log-norm stays within ±δ of a constant has |p| ≤ 3δ / ln 2 (log t spread
evenly over the octave), so it can pass the threshold only if its norm wanders by more than ±11 %; a fixed point
still far away and approached slowly (‖x* − x_T‖ ≫ ‖x_T‖) looks like drift over one octave, which no finite window
tells apart. With ``--solver anderson`` the window is still the model's own (Picard) iteration, from the
root-finder's last image, with t counted from T as well.
"""

from __future__ import annotations

from typing import Callable

import torch

from stability.stats import DRIFTING

__all__ = ["DRIFT_POWER", "growth_power", "mark_drifting"]

#: the power of t above which a norm's growth over the window [T, 2T] counts as without bound
DRIFT_POWER = 0.5


def growth_power(f: Callable, x_last: torch.Tensor, x0: torch.Tensor, t0: int, window: int) -> torch.Tensor:
    """The least-squares slope p of log ‖x_t‖₂ on log t, t = t0 … t0 + ``window``, from x_{t0} = ``x_last`` by
    x_{t+1} = f(x_t, x0), per sample (B,) float64 (module docstring); +inf where a norm is not finite. The norms stay
    on the device until the window is done (no host sync inside it)."""
    with torch.no_grad():
        x, norms = x_last, [x_last.flatten(1).norm(dim=1)]
        for _ in range(window):
            x = f(x, x0)
            norms.append(x.flatten(1).norm(dim=1))
        n = torch.stack(norms, 1).double().cpu()
    t = torch.arange(t0, t0 + window + 1, dtype=torch.float64).log()
    y = n.clamp_min(torch.finfo(torch.float64).tiny).log()
    tc = t - t.mean()
    p = ((y - y.mean(1, keepdim=True)) * tc).sum(1) / (tc * tc).sum()
    return torch.where(torch.isfinite(n).all(1), p, torch.full_like(p, torch.inf))


def mark_drifting(solution, f: Callable, x0: torch.Tensor, budget: int) -> dict:
    """Name the drifting samples of a solve from e (``solution``, a :class:`~stability.solvers.SolveResult` whose
    samples ran ``budget`` evaluations): the test of the module docstring on its max-iterations samples and its
    stalled ones without an orbit, all in one batch; their status becomes :data:`~stability.stats.DRIFTING`, in
    place. Returns the JSON's ``drift`` block: {power: p per sample (None where not tested), threshold, window}."""
    tested = [b for b, (s, k) in enumerate(zip(solution.status, solution.period.tolist()))
              if s == "max-iterations" or (s == "stalled" and k == 0)]
    power = [None] * len(solution.status)
    if tested:
        idx = torch.tensor(tested, device=solution.x_last.device)
        p = growth_power(f, solution.x_last[idx], x0[idx.to(x0.device)], budget, budget).tolist()
        for b, pb in zip(tested, p):
            power[b] = pb
            if pb >= DRIFT_POWER:
                solution.status[b] = DRIFTING
    return {"power": power, "threshold": DRIFT_POWER, "window": budget}
