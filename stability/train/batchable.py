"""What an ensemble (:mod:`stability.train.ensemble`) can batch, torch-free: ``stability sweep --ensemble auto``
plans its groups (and shows them in a dry run) without importing torch."""

from __future__ import annotations

from typing import Optional

from stability.config import RunConfig


def solo_reason(config: RunConfig, step: str = "auto") -> Optional[str]:
    """Why ``config`` cannot be a member of a batched ensemble trained by the ``step`` (``--ensemble-step``:
    auto, subsets, fixed; stability/train/fixed_step.py), in a few words (None when it can)."""
    cfg = config.train
    if cfg.method.name != "progressive":
        return (f"method {cfg.method.name}: ensembles train the progressive loss only (deep supervision's and "
                "implicit training's per-sample halting stay solo)")
    if cfg.compile and step == "subsets":
        return ("compile with --ensemble-step subsets: the subset step changes shape every batch; a compiled "
                "ensemble trains the fixed step (--ensemble-step fixed or auto)")
    if config.model.initial_state == "noise":
        return "initial state noise: drawn from one global generator per batch, so it stays solo"
    return None
