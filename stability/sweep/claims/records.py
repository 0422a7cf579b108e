"""What a sweep record holds for the claims: its cell's coordinates, whether it ever trained, and each metric's
value (or why it is not measured); and the records of a results directory. A record is read typed
(:class:`~stability.sweep.record.SweepRecord`; its JSON is validated through it once): the final evaluation, the
monitor, the stability summary and each split's headline block by their fields."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Union

from stability.errors import StabilityError
from stability.sweep.export import read_jsonl
from stability.sweep.record import SplitSummary, SweepRecord, load_records, typed


def run_keys(rec: Union[SweepRecord, dict]) -> dict:
    """The record's cell coordinates: task, norm, recall, lr, seed (from its config, as the tables read them)."""
    c = typed(rec).config
    return {"task.name": c.task.name, "model.norm": c.model.norm, "model.recall": c.model.recall,
            "train.lr": float(c.train.lr), "train.seed": int(c.train.seed)}


def never_trained(rec: Union[SweepRecord, dict], loss_fraction: float) -> Optional[str]:
    """Why a run counts as never trained, or None: it diverged, has no final evaluation, or its last epoch's loss
    is ≥ ``loss_fraction`` × the chance loss ln C (a uniform prediction over the C = ``model.out_channels``
    classes; ln 2 = 0.693 on prefix sums)."""
    rec = typed(rec)
    if rec.status == "diverged":
        return "diverged"
    if not rec.final:
        return "no final evaluation"
    loss = rec.loss_last
    classes = int(rec.config.model.out_channels)
    if loss is not None and classes > 1 and math.isfinite(float(loss)):
        chance = math.log(classes)
        if float(loss) >= loss_fraction * chance:
            return f"final loss {float(loss):.3f} ≥ {loss_fraction:g} × chance {chance:.3f}"
    return None


#: a geometry metric's name in the claims file -> the headline key of ``analysis.<split>`` (the geometry stage's
#: summary, stability/analysis/verdict.py: the median radius over directions and App. B.2's log max/min range)
GEOMETRY_FIELDS = {"median_radius": "geometry_median_radius", "anisotropy_log_range": "geometry_log_range"}


#: a version-2 ``<split>.analysis.<name>`` metric -> the headline key of ``analysis.<split>`` where it differs;
#: ``path_alignment`` is the path stage's headline (Anil et al. 2022's asymptotic alignment, the median over inputs,
#: restarted from another input's fixed point: stability/analysis/stages/path_independence.py)
ANALYSIS_FIELDS = {"path_alignment": "path_aa_other_median"}


def _curve_at(rec: SweepRecord, split: str, iteration: int) -> Optional[float]:
    curve = rec.final[split].curve if rec.final and split in rec.final else []
    return 100.0 * float(curve[iteration - 1]) if 1 <= iteration <= len(curve) else None


def _finite(v) -> bool:
    return v is not None and math.isfinite(float(v))


def _headline(rec: SweepRecord, split: str) -> Optional[SplitSummary]:
    """The record's headline block of ``split`` (its compact analysis), or None."""
    return (rec.analysis or {}).get(split)


def metric_value(rec: Union[SweepRecord, dict], metric: str) -> tuple[Optional[float], Optional[str]]:
    """(value, None) or (None, why it is not measured) for one record.

    Accuracy is whole-answer accuracy in percent at the test iteration (a diverged run counts 0, as in the
    tables); ``*.accuracy_at_train_depth`` is the curve at iteration T = ``train.iterations``;
    ``*.overthinking`` the points lost from T to the test iteration (Figure 3); ``val-hard.accuracy`` the
    val-to-hard drop; ``rho_Wx`` the final model's ρ(W_x); ``monitor.rho_Wx.max`` its largest value in the
    training monitor series (App. B.3); ``*.analysis.*`` a headline number of that split
    (:data:`ANALYSIS_FIELDS`); ``*.geometry.*`` the geometry stage's (:data:`GEOMETRY_FIELDS`).
    """
    rec = typed(rec)
    final = rec.final or {}
    diverged = rec.status == "diverged" or not final
    if metric in ("val.accuracy", "hard.accuracy"):
        return (0.0 if diverged else 100.0 * float(final[metric.split(".")[0]].accuracy)), None
    if metric == "val-hard.accuracy":
        if diverged:
            return None, "diverged: no accuracy"
        return 100.0 * (float(final["val"].accuracy) - float(final["hard"].accuracy)), None
    if metric.endswith(".accuracy_at_train_depth") or metric.endswith(".overthinking"):
        split = metric.split(".")[0]
        if diverged:
            return None, "diverged: no accuracy curve"
        T = int(rec.config.train.iterations)
        at_T = _curve_at(rec, split, T)
        if at_T is None:
            return None, f"no {split} accuracy curve reaching the training depth T = {T}"
        if metric.endswith(".accuracy_at_train_depth"):
            return at_T, None
        return at_T - 100.0 * float(final[split].accuracy), None
    if metric == "rho_Wx":
        return _rho_wx(rec)
    if metric == "monitor.rho_Wx.max":
        series = [float(m.rho_Wx) for m in rec.monitor if _finite(m.rho_Wx)]
        if not series:
            return None, "no monitor series of ρ(W_x) (train.monitor_every = 0 or no recall)"
        return max(series), None
    if ".analysis." in metric:
        split, _, key = metric.split(".", 2)
        field = ANALYSIS_FIELDS.get(key, key)
        v = getattr(_headline(rec, split), field, None)
        return (float(v), None) if _finite(v) else (None, f"analysis.{split}.{field} not recorded")
    if ".geometry." in metric:
        split, _, key = metric.split(".", 2)
        return _geometry(_headline(rec, split), split, GEOMETRY_FIELDS[key])
    raise ValueError(f"unknown metric {metric!r}")


def _rho_wx(rec: SweepRecord) -> tuple[Optional[float], Optional[str]]:
    """The final model's ρ(W_x): the stability summary's, else the val headline's."""
    if rec.config.model.recall in ("none", "fixed"):
        return None, "no W_x (no recall)"
    v = rec.stability.rho_Wx if rec.stability is not None else None
    if v is None:
        v = getattr(_headline(rec, "val"), "rho_Wx", None)
    return (float(v), None) if _finite(v) else (None, "ρ(W_x) not recorded")


def _geometry(block: Optional[SplitSummary], split: str, field: str) -> tuple[Optional[float], Optional[str]]:
    """A geometry headline number of one split, or why not (the stage did not run; no stable region)."""
    if block is None or not any(k.startswith("geometry_") for k in block.model_fields_set):
        return None, f"no analysis.{split}.geometry block (the geometry stage did not run)"
    v = getattr(block, field)
    if not _finite(v):
        why = (" (no stable region: the trained weights are not stable, geometry_unstable_t0 = 1)"
               if block.geometry_unstable_t0 == 1 else "")
        return None, f"analysis.{split}.{field} not measured{why}"
    return float(v), None


def read_results(path) -> list[SweepRecord]:
    """The records of RESULTS, typed: ``RESULTS/records/*.json`` (the sweep's source of truth), else
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
