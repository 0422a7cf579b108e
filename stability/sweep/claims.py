"""Claims as code (issue 27, item 2): the paper's empirical claims, registered in a claims file before the grid
runs, and their verdicts computed from sweep records by the rule the file fixes.

A claims file (``experiments/claims.toml``; docs/experiments.md, "Claims as code") names, for each claim, the
paper's words and where they are, the two arms it compares (cells by their axes: norm, recall, learning rate, with
rates symbolic — ``lowest``, ``middle``, ``highest`` — where the grid is not fixed yet), the metric, the design
(``paired`` by the ``unit`` keys, ``one-sample`` against ``null``, ``unpaired``), the test, the predicted direction,
the selection rule where one is needed (Figure 3's "best configuration"), how runs that never trained are treated,
and the minimum n. :func:`load_claims` validates it (pydantic, one :class:`ConfigError` line on any unknown key
or wrong value); :func:`evaluate` computes every verdict; :func:`markdown` and :func:`verdicts_json` write them.

The decision rule, the same for every claim (α is stated once in the file):

* fewer than ``min_n`` units (pairs; in an unpaired claim, in either arm) → **inconclusive (n too small)**, its
  numbers still computed and shown; a metric absent from the records (an empty monitor series, no geometry
  block) → **inconclusive (not measured)**; more than ``untestable_untrained_fraction`` of an arm's runs never trained → **inconclusive (untestable)**.
* a test with a p-value (sign, Wilcoxon signed-rank, Mann–Whitney U, Fisher exact; ``scipy.stats``): one-sided
  in the predicted direction, p < α → **supported**; the same test one-sided in the opposite direction, p < α →
  **contradicted**; otherwise **inconclusive (not significant)**. The two-sided p is reported beside them.
* ``test = "bootstrap"``: the (1 − 2α) two-sided percentile interval (its bounds are the one-sided 1 − α bounds)
  entirely on the predicted side of ``null`` → supported, entirely on the other side → contradicted.

Every claim reports n, the effect (mean or median of the paired differences or of the values; the difference of
the arms' means; the difference of success rates for Fisher) in the metric's unit, its (1 − 2α) bootstrap CI
resampling whole configurations (the ``cluster`` keys; default: the unit's keys without the seed), and p.
Ties (differences within 1e-9) are dropped by the sign test and by Wilcoxon (``zero_method="wilcox"``).
Pure functions: no plotting, no training.
"""

from __future__ import annotations

import hashlib
import math
import re
import typing
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from stability.config import Norm, Recall, TaskName
from stability.errors import ConfigError, StabilityError

FORMAT = "stability-claims"
VERDICTS_FORMAT = "stability-claims-verdicts"
TIE = 1e-9

Metric = Literal[
    "val.accuracy", "hard.accuracy", "val-hard.accuracy",
    "val.accuracy_at_train_depth", "hard.accuracy_at_train_depth", "val.overthinking", "hard.overthinking",
    "rho_Wx", "monitor.rho_Wx.max",
    "val.geometry.anisotropy_log_range", "hard.geometry.anisotropy_log_range",
    "val.geometry.median_radius", "hard.geometry.median_radius",
]
LrSymbol = Literal["lowest", "middle", "highest"]
UnitKey = Literal["model.norm", "model.recall", "train.lr", "train.seed"]
Test = Literal["sign", "wilcoxon", "mann-whitney", "fisher", "bootstrap"]
Design = Literal["paired", "one-sample", "unpaired"]
Direction = Literal["greater", "less"]

METRICS = typing.get_args(Metric)
#: metric -> unit of its values (and of an effect computed from them)
UNITS = {m: "points" for m in METRICS if "accuracy" in m or "overthinking" in m}
UNITS.update({"rho_Wx": "ρ(W_x)", "monitor.rho_Wx.max": "ρ(W_x)",
              "val.geometry.anisotropy_log_range": "log-range", "hard.geometry.anisotropy_log_range": "log-range",
              "val.geometry.median_radius": "radius", "hard.geometry.median_radius": "radius"})
TESTS_OF = {"paired": ("sign", "wilcoxon", "bootstrap"), "one-sample": ("sign", "wilcoxon", "bootstrap"),
            "unpaired": ("mann-whitney", "fisher", "bootstrap")}


# ---- schema --------------------------------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


class Condition(_Strict):
    """A run is kept only if its ``metric`` is ≥ ``at_least`` and < ``below`` (either may be absent)."""

    metric: Metric
    at_least: Optional[float] = None
    below: Optional[float] = None

    @model_validator(mode="after")
    def _check(self):
        if self.at_least is None and self.below is None:
            raise ValueError("a condition needs at_least, below or both")
        if self.at_least is not None and self.below is not None and self.at_least >= self.below:
            raise ValueError(f"at_least {self.at_least} must be below {self.below}")
        return self


class Arm(_Strict):
    """One side of a comparison: the cells (norm × recall × lr; every lr when ``lr`` is absent), then the runs of
    those cells that meet every ``require`` condition."""

    label: str = Field(min_length=1)
    norm: list[Norm] = Field(min_length=1)
    recall: list[Recall] = Field(min_length=1)
    lr: Optional[list[Union[float, LrSymbol]]] = Field(None, min_length=1)
    require: list[Condition] = []


class Exclude(_Strict):
    """A cell the paper itself excepts from the claim (e.g. Section 5.1's footnote 4)."""

    norm: Optional[Norm] = None
    recall: Optional[Recall] = None
    lr: Optional[Union[float, LrSymbol]] = None
    note: str = Field(min_length=1)


