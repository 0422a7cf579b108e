"""Result-driven figures: the paper's Figures 3, 6, 7 from sweep records, the same against the fixed-point ρ(J*),
and the training-time stability monitor of one run.

* Figure 3 (:func:`figure3`): per task, the best autonomous (recall none) norm + LR configuration by the registered
  rule (mean hard accuracy, ties by mean val: ``claims.FIGURE3_RULE``), its accuracy against iteration count (mean over seeds, band min–max), the training depth T shaded.
* Figure 6 (:func:`figure6`): learning rate against ρ(W_x) for recall models without outer normalisation
  (norm pre / peri, which the paper averages), top external recall, bottom internal (App. B.3).
* Figure 7 (:func:`figure7`): accuracy against ρ(W_x) for external recall with pre-norm, as the paper's App. B.4,
  validation and hard.
* Figures 6J and 7J (:func:`figure6_rho_J`, :func:`figure7_rho_J`): the same against the median ρ(J*) at the
  probe's fixed points (Props. 3–4: x* attracts iff ρ(J*) < 1), for every looped model, which the paper could not
  plot because its release never computes J.
* Figure 3 by recall (:func:`figure3_by_recall`): the best norm + LR of each recall, val and hard, against
  iterations (issue: the replication's Fig. 3), the fixed-depth baseline as a line.
* Hard accuracy against the fixed point (:func:`figure_hard_vs_fixed_point`): against ρ(J*) and against the
  converged share, colour = norm, marker = recall.
* :func:`monitor_figure`: ρ(W_x), median ρ(J*), converged fraction and median ‖dx*/dx0‖_F against epoch, from a
  checkpoint trained with ``--monitor-every``.

No run is dropped silently: a run in which no probe sample converged (ρ(J*) undefined: exactly the unstable
models) is drawn in a grey strip at the edge of the ρ(J*) axis labelled "no converged sample", and runs that
cannot be drawn at all (diverged, not analysed) are counted and named in the figure's caption. Each figure built
from records carries what it drew as ``fig.stability_data`` (the ``*_data`` functions), which the tests check.
Accuracy is whole-answer accuracy throughout (the tables' number), said in each axis label.

``results_figures(results_dir, out_dir)`` and ``run_figures(ckpt_path, out_dir)`` write PNG + PDF (atomically, via
:func:`stability.theory.figures.save_figure`) and return the paths; a figure whose records are absent is skipped.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional, Union

import stability
from stability.errors import StabilityError
from stability.sweep.correlations import write_correlations
from stability.sweep.quantities import accuracy as _acc, is_looped as _looped, split_quantity  # noqa: F401
from stability.sweep.record import SweepRecord, load_records, typed
from stability.sweep.tables import RECALL_ORDER, TASK_ORDER, TASK_TITLE

#: the norms the paper draws: Figure 6 averages pre and peri (App. B.3), Figure 7 is external recall with pre-norm
#: (App. B.4); a grid's "none" norm is not the paper's and is left out of both
FIGURE6_NORMS = ("pre", "peri")
FIGURE7_NORMS = ("pre",)
NORM_MARKERS = {"none": "o", "pre": "s", "peri": "^", "post": "D", "gru": "v"}
RECALL_COLORS = {"external": "tab:blue", "internal": "tab:red", "none": "tab:gray"}
TASK_COLORS = {"chess": "tab:green", "sudoku": "tab:purple", "prefix-sums": "tab:orange"}


def _figure(*args, **kwargs):
    from matplotlib.figure import Figure

    return Figure(*args, **kwargs)


#: records as the figures take them: typed, or their JSON (read typed once, at the figure's entry)
Records = list[Union[SweepRecord, dict]]


def _typed(records: Records) -> list[SweepRecord]:
    return [typed(r) for r in records]


def _tasks(records: list[SweepRecord]) -> list[str]:
    present = {r.config.task.name for r in records}
    return [t for t in TASK_ORDER if t in present] + sorted(present - set(TASK_ORDER))


def _stab(rec: SweepRecord, key: str) -> Optional[float]:
    """The record's stability summary's ``key`` (None where it has none or it is not finite)."""
    v = getattr(rec.stability, key, None)
    return float(v) if v is not None and math.isfinite(float(v)) else None


def _mean(vals: list) -> Optional[float]:
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def _unity(ax, axis: str = "y") -> None:
    (ax.axhline if axis == "y" else ax.axvline)(1.0, color="k", lw=0.8, ls="--", zorder=0)


def missing_reason(rec: Union[SweepRecord, dict], key: str) -> Optional[str]:
    """Why a run has no value of the stability quantity ``key``: ``"no converged sample"`` (analysed, but no probe
    sample reached a fixed point, so ρ(J*) is undefined: exactly the unstable models), ``"diverged"`` (training
    diverged: no model to analyse), ``"not analysed"``; None when it has a value."""
    rec = typed(rec)
    if _stab(rec, key) is not None:
        return None
    if rec.status == "diverged":
        return "diverged"
    st = rec.stability
    if st is None:
        return "not analysed"
    if key in ("rho_J_median", "input_grad_norm_median") and (st.converged_fraction in (0, 0.0)):
        return NO_CONVERGED
    return "not analysed"


NO_CONVERGED = "no converged sample"


def _missing_note(missing: list[dict]) -> str:
    """One caption line counting the runs drawn at a marked position or left out, by reason."""
    counts: dict[str, int] = {}
    for m in missing:
        counts[m["reason"]] = counts.get(m["reason"], 0) + 1
    parts = []
    if counts.get(NO_CONVERGED):
        parts.append(f"{counts[NO_CONVERGED]} run(s) with no converged probe sample drawn in the strip "
                     f"\"{NO_CONVERGED}\"")
    for reason in ("diverged", "not analysed"):
        if counts.get(reason):
            ids = ", ".join(m["cell_id"] for m in missing if m["reason"] == reason)
            parts.append(f"{counts[reason]} {reason} run(s) not drawn ({ids})")
    return "; ".join(parts)


def _caption(fig, text: str) -> None:
    """A caption under the figure (the constrained layout keeps room for it), wrapped to the figure's width."""
    import textwrap

    width = max(60, int(fig.get_figwidth() * 17))
    fig.supxlabel("\n".join(textwrap.wrap(text, width)), fontsize=6, color="0.25")


