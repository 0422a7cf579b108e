"""Accuracy against the iteration count, and at the fixed point (Section 3.2; Fig. 3; the release tests at
iterations 1…500). A sample is correct only if every position is right (the task's ``score``).

``score`` is a task (anything with ``.score``) or a function ``score(logits, targets) -> (correct, position
accuracy)``, both (B,); :func:`argmax_score` (also ``score=None``) scores a model of one's own (argmax over
the last axis of ``readout``, as the tasks do)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class AccuracyCurve:
    """accuracy[t-1] = share of samples whose readout(x_t) is entirely right, t = 1..T_max; at_fixed_point:
    the same for readout(x*) (the solver's lowest-residual iterate; over all samples, and over converged ones)."""

    iterations: list
    accuracy: list
    position_accuracy: list
    at_fixed_point: Optional[float] = None
    at_fixed_point_converged: Optional[float] = None

    def to_dict(self) -> dict:
        return {"iterations": self.iterations, "accuracy": self.accuracy,
                "position_accuracy": self.position_accuracy, "at_fixed_point": self.at_fixed_point,
                "at_fixed_point_converged": self.at_fixed_point_converged}


def argmax_score(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, position_accuracy), both (B,): argmax over the last (class) axis against the targets (B, *positions);
    a sample is correct only if every position is right, as the tasks score (``Task.score``)."""
    right = (logits.argmax(-1) == targets.to(logits.device)).reshape(targets.shape[0], -1)
    return right.all(dim=1), right.float().mean(dim=1)


def _scorer(score):
    return argmax_score if score is None else (score.score if hasattr(score, "score") else score)


@torch.no_grad()
def accuracy_vs_iteration(model, score, x0: torch.Tensor, e: torch.Tensor, targets: torch.Tensor, T_max: int = 500,
                          *, batch_size: int = 256) -> AccuracyCurve:
    """Iterate x_{t+1} = step(x_t, x0) from e for T_max steps and score readout(x_t) at every t.

    x0, e: (N, *S); targets: (N, *spatial). Memory: one batch of states, whatever T_max.
    """
    score = _scorer(score)
    N = x0.shape[0]
    correct = torch.zeros(T_max, dtype=torch.float64)
    pos = torch.zeros(T_max, dtype=torch.float64)
    for i in range(0, N, batch_size):
        x, xb, tb = e[i:i + batch_size], x0[i:i + batch_size], targets[i:i + batch_size].to(x0.device)
        for t in range(T_max):
            x = model.step(x, xb)
            ok, pa = score(model.readout(x), tb)
            correct[t] += ok.double().sum().cpu()
            pos[t] += pa.double().sum().cpu()
    return AccuracyCurve(iterations=list(range(1, T_max + 1)), accuracy=(correct / N).tolist(),
                         position_accuracy=(pos / N).tolist())


@torch.no_grad()
def accuracy_at(model, score, x: torch.Tensor, targets: torch.Tensor, mask: Optional[torch.Tensor] = None) -> Optional[float]:
    """Share of samples (within ``mask``) whose readout(x) is entirely right; None for an empty mask."""
    ok, _ = _scorer(score)(model.readout(x), targets.to(x.device))
    ok = ok.cpu()
    if mask is not None:
        ok = ok[mask.cpu()]
    return float(ok.double().mean()) if ok.numel() else None