class Success(_Strict):
    """Fisher's outcome: a unit succeeds when its ``metric`` (the mean of the unit's runs) is ≥ ``at_least``."""

    metric: Metric
    at_least: float


class Select(_Strict):
    """A selection fixed in advance, applied to arm a: its runs grouped by ``over``; the group with the largest
    mean of ``by[0]`` is kept (ties: ``by[1]``, …; then the first group in sorted order)."""

    rule: Literal["max-mean"]
    over: list[UnitKey] = Field(min_length=1)
    by: list[Metric] = Field(min_length=1)


class Claim(_Strict):
    """One empirical claim of the paper and the rule that decides it."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    paper: str = Field(min_length=1)
    where: str = Field(min_length=1)
    task: Optional[TaskName] = None
    design: Design
    test: Test
    metric: Optional[Union[Metric, list[Metric]]] = None
    success: Optional[Success] = None
    a: Arm
    b: Optional[Arm] = None
    unit: list[UnitKey] = Field(min_length=1)
    cluster: Optional[list[UnitKey]] = None
    direction: Direction
    null: float = 0.0
    effect: Literal["mean", "median"] = "mean"
    select: Optional[Select] = None
    exclude: list[Exclude] = []
    untrained: Literal["include", "exclude"] = "include"
    untestable_untrained_fraction: Optional[float] = Field(None, ge=0.0, le=1.0)
    min_n: int = Field(ge=1)
    note: str = ""

    @model_validator(mode="after")
    def _check(self):
        if self.test not in TESTS_OF[self.design]:
            raise ValueError(f"test {self.test!r} does not fit design {self.design!r}; allowed: "
                             f"{', '.join(TESTS_OF[self.design])}")
        if (self.b is None) != (self.design == "one-sample"):
            raise ValueError("a one-sample claim has no arm b" if self.b is not None
                             else f"a {self.design} claim needs arm b")
        if self.test == "fisher":
            if self.success is None or self.metric is not None:
                raise ValueError("a fisher claim names its outcome in success (metric, at_least), not metric")
            if self.null != 0.0 or self.effect != "mean":
                raise ValueError("a fisher claim compares success rates: leave null and effect at their defaults")
        elif self.metric is None or self.success is not None:
            raise ValueError(f"a {self.test} claim needs metric and no success block")
        if len(set(self.unit)) != len(self.unit):
            raise ValueError("unit names a key twice")
        if self.cluster is not None and not set(self.cluster) <= set(self.unit):
            raise ValueError("cluster keys must be among the unit keys (a configuration holds whole units)")
        if self.design == "paired":
            differ = _arm_differences(self.a, self.b)
            clash = [k for k in self.unit if k in differ]
            if clash:
                raise ValueError(f"unit key {clash[0]} is what the arms differ in, so no unit would have both arms")
        return self


def _arm_differences(a: Arm, b: Arm) -> set:
    out = set()
    if sorted(a.norm) != sorted(b.norm):
        out.add("model.norm")
    if sorted(a.recall) != sorted(b.recall):
        out.add("model.recall")
    if (a.lr is None) != (b.lr is None) or (a.lr is not None and sorted(map(str, a.lr)) != sorted(map(str, b.lr))):
        out.add("train.lr")
    return out


class Bootstrap(_Strict):
    resamples: int = Field(ge=100)
    seed: int = Field(ge=0)


class ClaimsFile(_Strict):
    """The claims file: one α, the never-trained rule, the bootstrap settings and the claims."""

    format: Literal["stability-claims"]
    version: Literal[1]
    title: str = Field(min_length=1)
    task: TaskName
    alpha: float = Field(gt=0.0, lt=0.5)
    untrained_loss_fraction: float = Field(gt=0.0, le=1.0)
    bootstrap: Bootstrap
    claim: list[Claim] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self):
        seen = set()
        for c in self.claim:
            if c.id in seen:
                raise ValueError(f"claim id {c.id!r} is used twice")
            seen.add(c.id)
        return self


# ---- one-line errors -------------------------------------------------------------------------------------------
def _unwrap(tp: Any) -> list:
    """The model classes an annotation may hold (through Optional, Union, list)."""
    origin = typing.get_origin(tp)
    if origin in (Union, list, tuple) or str(origin) == "types.UnionType":
        return [m for a in typing.get_args(tp) for m in _unwrap(a)]
    return [tp] if isinstance(tp, type) and issubclass(tp, BaseModel) else []


def _where(loc: tuple, data: Any) -> tuple[str, Optional[type]]:
    """A readable location (``claim 'id'.a.norm[0]``) and the model class reached at its end (None past a
    model). String keys that are not fields (pydantic's union-member tags) are skipped."""
    parts: list[str] = []
    cls: Optional[type] = ClaimsFile
    node = data
    for key in loc:
        if isinstance(key, int):
            item = node[key] if isinstance(node, list) and 0 <= key < len(node) else None
            ident = item.get("id") if isinstance(item, dict) else None
            if parts:
                parts[-1] = f"{parts[-1]} {ident!r}" if isinstance(ident, str) else f"{parts[-1]}[{key}]"
            node = item
            continue
        if cls is None or key not in cls.model_fields:
            continue
        parts.append(str(key))
        models = _unwrap(cls.model_fields[key].annotation)
        cls = models[0] if models else None
        node = node.get(key) if isinstance(node, dict) else None
    return ".".join(parts), cls


_EXPECTED = {"float_type": "a number", "int_type": "an integer", "string_type": "a string", "list_type": "a list",
             "bool_type": "true or false", "finite_number": "a finite number", "model_type": "a table",
             "dict_type": "a table", "int_from_float": "an integer"}


def _message(exc: ValidationError, data: Any) -> str:
    """The first error of ``exc`` as one line ``where: what is wrong; what is allowed``."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    kind, loc, ctx = first["type"], tuple(first["loc"]), first.get("ctx") or {}
    if kind == "extra_forbidden":
        where, holder = _where(loc[:-1], data)
        allowed = ", ".join(holder.model_fields) if holder is not None else "?"
        return f"{where + ': ' if where else ''}unknown key {loc[-1]!r}; allowed: {allowed}"
    where, _ = _where(loc, data)
    value = first.get("input")
    if kind == "value_error" and "error" in ctx:
        return f"{where}: {ctx['error']}" if where else str(ctx["error"])
    where = where or "the file"
    if kind == "missing":
        return f"{where}: missing"
    # a union: every alternative failed at the same place
    same = [e for e in errors if _where(tuple(e["loc"]), data)[0] == where or not _where(tuple(e["loc"]), data)[0]]
    options = []
    for e in same:
        if e["type"] == "literal_error":
            options.append((e.get("ctx") or {}).get("expected", "?"))
        elif e["type"] in _EXPECTED:
            options.append(_EXPECTED[e["type"]])
    if kind in ("literal_error",) or (len(options) > 1 and kind in _EXPECTED):
        return f"{where}: {value!r} is not allowed; allowed: {' or '.join(dict.fromkeys(options))}"
    if kind in _EXPECTED:
        return f"{where}: expected {_EXPECTED[kind]}, got {value!r}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_short",
                "string_pattern_mismatch"):
        return f"{where}: {value!r}: {first['msg'].lower()}"
    return f"{where}: {first['msg']} (got {value!r})"


def parse_claims(data: dict, where: str = "claims") -> ClaimsFile:
    """A :class:`ClaimsFile` from a parsed TOML dict; one ConfigError line on any unknown key or wrong value."""
    try:
        return ClaimsFile(**data) if isinstance(data, dict) else ClaimsFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_message(exc, data)}") from None


def load_claims(path) -> tuple[ClaimsFile, str]:
    """The claims file at ``path`` and the SHA-256 of its bytes (what the verdicts were computed against)."""
    from stability.config import parse_toml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--claims {path}: no such file" if not path.exists() else f"--claims {path}: not a file")
    data = parse_toml(path, f"--claims {path}")
    return parse_claims(data, str(path)), hashlib.sha256(path.read_bytes()).hexdigest()


# ---- what a record holds ---------------------------------------------------------------------------------------
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


# ---- the verdict of one claim ------------------------------------------------------------------------------------
class _Undecidable(Exception):
    """The claim cannot be evaluated on these records (the message says why): the verdict is inconclusive."""


@dataclass
class Result:
    """One claim's verdict with the numbers it rests on (JSON-ready through :meth:`to_dict`)."""

    id: str
    verdict: str
    reason: str
    n: Optional[int] = None
    n_a: Optional[int] = None
    n_b: Optional[int] = None
    effect: Optional[float] = None
    unit: str = ""
    ci: Optional[tuple] = None
    ci_resampling: Optional[str] = None
    p: Optional[float] = None
    p_opposite: Optional[float] = None
    p_two_sided: Optional[float] = None
    null: float = 0.0
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("id", "verdict", "reason", "n", "n_a", "n_b", "effect", "unit",
                                              "ci_resampling", "p", "p_opposite", "p_two_sided", "null", "detail")}
        out["ci"] = list(self.ci) if self.ci is not None else None
        return out