def _cell_name(rec: SweepRecord) -> str:
    return rec.cell_id or rec.id


def _norm_legend(ax, norms, loc="lower right") -> None:
    """A legend of the marker shapes (marker = norm), added beside any other legend of ``ax``."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker=NORM_MARKERS.get(n, "o"), color="0.3", label=n)
               for n in NORM_ORDER if n in norms]
    if not handles:
        return
    first = ax.get_legend()
    ax.legend(handles=handles, fontsize=6, title="marker: norm", title_fontsize=6, loc=loc)
    if first is not None:
        ax.add_artist(first)


NORM_ORDER = ("none", "pre", "peri", "post", "gru")


# ---- Figure 3 ------------------------------------------------------------------------------------------------
def best_autonomous(records: Records, task: str) -> Optional[tuple[str, float, list[SweepRecord]]]:
    """(norm, lr, records) of the autonomous configuration Figure 3 draws on ``task``: the registered rule
    (:data:`stability.sweep.claims.FIGURE3_RULE`: best mean hard accuracy, ties by mean val accuracy), the same
    selection the claim ``no-overthinking-best-autonomous`` tests."""
    # lazy: numpy; this module imports without it
    from stability.sweep.claims import select_runs

    runs = [r for r in _typed(records) if r.config.task.name == task and r.config.model.recall == "none"]
    if not runs:
        return None
    chosen, how = select_runs(runs)
    return how["selected"]["model.norm"], how["selected"]["train.lr"], chosen


def figure3(records: Records):
    """Whole-answer accuracy against iterations (val and hard: mean over seeds, band min–max) of each task's best
    autonomous configuration (:func:`best_autonomous`)."""
    records = _typed(records)
    tasks = [t for t in _tasks(records) if best_autonomous(records, t)]
    if not tasks:
        return None
    import numpy as np

    fig = _figure(figsize=(max(6.0, 4.2 * len(tasks)), 3.6), layout="constrained")
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, task in zip(axes, tasks):
        norm, lr, recs = best_autonomous(records, task)
        done = [r for r in recs if r.final]
        T_train = recs[0].config.train.iterations
        ax.axvspan(0, T_train, color="0.88", zorder=0, label=f"training depth T = {T_train}")
        for split, color in (("val", "tab:blue"), ("hard", "tab:red")):
            curves = [r.final[split].curve for r in done]
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
        ax.set_ylabel("whole-answer accuracy (%)")
        ax.set_xlim(0, None)
        ax.set_ylim(-2, 102)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("Figure 3: accuracy against iterations, best autonomous configuration per task", fontsize=10)
    return fig


def best_by_recall(records: Records, task: str) -> dict:
    """recall -> (norm, lr, records) of its configuration with the best mean hard accuracy on ``task`` (ties: the
    first in sorted (norm, lr) order)."""
    groups: dict[tuple, list] = {}
    for r in _typed(records):
        c = r.config
        if c.task.name == task:
            groups.setdefault((c.model.recall, c.model.norm, c.train.lr), []).append(r)
    out = {}
    for recall in RECALL_ORDER:
        keys = sorted(k for k in groups if k[0] == recall)
        if keys:
            best = max(keys, key=lambda k: _mean([_acc(r, "hard") for r in groups[k]]))
            out[recall] = (best[1], best[2], groups[best])
    return out


def figure3_by_recall(records: Records):
    """Figure 3 for each recall: per task, the best norm + LR configuration of each recall (by mean hard accuracy),
    whole-answer accuracy against iterations on val and hard (mean over seeds, band min–max). A fixed-depth
    baseline has no iterations: it is drawn as a horizontal line at its accuracy."""
    records = _typed(records)
    tasks = [t for t in _tasks(records) if best_by_recall(records, t)]
    if not tasks:
        return None
    import numpy as np

    colors = {**RECALL_COLORS, "fixed": "k"}
    fig = _figure(figsize=(9, 3.4 * len(tasks)), layout="constrained")
    axes = fig.subplots(len(tasks), 2, squeeze=False)
    for row, task in zip(axes, tasks):
        best = best_by_recall(records, task)
        T_train = next(iter(best.values()))[2][0].config.train.iterations
        for ax, split in zip(row, ("val", "hard")):
            ax.axvspan(0, T_train, color="0.9", zorder=0, label=f"training depth T = {T_train}")
            for recall, (norm, lr, recs) in best.items():
                done = [r for r in recs if r.final]
                label = f"{recall}: {norm}, lr {lr:g} ({len(done)}/{len(recs)} seeds)"
                if not done:
                    continue
                if recall == "fixed":
                    ax.axhline(_mean([_acc(r, split) for r in done]), color=colors["fixed"], ls="--", lw=1,
                               label=f"fixed depth: {norm}, lr {lr:g}")
                    continue
                curves = [r.final[split].curve for r in done]
                n = min(len(c) for c in curves)
                C = 100.0 * np.array([c[:n] for c in curves])
                it = np.arange(1, n + 1)
                ax.plot(it, C.mean(0), color=colors.get(recall, "tab:blue"), label=label)
                if len(curves) > 1:
                    ax.fill_between(it, C.min(0), C.max(0), color=colors.get(recall, "tab:blue"), alpha=0.15, lw=0)
            ax.set_xscale("log")
            ax.set_xlabel("iterations (log scale)")
            ax.set_ylabel(f"{'validation' if split == 'val' else 'hard'} whole-answer accuracy (%)")
            ax.set_ylim(-2, 102)
            ax.set_title(f"{TASK_TITLE.get(task, task)}, {'validation' if split == 'val' else 'hard'}", fontsize=9)
            ax.legend(fontsize=6, loc="best")
    fig.suptitle("Figure 3 by recall: accuracy against iterations, best norm + LR of each recall\n"
                 "(line: mean over seeds, band: min–max; dashed: the fixed-depth baseline)", fontsize=10)
    return fig


# ---- Figures 6 and 6J ------------------------------------------------------------------------------------------
def _lr_panel(ax, recs: list[SweepRecord], key: str, group_by: str, colors: dict) -> int:
    """Scatter each run's (lr, key) and the mean per lr for each group; returns the points drawn."""
    drawn = 0
    groups: dict[str, dict[float, list]] = {}
    for r in recs:
        v = _stab(r, key)
        if v is None:
            continue
        g = getattr(r.config.model, group_by) if group_by else "all"
        groups.setdefault(g, {}).setdefault(r.config.train.lr, []).append(v)
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


