"""Summary statistics shared by every report of the toolkit (analysis, sweep records, the training monitor).

One median, so that a number called ``*_median`` means the same thing wherever it is written: the sweep record's
``rho_M_median`` equals the one the ``analyze`` report prints, and the monitor's ``rho_J_median`` is computed the way
the analysis computes ``spectral_radius_median``.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

from stability.errors import ConfigError

__all__ = ["FIXED_POINT_STATUSES", "DRIFTING", "median", "finite_values", "distinct_clusters"]

#: the solver statuses of a sample at which a fixed point was found (stability.solvers): the one definition of
#: "converged" for every median over converged samples (ρ(J*), ρ(M), σ_max), attracting or not
FIXED_POINT_STATUSES = ("converged", "repelling")
#: the status of a sample whose state norm grows without bound along its iterates (no finite fixed point to reach;
#: the test: stability.analysis.drift), given by stage reachability where ``AnalysisOptions.drift`` asks for it, in
#: place of the solver's max-iterations or stalled (an orbit found stays stalled)
DRIFTING = "drifting"


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


def distinct_clusters(points, *, atol: float = 0.0, rtol: float = 0.0) -> tuple[int, list[int]]:
    """The distinct points of a set, up to a tolerance: (number of clusters, cluster label of every point).

    Metric and tolerance: two points a, b are *linked* when ‖a − b‖∞ ≤ atol + rtol · max(‖a‖∞, ‖b‖∞) (the
    max-norm over all coordinates, absolute plus relative to the larger of the two). Clusters are the connected
    components of the linked graph (single linkage): transitive and independent of the points' order, unlike
    a greedy assignment to the first centre within reach. A point with a non-finite coordinate is linked to
    nothing (its own cluster). Labels number the clusters 0, 1, … in the order of their first point.

    ``points``: (N, ...) array or tensor (each row flattened). Candidate pairs come from a KD-tree query at the
    largest radius any pair can have, atol + rtol · max_i ‖p_i‖∞, then each is checked against its own bound;
    cost O(N log N + pairs). This is Prop. 2's count of the fixed points the inputs select among (the analysis'
    ``distinct_fixed_points``) and the theory checks' count of Newton solutions.
    """
    import numpy as np

    if hasattr(points, "detach"):
        points = points.detach().cpu().double().numpy()
    P = np.asarray(points, dtype=np.float64)
    N = P.shape[0]
    if N == 0:
        return 0, []
    P = P.reshape(N, -1)
    if not (atol >= 0 and rtol >= 0 and math.isfinite(atol) and math.isfinite(rtol)):
        raise ConfigError(f"atol and rtol must be finite and ≥ 0, got {atol!r}, {rtol!r}")
    finite = np.isfinite(P).all(axis=1)
    links: list = []
    idx = np.flatnonzero(finite)
    if idx.size > 1:
        from scipy.spatial import cKDTree

        Q = P[idx]
        scale = np.abs(Q).max(axis=1) if Q.shape[1] else np.zeros(len(Q))
        radius = (atol + rtol * float(scale.max())) * (1 + 1e-12)  # every pair's bound, with rounding slack
        pairs = cKDTree(Q).query_pairs(r=radius, p=np.inf, output_type="ndarray")
        if len(pairs):
            i, j = pairs[:, 0], pairs[:, 1]
            dist = np.abs(Q[i] - Q[j]).max(axis=1)
            keep = dist <= atol + rtol * np.maximum(scale[i], scale[j])
            links = list(zip(idx[i[keep]].tolist(), idx[j[keep]].tolist()))
    return _components(N, links)


def _components(N: int, links) -> tuple[int, list[int]]:
    """(clusters, labels) of N points joined by the pairs ``links`` (a union-find): clusters numbered in the order
    of their first point, so the labels depend on the partition only."""
    parent = list(range(N))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in links:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    roots, labels = {}, []
    for k in range(N):
        labels.append(roots.setdefault(find(k), len(roots)))
    return len(roots), labels


def linked_clusters(linked) -> tuple[int, list[int]]:
    """:func:`distinct_clusters` from the linked graph itself: ``linked[i][j]`` true where points i and j are linked
    (symmetric; computed by the caller with the same metric and bound, e.g. for many small sets at once on a
    device). Single linkage, labels in the order of the clusters' first points, as :func:`distinct_clusters`."""
    N = len(linked)
    return _components(N, [(a, b) for a in range(N) for b in range(a + 1, N) if linked[a][b]])