def resolve_lrs(records: list[dict], task: str) -> list[float]:
    return sorted({run_keys(r)["train.lr"] for r in records if run_keys(r)["task.name"] == task})


def _resolve_lr(value, lrs: list[float]) -> float:
    if not isinstance(value, str):
        return float(value)
    if not lrs:
        raise _Undecidable("no learning rates in the records")
    if value == "lowest":
        return lrs[0]
    if value == "highest":
        return lrs[-1]
    if len(lrs) < 3 or len(lrs) % 2 == 0:
        raise _Undecidable(f"lr 'middle' is undefined for the records' {len(lrs)} learning rates")
    return lrs[len(lrs) // 2]


def _same_lr(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


def _in_arm(keys: dict, arm: Arm, lrs_of_arm: Optional[list[float]]) -> bool:
    return (keys["model.norm"] in arm.norm and keys["model.recall"] in arm.recall
            and (lrs_of_arm is None or any(_same_lr(keys["train.lr"], lr) for lr in lrs_of_arm)))


def _excluded(keys: dict, exclude: list[Exclude], lrs: list[float]) -> bool:
    for ex in exclude:
        if ex.norm is not None and keys["model.norm"] != ex.norm:
            continue
        if ex.recall is not None and keys["model.recall"] != ex.recall:
            continue
        if ex.lr is not None and not _same_lr(keys["train.lr"], _resolve_lr(ex.lr, lrs)):
            continue
        return True
    return False


def _meets(rec: dict, conditions: list[Condition]) -> tuple[bool, Optional[str]]:
    for cond in conditions:
        v, why = metric_value(rec, cond.metric)
        if v is None:
            return False, why
        if (cond.at_least is not None and v < cond.at_least) or (cond.below is not None and v >= cond.below):
            return False, None
    return True, None


#: Figure 3's "best configuration" (Section 4): the autonomous norm x lr with the best mean hard accuracy, ties by
#: mean val accuracy, as registered in experiments/claims.toml (no-overthinking-best-autonomous); the figure uses it
FIGURE3_RULE = Select(rule="max-mean", over=["model.norm", "train.lr"], by=["hard.accuracy", "val.accuracy"])


def select_runs(runs: list[dict], sel: Select = FIGURE3_RULE) -> tuple[list[dict], dict]:
    """The runs of the group a selection rule picks, and what it picked (``selected``, ``selected_by``): the group
    of ``over`` with the largest mean of ``by`` (tie-breakers in order; then the first group in sorted order)."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        k = run_keys(r)
        groups.setdefault(tuple(k[o] for o in sel.over), []).append(r)
    best, best_score = None, None
    for key in sorted(groups):
        score = []
        for m in sel.by:
            vals = [v for v, _ in (metric_value(r, m) for r in groups[key]) if v is not None]
            score.append(sum(vals) / len(vals) if vals else -math.inf)
        if best_score is None or tuple(score) > tuple(best_score):
            best, best_score = key, score
    if best is None:
        raise _Undecidable("nothing to select from")
    chosen = dict(zip(sel.over, best))
    return groups[best], {"selected": chosen, "selected_by": dict(zip(sel.by, best_score)),
                          "candidates": len(groups)}


def _location(values, how: str) -> float:
    import numpy as np

    return float(np.mean(values) if how == "mean" else np.median(values))


def _tests(claim: Claim, xs: list[float], ys: Optional[list[float]]) -> tuple[float, float, float, dict]:
    """(p predicted direction, p opposite direction, p two-sided, detail) of the claim's test."""
    from scipy import stats

    pred, opp = claim.direction, ("less" if claim.direction == "greater" else "greater")
    if claim.test == "sign":
        d = [x - claim.null for x in xs]
        pos, neg = sum(v > TIE for v in d), sum(v < -TIE for v in d)
        detail = {"above": pos, "below": neg, "tied": len(d) - pos - neg}
        if pos + neg == 0:
            return 1.0, 1.0, 1.0, detail
        p = {alt: float(stats.binomtest(pos, pos + neg, 0.5, alternative=alt).pvalue)
             for alt in ("greater", "less", "two-sided")}
        return p[pred], p[opp], p["two-sided"], detail
    if claim.test == "wilcoxon":
        d = [x - claim.null for x in xs]
        nonzero = [v for v in d if abs(v) > TIE]
        detail = {"above": sum(v > 0 for v in nonzero), "below": sum(v < 0 for v in nonzero),
                  "tied": len(d) - len(nonzero)}
        if not nonzero:
            return 1.0, 1.0, 1.0, detail
        with warnings.catch_warnings():  # scipy's note that ties switch it to the normal approximation
            warnings.simplefilter("ignore")
            p = {alt: float(stats.wilcoxon(nonzero, zero_method="wilcox", alternative=alt).pvalue)
                 for alt in ("greater", "less", "two-sided")}
        return p[pred], p[opp], p["two-sided"], detail
    if claim.test == "mann-whitney":
        a = [x - claim.null for x in xs]
        p = {alt: float(stats.mannwhitneyu(a, ys, alternative=alt).pvalue) for alt in ("greater", "less",
                                                                                          "two-sided")}
        return p[pred], p[opp], p["two-sided"], {}
    if claim.test == "fisher":
        sa, sb = int(sum(xs)), int(sum(ys))
        table = [[sa, len(xs) - sa], [sb, len(ys) - sb]]
        p = {alt: float(stats.fisher_exact(table, alternative=alt).pvalue) for alt in ("greater", "less",
                                                                                          "two-sided")}
        return p[pred], p[opp], p["two-sided"], {"table": table}
    raise ValueError(claim.test)


def _bootstrap_ci(claim: Claim, clusters_a: list[list[float]], clusters_b: Optional[list[list[float]]],
                  level: float, resamples: int, seed: int) -> tuple[Optional[tuple], str]:
    """The (level) percentile bootstrap interval of the effect, resampling whole clusters (configurations) within
    each arm (``scipy.stats.bootstrap``); where an arm has a single cluster its units are resampled instead."""
    import numpy as np
    from scipy import stats

    def prepare(clusters):
        if len(clusters) >= 2:
            return clusters, "configurations"
        flat = [v for c in clusters for v in c]
        return [[v] for v in flat], "units (one configuration)"

    ca, how = prepare(clusters_a)
    arms = [ca]
    if clusters_b is not None:
        cb, how_b = prepare(clusters_b)
        arms.append(cb)
        how = how if how == how_b else f"{how} / {how_b}"
    if any(sum(len(c) for c in arm) < 2 for arm in arms):
        return None, how
    rng = np.random.default_rng([seed, zlib.crc32(claim.id.encode())])
    use_mean = claim.effect == "mean"
    sums = [np.array([sum(c) for c in arm], dtype=float) for arm in arms]
    counts = [np.array([len(c) for c in arm], dtype=float) for arm in arms]

    def loc(arm_i: int, idx):
        idx = np.asarray(idx, dtype=int)
        if use_mean:
            return sums[arm_i][idx].sum(axis=-1) / counts[arm_i][idx].sum(axis=-1)
        flat = lambda row: np.median(np.concatenate([np.asarray(arms[arm_i][j], dtype=float) for j in row]))
        return np.array([flat(row) for row in idx.reshape(-1, idx.shape[-1])]).reshape(idx.shape[:-1])

    def statistic(*idx, axis=-1):
        value = loc(0, idx[0])
        if len(idx) > 1:
            value = value - loc(1, idx[1])
        return value

    data = tuple(np.arange(len(arm)) for arm in arms)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = dict(n_resamples=resamples, confidence_level=level, method="percentile", vectorized=True)
        try:
            res = stats.bootstrap(data, statistic, rng=rng, **kw)
        except TypeError:  # scipy < 1.15 names it random_state
            res = stats.bootstrap(data, statistic, random_state=rng, **kw)
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None, how
    if claim.test == "fisher":
        lo, hi = 100.0 * lo, 100.0 * hi
    return (lo, hi), how


def evaluate_claim(claim: Claim, spec: ClaimsFile, records: list[dict]) -> Result:
    """The verdict of one claim on ``records`` by the rule of the claims file (module docstring)."""
    try:
        return _evaluate(claim, spec, records)
    except _Undecidable as exc:
        return Result(claim.id, "inconclusive", f"not testable on these records: {exc}", null=claim.null,
                      unit=_unit(claim))


def _unit(claim: Claim) -> str:
    if claim.test == "fisher":
        return "points (share)"
    metrics = claim.metric if isinstance(claim.metric, list) else [claim.metric]
    return UNITS[metrics[0]]


def _count(table: dict, arm: str, why: str) -> None:
    per = table.setdefault(arm, {})
    per[why] = per.get(why, 0) + 1


def _evaluate(claim: Claim, spec: ClaimsFile, records: list[dict]) -> Result:
    task = claim.task or spec.task
    recs = [r for r in records if run_keys(r)["task.name"] == task]
    if not recs:
        raise _Undecidable(f"no records of task {task}")
    lrs = resolve_lrs(recs, task)
    arms = [claim.a] + ([claim.b] if claim.b is not None else [])
    names = ["a", "b"][: len(arms)]
    detail: dict = {"lrs": lrs, "untrained": {}, "not_measured": {}, "dropped_by_require": {}}
    arm_runs: list[list[dict]] = []
    for name, arm in zip(names, arms):
        arm_lrs = None if arm.lr is None else [_resolve_lr(v, lrs) for v in arm.lr]
        runs = [r for r in recs if _in_arm(run_keys(r), arm, arm_lrs) and not _excluded(run_keys(r), claim.exclude,
                                                                                         lrs)]
        if not runs:
            raise _Undecidable(f"arm {name} ({arm.label}) matches no record")
        flagged = [r for r in runs if never_trained(r, spec.untrained_loss_fraction)]
        detail["untrained"][name] = [len(flagged), len(runs)]
        if claim.untestable_untrained_fraction is not None and len(flagged) > claim.untestable_untrained_fraction * len(
                runs):
            return Result(claim.id, "inconclusive",
                          f"untestable: {len(flagged)} of {len(runs)} runs of arm {name} ({arm.label}) never trained "
                          f"(more than {claim.untestable_untrained_fraction:.0%})", null=claim.null,
                          unit=_unit(claim), detail=detail)
        if claim.untrained == "exclude":
            gone = {id(r) for r in flagged}
            runs = [r for r in runs if id(r) not in gone]
        kept, dropped, unmeasured = [], 0, []
        for r in runs:
            ok, why = _meets(r, arm.require)
            if ok:
                kept.append(r)
            elif why:
                unmeasured.append(why)
            else:
                dropped += 1
        detail["dropped_by_require"][name] = dropped
        for why in unmeasured:
            _count(detail["not_measured"], name, why)
        arm_runs.append(kept)
    if claim.select is not None:
        arm_runs[0], chosen = select_runs(arm_runs[0], claim.select)
        detail.update(chosen)

    # values per unit (the mean of an arm's runs in the unit)
    metrics = ([claim.success.metric] if claim.test == "fisher"
               else claim.metric if isinstance(claim.metric, list) else [claim.metric])
    cluster_keys = claim.cluster if claim.cluster is not None else [k for k in claim.unit if k != "train.seed"]
    per_arm: list[dict] = []
    for name, runs in zip(names, arm_runs):
        units: dict[tuple, list[float]] = {}
        for r in runs:
            k = run_keys(r)
            for m in metrics:
                v, why = metric_value(r, m)
                if v is None:
                    _count(detail["not_measured"], name, why)
                    continue
                units.setdefault(tuple(k[u] for u in claim.unit) + ((m,) if len(metrics) > 1 else ()), []).append(v)
        per_arm.append({u: sum(v) / len(v) for u, v in units.items()})
    # every unit's value per arm, for the claim's figure (stability/sweep/claim_figures.py) and the JSON
    detail["values"] = {name: [[list(u), v] for u, v in sorted(values.items(), key=lambda kv: repr(kv[0]))]
                        for name, values in zip(names, per_arm)}
    detail["unit_keys"] = list(claim.unit) + (["metric"] if len(metrics) > 1 else [])

    def cluster_of(u: tuple) -> tuple:
        return tuple(u[claim.unit.index(c)] for c in cluster_keys) + ((u[-1],) if len(metrics) > 1 else ())

    def grouped(values: dict) -> list[list[float]]:
        cl: dict[tuple, list[float]] = {}
        for u in sorted(values, key=repr):
            cl.setdefault(cluster_of(u), []).append(values[u])
        return [cl[k] for k in sorted(cl, key=repr)]

    unit = _unit(claim)
    if claim.design == "paired":
        common = sorted(set(per_arm[0]) & set(per_arm[1]), key=repr)
        values = {u: per_arm[0][u] - per_arm[1][u] for u in common}
        detail["unpaired_units"] = len(set(per_arm[0]) ^ set(per_arm[1]))
        xs, ys = [values[u] for u in common], None
        n, n_a, n_b = len(xs), None, None
        clusters_a, clusters_b = grouped(values), None
    elif claim.design == "one-sample":
        values = per_arm[0]
        xs, ys = [values[u] for u in sorted(values, key=repr)], None
        n, n_a, n_b = len(xs), None, None
        clusters_a, clusters_b = grouped(values), None
    else:
        va, vb = per_arm
        if claim.test == "fisher":
            thr = claim.success.at_least
            va = {u: float(v >= thr) for u, v in va.items()}
            vb = {u: float(v >= thr) for u, v in vb.items()}
        xs, ys = [va[u] for u in sorted(va, key=repr)], [vb[u] for u in sorted(vb, key=repr)]
        n_a, n_b = len(xs), len(ys)
        n = n_a + n_b
        clusters_a, clusters_b = grouped(va), grouped(vb)

    smallest = n if claim.design != "unpaired" else min(n_a, n_b)
    base = dict(id=claim.id, n=n, n_a=n_a, n_b=n_b, unit=unit, null=claim.null, detail=detail)
    missing = sorted({w for ws in detail["not_measured"].values() for w in ws})
    if smallest == 0:
        why = f"not measured: {missing[0]}" if missing else "no unit has a value in every arm"
        return Result(verdict="inconclusive", reason=why + _untrained_note(claim, detail), **base)

    # the numbers are computed whatever n is (they are reported); the verdict needs n >= min_n
    if claim.test == "fisher":
        effect = 100.0 * (_location(xs, "mean") - _location(ys, "mean"))
    elif claim.design == "unpaired":
        effect = _location(xs, claim.effect) - _location(ys, claim.effect)
    else:
        effect = _location(xs, claim.effect)
    alpha = spec.alpha
    ci, how = _bootstrap_ci(claim, clusters_a, clusters_b, 1.0 - 2.0 * alpha, spec.bootstrap.resamples,
                            spec.bootstrap.seed)
    base.update(effect=effect, ci=ci, ci_resampling=how)
    side = "above" if claim.direction == "greater" else "below"
    against = f" {claim.null:g}" if claim.design != "unpaired" or claim.null else " 0"
    level = f"{1 - 2 * alpha:.0%} CI"
    counts = ""
    if claim.test == "bootstrap":
        if ci is None:
            verdict, why = "inconclusive", "no bootstrap interval (fewer than 2 values)"
        elif (ci[0] > claim.null) if claim.direction == "greater" else (ci[1] < claim.null):
            verdict, why = "supported", f"{level} entirely {side}{against}"
        elif (ci[1] < claim.null) if claim.direction == "greater" else (ci[0] > claim.null):
            verdict, why = "contradicted", f"{level} entirely on the other side of{against}"
        else:
            verdict, why = "inconclusive", f"{level} contains{against}"
    else:
        p, p_opp, p_two, extra = _tests(claim, xs, ys)
        if not all(math.isfinite(v) for v in (p, p_opp, p_two)):  # an undefined test is no evidence
            extra["p_undefined"] = True
            p, p_opp, p_two = (v if math.isfinite(v) else 1.0 for v in (p, p_opp, p_two))
        detail.update(extra)
        base.update(p=p, p_opposite=p_opp, p_two_sided=p_two)
        if "above" in extra:
            k, m, t = extra["above"], extra["below"], extra["tied"]
            if claim.design == "paired" and claim.null == 0:
                counts = f"a ahead in {k}, behind in {m}, tied in {t}; "
            elif claim.design == "paired":
                counts = f"a − b above {claim.null:g} in {k}, below in {m}, at it in {t}; "
            else:
                counts = f"above {claim.null:g} in {k}, below in {m}, at it in {t}; "
        elif "table" in extra:
            t = extra["table"]
            counts = (f"a {t[0][0]}/{n_a}, b {t[1][0]}/{n_b} with {claim.success.metric} ≥ "
                      f"{claim.success.at_least:g}; ")
        if p < alpha:
            verdict, why = "supported", f"p < α = {alpha:g} ({claim.direction})"
        elif p_opp < alpha:
            verdict, why = "contradicted", f"significant in the opposite direction (p = {_p(p_opp)})"
        else:
            verdict, why = "inconclusive", "not significant"
    if smallest < claim.min_n:
        verdict, why = "inconclusive", f"n too small ({smallest} < {claim.min_n}; the test alone: {why})"
    if missing:
        why += f"; not measured in some runs: {missing[0]}"
    if "selected" in detail:
        chosen = ", ".join(f"{k.split('.')[-1]} {v:g}" if isinstance(v, float) else f"{k.split('.')[-1]} {v}"
                           for k, v in detail["selected"].items())
        scores = ", ".join(f"{m} {v:.3g}" for m, v in detail["selected_by"].items())
        counts = f"selected {chosen} ({scores}); " + counts
    return Result(verdict=verdict, reason=counts + why + _untrained_note(claim, detail), **base)


def _untrained_note(claim: Claim, detail: dict) -> str:
    flagged = {k: v for k, v in detail["untrained"].items() if v[0]}
    if not flagged:
        return ""
    what = "excluded" if claim.untrained == "exclude" else "included"
    return "; never trained (" + what + "): " + ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in flagged.items())


def evaluate(spec: ClaimsFile, records: list[dict]) -> list[Result]:
    """Every claim's verdict, in the file's order."""
    return [evaluate_claim(c, spec, records) for c in spec.claim]


# ---- output ------------------------------------------------------------------------------------------------------
def _num(v: Optional[float]) -> str:
    if v is None:
        return "–"
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.3e}"


