"""Stability regions of Figure 5 and the anisotropy experiment of App. B.2 (Table 3).

Figure 5 is the single-layer model whose recall Jacobian J_g and sublayer Jacobian J_h share their eigenvectors,
so each eigen-pair (λ_g, λ_h) is stable on its own (derived in :mod:`stability.theory.symbolic`):

- external recall  x ↦ g(x) + h(g(x)):   eigenvalue (1 + λ_h) λ_g,   stable iff |(1 + λ_h) λ_g| < 1;
- internal recall  x ↦ x + h(g(x)):      eigenvalue 1 + λ_g λ_h,     stable iff |1 + λ_g λ_h| < 1.

For real eigenvalues (x, y) = (λ_g, λ_h) the closed regions are bands between hyperbolas:

- internal:  -2 ≤ x·y ≤ 0, bounded by x·y = 0 (the two axes) and the hyperbola x·y = -2;
- external:  -1 ≤ x·(1 + y) ≤ 1, bounded by the shifted hyperbolas x·(1 + y) = ±1.

:func:`project_internal` and :func:`project_external` give the exact nearest point of each closed region.
A point outside a band ``lo ≤ q ≤ hi`` of a continuous q lies beyond one boundary level; any segment from it to a
region point crosses that level set, so the nearest region point lies on that level set alone: on the axes for
internal points with x·y > 0, on x·y = -2 for x·y < -2, on x(1 + y) = ±1 for external points beyond ±1. The
nearest point of the hyperbola u·v = c (c ≠ 0) to (a, b) is a real root of the quartic
u⁴ - a u³ + b c u - c² = 0 (the stationarity condition of (u - a)² + (c/u - b)²); external recall uses it in the
shifted coordinates (u, v) = (x, 1 + y). All roots come from batched companion-matrix eigenvalues, so the whole
experiment is vectorised; the tests compare it with a dense brute-force search.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The closed internal region is INTERNAL_LO ≤ λ_g λ_h ≤ INTERNAL_HI (|1 + t| ≤ 1 ⟺ t ∈ [-2, 0]).
INTERNAL_LO, INTERNAL_HI = -2.0, 0.0
#: The closed external region is EXTERNAL_LO ≤ λ_g (1 + λ_h) ≤ EXTERNAL_HI (|s| ≤ 1 ⟺ s ∈ [-1, 1]).
EXTERNAL_LO, EXTERNAL_HI = -1.0, 1.0

#: App. B.2 as the paper's release runs it (docs/theory.md, Table 3): the σ values, draws per σ, ε of both metrics.
SIGMAS = (0.5, 1.0, 2.0, 4.0)
N_DRAWS = 10_000
EPSILON = 1e-8


def external_eigenvalue(lam_g, lam_h):
    """(1 + λ_h) λ_g: the eigenvalue of the single-layer external-recall Jacobian (I + J_h) J_g (Fig. 5)."""
    return (1 + np.asarray(lam_h)) * np.asarray(lam_g)


def internal_eigenvalue(lam_g, lam_h):
    """1 + λ_g λ_h: the eigenvalue of the single-layer internal-recall Jacobian I + J_h J_g (Fig. 5)."""
    return 1 + np.asarray(lam_g) * np.asarray(lam_h)


def stable_external(lam_g, lam_h, *, closed: bool = False) -> np.ndarray:
    """|(1 + λ_h) λ_g| < 1 (or ≤ 1 when ``closed``): the external region of Fig. 5 (complex inputs allowed)."""
    m = np.abs(external_eigenvalue(lam_g, lam_h))
    return m <= 1 if closed else m < 1


def stable_internal(lam_g, lam_h, *, closed: bool = False) -> np.ndarray:
    """|1 + λ_g λ_h| < 1 (or ≤ 1 when ``closed``): the internal region of Fig. 5 (complex inputs allowed)."""
    m = np.abs(internal_eigenvalue(lam_g, lam_h))
    return m <= 1 if closed else m < 1


def external_band(lam_g) -> tuple[np.ndarray, np.ndarray]:
    """For each real λ_g, the open interval of λ_h with |(1 + λ_h) λ_g| < 1: (-1 - 1/|λ_g|, -1 + 1/|λ_g|)."""
    with np.errstate(divide="ignore"):
        r = 1.0 / np.abs(np.asarray(lam_g, dtype=float))
    return -1.0 - r, -1.0 + r


def internal_band(lam_g) -> tuple[np.ndarray, np.ndarray]:
    """For each real λ_g ≠ 0, the open interval of λ_h with |1 + λ_g λ_h| < 1: between 0 and -2/λ_g.

    (At λ_g = 0 the eigenvalue is 1 for every λ_h: the interval is empty, returned as (0, 0).)
    """
    x = np.asarray(lam_g, dtype=float)
    with np.errstate(divide="ignore"):
        other = np.where(x != 0, -2.0 / np.where(x != 0, x, 1.0), 0.0)
    return np.minimum(0.0, other), np.maximum(0.0, other)


def nearest_on_hyperbola(a, b, c) -> tuple[np.ndarray, np.ndarray]:
    """The nearest point (u, c/u) of the hyperbola u·v = c (c ≠ 0, both branches) to each point (a, b).

    The stationary points of (u - a)² + (c/u - b)² are the real roots of u⁴ - a u³ + b c u - c² = 0; the distance
    tends to ∞ at u → 0 and u → ±∞, so the minimiser is one of them. Every root's real part is a point of the
    hyperbola, so taking the nearest over all four (then two Newton steps) returns the exact minimiser.
    """
    a, b, c = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (a, b, c)))
    a, b, c = a.ravel(), b.ravel(), c.ravel()
    if np.any(c == 0):
        raise ValueError("nearest_on_hyperbola needs c ≠ 0 (c = 0 is the pair of axes)")
    n = a.size
    companion = np.zeros((n, 4, 4))
    companion[:, 0, 0] = a  # monic u⁴ + p3 u³ + p2 u² + p1 u + p0 with p3 = -a, p2 = 0, p1 = bc, p0 = -c²
    companion[:, 0, 2] = -b * c
    companion[:, 0, 3] = c * c
    companion[:, 1, 0] = companion[:, 2, 1] = companion[:, 3, 2] = 1.0
    roots = np.linalg.eigvals(companion).real if n else np.zeros((0, 4))
    d2 = (roots - a[:, None]) ** 2 + (c[:, None] / roots - b[:, None]) ** 2
    u = roots[np.arange(n), np.argmin(d2, axis=1)]
    for _ in range(2):  # polish the chosen root of the quartic; keep a step only if it brings the point closer
        p = ((u - a) * u * u + b * c) * u - c * c
        dp = (4 * u - 3 * a) * u * u + b * c
        step = np.divide(p, dp, out=np.zeros_like(p), where=dp != 0)
        w = u - step
        closer = (w != 0) & ((w - a) ** 2 + (c / np.where(w != 0, w, 1) - b) ** 2 <= (u - a) ** 2 + (c / u - b) ** 2)
        u = np.where(closer, w, u)
    return u, c / u


def project_internal(x, y) -> tuple[np.ndarray, np.ndarray]:
    """Nearest point of the closed internal region {-2 ≤ x·y ≤ 0}: the identity inside (App. B.2)."""
    x, y = np.broadcast_arrays(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
    px, py = x.astype(float).copy(), y.astype(float).copy()
    t = x * y
    above = t > INTERNAL_HI  # first/third quadrant: the nearest point is the nearer axis
    to_x_axis = above & (np.abs(y) <= np.abs(x))
    py[to_x_axis] = 0.0
    to_y_axis = above & ~to_x_axis
    px[to_y_axis] = 0.0
    below = t < INTERNAL_LO  # beyond the hyperbola x·y = -2
    if below.any():
        px[below], py[below] = nearest_on_hyperbola(x[below], y[below], INTERNAL_LO)
    return px, py


def project_external(x, y) -> tuple[np.ndarray, np.ndarray]:
    """Nearest point of the closed external region {|x(1 + y)| ≤ 1}: the identity inside (App. B.2)."""
    x, y = np.broadcast_arrays(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
    px, py = x.astype(float).copy(), y.astype(float).copy()
    u, v = x, 1.0 + y  # shifted coordinates: the region is |u v| ≤ 1
    s = u * v
    for mask, level in ((s > EXTERNAL_HI, EXTERNAL_HI), (s < EXTERNAL_LO, EXTERNAL_LO)):
        if mask.any():
            pu, pv = nearest_on_hyperbola(u[mask], v[mask], level)
            px[mask], py[mask] = pu, pv - 1.0
    return px, py


PROJECTIONS = {"internal": project_internal, "external": project_external}


def log_range(x, y, eps: float = EPSILON) -> np.ndarray:
    """|log((|x| + ε) / (|y| + ε))|: 0 for isotropic points (App. B.2)."""
    ax, ay = np.abs(x), np.abs(y)
    return np.abs(np.log((ax + eps) / (ay + eps)))


def balance(x, y, eps: float = EPSILON) -> np.ndarray:
    """(min(|x|, |y|) + ε) / (max(|x|, |y|) + ε): 1 for isotropic points (App. B.2)."""
    ax, ay = np.abs(x), np.abs(y)
    return (np.minimum(ax, ay) + eps) / (np.maximum(ax, ay) + eps)


def draw(sigma: float, n: int = N_DRAWS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n points of N(0, σ² I₂) from a fresh ``default_rng(seed)`` (docs/theory.md, Table 3): x = λ_g, y = λ_h.

    Drawn as ``rng.normal(0, σ, size=(n, 2))``, one row per point, so every σ scales the same standard draws.
    """
    z = np.random.default_rng(seed).normal(0.0, sigma, size=(n, 2))
    return z[:, 0], z[:, 1]


