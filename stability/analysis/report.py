"""Reporting the analysis: a text report (the verdict, then one table per split), JSON, and PNG plots.

Everything here reads the JSON of an :class:`~stability.analysis.results.Analysis` (``.to_json()``; the object itself is
accepted too); nothing is recomputed. A split's table asks each stage of the registry for its rows
(:mod:`stability.analysis.stages`); the plots find a stage's block by its module's ``KEY``. Stages that did not run
(``--only``) are ``null`` and left out of the table; a stage that does not apply to the model is ``{"applicable": false,
"reason": ...}`` and shown as "not applicable". Non-finite numbers become ``null`` in the JSON (strict JSON has no NaN).
:func:`publish` is what ``stability analyze`` and ``stability demo`` print and write.
"""

from __future__ import annotations

from pathlib import Path

from stability import atomic
from stability.analysis.publish import publish  # noqa: F401  (what analyze and demo print and write)
from stability.analysis.stages import accuracy, geometry, prop5, reachability, rho
from stability.analysis.stages.base import applies
from stability.analysis.stages.registry import REGISTRY
from stability.analysis.text import WIDTH, table_lines, verdict_text  # noqa: F401 (verdict_text: the report's)
from stability.atomic import atomic_path


def as_report(report) -> dict:
    """The JSON of an :class:`~stability.analysis.results.Analysis`, or the dict itself."""
    return report if isinstance(report, dict) else report.to_json()


def _timings_row(block: dict) -> tuple:
    """The split's time, and each stage's (a stage whose work was done inside another's says where: its block's
    ``scored_in``)."""
    keys = {s.name: s.key for s in REGISTRY}

    def part(name, seconds):
        inside = (block.get(keys[name]) or {}).get("scored_in") if name in keys else None
        return f"{name} (in {inside})" if inside else f"{name} {seconds:.1f}"

    return ("time", f"{sum(block['timings'].values()):.1f} s",
            ", ".join(part(k, v) for k, v in block["timings"].items()))


def split_table(block: dict) -> str:
    """One split's table: quantity, value, and what it means; each stage of the registry gives its rows, in run
    order (a stage that did not run gives none)."""
    few = block.get("measured_samples")
    rows = [
        ("samples", f"{block['samples']}  (state {' × '.join(map(str, block['state_shape']))})", ""),
        *([("measured by", f"{', '.join(few['stages'])}: the first {few['samples']} of {few['of']}", few["why"])]
          if few else []),
    ]
    for s in REGISTRY:
        rows += s.rows(block.get(s.key), block)
    if block.get("timings"):
        rows.append(_timings_row(block))
    line = "-" * WIDTH
    return "\n".join([f"split: {block['split']}", line, *table_lines(rows), line])


def _head(report: dict) -> str:
    cfg = report.get("config")
    if report.get("checkpoint") is not None and cfg:
        m = cfg["model"]
        return (f"checkpoint: {report['checkpoint']}  (epoch {report.get('epoch')})\n"
                f"model: recall {m['recall']}, norm {m['norm']}, width {m['width']}, heads {m['heads']}; "
                f"task {cfg['task']['name']}")
    src = report.get("source") or {}
    parts = [f"model: {src.get('model') or 'a LoopedModel'}"]
    parts += [f"{k} {src[k]}" for k in ("weights", "inputs", "targets") if src.get(k)]
    return "; ".join(parts)


#: where the report's rows are explained in plain words, one line each (printed between the verdict and the tables)
GUIDE = "what each row below means, in plain words: docs/analysis.md#reading-the-report-in-plain-words"


def text_report(report) -> str:
    """The verdict, the pointer to the rows' plain-words explanations, then one table per split."""
    report = as_report(report)
    return "\n\n".join([_head(report), verdict_text(report), GUIDE]
                       + [split_table(report[s]) for s in report["splits"]]) + "\n"


# ---- plots ---------------------------------------------------------------------------------------------

_STATUS_COLOURS = {"converged": "tab:green", "max-iterations": "tab:orange", "stalled": "tab:purple",
                   "diverged": "tab:red", "non-finite": "black"}


def _figure(n: int, width: float = 5.0, height: float = 4.0):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    return fig, axes[0], plt