def _p(v: Optional[float]) -> str:
    return "–" if v is None else (f"{v:.2g}" if v < 0.001 else f"{v:.3f}")


def _ci(ci: Optional[tuple]) -> str:
    return "–" if ci is None else f"[{_num(ci[0])}, {_num(ci[1])}]"


def _n(r: Result) -> str:
    if r.n is None:
        return "–"
    return f"{r.n_a}+{r.n_b}" if r.n_a is not None else str(r.n)


def _effect(r: Result) -> str:
    return "–" if r.effect is None else f"{r.effect:+.3g} {r.unit}"


def hypothesis(claim: Claim) -> str:
    """What the one-sided test asks, in the effect's own terms (a positive effect is A > B): ``A > B (A external, B autonomous)``, ``A − B > -10 (...)`` against a null, or
    ``A < 1 (A lowest lr)`` for one sample."""
    sym = ">" if claim.direction == "greater" else "<"
    if claim.b is None:
        return f"A {sym} {claim.null:g} (A {claim.a.label})"
    arms = f"(A {claim.a.label}, B {claim.b.label})"
    if claim.null == 0:
        return f"A {sym} B {arms}"
    return f"A − B {sym} {claim.null:g} {arms}"


#: what each test weighs, in words (``{d}``: the values it tests, A − B or A)
_WEIGHS = {"sign": "the signs of {d} against the null", "wilcoxon": "the signed ranks of {d}",
           "mann-whitney": "the ranks of A's values among B's", "fisher": "the success rates",
           "bootstrap": "the effect's interval"}