@dataclass(frozen=True)
class Summary:
    """Mean (SE = sample std / √n, ddof = 1) and median of both metrics for one recall placement and one σ."""

    log_range_mean: float
    log_range_se: float
    log_range_median: float
    balance_mean: float
    balance_se: float
    balance_median: float
    projected_fraction: float

    def table_dict(self) -> dict[str, float]:
        """The six numbers of Table 3 (the keys of ``anisotropy.json``)."""
        d = dict(self.__dict__)
        d.pop("projected_fraction")
        return d


def summarise(px, py, moved, eps: float = EPSILON) -> Summary:
    """Table 3's statistics of projected points (px, py); ``moved`` marks the points that were outside."""
    lr, bal = log_range(px, py, eps), balance(px, py, eps)
    n = lr.size
    return Summary(
        log_range_mean=float(lr.mean()), log_range_se=float(lr.std(ddof=1) / np.sqrt(n)),
        log_range_median=float(np.median(lr)),
        balance_mean=float(bal.mean()), balance_se=float(bal.std(ddof=1) / np.sqrt(n)),
        balance_median=float(np.median(bal)),
        projected_fraction=float(np.mean(moved)),
    )


def anisotropy(sigmas=SIGMAS, n: int = N_DRAWS, eps: float = EPSILON, seed: int = 0) -> dict[float, dict[str, Summary]]:
    """App. B.2 / Table 3: project N(0, σ²I₂) draws onto both closed regions and summarise their anisotropy."""
    out: dict[float, dict[str, Summary]] = {}
    for sigma in sigmas:
        x, y = draw(sigma, n, seed)
        out[float(sigma)] = {}
        for name, project in PROJECTIONS.items():
            px, py = project(x, y)
            moved = (px != x) | (py != y)
            out[float(sigma)][name] = summarise(px, py, moved, eps)
    return out


