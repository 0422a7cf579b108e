"""Two analyses (or two checkpoints) side by side, with what changed.

:func:`compare_files` reads two analysis JSONs written by ``stability analyze --json`` (with or without their
``format`` / ``schema_version`` keys) or two checkpoints written by ``stability train`` (their ``final`` accuracy
blocks), and returns a :class:`Comparison`: the options in which the two runs differ, and per split one row per
quantity of its headline block (:mod:`stability.analysis.headline`, computed from the stages' blocks, so an
analysis of any schema reads the same way) — the converged share of the Picard iteration (Def. 3.1's
reachability), the medians of ρ(J*) and σ_max (Prop. 3), ρ(W_x) (Prop. 4), the Prop. 5 relative error at the
largest T tested, the median ‖dx*/dx0‖_F, the initial-iterate distance (App. A.8) — and whole-answer accuracy at
the tested iterations, with the change B − A. See docs/analysis.md for what each quantity means.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from stability import hardware
from stability.analysis.headline import SplitSummary, typed_headline
from stability.analysis.stages import accuracy, prop5
from stability.config import changes, is_flat_config
from stability.errors import ConfigError, StabilityError, first_line

#: iterations at which accuracy is compared (those the runs reached)
ITERATION_MARKS = (1, 2, 5, 10, 20, 30, 50, 100, 200, 300, 500, 1000)


#: a relative change is shown only when the smaller value is at least this fraction of the larger (so between
#: −90 % and +900 %): beyond it one side is near zero on the other's scale (a residual of 1e-15 against 4e-4), and
#: the percentage (+38102323392 %) says nothing the absolute difference does not
RELATIVE_RANGE = 0.1


def relative_change(a: float, b: float) -> Optional[float]:
    """(b − a) / |a| when both are finite, of one sign and away from zero on their common scale (the smaller at
    least :data:`RELATIVE_RANGE` of the larger in magnitude); else None, and only the absolute difference is
    meaningful."""
    if not (math.isfinite(a) and math.isfinite(b)) or a == 0 or b == 0 or (a > 0) != (b > 0):
        return None
    if min(abs(a), abs(b)) < RELATIVE_RANGE * max(abs(a), abs(b)):
        return None
    return (b - a) / abs(a)


@dataclass
class Row:
    """One quantity of one split: A's and B's value (None where a side lacks it) and how to print it."""

    split: str
    label: str
    a: Optional[float]
    b: Optional[float]
    percent: bool = False  # a share in [0, 1], printed as %; its change in percentage points

    @property
    def delta(self) -> Optional[float]:
        if self.a is None or self.b is None:
            return None
        return self.b - self.a

    @property
    def relative(self) -> Optional[float]:
        """(B − A) / |A| where it means something (:func:`relative_change`), else None."""
        return None if self.a is None or self.b is None else relative_change(self.a, self.b)

    @property
    def only(self) -> Optional[str]:
        """``"A"`` or ``"B"`` when only that side has a value (not a change: the other side did not measure it)."""
        if (self.a is None) == (self.b is None):
            return None
        return "A" if self.b is None else "B"

    @property
    def changed(self) -> bool:
        """Whether both sides have a value and the two differ (a value on one side only is :attr:`only`)."""
        if self.a is None or self.b is None:
            return False
        return not math.isclose(self.a, self.b, rel_tol=1e-9, abs_tol=1e-12)

    def to_dict(self) -> dict:
        return {"split": self.split, "quantity": self.label, "a": self.a, "b": self.b, "delta": self.delta,
                "changed": self.changed, "only_in": self.only, "relative": self.relative}


@dataclass
class Comparison:
    kind: str  # "analysis" or "checkpoint"
    a: str
    b: str
    config_changes: list[tuple[str, Any, Any]] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    #: the options of the two analyses that differ (samples, splits, solver, tolerance, ...): their numbers answer
    #: different questions where these differ
    analysis_changes: list[tuple[str, Any, Any]] = field(default_factory=list)
    #: one line each: what the table cannot show (e.g. a side without a final evaluation)
    notes: list[str] = field(default_factory=list)
    #: what computed each side (stability.hardware.signature), shown first: where it differs, numbers may too
    hardware_a: Optional[dict] = None
    hardware_b: Optional[dict] = None

    @property
    def hardware_changes(self) -> list:
        return hardware.differences(self.hardware_a, self.hardware_b)

    def same_bits_possible(self) -> tuple:
        return hardware.same_bits_possible(self.hardware_a, self.hardware_b)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "a": self.a, "b": self.b,
                "hardware_changes": [{"key": k, "a": va, "b": vb} for k, va, vb in self.hardware_changes],
                "same_bits_possible": self.same_bits_possible()[0],
                "config_changes": [{"option": k, "a": va, "b": vb} for k, va, vb in self.config_changes],
                "analysis_changes": [{"option": k, "a": va, "b": vb} for k, va, vb in self.analysis_changes],
                "notes": list(self.notes),
                "rows": [r.to_dict() for r in self.rows]}


# ---- reading -----------------------------------------------------------------------------------------------------
def _sniff(path: Path) -> str:
    if not path.exists():
        raise StabilityError(f"{path}: no such file")
    if path.is_dir():
        raise StabilityError(f"{path}: is a directory, expected an analysis JSON or a checkpoint")
    with open(path, "rb") as fh:
        head = fh.read(64).lstrip()
    if head.startswith(b"PK\x03\x04"):
        return "checkpoint"
    if head.startswith((b"{", b"[")):
        return "analysis"
    raise StabilityError(f"{path}: neither an analysis JSON (`stability analyze --json`) nor a checkpoint "
                         "(`stability train`)")


def load_analysis(path: Path | str) -> dict:
    """An analysis JSON, checked to be one (``splits`` and one block per split with its ``fixed_point``)."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StabilityError(f"{path}: not a readable JSON file ({first_line(exc)[:80]})") from None
    what = f"{path}: not an analysis JSON written by `stability analyze --json`"
    if not isinstance(obj, dict):
        raise StabilityError(what)
    fmt = obj.get("format")
    if fmt is not None and not (isinstance(fmt, str) and "analysis" in fmt):
        raise StabilityError(f"{what} (its format is {fmt!r})")
    splits = obj.get("splits")
    if not isinstance(splits, list) or not splits or not all(
            isinstance(obj.get(s), dict) and isinstance(obj[s].get("fixed_point"), dict) for s in splits):
        raise StabilityError(f"{what} (no 'splits' with a 'fixed_point' block each)")
    if is_flat_config(obj.get("config")):
        raise StabilityError(f"{path}: written before the method block (its config has the method options beside "
                             f"the train options); convert it once with `stability migrate {path}`")
    return obj


