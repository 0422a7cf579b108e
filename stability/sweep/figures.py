"""Result-driven figures: the paper's Figures 3, 6, 7 from sweep records, the same against the fixed-point ρ(J*),
and the training-time stability monitor of one run.

* Figure 3 (:func:`figure3`): per task, the best autonomous (recall none) norm + LR configuration by mean hard
  accuracy, its accuracy against iteration count (mean over seeds, band min–max), the training depth T shaded.
* Figure 6 (:func:`figure6`): learning rate against ρ(W_x) for recall models without outer normalisation
  (norm none / pre / peri; the paper averages pre and peri), top external recall, bottom internal (App. B.3).
* Figure 7 (:func:`figure7`): accuracy against ρ(W_x) for external recall without outer normalisation
  (App. B.4; the paper shows pre-norm), validation and hard.
* Figures 6J and 7J (:func:`figure6_rho_J`, :func:`figure7_rho_J`): the same against the median ρ(J*) at the
  probe's fixed points (Props. 3–4: x* attracts iff ρ(J*) < 1), for every looped model, which the paper could not
  plot because its release never computes J.
* :func:`monitor_figure`: ρ(W_x), median ρ(J*), converged fraction and median ‖dx*/dx0‖_F against epoch, from a
  checkpoint trained with ``--monitor-every``.

``results_figures(results_dir, out_dir)`` and ``run_figures(ckpt_path, out_dir)`` write PNG + PDF (atomically, via
:func:`stability.theory.figures.save_figure`) and return the paths; a figure whose records are absent is skipped.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional

from stability.errors import StabilityError
from stability.sweep.tables import RECALL_ORDER, TASK_ORDER, TASK_TITLE

NO_OUTER_NORM = ("none", "pre", "peri")
NORM_MARKERS = {"none": "o", "pre": "s", "peri": "^", "post": "D", "gru": "v"}
RECALL_COLORS = {"external": "tab:blue", "internal": "tab:red", "none": "tab:gray"}
TASK_COLORS = {"chess": "tab:green", "sudoku": "tab:purple", "prefix-sums": "tab:orange"}


def _figure(*args, **kwargs):
    from matplotlib.figure import Figure

    return Figure(*args, **kwargs)


def _tasks(records: list[dict]) -> list[str]:
    present = {r["config"]["task"]["name"] for r in records}
    return [t for t in TASK_ORDER if t in present] + sorted(present - set(TASK_ORDER))


def _acc(rec: dict, split: str) -> Optional[float]:
    """Percent accuracy at the test iteration; 0 for a diverged run (as in the tables)."""
    if rec.get("status") == "diverged" or not rec.get("final"):
        return 0.0
    return 100.0 * float(rec["final"][split]["accuracy"])


def _stab(rec: dict, key: str) -> Optional[float]:
    v = (rec.get("stability") or {}).get(key)
    return float(v) if v is not None and math.isfinite(float(v)) else None


def _mean(vals: list) -> Optional[float]:
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def _unity(ax, axis: str = "y") -> None:
    (ax.axhline if axis == "y" else ax.axvline)(1.0, color="k", lw=0.8, ls="--", zorder=0)


# ---- Figure 3 ------------------------------------------------------------------------------------------------
def best_autonomous(records: list[dict], task: str) -> Optional[tuple[str, float, list[dict]]]:
    """(norm, lr, records) of the autonomous configuration with the best mean hard accuracy on ``task``."""
    groups: dict[tuple, list] = {}
    for r in records:
        c = r["config"]
        if c["task"]["name"] == task and c["model"]["recall"] == "none":
            groups.setdefault((c["model"]["norm"], c["train"]["lr"]), []).append(r)
    if not groups:
        return None
    key = max(sorted(groups), key=lambda k: _mean([_acc(r, "hard") for r in groups[k]]))
    return key[0], key[1], groups[key]


def figure3(records: list[dict]):
    tasks = [t for t in _tasks(records) if best_autonomous(records, t)]
    if not tasks:
        return None
    import numpy as np

    fig = _figure(figsize=(max(6.0, 4.2 * len(tasks)), 3.6), layout="constrained")
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, task in zip(axes, tasks):
        norm, lr, recs = best_autonomous(records, task)
        done = [r for r in recs if r.get("final")]
        T_train = recs[0]["config"]["train"]["iterations"]
        ax.axvspan(0, T_train, color="0.88", zorder=0, label=f"training depth T = {T_train}")
        for split, color in (("val", "tab:blue"), ("hard", "tab:red")):
            curves = [r["final"][split]["curve"] for r in done]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            C = 100.0 * np.array([c[:n] for c in curves])
            it = np.arange(1, n + 1)
            ax.plot(it, C.mean(0), color=color, label=f"{split} (mean of {len(curves)})")
            if len(curves) > 1:
                ax.fill_between(it, C.min(0), C.max(0), color=color, alpha=0.2, lw=0)
        ax.set_title(f"{TASK_TITLE.get(task, task)}: none recall, {norm} norm, lr {lr:g}", fontsize=9)
        ax.set_xlabel("iterations")
        ax.set_ylabel("accuracy (%)")
        ax.set_xlim(0, None)
        ax.set_ylim(-2, 102)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("Figure 3: accuracy against iterations, best autonomous configuration per task", fontsize=10)
    return fig


# ---- Figures 6 and 6J ------------------------------------------------------------------------------------------
def _lr_panel(ax, recs: list[dict], key: str, group_by: str, colors: dict) -> int:
    """Scatter each run's (lr, key) and the mean per lr for each group; returns the points drawn."""
    drawn = 0
    groups: dict[str, dict[float, list]] = {}
    for r in recs:
        v = _stab(r, key)
        if v is None:
            continue
        g = r["config"]["model"][group_by] if group_by else "all"
        groups.setdefault(g, {}).setdefault(r["config"]["train"]["lr"], []).append(v)
    for g, by_lr in sorted(groups.items()):
        color = colors.get(g, "tab:blue")
        lrs = sorted(by_lr)
        for lr in lrs:
            ax.scatter([lr] * len(by_lr[lr]), by_lr[lr], color=color, s=12, alpha=0.5,
                       marker=NORM_MARKERS.get(g, "o") if group_by == "norm" else "o")
            drawn += len(by_lr[lr])
        ax.plot(lrs, [_mean(by_lr[lr]) for lr in lrs], color=color, marker="o", ms=3,
                label=g if group_by else "mean")
    ax.set_xscale("log")
    _unity(ax)
    return drawn