def _effect_is(claim: Claim) -> str:
    """What the effect is: the mean or median of A − B (paired) or of A (one sample), the difference of the two
    arms' means or medians (unpaired), of their success rates (fisher)."""
    if claim.test == "fisher":
        return "A's success rate − B's"
    if claim.design == "paired":
        return f"the {claim.effect} of A − B"
    if claim.design == "one-sample":
        return f"the {claim.effect} of A"
    return f"A's {claim.effect} − B's"


def direction_text(claim: Claim, r: Result) -> str:
    """``test: one-sided sign test, A > B (A ..., B ...); effect +1.7 points (the mean of A − B), in that
    direction``: the direction the test took and on which side of it the effect lies; where the verdict and the
    effect's side disagree, it says why (the test weighs signs or ranks, the effect is a mean or median), so a
    "contradicted" next to an effect of the predicted sign reads as what it is."""
    text = f"test: one-sided {claim.test}, {hypothesis(claim)}"
    if r.effect is None or not math.isfinite(r.effect):
        return text
    gap = (r.effect - claim.null) * (1 if claim.direction == "greater" else -1)
    side = "in that direction" if gap > 0 else "against it" if gap < 0 else f"at {claim.null:g}"
    text += f"; effect {_effect(r)} ({_effect_is(claim)}), {side}"
    if (r.verdict == "contradicted" and gap >= 0) or (r.verdict == "supported" and gap <= 0):
        d = "A − B" if claim.design == "paired" else "A"
        text += (f", yet the test went the other way: it weighs {_WEIGHS[claim.test].format(d=d)}, not the "
                 f"effect's {claim.effect}")
    return text