def figure6(records: Records):
    """LR against ρ(W_x), recall models without outer normalisation; rows external / internal, one column per task."""
    records = _typed(records)
    tasks = _tasks(records)
    rows = ("external", "internal")
    cand = [r for r in records if r.config.model.norm in FIGURE6_NORMS
            and r.config.model.recall in rows]
    sel = [r for r in cand if _stab(r, "rho_Wx") is not None]
    if not sel:
        return None
    missing = [{"cell_id": _cell_name(r), "reason": missing_reason(r, "rho_Wx")} for r in cand
               if _stab(r, "rho_Wx") is None]
    fig = _figure(figsize=(max(6.0, 3.6 * len(tasks)), 5.6), layout="constrained")
    axes = fig.subplots(2, len(tasks), squeeze=False)
    for i, recall in enumerate(rows):
        for j, task in enumerate(tasks):
            ax = axes[i][j]
            recs = [r for r in sel if r.config.model.recall == recall and r.config.task.name == task]
            _lr_panel(ax, recs, "rho_Wx", "", {"all": RECALL_COLORS[recall]})
            ax.set_title(f"{TASK_TITLE.get(task, task)}, {recall} recall", fontsize=9)
            ax.set_xlabel("learning rate")
            ax.set_ylabel("ρ(W_x)")
    fig.suptitle("Figure 6: learning rate against ρ(W_x)\n(norm pre / peri, as the paper; line: mean, dots: runs)",
                 fontsize=10)
    if missing:
        _caption(fig, _missing_note(missing))
    fig.stability_data = {"points": [{"cell_id": _cell_name(r), "value": _stab(r, "rho_Wx")} for r in sel],
                          "missing": missing}
    return fig