def load_checkpoint_final(path: Path | str) -> dict:
    """A checkpoint's config, epoch and ``final`` accuracy blocks. An imported release checkpoint (``stability
    import``) is a finished model without a final evaluation of this toolkit: its ``final`` is empty and
    ``note`` says so. A toolkit run without one is refused: its training has not finished."""
    # lazy: torch; this module imports without it
    from stability import checkpoint as ckpt

    path = Path(path)
    obj = ckpt.read(path)
    final = obj.get("final")
    note = None
    if not isinstance(final, dict) or not final:
        if (obj.get("source") or {}).get("kind") != "release":
            done, total = obj.get("epoch"), _get(obj.get("config"), "train", "epochs")
            where = f" (epoch {done} of {total})" if done is not None and total is not None else ""
            raise StabilityError(f"{path}: training has not finished{where}: no final evaluation to compare; "
                                 f"resume it with `stability train --out {path} --resume`")
        final = {}
        note = (f"{path} is an imported release checkpoint (finished, but never evaluated here): its accuracy rows "
                "are blank; to compare the models, `stability analyze` both with --json and compare the analyses")
    return {"note": note, "config": obj.get("config") or {}, "epoch": obj.get("epoch"), "final": final,
            "hardware": obj.get("hardware")}


# ---- what is compared --------------------------------------------------------------------------------------------
def _get(block: Any, *keys) -> Any:
    for k in keys:
        if not isinstance(block, dict) or k not in block:
            return None
        block = block[k]
    return block