def sigma_key(sigma: float) -> str:
    """The JSON key of a σ: ``0.5``, ``1``, ``2``, ``4``."""
    return f"{sigma:g}"


def anisotropy_json(result: dict[float, dict[str, Summary]]) -> dict:
    """``anisotropy.json``: sigma → internal / external → the six Table 3 numbers."""
    return {sigma_key(s): {name: summ.table_dict() for name, summ in per.items()} for s, per in result.items()}


def median_log_range_ratio(result: dict[float, dict[str, Summary]]) -> dict[float, float]:
    """internal / external median log-range per σ (the paper claims ≥ 3 for every σ, Sec. 5.1)."""
    return {s: per["internal"].log_range_median / per["external"].log_range_median for s, per in result.items()}


def anisotropy_markdown(result: dict[float, dict[str, Summary]]) -> str:
    """Table 3 as a Markdown table: mean (SE) and median of log-range and balance, internal vs external."""
    head = ("| σ | log-range mean, int | log-range mean, ext | log-range median, int | log-range median, ext "
            "| balance mean, int | balance mean, ext | balance median, int | balance median, ext "
            "| median log-range int/ext | projected, int | projected, ext |")
    lines = [head, "|" + "---|" * 12]
    ratios = median_log_range_ratio(result)
    for s, per in result.items():
        i, e = per["internal"], per["external"]
        lines.append(
            f"| {s:g} | {i.log_range_mean:.3f} ({i.log_range_se:.3f}) | {e.log_range_mean:.3f} ({e.log_range_se:.3f}) "
            f"| {i.log_range_median:.3f} | {e.log_range_median:.3f} "
            f"| {i.balance_mean:.3f} ({i.balance_se:.3f}) | {e.balance_mean:.3f} ({e.balance_se:.3f}) "
            f"| {i.balance_median:.3f} | {e.balance_median:.3f} | {ratios[s]:.2f} "
            f"| {100 * i.projected_fraction:.1f}% | {100 * e.projected_fraction:.1f}% |")
    return "\n".join(lines) + "\n"