def _norm_colors() -> dict:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {n: cmap(i) for i, n in enumerate(("none", "pre", "post", "peri", "gru"))}


def figure6_rho_J_data(records: Records) -> dict:
    """What Figure 6J draws: per (recall, task) panel the runs with a median ρ(J*) (``points``: cell id, norm, lr,
    value) and those without (``missing``: cell id, norm, lr, reason, see :func:`missing_reason`). Runs with no
    converged probe sample are drawn in a strip above the axis, never dropped."""
    looped = [r for r in _typed(records) if _looped(r)]
    rows = [r for r in ("external", "internal", "none") if any(rec.config.model.recall == r
                                                                 for rec in looped)]
    panels = {}
    for recall in rows:
        for task in _tasks(looped):
            pts, miss = [], []
            for r in looped:
                c = r.config
                if c.model.recall != recall or c.task.name != task:
                    continue
                item = {"cell_id": _cell_name(r), "norm": c.model.norm, "lr": c.train.lr}
                reason = missing_reason(r, "rho_J_median")
                if reason is None:
                    pts.append({**item, "value": _stab(r, "rho_J_median")})
                else:
                    miss.append({**item, "reason": reason})
            panels[(recall, task)] = {"points": pts, "missing": miss}
    return {"rows": rows, "tasks": _tasks(looped), "panels": panels,
            "caption": _missing_note([m for p in panels.values() for m in p["missing"]])}


