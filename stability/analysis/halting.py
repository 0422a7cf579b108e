"""Residual-based halting at inference (Fixed-Point Reasoners, App. C and App. E); ``stability halt`` prints it.

Each sample is iterated x_{t+1} = step(x_t, x0) from e and stops, on its own, at the first iteration t at which
its relative L∞ residual

    r_t = ‖x_t − x_{t−1}‖∞ / (‖x_t‖∞ + ε)

falls below τ (the FPRM criterion, ``stability.solvers.residual``); the others go on until the budget T. A
stopped sample costs no further evaluations of f, so the compute used is Σ_b t_b against N·T for the fixed
budget. The answer is read out at the iterate where the sample stopped. :func:`halting_report` sets accuracy
against compute for several τ beside the fixed budget (App. E: accuracy stops improving where the residual
plateaus). With damping η < 1 the iterates are those of the damped map, as in training. The iteration is the
analysis' :class:`~stability.analysis.fixed_point.FixedPoint` solved by :func:`stability.solvers.solve` with the
preset :data:`~stability.solvers.HALTING` (Picard, each sample frozen once r < τ, no divergence or cycle checks: a
sample runs until it halts or the budget is spent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from stability.errors import StabilityError
from stability.stats import median

if TYPE_CHECKING:  # torch is imported where it is used, so that the command line starts fast
    import torch


@dataclass
class HaltResult:
    """Per sample (B,): ``iterations`` t_b spent, ``halted`` (r < τ reached within the budget), ``residual`` the
    last r; ``x`` (B, *S) the state each sample stopped at and ``logits`` its readout."""

    x: torch.Tensor
    logits: torch.Tensor
    iterations: torch.Tensor
    halted: torch.Tensor
    residual: torch.Tensor
    tol: float
    max_iter: int


def halt(model, inputs: torch.Tensor, *, tol: float = 0.1, max_iter: int = 100, eps: float = 1e-8) -> HaltResult:
    """Iterate each sample until r_t < ``tol`` (it halts) or ``max_iter`` iterations; only the samples still
    running are passed to ``step``."""
    import torch

    if not hasattr(model, "step"):
        raise StabilityError("a fixed-depth baseline has no loop map: there is nothing to halt")
    with torch.no_grad():
        return _halt(model, inputs, tol, max_iter, eps)


def _halt(model, inputs, tol, max_iter, eps) -> HaltResult:
    # lazy: torch; this module imports without it
    import torch

    from stability.analysis.fixed_point import FixedPoint
    from stability.solvers import HALTING

    # x0, e (as training draws it) and the solve, as the analysis builds them: Picard iteration, each sample frozen
    # at r < τ; no divergence or cycle checks (halting only)
    fp = FixedPoint.of(model, inputs)
    res = fp.solve(HALTING.replace(tol=tol, max_iter=max_iter, eps=eps))
    iterations = res.nfe
    halted = torch.tensor([s == "converged" for s in res.status], dtype=torch.bool)
    last = (iterations - 1).clamp(min=0).unsqueeze(1)
    last_r = res.residuals.gather(1, last).squeeze(1).to(fp.e.dtype)
    x = res.x_last  # the iterate each sample stopped at: x_t with r_t = ‖x_t − x_(t−1)‖∞ / ‖x_t‖∞ < τ
    return HaltResult(x=x, logits=model.readout(x), iterations=iterations, halted=halted, residual=last_r, tol=tol,
                      max_iter=max_iter)


def halting_report(model, task, split: str = "val", taus: Sequence[float] = (0.1, 0.01, 0.001), *,
                   max_iter: int = 100, limit: Optional[int] = None, batch_size: int = 500,
                   device: str | torch.device = "cpu", on_batch: Optional[Callable[[int], None]] = None) -> dict:
    """Accuracy against compute on ``split``: one row for the fixed budget (every sample runs ``max_iter``
    iterations) and one per τ. Each row: halted fraction, mean / median / max iterations, compute (the share
    of the fixed budget's evaluations of f), whole-answer and per-position accuracy, and the accuracy of the
    halted and of the unhalted samples. JSON-ready. ``on_batch(n)`` hears each batch of n samples done (of
    ``len(taus) + 1`` passes over the samples: a progress bar)."""
    import torch

    inputs, targets = task.dataset(split)
    if limit is not None:
        inputs, targets = inputs[:limit], targets[:limit]
    was_training = model.training
    model.eval()
    rows = []
    try:
        for tau in [None, *taus]:
            its, hal, cor, pos = [], [], [], []
            for i in range(0, inputs.shape[0], batch_size):
                xb, yb = inputs[i:i + batch_size].to(device), targets[i:i + batch_size].to(device)
                if tau is None:  # the fixed budget: never halt
                    res = halt(model, xb, tol=0.0, max_iter=max_iter)
                else:
                    res = halt(model, xb, tol=tau, max_iter=max_iter)
                c, p = task.score(res.logits.float(), yb)
                its.append(res.iterations)
                hal.append(res.halted)
                cor.append(c.cpu())
                pos.append(p.cpu())
                if on_batch is not None:
                    on_batch(int(xb.shape[0]))
            its_t, hal_t, cor_t = torch.cat(its).double(), torch.cat(hal), torch.cat(cor).double()
            rows.append({
                "tau": tau,
                "halted_fraction": float(hal_t.double().mean()),
                "iterations_mean": float(its_t.mean()),
                "iterations_median": median(its_t.tolist()),  # the middle two's mean, as every report
                "iterations_max": int(its_t.max()),
                "compute": float(its_t.sum() / (max_iter * its_t.numel())),
                "accuracy": float(cor_t.mean()),
                "position_accuracy": float(torch.cat(pos).double().mean()),
                "accuracy_halted": float(cor_t[hal_t].mean()) if hal_t.any() else None,
                "accuracy_unhalted": float(cor_t[~hal_t].mean()) if (~hal_t).any() else None,
            })
    finally:
        model.train(was_training)
    return {"split": split, "samples": int(inputs.shape[0]), "budget": max_iter, "rows": rows}


def format_report(report: dict) -> str:
    """The report as a text table."""
    lines = [f"halting on {report['split']} ({report['samples']} samples), budget T = {report['budget']} "
             "iterations; r = ‖x_t − x_(t−1)‖∞ / ‖x_t‖∞",
             f"{'τ':>8} {'halted':>8} {'mean it':>8} {'median':>7} {'max':>5} {'compute':>8} {'accuracy':>9} "
             f"{'acc halted':>11} {'acc unhalted':>13}   (shares and accuracies in %)"]

    def pct(v):
        return "–" if v is None else f"{100 * v:.1f}%"

    for r in report["rows"]:
        tau = "fixed T" if r["tau"] is None else f"{r['tau']:g}"
        lines.append(f"{tau:>8} {pct(r['halted_fraction']):>8} {r['iterations_mean']:>8.1f} "
                     f"{r['iterations_median']:>7.0f} {r['iterations_max']:>5d} {pct(r['compute']):>8} "
                     f"{pct(r['accuracy']):>9} {pct(r['accuracy_halted']):>11} {pct(r['accuracy_unhalted']):>13}")
    return "\n".join(lines)
