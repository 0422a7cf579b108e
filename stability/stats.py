"""Summary statistics shared by every report of the toolkit (analysis, sweep records, the training monitor).

One median, so that a number called ``*_median`` means the same thing wherever it is written: the sweep record's
``rho_M_median`` equals the one the ``analyze`` report prints, and the monitor's ``rho_J_median`` is computed the way
the analysis computes ``spectral_radius_median``.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

__all__ = ["median", "finite_values"]


def finite_values(values: Iterable) -> list[float]:
    """The entries of ``values`` that are numbers and finite, as floats (None, NaN and ±inf are dropped)."""
    out = []
    for v in values:
        if v is None:
            continue
        f = float(v)
        if math.isfinite(f):
            out.append(f)
    return out


def median(values: Iterable) -> Optional[float]:
    """The median of the finite entries of ``values``; None when there are none.

    For an even count it is the mean of the two middle values (as :func:`numpy.median` and
    :func:`statistics.median`), never the upper or lower middle element. Accepts lists, tuples, numpy arrays and
    1-D tensors (anything iterable of numbers); None, NaN and ±inf entries are left out first.
    """
    vals = sorted(finite_values(values))
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else 0.5 * (vals[mid - 1] + vals[mid])