def lines(results: list[Result], claims: Optional[list[Claim]] = None) -> list[str]:
    """One line per claim: id, verdict, n, effect (unit), CI, p, then, with ``claims`` (the file's), the direction
    the test took (:func:`direction_text`), and the reason."""
    width = max(len(r.id) for r in results)
    by_id = {c.id: c for c in claims or ()}
    out = []
    for r in results:
        effect = _effect(r)
        test = f"{direction_text(by_id[r.id], r)}; " if r.id in by_id else ""
        out.append(f"{r.id:<{width}}  {r.verdict:<12}  n={_n(r):<6}  effect={effect:<20}  CI={_ci(r.ci):<18}  "
                   f"p={_p(r.p):<6}  {test}{r.reason}")
    return out


def _arm_text(arm: Arm) -> str:
    lr = "every lr" if arm.lr is None else "lr " + ", ".join(v if isinstance(v, str) else f"{v:g}" for v in arm.lr)
    req = "".join(f"; {c.metric}" + (f" ≥ {c.at_least:g}" if c.at_least is not None else "")
                  + (f" < {c.below:g}" if c.below is not None else "") for c in arm.require)
    return f"{'/'.join(arm.recall)} × {'/'.join(arm.norm)} × {lr}{req}"


def compared(claim: Claim) -> str:
    """The cells a claim compares, in words (for the generated table)."""
    text = f"{claim.a.label}: {_arm_text(claim.a)}"
    if claim.b is not None:
        text += f" vs {claim.b.label}: {_arm_text(claim.b)}"
    else:
        text += f" vs {claim.null:g}"
    if claim.select is not None:
        text += f"; selected: max mean {', then '.join(claim.select.by)} over {', '.join(claim.select.over)}"
    for ex in claim.exclude:
        text += f"; except {ex.note}"
    return text