def write_plots(report, directory: Path) -> list[Path]:
    """residuals.png, eigenvalues.png, accuracy.png, prop5.png (one panel per split; a plot whose stage did not
    run, or does not apply, is left out). Returns their paths. The folder gets all of them or none
    (:func:`stability.atomic.staged_dir`): a write that fails (a full disk) leaves it as it was."""
    directory = Path(directory)
    with atomic.staged_dir(directory) as stage:
        written = _write_plots(as_report(report), stage)
    return [directory / p.name for p in written]


def _write_plots(report: dict, directory: Path) -> list[Path]:
    splits = report["splits"]
    paths = []

    def save(fig, plt, name):
        path = directory / name
        try:
            with atomic_path(path) as tmp:
                fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
        finally:
            plt.close(fig)
        paths.append(path)

    # residual traces
    fig, axes, plt = _figure(len(splits))
    for ax, s in zip(axes, splits):
        fp = report[s][reachability.KEY]
        seen = set()
        for trace, status in zip(fp["residual_trace"], fp["status"]):
            y = [float("nan") if v is None else v for v in trace]
            label = status if status not in seen else None
            seen.add(status)
            ax.semilogy(range(1, len(y) + 1), y, color=_STATUS_COLOURS.get(status, "grey"), alpha=0.6, lw=1,
                        label=label)
        ax.axhline(fp["tol"], color="k", ls="--", lw=0.8, label=f"τ = {fp['tol']:g}")
        ax.set(title=f"{s}: fixed-point residual (n = {report[s]['samples']})", xlabel="iteration", ylabel="‖f(x)−x‖∞ / ‖f(x)‖∞")
        ax.legend(fontsize=8)
    save(fig, plt, "residuals.png")

    def ran(key):
        return [sp for sp in splits if applies(report[sp].get(key))]

    if ran(rho.KEY):
        _eigen_plot(report, ran(rho.KEY), save)
    if ran(accuracy.KEY):
        _accuracy_plot(report, ran(accuracy.KEY), save)
    if ran(prop5.KEY):
        _prop5_plot(report, ran(prop5.KEY), save)
    planes = [sp for sp in splits if (report[sp].get(geometry.KEY) or {}).get("plane")]
    if planes:
        _region_plot(report, planes, save)
    return paths


def _eigen_plot(report, splits, save):
    import numpy as np

    fig, axes, plt = _figure(len(splits), 4.6, 4.6)
    for ax, s in zip(axes, splits):
        jac, fp = report[s][rho.KEY], report[s][reachability.KEY]
        th = np.linspace(0, 2 * np.pi, 400)
        ax.plot(np.cos(th), np.sin(th), color="k", lw=0.8, label="unit circle")
        for conv in (True, False):
            pts = [z for ev, st in zip(jac["eigenvalues"], fp["status"]) if (st == "converged") == conv for z in ev]
            if pts:
                pts = np.asarray(pts, dtype=float)
                ax.scatter(pts[:, 0], pts[:, 1], s=10, alpha=0.7,
                           color="tab:blue" if conv else "tab:red",
                           label="at converged x*" if conv else "at best iterate (unconverged)")
        lim = max([1.1] + [abs(c) * 1.1 for ev in jac["eigenvalues"] for z in ev for c in z])
        ax.set(xlim=(-lim, lim), ylim=(-lim, lim), aspect="equal", xlabel="Re λ", ylabel="Im λ",
               title=f"{s}: leading eigenvalues of J* (n = {report[s]['samples']})")
        ax.legend(fontsize=8, loc="lower left")
    save(fig, plt, "eigenvalues.png")


def _accuracy_plot(report, splits, save):
    fig, axes, plt = _figure(1, 6.0, 4.0)
    ax = axes[0]
    for s in splits:
        acc = report[s][accuracy.KEY]
        line, = ax.plot(acc["iterations"], acc["accuracy"], label=f"{s}")
        ax.plot(acc["iterations"], acc["position_accuracy"], color=line.get_color(), ls="--", lw=0.8,
                label=f"{s} (per position)")
        if acc["at_fixed_point"] is not None:
            ax.axhline(acc["at_fixed_point"], color=line.get_color(), ls=":", lw=1, label=f"{s} at x*")
    sizes = ", ".join(f"{s} {report[s]['samples']}" for s in splits)
    ax.set(xscale="log", xlabel="iteration T", ylabel="accuracy", ylim=(-0.02, 1.02),
           title=f"accuracy against iteration (n = {sizes} analysed samples)")
    ax.legend(fontsize=8)
    save(fig, plt, "accuracy.png")


