"""What a sweep record holds for the claims: its cell's coordinates, whether it ever trained, and each metric's
value (or why it is not measured); and the records of a results directory."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from stability.errors import StabilityError
from stability.sweep.export import read_jsonl
from stability.sweep.record import load_records


def run_keys(rec: dict) -> dict:
    """The record's cell coordinates: task, norm, recall, lr, seed (from its config, as the tables read them)."""
    c = rec["config"]
    return {"task.name": c["task"]["name"], "model.norm": c["model"]["norm"], "model.recall": c["model"]["recall"],
            "train.lr": float(c["train"]["lr"]), "train.seed": int(c["train"]["seed"])}


def never_trained(rec: dict, loss_fraction: float) -> Optional[str]:
    """Why a run counts as never trained, or None: it diverged, has no final evaluation, or its last epoch's loss
    is ≥ ``loss_fraction`` × the chance loss ln C (a uniform prediction over the C = ``model.out_channels``
    classes; ln 2 = 0.693 on prefix sums)."""
    if rec.get("status") == "diverged":
        return "diverged"
    if not rec.get("final"):
        return "no final evaluation"
    loss = rec.get("loss_last")
    classes = int(rec["config"]["model"].get("out_channels") or 2)
    if loss is not None and classes > 1 and math.isfinite(float(loss)):
        chance = math.log(classes)
        if float(loss) >= loss_fraction * chance:
            return f"final loss {float(loss):.3f} ≥ {loss_fraction:g} × chance {chance:.3f}"
    return None


#: a geometry metric's name in the claims file -> the record's key in ``analysis.<split>`` (the geometry stage's
#: summary, stability/analysis/verdict.py: the median radius over directions and App. B.2's log max/min range)
GEOMETRY_FIELDS = {"median_radius": "geometry_median_radius", "anisotropy_log_range": "geometry_log_range"}


#: a version-2 ``<split>.analysis.<name>`` metric -> the record's key in ``analysis.<split>`` where it differs;
#: ``path_alignment`` is the path stage's headline (Anil et al. 2022's asymptotic alignment, the median over inputs,
#: restarted from another input's fixed point: stability/analysis/stages/path_independence.py)
ANALYSIS_FIELDS = {"path_alignment": "path_aa_other_median"}


def _curve_at(rec: dict, split: str, iteration: int) -> Optional[float]:
    curve = ((rec.get("final") or {}).get(split) or {}).get("curve") or []
    return 100.0 * float(curve[iteration - 1]) if 1 <= iteration <= len(curve) else None


def metric_value(rec: dict, metric: str) -> tuple[Optional[float], Optional[str]]:
    """(value, None) or (None, why it is not measured) for one record.

    Accuracy is whole-answer accuracy in percent at the test iteration (a diverged run counts 0, as in the
    tables); ``*.accuracy_at_train_depth`` is the curve at iteration T = ``train.iterations``;
    ``*.overthinking`` the points lost from T to the test iteration (Figure 3); ``val-hard.accuracy`` the
    val-to-hard drop; ``rho_Wx`` the final model's ρ(W_x); ``monitor.rho_Wx.max`` its largest value in the
    training monitor series (App. B.3); ``*.geometry.*`` the geometry stage's summary of that split
    (``analysis.<split>.geometry_*``, :data:`GEOMETRY_FIELDS`).
    """
    final = rec.get("final") or {}
    diverged = rec.get("status") == "diverged" or not final
    if metric in ("val.accuracy", "hard.accuracy"):
        split = metric.split(".")[0]
        return (0.0 if diverged else 100.0 * float(final[split]["accuracy"])), None
    if metric == "val-hard.accuracy":
        if diverged:
            return None, "diverged: no accuracy"
        return 100.0 * (float(final["val"]["accuracy"]) - float(final["hard"]["accuracy"])), None
    if metric.endswith(".accuracy_at_train_depth") or metric.endswith(".overthinking"):
        split = metric.split(".")[0]
        if diverged:
            return None, "diverged: no accuracy curve"
        T = int(rec["config"]["train"]["iterations"])
        at_T = _curve_at(rec, split, T)
        if at_T is None:
            return None, f"no {split} accuracy curve reaching the training depth T = {T}"
        if metric.endswith(".accuracy_at_train_depth"):
            return at_T, None
        return at_T - 100.0 * float(final[split]["accuracy"]), None
    if metric == "rho_Wx":
        if rec["config"]["model"]["recall"] in ("none", "fixed"):
            return None, "no W_x (no recall)"
        v = (rec.get("stability") or {}).get("rho_Wx")
        if v is None:
            v = ((rec.get("analysis") or {}).get("val") or {}).get("rho_Wx")
        return (float(v), None) if v is not None and math.isfinite(float(v)) else (None, "ρ(W_x) not recorded")
    if metric == "monitor.rho_Wx.max":
        series = [m.get("rho_Wx") for m in rec.get("monitor") or [] if isinstance(m, dict)]
        series = [float(v) for v in series if v is not None and math.isfinite(float(v))]
        if not series:
            return None, "no monitor series of ρ(W_x) (train.monitor_every = 0 or no recall)"
        return max(series), None
    if ".analysis." in metric:
        split, _, key = metric.split(".", 2)
        field = ANALYSIS_FIELDS.get(key, key)
        v = ((rec.get("analysis") or {}).get(split) or {}).get(field)
        if v is None or not math.isfinite(float(v)):
            return None, f"analysis.{split}.{field} not recorded"
        return float(v), None
    if ".geometry." in metric:
        split, _, key = metric.split(".", 2)
        summary = (rec.get("analysis") or {}).get(split) or {}
        if not any(k.startswith("geometry_") for k in summary):
            return None, f"no analysis.{split}.geometry block (the geometry stage did not run)"
        field = GEOMETRY_FIELDS[key]
        v = summary.get(field)
        if v is None or not math.isfinite(float(v)):
            u = summary.get("geometry_unstable_t0")
            why = " (no stable region: the trained weights are not stable, geometry_unstable_t0 = 1)" if u == 1 else ""
            return None, f"analysis.{split}.{field} not measured{why}"
        return float(v), None
    raise ValueError(f"unknown metric {metric!r}")


def read_results(path) -> list[dict]:
    """The records of RESULTS: ``RESULTS/records/*.json`` (the sweep's source of truth), else
    ``RESULTS/records.jsonl``, or a ``.jsonl`` file given directly."""
    path = Path(path)
    if path.is_file():
        return read_jsonl(path)
    if (path / "records").is_dir():
        return load_records(path)
    if (path / "records.jsonl").is_file():
        return read_jsonl(path / "records.jsonl")
    if not path.exists():
        raise StabilityError(f"{path}: no such results directory")
    raise StabilityError(f"{path}: no sweep records (expected records/*.json or records.jsonl)")