def figure6_rho_J(records: Records):
    """LR against the median ρ(J*) at the probe's fixed points; rows recall (external, internal, none), colour norm;
    runs with no converged probe sample in a marked strip above each panel (:func:`figure6_rho_J_data`)."""
    data = figure6_rho_J_data(records)
    if not any(p["points"] or p["missing"] for p in data["panels"].values()):
        return None
    rows, tasks = data["rows"], data["tasks"]
    norm_colors = _norm_colors()
    fig = _figure(figsize=(max(6.0, 3.6 * len(tasks)), 2.8 * len(rows) + 0.9), layout="constrained")
    axes = fig.subplots(len(rows), len(tasks), squeeze=False)
    for i, recall in enumerate(rows):
        for j, task in enumerate(tasks):
            ax = axes[i][j]
            panel = data["panels"][(recall, task)]
            by_norm: dict[str, dict[float, list]] = {}
            for pt in panel["points"]:
                by_norm.setdefault(pt["norm"], {}).setdefault(pt["lr"], []).append(pt["value"])
            for norm, by_lr in sorted(by_norm.items()):
                color = norm_colors.get(norm, "tab:blue")
                lrs = sorted(by_lr)
                for lr in lrs:
                    ax.scatter([lr] * len(by_lr[lr]), by_lr[lr], color=color, s=12, alpha=0.5,
                               marker=NORM_MARKERS.get(norm, "o"))
                ax.plot(lrs, [_mean(by_lr[lr]) for lr in lrs], color=color, marker=NORM_MARKERS.get(norm, "o"),
                        ms=3, label=norm)
            values = [pt["value"] for pt in panel["points"]]
            top = max(values + [1.0]) * 1.25
            strip = [m for m in panel["missing"] if m["reason"] == NO_CONVERGED]
            if strip:
                y = top * 1.08
                ax.axhspan(top, top * 1.16, color="0.92", zorder=0)
                for m in strip:
                    ax.scatter([m["lr"]], [y], color=norm_colors.get(m["norm"], "tab:blue"), s=16,
                               marker="x", zorder=3)
                ax.text(0.02, y, NO_CONVERGED, transform=ax.get_yaxis_transform(), fontsize=6, va="center",
                        color="0.3")
                ax.set_ylim(0, top * 1.16)
            ax.set_xscale("log")
            _unity(ax)
            norms = sorted({pt["norm"] for pt in panel["points"]} | {m["norm"] for m in strip},
                           key=lambda n: NORM_ORDER.index(n) if n in NORM_ORDER else 9)
            if norms:
                from matplotlib.lines import Line2D

                ax.legend(handles=[Line2D([], [], color=norm_colors.get(n, "tab:blue"), marker=NORM_MARKERS.get(n, "o"),
                                          ms=3, label=n) for n in norms],
                          fontsize=6, title="colour: norm", title_fontsize=6, loc="center left")
            ax.set_title(f"{TASK_TITLE.get(task, task)}, {recall} recall", fontsize=9)
            ax.set_xlabel("learning rate")
            ax.set_ylabel("median ρ(J*) over converged samples")
    fig.suptitle("Figure 6J: learning rate against the fixed-point ρ(J*)\n(line: mean per norm, markers: runs;\n"
                 "× in the grey strip: no probe sample converged, ρ(J*) undefined)", fontsize=10)
    if data["caption"]:
        _caption(fig, data["caption"])
    fig.stability_data = data
    return fig


# ---- Figures 7 and 7J ------------------------------------------------------------------------------------------
def accuracy_scatter_data(records: Records, key: str) -> dict:
    """What an accuracy-against-``key`` figure draws: ``points`` (cell id, norm, recall, task, x, val, hard accuracy
    in percent) and ``missing`` (the same with a reason instead of x: see :func:`missing_reason`). Runs with no
    converged sample are drawn in a strip at the right edge; the others are listed in the caption."""
    pts, miss = [], []
    for r in _typed(records):
        c = r.config
        item = {"cell_id": _cell_name(r), "norm": c.model.norm, "recall": c.model.recall,
                "task": c.task.name, "val": _acc(r, "val"), "hard": _acc(r, "hard")}
        reason = missing_reason(r, key)
        if reason is None:
            pts.append({**item, "x": _stab(r, key)})
        else:
            miss.append({**item, "reason": reason})
    return {"key": key, "points": pts, "missing": miss, "caption": _missing_note(miss)}


def _acc_panels(fig, data: dict, color_of: Callable, xlabel: str, legend_title: str) -> None:
    axes = fig.subplots(1, 2, squeeze=False)[0]
    xs = [p["x"] for p in data["points"]]
    strip = [m for m in data["missing"] if m["reason"] == NO_CONVERGED]
    right = max(xs + [1.0]) * 1.2
    for ax, split in zip(axes, ("val", "hard")):
        seen = set()
        for pt in data["points"] + strip:
            label, color = color_of(pt)
            x = pt.get("x", right * 1.08)
            marker = NORM_MARKERS.get(pt["norm"], "o")
            ax.scatter([x], [pt[split]], color=color, marker=marker, s=18, alpha=0.7,
                       label=label if label not in seen else None)
            seen.add(label)
        if strip:
            ax.axvspan(right, right * 1.16, color="0.92", zorder=0)
            ax.text(right * 1.08, 50, NO_CONVERGED, rotation=90, ha="center", va="center", fontsize=6, color="0.3")
            ax.set_xlim(min(xs + [0.0]) - 0.05 * right, right * 1.16)
        _unity(ax, "x")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{'validation' if split == 'val' else 'hard'} whole-answer accuracy (%)")
        ax.set_ylim(-2, 102)
        ax.set_title("validation" if split == "val" else "hard", fontsize=9)
        if seen:
            ax.legend(fontsize=7, title=f"colour: {legend_title}", title_fontsize=7, loc="upper left")
        _norm_legend(ax, {p["norm"] for p in data["points"] + strip}, loc="center left")
    if data["caption"]:
        _caption(fig, data["caption"])
    fig.stability_data = data