def figure6(records: list[dict]):
    """LR against ρ(W_x), recall models without outer normalisation; rows external / internal, one column per task."""
    tasks = _tasks(records)
    rows = ("external", "internal")
    sel = [r for r in records if r["config"]["model"]["norm"] in NO_OUTER_NORM
           and r["config"]["model"]["recall"] in rows and _stab(r, "rho_Wx") is not None]
    if not sel:
        return None
    fig = _figure(figsize=(max(6.0, 3.6 * len(tasks)), 5.6), layout="constrained")
    axes = fig.subplots(2, len(tasks), squeeze=False)
    for i, recall in enumerate(rows):
        for j, task in enumerate(tasks):
            ax = axes[i][j]
            recs = [r for r in sel if r["config"]["model"]["recall"] == recall and r["config"]["task"]["name"] == task]
            _lr_panel(ax, recs, "rho_Wx", "", {"all": RECALL_COLORS[recall]})
            ax.set_title(f"{TASK_TITLE.get(task, task)}, {recall} recall", fontsize=9)
            ax.set_xlabel("learning rate")
            ax.set_ylabel("ρ(W_x)")
    fig.suptitle("Figure 6: learning rate against ρ(W_x)\n(norm none / pre / peri; line: mean, dots: runs)",
                 fontsize=10)
    return fig


def figure6_rho_J(records: list[dict]):
    """LR against the median ρ(J*) at the probe's fixed points; rows recall (external, internal, none), colour norm."""
    tasks = _tasks(records)
    rows = [r for r in ("external", "internal", "none") if any(
        rec["config"]["model"]["recall"] == r and _stab(rec, "rho_J_median") is not None for rec in records)]
    if not rows:
        return None
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    norm_colors = {n: cmap(i) for i, n in enumerate(("none", "pre", "post", "peri", "gru"))}
    fig = _figure(figsize=(max(6.0, 3.6 * len(tasks)), 2.8 * len(rows) + 0.4), layout="constrained")
    axes = fig.subplots(len(rows), len(tasks), squeeze=False)
    for i, recall in enumerate(rows):
        for j, task in enumerate(tasks):
            ax = axes[i][j]
            recs = [r for r in records if r["config"]["model"]["recall"] == recall
                    and r["config"]["task"]["name"] == task]
            if _lr_panel(ax, recs, "rho_J_median", "norm", norm_colors):
                ax.legend(fontsize=6, title="norm", title_fontsize=6)
            ax.set_title(f"{TASK_TITLE.get(task, task)}, {recall} recall", fontsize=9)
            ax.set_xlabel("learning rate")
            ax.set_ylabel("median ρ(J*)")
    fig.suptitle("Figure 6J: learning rate against the fixed-point ρ(J*)\n(median over the probe; line: mean, "
                 "markers: runs)", fontsize=10)
    return fig


# ---- Figures 7 and 7J ------------------------------------------------------------------------------------------
def _acc_panels(fig, records: list[dict], key: str, color_of: Callable, xlabel: str, legend_title: str) -> None:
    axes = fig.subplots(1, 2, squeeze=False)[0]
    for ax, split in zip(axes, ("val", "hard")):
        seen = set()
        for r in records:
            x = _stab(r, key)
            if x is None:
                continue
            label, color = color_of(r)
            norm = r["config"]["model"]["norm"]
            ax.scatter([x], [_acc(r, split)], color=color, marker=NORM_MARKERS.get(norm, "o"), s=18, alpha=0.7,
                       label=label if label not in seen else None)
            seen.add(label)
        _unity(ax, "x")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{split} accuracy (%)")
        ax.set_ylim(-2, 102)
        ax.set_title("validation" if split == "val" else "hard", fontsize=9)
        if seen:
            ax.legend(fontsize=7, title=legend_title, title_fontsize=7)


