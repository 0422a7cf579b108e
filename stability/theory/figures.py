"""Matplotlib builders for the paper's theory figures and Table 3 (App. B.2), and atomic writers for them.

- :func:`phase_portraits` — Figure 2: the map (x, y) ↦ (λ_x x, λ_y y) for |λ_x|, |λ_y| < 1 and |λ_x| < 1 < |λ_y|.
- :func:`stability_regions` — Figure 5: the stable eigenvalue regions of single-layer external and internal recall.
- :func:`anisotropy_points` — a companion to Table 3: the projected points of the anisotropy experiment.
- :func:`write_table3` — Table 3 itself as ``anisotropy.json``, ``anisotropy.md`` and ``anisotropy.tex``.

Builders return a ``Figure`` and never touch the disk; :func:`save_figure` writes PNG and PDF through temporary
files and ``os.replace``, with fixed metadata so that regenerating an unchanged figure gives the same bytes.
Callers select the non-interactive backend (``matplotlib.use("Agg")``) before importing pyplot.
"""

from __future__ import annotations

from pathlib import Path

from stability.atomic import atomic_path, write_json

import numpy as np

from stability.theory import regions

EXTERNAL_COLOR, INTERNAL_COLOR, MANIFOLD_COLOR = "tab:blue", "tab:red", "red"


def _figure(*args, **kwargs):
    from matplotlib.figure import Figure

    return Figure(*args, **kwargs)


def _portrait(ax, lam_x: float, lam_y: float, title: str, *, steps: int = 40, lim: float = 1.2) -> None:
    """Trajectories of the linear map (x, y) ↦ (λ_x x, λ_y y) from a ring of starts, with its stable manifold."""
    grid = np.linspace(-lim, lim, 15)
    X, Y = np.meshgrid(grid, grid)
    ax.quiver(X, Y, (lam_x - 1) * X, (lam_y - 1) * Y, color="0.8", angles="xy", scale_units="xy", scale=1.6,
              width=0.003)
    if abs(lam_y) < 1:  # a ring of starts: all reach x*
        angles = np.linspace(0, 2 * np.pi, 16, endpoint=False) + np.pi / 16
        starts = np.c_[np.cos(angles), np.sin(angles)]
    else:  # starts beside the stable manifold travel in along it, then escape along y
        offsets = np.array([0.003, 0.02, 0.08, 0.25])
        starts = np.array([(sx * 1.15, sy * o) for sx in (-1, 1) for sy in (-1, 1) for o in offsets]
                          + [(-1.15, 0.0), (1.15, 0.0)])
    for x, y in starts:
        pts = [(x, y)]
        for _ in range(steps):
            x, y = lam_x * x, lam_y * y
            pts.append((x, y))
            if abs(y) > lim * 1.2 or (abs(x) < 1e-3 and abs(y) < 1e-3):
                break
        pts = np.array(pts)
        ax.plot(pts[:, 0], pts[:, 1], "-", color="0.35", lw=0.7)
        ax.plot(pts[:, 0], pts[:, 1], "o", color="0.35", ms=1.8)
        inside = np.flatnonzero(np.all(np.abs(pts) < lim * 0.95, axis=1))
        for k in {2, int(inside[-1]) if len(inside) else 0}:  # an arrow early on, and one where it leaves view
            if 2 <= k < len(pts) and np.hypot(*(pts[k] - pts[k - 1])) > 0.02:
                ax.annotate("", xy=pts[k], xytext=pts[k - 1], arrowprops=dict(arrowstyle="->", color="0.2", lw=0.8))
    if abs(lam_y) >= 1 > abs(lam_x):
        ax.axhline(0, color=MANIFOLD_COLOR, lw=2.2, label="stable manifold")
        ax.legend(loc="upper right", fontsize=8)
    ax.plot([0], [0], "k*", ms=11, zorder=5)
    ax.annotate("x*", (0, 0), xytext=(6, 6), textcoords="offset points", fontsize=11)
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_aspect("equal")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_title(title, fontsize=10)


def phase_portraits(stable=(0.8, 0.6), saddle=(0.7, 1.3)):
    """Figure 2: (a) both |λ| < 1, every trajectory reaches x*; (b) |λ_x| < 1 < |λ_y|, only the x-axis does."""
    fig = _figure(figsize=(9, 4.4), layout="constrained")
    a, b = fig.subplots(1, 2)
    _portrait(a, *stable, f"(a) |λx|, |λy| < 1   (λx = {stable[0]}, λy = {stable[1]})")
    _portrait(b, *saddle, f"(b) |λx| < 1 < |λy|   (λx = {saddle[0]}, λy = {saddle[1]})")
    fig.suptitle("Figure 2: phase portraits of (x, y) ↦ (λx x, λy y)", fontsize=11)
    return fig