def figure7(records: Records):
    """Accuracy against ρ(W_x) for external recall with pre-norm, as the paper's App. B.4 (colour = task)."""
    sel = [r for r in _typed(records) if r.config.model.recall == "external"
           and r.config.model.norm in FIGURE7_NORMS]
    data = accuracy_scatter_data(sel, "rho_Wx")
    if not data["points"]:
        return None
    fig = _figure(figsize=(9, 3.9), layout="constrained")
    _acc_panels(fig, data, lambda p: (TASK_TITLE.get(p["task"], p["task"]), TASK_COLORS.get(p["task"], "tab:blue")),
                "ρ(W_x)", "task")
    fig.suptitle("Figure 7: accuracy against ρ(W_x), external recall, pre-norm (as the paper)", fontsize=10)
    return fig


def figure7_rho_J(records: Records):
    """Accuracy against the median ρ(J*) for every looped model (colour = recall, marker = norm)."""
    data = accuracy_scatter_data([r for r in _typed(records) if _looped(r)], "rho_J_median")
    if not data["points"] and not data["missing"]:
        return None
    fig = _figure(figsize=(9, 3.9), layout="constrained")
    _acc_panels(fig, data, lambda p: (p["recall"], RECALL_COLORS.get(p["recall"], "tab:blue")),
                "median ρ(J*) over converged samples", "recall")
    fig.suptitle("Figure 7J: accuracy against the fixed-point spectral radius ρ(J*)\n(grey strip: runs where no "
                 "probe sample converged, so ρ(J*) is undefined)", fontsize=10)
    return fig


# ---- the figure the paper could not draw ------------------------------------------------------------------
def hard_vs_fixed_point_data(records: Records, split: str = "hard") -> dict:
    """What :func:`figure_hard_vs_fixed_point` draws: per looped, analysed run its cell id, norm, recall, hard
    accuracy (percent), median ρ(J*) (None: no converged sample) and converged share, measured on ``split``."""
    pts, left_out = [], []
    for r in _typed(records):
        if not _looped(r):
            continue
        c = r.config
        item = {"cell_id": _cell_name(r), "norm": c.model.norm, "recall": c.model.recall,
                "hard": _acc(r, "hard"), "rho_J": split_quantity(r, "rho_J_median", split),
                "converged": split_quantity(r, "converged_fraction", split)}
        if item["converged"] is None:
            left_out.append({**item, "reason": "diverged" if r.status == "diverged" else "not analysed"})
        else:
            pts.append(item)
    return {"split": split, "points": pts, "missing": left_out, "caption": _missing_note(left_out)}