def _prop5_plot(report, splits, save):
    fig, axes, plt = _figure(len(splits))
    for ax, s in zip(axes, splits):
        p5 = report[s][prop5.KEY]
        if p5.get("rel_error"):
            errs = [max(v, 1e-300) if v is not None else float("nan") for v in p5["rel_error"]]
            ax.loglog(p5["T"], errs, "o-", label="‖dx_T/dx0·u − dx*/dx0·u‖ / ‖dx*/dx0·u‖")
            if p5.get("gmres_tol"):
                ax.axhline(p5["gmres_tol"], color="k", ls="--", lw=0.8, label="GMRES tolerance")
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, p5.get("skipped", "not computed"), ha="center", va="center", wrap=True,
                    transform=ax.transAxes, fontsize=8)
        ax.set(title=f"{s}: Prop. 5 check (n = 1: sample {p5.get('sample')})", xlabel="T",
               ylabel="relative error")
    save(fig, plt, "prop5.png")


def region_axes(ax, geo: dict, title: str) -> None:
    """The stability region of a checkpoint on one axes: ρ(J*) over the plane θ* + a·D1 + b·D2 of the geometry
    stage (colour), the ρ = 1 contour, cells whose continued solve failed hatched, θ* at the origin, and the
    bisected radii along ±D1, ±D2 (which should lie on the contour)."""
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    pl = geo["plane"]
    a, b = np.asarray(pl["a"]), np.asarray(pl["b"])
    rho = np.array([[np.nan if v is None else v for v in row] for row in pl["rho"]], dtype=float)
    failed = np.array([[st != "converged" for st in row] for row in pl["status"]])
    hi = max(1.2, float(np.nanmax(rho)) if np.isfinite(rho).any() else 1.2)
    lo = min(0.5, float(np.nanmin(rho)) if np.isfinite(rho).any() else 0.5)
    mesh = ax.pcolormesh(a, b, np.ma.masked_invalid(rho), cmap="RdBu_r", shading="nearest",
                         norm=TwoSlopeNorm(vmin=lo, vcenter=1.0, vmax=hi))
    cb = ax.figure.colorbar(mesh, ax=ax, shrink=0.85)
    cb.set_label("ρ(J*)  (estimate)")
    contour = bool(np.isfinite(rho).sum() >= 4 and np.nanmin(rho) < 1 < np.nanmax(rho))
    if contour:
        ax.contour(a, b, np.where(np.isfinite(rho), rho, np.nan), levels=[1.0], colors="k", linewidths=1.4)
    if failed.any():
        A, B = np.meshgrid(a, b)
        ax.scatter(A[failed], B[failed], marker="x", s=14, color="0.25", lw=0.8,
                   label="continued solve failed (no x*)")
    ax.plot([0], [0], marker="*", ms=13, color="gold", mec="k", ls="none", label="θ* (the checkpoint)")
    r1, r2 = pl.get("radii_D1") or [None, None], pl.get("radii_D2") or [None, None]
    pts = [(r1[0], 0), (-r1[1], 0), (0, r2[0]), (0, -r2[1])] if None not in (*r1, *r2) else []
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", mfc="none", mec="k", ms=7,
                label="bisected radii along ±D1, ±D2")
    if contour:
        ax.plot([], [], color="k", lw=1.4, label="ρ(J*) = 1")
    ax.set(xlabel="a  (relative step along D1)", ylabel="b  (relative step along D2)", aspect="equal",
           title=title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.13), ncol=2, frameon=False)


def _region_plot(report, splits, save):
    fig, axes, plt = _figure(len(splits), 5.6, 5.6)
    for ax, s in zip(axes, splits):
        geo = report[s][geometry.KEY]
        region_axes(ax, geo, f"{s}: stability region around θ* (sample {geo['plane'].get('sample')})")
    save(fig, plt, "geometry_region.png")