def anisotropy_latex(result: dict[float, dict[str, Summary]], n: int = N_DRAWS) -> str:
    """Table 3 as a LaTeX ``tabular`` in the paper's layout (log-ratio and balance; mean (SE) and median)."""
    lines = [
        "\\begin{table}[t]",
        "\\centering",
        f"\\caption{{Projected-point anisotropy; $n = {n}$ draws per $\\sigma$. Parens after means: SE "
        "($\\hat\\sigma/\\sqrt{n}$).}",
        "\\begin{tabular}{l cccc cccc}",
        "\\toprule",
        " & \\multicolumn{4}{c}{log-ratio} & \\multicolumn{4}{c}{balance} \\\\",
        "\\cmidrule(lr){2-5} \\cmidrule(lr){6-9}",
        " & \\multicolumn{2}{c}{mean} & \\multicolumn{2}{c}{median} & \\multicolumn{2}{c}{mean} "
        "& \\multicolumn{2}{c}{median} \\\\",
        "$\\sigma$ & int & ext & int & ext & int & ext & int & ext \\\\",
        "\\midrule",
    ]
    for s, per in result.items():
        i, e = per["internal"], per["external"]
        lines.append(
            f"{s:g} & {i.log_range_mean:.2f} ({i.log_range_se:.2f}) & {e.log_range_mean:.2f} ({e.log_range_se:.2f}) "
            f"& {i.log_range_median:.2f} & {e.log_range_median:.2f} "
            f"& {i.balance_mean:.3f} ({i.balance_se:.3f}) & {e.balance_mean:.3f} ({e.balance_se:.3f}) "
            f"& {i.balance_median:.3f} & {e.balance_median:.3f} \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    return "\n".join(lines) + "\n"