def stability_regions(g_range=(-10.0, 10.0), h_range=(-6.0, 6.0), n: int = 4001):
    """Figure 5: λ_h with |(1 + λ_h)λ_g| < 1 (external, blue) and |1 + λ_gλ_h| < 1 (internal, red) per λ_g."""
    fig = _figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    x = np.linspace(*g_range, n)
    lo, hi = h_range
    for band, color, label in ((regions.external_band, EXTERNAL_COLOR, "external  |(1 + λh) λg| < 1"),
                               (regions.internal_band, INTERNAL_COLOR, "internal  |1 + λg λh| < 1")):
        y0, y1 = band(x)
        y0, y1 = np.clip(y0, lo, hi), np.clip(y1, lo, hi)
        ax.fill_between(x, y0, y1, where=y1 > y0, color=color, alpha=0.35, lw=0, label=label)
        with np.errstate(invalid="ignore"):
            for edge in (y0, y1):
                e = np.where((edge > lo) & (edge < hi), edge, np.nan)
                ax.plot(x, e, color=color, lw=0.8)
    ax.axhline(0, color="k", lw=0.5)
    ax.axvline(0, color="k", lw=0.5)
    ax.set_xlim(*g_range)
    ax.set_ylim(*h_range)
    ax.set_xlabel("λ(Jg)  (recall Jacobian eigenvalue)")
    ax.set_ylabel("λ(Jh)  (sublayer Jacobian eigenvalue)")
    ax.set_title("Figure 5: stability regions of the single-layer model with shared eigenvectors", fontsize=10)
    ax.legend(loc="upper right")
    return fig


def anisotropy_points(sigmas=regions.SIGMAS, n: int = regions.N_DRAWS, lim: float = 6.0):
    """The projected draws of App. B.2 per σ (columns) for internal and external recall (rows), with the regions."""
    fig = _figure(figsize=(3.0 * len(sigmas), 6.2), layout="constrained")
    axes = fig.subplots(2, len(sigmas), squeeze=False)
    xs = np.linspace(-lim, lim, 2001)
    for j, sigma in enumerate(sigmas):
        x, y = regions.draw(sigma, n)
        for i, (name, color, band) in enumerate((("internal", INTERNAL_COLOR, regions.internal_band),
                                                 ("external", EXTERNAL_COLOR, regions.external_band))):
            ax = axes[i, j]
            y0, y1 = band(xs)
            ax.fill_between(xs, np.clip(y0, -lim, lim), np.clip(y1, -lim, lim), where=y1 > y0, color=color,
                            alpha=0.2, lw=0)
            px, py = regions.PROJECTIONS[name](x, y)
            ax.scatter(px, py, s=1, color="k", alpha=0.25, lw=0, rasterized=True)
            ax.set_xlim(-lim, lim)
            ax.set_ylim(-lim, lim)
            ax.set_aspect("equal")
            ax.set_title(f"{name}, σ = {sigma:g}", fontsize=9)
            if i == 1:
                ax.set_xlabel("λg")
            if j == 0:
                ax.set_ylabel("λh")
    fig.suptitle(f"App. B.2: N(0, σ²I) draws projected onto the closed stable regions (n = {n})", fontsize=11)
    return fig


# ------------------------------------------------------------------------------------------------------------
# Atomic writers
# ------------------------------------------------------------------------------------------------------------

_METADATA = {"png": {"Software": None}, "pdf": {"CreationDate": None, "ModDate": None, "Producer": None}}


def _atomic(path: Path, write) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then move it into place."""
    with atomic_path(path) as tmp:
        write(str(tmp))
    return Path(path)


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` atomically (UTF-8)."""
    return _atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def save_figure(fig, out_dir: Path, stem: str, *, dpi: int = 150) -> list[Path]:
    """``stem.png`` and ``stem.pdf`` in ``out_dir``, each written atomically with reproducible metadata."""
    paths = []
    for ext in ("png", "pdf"):
        paths.append(_atomic(Path(out_dir) / f"{stem}.{ext}",
                             lambda tmp, ext=ext: fig.savefig(tmp, format=ext, dpi=dpi, metadata=_METADATA[ext])))
    return paths


def write_table3(out_dir: Path, result=None) -> list[Path]:
    """Table 3 (App. B.2): ``anisotropy.json`` (sigma → internal / external → six numbers), ``.md`` and ``.tex``."""
    result = regions.anisotropy() if result is None else result
    out_dir = Path(out_dir)
    ratios = regions.median_log_range_ratio(result)
    md = ["# Table 3: projected-point anisotropy (App. B.2)", "",
          f"n = {regions.N_DRAWS} draws of N(0, σ²I₂) per σ, each σ from a fresh `default_rng(0)`; ε = "
          f"{regions.EPSILON:g}; x = λ_g, y = λ_h; exact projection onto the closed regions (internal "
          "-2 ≤ xy ≤ 0, external |(1 + y)x| ≤ 1). Means are followed by their SE (sample std / √n). The last "
          "columns give the internal/external ratio of median log-range (the paper claims ≥ 3 for every σ) and "
          "the share of draws that lay outside each region.", "",
          regions.anisotropy_markdown(result).rstrip(), "",
          "Internal median log-range ≥ 3× external for every σ: "
          + ("yes" if all(r >= 3 for r in ratios.values()) else
             "no (σ = " + ", ".join(f"{s:g}" for s, r in ratios.items() if r < 3) + ")"), ""]
    return [
        write_json(out_dir / "anisotropy.json", regions.anisotropy_json(result), indent=2),
        write_text(out_dir / "anisotropy.md", "\n".join(md)),
        write_text(out_dir / "anisotropy.tex", regions.anisotropy_latex(result)),
    ]