def figure_hard_vs_fixed_point(records: Records):
    """Hard accuracy against the median ρ(J*) and against the converged share of the analysed samples (on the
    hard split where it was analysed), colour = norm, marker = recall; runs with no converged sample sit in a
    marked strip of the ρ(J*) panel."""
    records = _typed(records)
    data = hard_vs_fixed_point_data(records)
    if not data["points"]:
        data = hard_vs_fixed_point_data(records, "val")
        if not data["points"]:
            return None
    from matplotlib.lines import Line2D

    norm_colors = _norm_colors()
    recall_markers = {"external": "o", "internal": "s", "none": "^"}
    fig = _figure(figsize=(10, 4.0), layout="constrained")
    ax_j, ax_c = fig.subplots(1, 2, squeeze=False)[0]
    rhos = [p["rho_J"] for p in data["points"] if p["rho_J"] is not None]
    right = max(rhos + [1.0]) * 1.2
    strip = False
    for p in data["points"]:
        color, marker = norm_colors.get(p["norm"], "tab:blue"), recall_markers.get(p["recall"], "o")
        if p["rho_J"] is None:
            strip = True
            ax_j.scatter([right * 1.08], [p["hard"]], color=color, marker=marker, s=20, alpha=0.8)
        else:
            ax_j.scatter([p["rho_J"]], [p["hard"]], color=color, marker=marker, s=20, alpha=0.8)
        ax_c.scatter([100.0 * p["converged"]], [p["hard"]], color=color, marker=marker, s=20, alpha=0.8)
    if strip:
        ax_j.axvspan(right, right * 1.16, color="0.92", zorder=0)
        ax_j.text(right * 1.08, 50, NO_CONVERGED, rotation=90, ha="center", va="center", fontsize=6, color="0.3")
        ax_j.set_xlim(min(rhos + [0.0]) - 0.05 * right, right * 1.16)
    _unity(ax_j, "x")
    where = "hard" if data["split"] == "hard" else "validation"
    ax_j.set_xlabel(f"median ρ(J*) over converged {where} samples")
    ax_c.set_xlabel(f"converged share of the analysed {where} samples (%)")
    ax_c.set_xlim(-5, 105)
    for ax in (ax_j, ax_c):
        ax.set_ylabel("hard whole-answer accuracy (%)")
        ax.set_ylim(-2, 102)
    norms = sorted({p["norm"] for p in data["points"]}, key=lambda n: NORM_ORDER.index(n) if n in NORM_ORDER else 9)
    recalls = [r for r in ("external", "internal", "none") if any(p["recall"] == r for p in data["points"])]
    leg1 = ax_c.legend(handles=[Line2D([], [], ls="", marker="o", color=norm_colors.get(n, "tab:blue"), label=n)
                                for n in norms], fontsize=6, title="colour: norm", title_fontsize=6, loc="upper left")
    ax_c.add_artist(leg1)
    ax_c.legend(handles=[Line2D([], [], ls="", marker=recall_markers[r], color="0.3", label=r) for r in recalls],
                fontsize=6, title="marker: recall", title_fontsize=6, loc="center left")
    fig.suptitle("Hard accuracy against the fixed point: ρ(J*) (left) and the share of samples that converge (right)",
                 fontsize=10)
    if data["caption"]:
        _caption(fig, data["caption"])
    fig.stability_data = data
    return fig


RESULT_FIGURES = {
    "fig3_accuracy_vs_iterations": figure3,
    "fig3R_accuracy_vs_iterations_by_recall": figure3_by_recall,
    "fig6_lr_vs_rho_Wx": figure6,
    "fig7_accuracy_vs_rho_Wx": figure7,
    "fig6J_lr_vs_rho_J": figure6_rho_J,
    "fig7J_accuracy_vs_rho_J": figure7_rho_J,
    "figJ_hard_accuracy_vs_fixed_point": figure_hard_vs_fixed_point,
}


def results_figures(results_dir, out_dir, log: Optional[Callable[[str], None]] = None) -> list[Path]:
    """Write Figures 3 (and 3 by recall), 6, 7, 6J, 7J and the hard-accuracy-against-fixed-point figure (PNG + PDF)
    from the records in ``results_dir``, and the rank-correlation summary (correlations.json / .md, see
    :mod:`stability.sweep.correlations`); returns the paths written. A figure with no suitable records is skipped
    (and ``log`` is told why)."""
    # lazy: numpy; this module imports without it
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
    paths += write_correlations(records, out_dir)  # which measured quantity predicts hard accuracy (rank correlations)
    return paths


# ---- the monitor of one run ------------------------------------------------------------------------------------
MONITOR_PANELS = (
    ("rho_Wx", "ρ(W_x)", True),
    ("rho_J_median", "median ρ(J*)", True),
    ("converged_fraction", "converged fraction", False),
    ("input_grad_norm_median", "median ‖dx*/dx0‖_F", False),
)


def monitor_figure(history: list[dict], title: str = ""):
    """The four monitor quantities against epoch (``history`` as :func:`stability.analysis.monitor.monitor_history`)."""
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
    # lazy: torch; this module imports without it
    from stability.analysis.monitor import monitor_history
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