def _num(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


#: (label, headline field, percent) of the per-split analysis quantities, read from each split's typed headline
#: block (:class:`stability.analysis.headline.SplitSummary`)
ANALYSIS_QUANTITIES: list[tuple[str, str, bool]] = [
    ("samples analysed", "samples", False),
    ("converged share", "converged_fraction", True),
    ("distinct fixed points", "distinct_fixed_points", False),
    ("solver f-evaluations (median)", "nfe_median", False),
    ("ρ(J*) median", "rho_J_median", False),
    ("σ_max(J*) median", "sigma_max_median", False),
    ("ρ(W_x)", "rho_Wx", False),
    ("Prop. 4 |ρ(M) − autograd| max", "prop4_max_abs_diff", False),
    ("Prop. 5 relative error", "prop5_rel_error_last", False),
    ("‖dx*/dx0‖_F median", "input_grad_norm_median", False),
    ("A.8 initial-iterate distance max", "fixed_point_distance_max", False),
    ("accuracy at the fixed point", "accuracy_at_fixed_point", True),
    # schema 3 (an analysis of schema 2 has no geometry block: these rows show "–" on its side)
    ("geometry: median radius of stability", "geometry_median_radius", False),
    ("geometry: IQR of log r (anisotropy)", "geometry_log_iqr", False),
]


def _accuracy_rows(split: str, acc_a: Any, acc_b: Any, what: str = "accuracy") -> list[Row]:
    la = len(acc_a) if isinstance(acc_a, list) else 0
    lb = len(acc_b) if isinstance(acc_b, list) else 0
    T = max(la, lb)
    marks = [t for t in ITERATION_MARKS if t <= T] + ([T] if T and T not in ITERATION_MARKS else [])
    return [Row(split, f"{what} at iteration {t}", _num(acc_a[t - 1]) if t <= la else None,
                _num(acc_b[t - 1]) if t <= lb else None, percent=True) for t in marks]


#: analysis options that do not change the numbers (tests/analysis/test_parallel_splits.py): left out of the comparison
_SAME_NUMBERS = ("workers",)


def analysis_changes(a: dict, b: dict) -> list[tuple[str, Any, Any]]:
    """The options of two analysis JSONs that differ: ``splits`` and each of ``options`` (samples, solver, tol,
    max_iter, iterations, probes, stages, ...), except those that do not change the numbers."""
    fa = {"splits": a.get("splits"), **{k: v for k, v in (a.get("options") or {}).items() if k not in _SAME_NUMBERS}}
    fb = {"splits": b.get("splits"), **{k: v for k, v in (b.get("options") or {}).items() if k not in _SAME_NUMBERS}}
    return [(k, fa.get(k), fb.get(k)) for k in dict.fromkeys([*fa, *fb]) if fa.get(k) != fb.get(k)]


def config_changes(a: dict, b: dict) -> list[tuple[str, Any, Any]]:
    """The options (``section.name``, ``train.method.name``) whose values differ between two stored RunConfig
    dicts (:func:`stability.config.changes`)."""
    return changes(a, b)


def _headline(block: dict, name: str, split: str) -> SplitSummary:
    """A split's typed headline block (:func:`stability.analysis.headline.typed_headline`); a StabilityError line
    naming the side and the split where it does not fit."""
    try:
        return typed_headline(block)
    except ConfigError as exc:
        raise StabilityError(f"{name}: split {split!r}: its headline does not fit ({exc})") from None


def compare_analyses(a: dict, b: dict, name_a: str = "A", name_b: str = "B") -> Comparison:
    """Rows for every split either analysis has (a split on one side only shows blanks on the other)."""
    splits = list(dict.fromkeys([*a["splits"], *b["splits"]]))
    cmp = Comparison("analysis", name_a, name_b, config_changes(a.get("config") or {}, b.get("config") or {}),
                     hardware_a=a.get("hardware"), hardware_b=b.get("hardware"))
    cmp.analysis_changes = analysis_changes(a, b)
    for s in splits:
        ba, bb = a.get(s) or {}, b.get(s) or {}
        ha, hb = _headline(ba, name_a, s), _headline(bb, name_b, s)
        for label, key, pct in ANALYSIS_QUANTITIES:
            if key == "prop5_rel_error_last":  # at the largest T each analysis unrolled (a side without: none)
                ts = [t for t in (prop5.largest_T(ba.get(prop5.KEY)), prop5.largest_T(bb.get(prop5.KEY)))
                      if t is not None]
                label += "" if not ts else f" (T = {ts[0]})" if len(set(ts)) == 1 else f" (T = {ts[0]} vs {ts[1]})"
            row = Row(s, label, _num(getattr(ha, key)), _num(getattr(hb, key)), percent=pct)
            if row.a is not None or row.b is not None:
                cmp.rows.append(row)
        cmp.rows += _accuracy_rows(s, accuracy.curve(ba.get(accuracy.KEY)), accuracy.curve(bb.get(accuracy.KEY)))
    return cmp


def compare_checkpoints(a: dict, b: dict, name_a: str = "A", name_b: str = "B") -> Comparison:
    """Rows of the two final evaluations: whole-answer and per-position accuracy at the tested iterations."""
    cmp = Comparison("checkpoint", name_a, name_b, config_changes(a["config"], b["config"]),
                     hardware_a=a.get("hardware"), hardware_b=b.get("hardware"))
    cmp.notes += [n for n in (a.get("note"), b.get("note")) if n]
    cmp.rows.append(Row("run", "epochs trained", _num(a["epoch"]), _num(b["epoch"])))
    for s in list(dict.fromkeys([*a["final"], *b["final"]])):
        fa, fb = a["final"].get(s) or {}, b["final"].get(s) or {}
        cmp.rows += _accuracy_rows(s, fa.get("accuracy"), fb.get("accuracy"))
        cmp.rows += _accuracy_rows(s, fa.get("position_accuracy"), fb.get("position_accuracy"),
                                   "per-position accuracy")
    return cmp


def compare_files(path_a: Path | str, path_b: Path | str) -> Comparison:
    """Compare two analysis JSONs or two checkpoints (one of each is refused: they hold different things)."""
    pa, pb = Path(path_a), Path(path_b)
    ka, kb = _sniff(pa), _sniff(pb)
    if ka != kb:
        raise StabilityError(f"{pa} is {'an analysis JSON' if ka == 'analysis' else 'a checkpoint'} and {pb} "
                             f"{'an analysis JSON' if kb == 'analysis' else 'a checkpoint'}: compare two of a kind")
    if ka == "analysis":
        return compare_analyses(load_analysis(pa), load_analysis(pb), str(pa), str(pb))
    return compare_checkpoints(load_checkpoint_final(pa), load_checkpoint_final(pb), str(pa), str(pb))


# ---- text --------------------------------------------------------------------------------------------------------
def _fmt(v: Optional[float], percent: bool) -> str:
    if v is None:
        return "–"
    if percent:
        return f"{100 * v:.1f}%"
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
        return f"{v:.2e}"
    return f"{v:.4g}"


def change_text(row: Row) -> str:
    """The change column: ``=``, ``+0.4 (+50%)`` (the relative change where :func:`relative_change` allows it),
    ``+1.2 pts`` for a share, or ``only in A``."""
    d = row.delta
    if d is None:
        return f"only in {row.only}" if row.only else ""
    if not row.changed:
        return "="
    if row.percent:
        return f"{100 * d:+.1f} pts"
    rel = row.relative
    return f"{d:+.3g}" + (f" ({100 * rel:+.0f}%)" if rel is not None else "")


def format_comparison(cmp: Comparison, only_changed: bool = False) -> str:
    """The side-by-side table: what computed each side first (stability.hardware), the differing options, then
    per split one row per quantity."""
    lines = [f"A: {cmp.a}", f"B: {cmp.b}"]
    possible, why = cmp.same_bits_possible()
    lines.append(f"hardware: {'the same bits are possible' if possible else 'the bits may differ'} ({why})")
    lines += [f"  {k}: {va!r} → {vb!r}" for k, va, vb in cmp.hardware_changes if k != "dispatch_env"]
    lines += [f"  {k}: {v!r} → {w!r}" for k, v, w in hardware.differences(
        (cmp.hardware_a or {}).get("dispatch_env"), (cmp.hardware_b or {}).get("dispatch_env"))]
    if cmp.config_changes:
        lines.append("options that differ (A → B):")
        lines += [f"  {k}: {va!r} → {vb!r}" for k, va, vb in cmp.config_changes]
    if cmp.analysis_changes:
        lines.append("analysis options that differ (A → B): the numbers below answer different questions")
        lines += [f"  {k}: {va!r} → {vb!r}" for k, va, vb in cmp.analysis_changes]
    if not cmp.config_changes and not cmp.analysis_changes:
        lines.append("options: the same")
    lines += [f"note: {n}" for n in cmp.notes]
    width = max([len(r.label) for r in cmp.rows] + [10])
    split = None
    for r in cmp.rows:
        if only_changed and not (r.changed or r.only):
            continue
        if r.split != split:
            split = r.split
            lines.append("")
            lines.append(f"{split:<{width}}  {'A':>12}  {'B':>12}  change (B − A)")
        lines.append(f"{r.label:<{width}}  {_fmt(r.a, r.percent):>12}  {_fmt(r.b, r.percent):>12}  {change_text(r)}")
    changed = [r for r in cmp.rows if r.changed]
    both = [r for r in cmp.rows if r.only is None]
    only = {side: sum(r.only == side for r in cmp.rows) for side in ("A", "B")}
    lines.append("")
    lines.append(f"{len(changed)} of {len(both)} quantities changed"
                 + "".join(f"; {n} only in {side}" for side, n in only.items() if n))
    return "\n".join(lines) + "\n"