def test_text(claim: Claim) -> str:
    metric = (f"{claim.success.metric} ≥ {claim.success.at_least:g}" if claim.test == "fisher"
              else ", ".join(claim.metric) if isinstance(claim.metric, list) else claim.metric)
    design = f"paired by {', '.join(claim.unit)}" if claim.design == "paired" else claim.design
    return f"{claim.test} ({design}), {metric}, {claim.direction}"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(spec: ClaimsFile, results: list[Result], *, claims_path: str = "", sha256: str = "",
             records: int = 0, source: str = "") -> str:
    """The verdict table docs/replication.md includes (generated by ``stability claims --markdown``)."""
    alpha = spec.alpha
    head = (f"**Claims of the paper and their verdicts**, computed by `stability claims {source}` from {records} "
            f"records against `{claims_path}` (sha256 {sha256[:12]}). Decision: one-sided tests at α = {alpha:g} "
            f"(supported: p < α in the predicted direction; contradicted: p < α in the opposite one; else "
            f"inconclusive); effects with their {1 - 2 * alpha:.0%} percentile bootstrap interval resampling whole "
            f"configurations ({spec.bootstrap.resamples} resamples, seed {spec.bootstrap.seed}; a `bootstrap` claim "
            f"is decided by that interval against its null); fewer units than the claim's minimum n: inconclusive "
            f"(n too small), with the numbers still shown; a run counts as never trained when its final loss is "
            f"≥ {spec.untrained_loss_fraction:g} × the chance loss. "
            "Generated, never edited by hand.")
    rows = ["| claim | the paper (where) | compared | test | verdict | n | effect | CI | p | reason |",
            "|---|---|---|---|---|---:|---:|---|---:|---|"]
    by_id = {c.id: c for c in spec.claim}
    for r in results:
        c = by_id[r.id]
        effect = _effect(r)
        rows.append("| " + " | ".join(_md(x) for x in (
            f"`{r.id}`", f"“{c.paper}” ({c.where})", compared(c), test_text(c), f"**{r.verdict}**", _n(r), effect,
            _ci(r.ci), _p(r.p), r.reason)) + " |")
    counts: dict[str, int] = {}
    for r in results:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    tail = ", ".join(f"{counts[v]} {v}" for v in ("supported", "contradicted", "inconclusive") if v in counts)
    return head + "\n\n" + "\n".join(rows) + f"\n\n{len(results)} claims: {tail}.\n"


