"""What a sweep record measured, read one way for the figures, the correlations and the claims.

A record is one training run of a grid (stability/sweep/runner.py), read typed
(:class:`~stability.sweep.record.SweepRecord`): its ``final`` accuracy per split, its ``stability`` summary (the
split the sweep summarised) and its ``analysis`` headline block per split
(:class:`~stability.analysis.headline.SplitSummary`).
"""

from __future__ import annotations

import math
from typing import Optional

from stability.sweep.record import SweepRecord
from stability.sweep.tables import RECALL_ORDER


def accuracy(rec: SweepRecord, split: str) -> Optional[float]:
    """Percent whole-answer accuracy on ``split`` at the test iteration; 0 for a diverged run (as in the tables)."""
    if rec.status == "diverged" or not rec.final:
        return 0.0
    return 100.0 * float(rec.final[split].accuracy)


def is_looped(rec: SweepRecord) -> bool:
    """Whether the run is a looped model (recall internal, external or none), not the fixed-depth baseline."""
    return rec.config.model.recall in RECALL_ORDER[:3]


def split_quantity(rec: SweepRecord, key: str, split: str = "hard") -> Optional[float]:
    """A stability quantity of a run measured on ``split`` (its headline block), else on the record's summary
    split (``stability``); None where it is undefined (e.g. ρ(J*) with no converged sample)."""
    block = (rec.analysis or {}).get(split)
    v = getattr(block if block is not None else rec.stability, key, None)
    try:
        return float(v) if v is not None and math.isfinite(float(v)) else None
    except (TypeError, ValueError):
        return None
