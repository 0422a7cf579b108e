"""The training schedule: the learning rate's factor per epoch (warm-up, cooldown), its peak and the warning when
a short run never reaches it; and the progressive loss's draws of (n, k) from the run's generator."""

from __future__ import annotations

import math
from typing import Optional

import torch

from stability.config import TrainConfig


def lr_factor(epoch: int, cfg: TrainConfig) -> float:
    """LR multiplier for 0-based ``epoch``: warm-up 1 − exp(−(e+1)/10) for e < warmup_epochs, then 1;
    ×cooldown_factor from epoch ⌊cooldown_at · epochs⌋ on (epoch 60 of 100 in the paper)."""
    f = 1.0 - math.exp(-(epoch + 1) / 10.0) if epoch < cfg.warmup_epochs else 1.0
    if epoch >= cooldown_epoch(cfg):
        f *= cfg.cooldown_factor
    return f


def cooldown_epoch(cfg: TrainConfig) -> int:
    """The first (0-based) epoch of the cooldown: ⌊cooldown_at · epochs⌋."""
    return int(cfg.cooldown_at * cfg.epochs)


def schedule_peak(cfg: TrainConfig) -> tuple[float, int]:
    """(largest LR factor over the run, the 0-based epoch where it is first reached), in O(log epochs) time and
    constant memory: the factor never decreases within the epochs before the cooldown, nor within those from it
    on, so each part peaks at its last epoch, first reached where a bisection finds it."""
    best = (-1.0, 0)
    cut = min(cooldown_epoch(cfg), cfg.epochs)
    for start, stop in ((0, cut), (cut, cfg.epochs)):
        if start >= stop:
            continue
        peak = lr_factor(stop - 1, cfg)
        lo, hi = start, stop - 1  # the first epoch of [start, stop) whose factor is the part's peak
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if lr_factor(mid, cfg) >= peak else (mid + 1, hi)
        if peak > best[0]:
            best = (peak, lo)
    return best


def schedule_warning(cfg: TrainConfig) -> Optional[str]:
    """A one-line warning when the schedule never reaches the requested learning rate, else None.

    With the paper's 9-epoch warm-up and cooldown at 60 %, a short run cools down before its warm-up is over:
    ``--lr 3e-3 --epochs 6`` peaks at 7.8e-4 (in epoch 3)."""
    peak, at = schedule_peak(cfg)
    if peak >= 1.0 - 1e-12:
        return None
    why = f"the warm-up lasts {cfg.warmup_epochs} of the {cfg.epochs} epochs"
    if cooldown_epoch(cfg) < min(cfg.warmup_epochs, cfg.epochs):
        why += f" and the cooldown (×{cfg.cooldown_factor:g}) starts at epoch {cooldown_epoch(cfg) + 1} of {cfg.epochs}"
    return (f"the learning rate {cfg.lr:g} is never reached: {why}, so it peaks at {cfg.lr * peak:.2g} in epoch "
            f"{at + 1}; lower --warmup-epochs, raise --cooldown-at or train more --epochs")


def draw_depths(iterations: int, gen: torch.Generator) -> tuple[int, int]:
    """The progressive loss's (n, k) of one batch, drawn from ``gen``: n ~ U{0..T−1} iterations without gradient,
    then k ~ U{1..T−n} with it (T = ``iterations``)."""
    n = int(torch.randint(0, iterations, (1,), generator=gen))
    k = int(torch.randint(1, iterations - n + 1, (1,), generator=gen))
    return n, k