def figure7(records: list[dict]):
    """Accuracy against ρ(W_x) for external recall without outer normalisation (marker = norm, colour = task)."""
    sel = [r for r in records if r["config"]["model"]["recall"] == "external"
           and r["config"]["model"]["norm"] in NO_OUTER_NORM and _stab(r, "rho_Wx") is not None]
    if not sel:
        return None
    fig = _figure(figsize=(9, 3.6), layout="constrained")
    _acc_panels(fig, sel, "rho_Wx", lambda r: (TASK_TITLE.get(t := r["config"]["task"]["name"], t),
                                               TASK_COLORS.get(t, "tab:blue")), "ρ(W_x)", "task")
    fig.suptitle("Figure 7: accuracy against ρ(W_x), external recall (norm none ○ / pre □ / peri △)", fontsize=10)
    return fig


def figure7_rho_J(records: list[dict]):
    """Accuracy against the median ρ(J*) for every looped model (colour = recall, marker = norm)."""
    sel = [r for r in records if r["config"]["model"]["recall"] in RECALL_ORDER[:3]
           and _stab(r, "rho_J_median") is not None]
    if not sel:
        return None
    fig = _figure(figsize=(9, 3.6), layout="constrained")
    _acc_panels(fig, sel, "rho_J_median", lambda r: (rc := r["config"]["model"]["recall"],
                                                     RECALL_COLORS.get(rc, "tab:blue")), "median ρ(J*)", "recall")
    fig.suptitle("Figure 7J: accuracy against the fixed-point spectral radius ρ(J*) (marker = norm)", fontsize=10)
    return fig


RESULT_FIGURES = {
    "fig3_accuracy_vs_iterations": figure3,
    "fig6_lr_vs_rho_Wx": figure6,
    "fig7_accuracy_vs_rho_Wx": figure7,
    "fig6J_lr_vs_rho_J": figure6_rho_J,
    "fig7J_accuracy_vs_rho_J": figure7_rho_J,
}


def results_figures(results_dir, out_dir, log: Optional[Callable[[str], None]] = None) -> list[Path]:
    """Write Figures 3, 6, 7, 6J, 7J (PNG + PDF) from the records in ``results_dir``; returns the paths written.
    A figure with no suitable records is skipped (and ``log`` is told why)."""
    from stability.sweep.runner import load_records
    from stability.theory.figures import save_figure

    records = load_records(Path(results_dir))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for stem, build in RESULT_FIGURES.items():
        fig = build(records)
        if fig is None:
            if log:
                log(f"{stem}: skipped (no records with what it plots)")
            continue
        paths += save_figure(fig, out_dir, stem)
    return paths


# ---- the monitor of one run ------------------------------------------------------------------------------------
MONITOR_PANELS = (
    ("rho_Wx", "ρ(W_x)", True),
    ("rho_J_median", "median ρ(J*)", True),
    ("converged_fraction", "converged fraction", False),
    ("input_grad_norm_median", "median ‖dx*/dx0‖_F", False),
)


def monitor_figure(history: list[dict], title: str = ""):
    """The four monitor quantities against epoch (``history`` as :func:`stability.monitor.monitor_history`)."""
    fig = _figure(figsize=(10, 2.8), layout="constrained")
    axes = fig.subplots(1, 4, squeeze=False)[0]
    epochs = [h["epoch"] for h in history]
    for ax, (key, label, unit_line) in zip(axes, MONITOR_PANELS):
        ys = [h.get(key) for h in history]
        pts = [(e, y) for e, y in zip(epochs, ys) if y is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3)
        else:
            ax.text(0.5, 0.5, "not defined\n(no recall / no converged sample)", ha="center", va="center",
                    transform=ax.transAxes, fontsize=8, color="0.4")
        if unit_line:
            _unity(ax)
        if key == "converged_fraction":
            ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("epoch")
        ax.set_title(label, fontsize=9)
    fig.suptitle(title or "stability monitor", fontsize=10)
    return fig


def run_figures(ckpt_path, out_dir) -> list[Path]:
    """The monitor's plot against epoch for one checkpoint (``monitor_<stem>.png/.pdf``)."""
    import stability
    from stability.monitor import monitor_history
    from stability.theory.figures import save_figure

    ckpt_path = Path(ckpt_path)
    loaded = stability.load(ckpt_path)
    history = monitor_history(loaded.history)
    if not history:
        raise StabilityError(f"{ckpt_path}: no stability-monitor records in its history; train with "
                             "--monitor-every N to log them")
    c = loaded.config
    title = (f"stability monitor: {c.task.name}, {c.model.recall} recall, {c.model.norm} norm, lr {c.train.lr:g}, "
             f"probe of {history[-1].get('samples', '?')} val samples")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return save_figure(monitor_figure(history, title), out_dir, f"monitor_{ckpt_path.stem}")