def compact_markdown(results: list[Result], *, records: int = 0, source: str = "", sha256: str = "") -> str:
    """The short verdict table the README shows: claim, verdict, n, effect, interval, p (generated)."""
    rows = [f"Computed by `stability claims {source}` from {records} records (claims file sha256 {sha256[:12]}); "
            "generated, never edited by hand.", "",
            "| claim | verdict | n | effect | 90% CI | p |", "|---|---|---:|---:|---|---:|"]
    for r in results:
        effect = _effect(r)
        rows.append("| " + " | ".join(_md(x) for x in (f"`{r.id}`", f"**{r.verdict}**", _n(r), effect, _ci(r.ci),
                                                        _p(r.p))) + " |")
    return "\n".join(rows) + "\n"


#: a generated block inside a hand-written page: ``<!-- stability claims RESULTS: begin [compact] -->`` ... end
BLOCK = re.compile(r"(<!-- stability claims (?P<source>\S+): begin(?P<compact> compact)? -->\n)(?P<body>.*?)"
                   r"(<!-- stability claims: end -->)", re.S)


def generated_blocks(text: str) -> list[tuple[str, bool]]:
    """(results source, compact?) of every generated claims block of a page."""
    return [(m["source"], bool(m["compact"])) for m in BLOCK.finditer(text)]


def splice(text: str, render) -> str:
    """``text`` with every generated block's body replaced by ``render(source, compact)`` (None: left as it is)."""
    def one(m) -> str:
        body = render(m["source"], bool(m["compact"]))
        return m[0] if body is None else m[1] + body + m[5]

    return BLOCK.sub(one, text)


def verdicts_json(spec: ClaimsFile, results: list[Result], *, claims_path: str = "", sha256: str = "",
                  records: int = 0, source: str = "") -> dict:
    return {"format": VERDICTS_FORMAT, "claims_file": claims_path, "claims_sha256": sha256, "records": records,
            "results_source": source, "alpha": spec.alpha, "ci_level": 1 - 2 * spec.alpha,
            "bootstrap": spec.bootstrap.model_dump(), "untrained_loss_fraction": spec.untrained_loss_fraction,
            "claims": [r.to_dict() for r in results]}


def read_results(path) -> list[dict]:
    """The records of RESULTS: ``RESULTS/records/*.json`` (the sweep's source of truth), else
    ``RESULTS/records.jsonl``, or a ``.jsonl`` file given directly."""
    from stability.sweep.export import read_jsonl
    from stability.sweep.runner import load_records

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


__all__ = ["ClaimsFile", "Claim", "Arm", "Result", "load_claims", "parse_claims", "evaluate", "evaluate_claim",
           "metric_value", "never_trained", "run_keys", "select_runs", "FIGURE3_RULE", "markdown", "compact_markdown", "splice", "generated_blocks", "lines", "verdicts_json", "read_results",
           "METRICS"]
