"""Accuracy against the iteration count, and at the fixed point (Section 3.2; Fig. 3; the release tests at
iterations 1…500). A sample is correct only if every position is right (the task's ``score``).

``score`` is a task (anything with ``.score``) or a function ``score(logits, targets) -> (correct, position
accuracy)``, both (B,); :func:`argmax_score` (also ``score=None``) scores a model of one's own (argmax over
the last axis of ``readout``, as the tasks do)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import torch

#: a target position that is not scored (PyTorch's and Hugging Face's ignore index for cross entropy)
IGNORE_INDEX = -100


@dataclass
class AccuracyCurve:
    """accuracy[t-1] = share of samples whose readout(x_t) is entirely right, t = 1..T_max; at_fixed_point:
    the same for readout(x*) (the solver's lowest-residual iterate; over all samples, and over converged ones)."""

    iterations: list
    accuracy: list
    position_accuracy: list
    at_fixed_point: Optional[float] = None
    at_fixed_point_converged: Optional[float] = None
    scored_in: Optional[str] = None  # "reachability": scored from that stage's Picard solve (its time is there)

    def to_dict(self) -> dict:
        return {"iterations": self.iterations, "accuracy": self.accuracy,
                "position_accuracy": self.position_accuracy, "at_fixed_point": self.at_fixed_point,
                "at_fixed_point_converged": self.at_fixed_point_converged, "scored_in": self.scored_in}


def argmax_score(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, position_accuracy), both (B,): argmax over the last (class) axis against the targets (B, *positions);
    a sample is correct only if every position is right, as the tasks score (``Task.score``). Positions whose target
    is :data:`IGNORE_INDEX` (−100) are not scored: correct means every scored position right, the position accuracy
    is over the scored positions (1 where none is)."""
    targets = targets.to(logits.device)
    right = (logits.argmax(-1) == targets).reshape(targets.shape[0], -1)
    scored = (targets != IGNORE_INDEX).reshape(targets.shape[0], -1)
    if bool(scored.all()):  # every position scored: the tasks' rule, bit for bit
        return right.all(dim=1), right.float().mean(dim=1)
    n = scored.sum(dim=1)
    acc = (right & scored).sum(dim=1).float() / n.clamp_min(1).float()
    return (right | ~scored).all(dim=1), torch.where(n > 0, acc, torch.ones_like(acc))


def _scorer(score):
    return argmax_score if score is None else (score.score if hasattr(score, "score") else score)


def _as_scored(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits (a bf16 autocast) are scored in float32; any other dtype as it is."""
    return logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits


class CurveRecorder:
    """Scores readout(x_t) against ``targets`` for t = 1..T_max, batch by batch: ``record(t, x_t, targets)`` adds
    the batch's whole-answer and per-position counts at t (summed in float64), :meth:`curve` divides by the samples
    seen (counted at t = 1). ``observe(t, x_t)`` is the same for one fixed batch of ``targets``: the hook of the Picard solve that
    yields the curve from the solve's own evaluations (:func:`stability.solvers.solve`, ``observe``)."""

    def __init__(self, model, score, T_max: int, targets: Optional[torch.Tensor] = None):
        self.model, self.score, self.T_max, self.targets = model, _scorer(score), T_max, targets
        self.correct = torch.zeros(T_max, dtype=torch.float64)
        self.pos = torch.zeros(T_max, dtype=torch.float64)
        self.n = 0

    @torch.no_grad()
    def record(self, t: int, x: torch.Tensor, targets: torch.Tensor) -> None:
        ok, pa = self.score(_as_scored(self.model.readout(x)), targets)
        if t == 1:
            self.n += int(ok.shape[0])
        self.correct[t - 1] += ok.double().sum().cpu()
        self.pos[t - 1] += pa.double().sum().cpu()

    def observe(self, t: int, x: torch.Tensor) -> None:
        self.record(t, x, self.targets)

    def curve(self) -> AccuracyCurve:
        return AccuracyCurve(iterations=list(range(1, self.T_max + 1)), accuracy=(self.correct / self.n).tolist(),
                             position_accuracy=(self.pos / self.n).tolist())


@torch.no_grad()
def accuracy_curve(model, score, batches: Iterable, T_max: int, *, context: Optional[Callable] = None,
                   on_step: Optional[Callable[[], None]] = None) -> AccuracyCurve:
    """The one accuracy-vs-iteration loop: for every batch (x0, e, targets) of ``batches``, iterate
    x_{t+1} = step(x_t, x0) from e for T_max steps and score readout(x_t) at every t (Section 3.2; Fig. 3).

    ``batches`` may be a generator, so a batch's x0 and e are made only when it is reached (memory: one batch of
    states, whatever T_max). ``context``: a function returning the context the iteration runs in (the trainer's
    bf16 autocast); ``on_step``: called after every scored iteration (a progress bar). Counts are summed in
    float64 and divided by the total number of samples (:class:`CurveRecorder`). Used by
    :func:`accuracy_vs_iteration` (the analysis) and by the trainer's evaluation
    (:func:`stability.train.loop.evaluate`), so the two curves are one routine.
    """
    rec = CurveRecorder(model, score, T_max)
    for x0, e, tb in batches:
        with (context() if context is not None else contextlib.nullcontext()):
            x = e
            for t in range(1, T_max + 1):
                x = model.step(x, x0)
                rec.record(t, x, tb)
                if on_step is not None:
                    on_step()
    return rec.curve()


@torch.no_grad()
def accuracy_vs_iteration(model, score, x0: torch.Tensor, e: torch.Tensor, targets: torch.Tensor, T_max: int = 500,
                          *, batch_size: int = 256) -> AccuracyCurve:
    """Iterate x_{t+1} = step(x_t, x0) from e for T_max steps and score readout(x_t) at every t
    (:func:`accuracy_curve` over batches of ``batch_size``).

    x0, e: (N, *S); targets: (N, *spatial). Memory: one batch of states, whatever T_max.
    """
    N = x0.shape[0]
    batches = ((x0[i:i + batch_size], e[i:i + batch_size], targets[i:i + batch_size].to(x0.device))
               for i in range(0, N, batch_size))
    return accuracy_curve(model, score, batches, T_max)


@torch.no_grad()
def accuracy_at(model, score, x: torch.Tensor, targets: torch.Tensor, mask: Optional[torch.Tensor] = None) -> Optional[float]:
    """Share of samples (within ``mask``) whose readout(x) is entirely right; None for an empty mask."""
    ok, _ = _scorer(score)(model.readout(x), targets.to(x.device))
    ok = ok.cpu()
    if mask is not None:
        ok = ok[mask.cpu()]
    return float(ok.double().mean()) if ok.numel() else None
