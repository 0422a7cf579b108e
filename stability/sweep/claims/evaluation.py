"""The verdict of each claim on a sweep's records, by the one decision rule of the claims file (the package's
docstring): the arms' runs, the values per unit, the test or the interval, and the reason in words."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from stability.sweep.claims.records import metric_value, never_trained, run_keys
from stability.sweep.claims.schema import UNITS, Arm, Claim, ClaimsFile, Condition, Exclude, Select
from stability.sweep.claims.statistics import bootstrap_ci, format_p, location, p_values
from stability.sweep.record import SweepRecord, typed


class _Undecidable(Exception):
    """The claim cannot be evaluated on these records (the message says why): the verdict is inconclusive."""


class _Decided(Exception):
    """The verdict is known before the test (an arm mostly never trained): ``result``."""

    def __init__(self, result: "Result") -> None:
        super().__init__(result.reason)
        self.result = result


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


@dataclass
class _Sample:
    """What the test sees: the values (``xs``; arm b's ``ys`` when unpaired), the counts, and the values grouped
    by configuration for the bootstrap."""

    xs: list
    ys: Optional[list]
    n: int
    n_a: Optional[int]
    n_b: Optional[int]
    clusters_a: list
    clusters_b: Optional[list]

    @property
    def smallest(self) -> int:
        return self.n if self.n_a is None else min(self.n_a, self.n_b)


# ---- which runs ---------------------------------------------------------------------------------------------------
def resolve_lrs(records: list, task: str) -> list[float]:
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


def _in_arm(keys: dict, arm: Arm, lrs_of_arm: Optional[list[float]], depth: int = 15) -> bool:
    return (keys["model.norm"] in arm.norm and keys["model.recall"] in arm.recall
            and (lrs_of_arm is None or any(_same_lr(keys["train.lr"], lr) for lr in lrs_of_arm))
            and (arm.depth is None or depth in arm.depth))


def _depth(rec: SweepRecord) -> int:
    """The record's model.depth (the fixed-depth baseline's blocks; 15, the default, where the config omits it)."""
    return int(rec.config.model.depth)


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


def select_runs(runs: list, sel: Select = FIGURE3_RULE) -> tuple[list, dict]:
    """The runs of the group a selection rule picks, and what it picked (``selected``, ``selected_by``): the group
    of ``over`` with the largest mean of ``by`` (tie-breakers in order; then the first group in sorted order).
    The runs come back as given (a record's JSON or a typed record), each read typed."""
    groups: dict[tuple, list] = {}
    for r in runs:
        k = run_keys(t := typed(r))
        groups.setdefault(tuple(k[o] for o in sel.over), []).append((r, t))
    best, best_score = None, None
    for key in sorted(groups):
        score = []
        for m in sel.by:
            vals = [v for v, _ in (metric_value(t, m) for _, t in groups[key]) if v is not None]
            score.append(sum(vals) / len(vals) if vals else -math.inf)
        if best_score is None or tuple(score) > tuple(best_score):
            best, best_score = key, score
    if best is None:
        raise _Undecidable("nothing to select from")
    chosen = dict(zip(sel.over, best))
    return [r for r, _ in groups[best]], {"selected": chosen, "selected_by": dict(zip(sel.by, best_score)),
                          "candidates": len(groups)}


def _unit(claim: Claim) -> str:
    if claim.success is not None:
        return "points (share)"
    metrics = claim.metric if isinstance(claim.metric, list) else [claim.metric]
    return UNITS[metrics[0]]


def _count(table: dict, arm: str, why: str) -> None:
    per = table.setdefault(arm, {})
    per[why] = per.get(why, 0) + 1


def _arm_runs(claim: Claim, spec: ClaimsFile, name: str, arm: Arm, recs: list[SweepRecord],
              lrs: list[float], detail: dict) -> list[SweepRecord]:
    """The runs of one arm: its cells less the excluded ones, the never-trained ones dropped where the claim says
    so (an arm mostly never trained: :class:`_Decided` inconclusive), then those meeting every ``require``."""
    arm_lrs = None if arm.lr is None else [_resolve_lr(v, lrs) for v in arm.lr]
    runs = [r for r in recs if _in_arm(run_keys(r), arm, arm_lrs, _depth(r))
            and not _excluded(run_keys(r), claim.exclude, lrs)]
    if not runs:
        raise _Undecidable(f"arm {name} ({arm.label}) matches no record")
    flagged = [r for r in runs if never_trained(r, spec.untrained_loss_fraction)]
    detail["untrained"][name] = [len(flagged), len(runs)]
    limit = claim.untestable_untrained_fraction
    if limit is not None and len(flagged) > limit * len(runs):
        raise _Decided(Result(claim.id, "inconclusive", f"untestable: {len(flagged)} of {len(runs)} runs of arm "
                              f"{name} ({arm.label}) never trained (more than {limit:.0%})", null=claim.null,
                              unit=_unit(claim), detail=detail))
    if claim.untrained == "exclude":
        gone = {id(r) for r in flagged}
        runs = [r for r in runs if id(r) not in gone]
    kept, dropped = [], 0
    for r in runs:
        ok, why = _meets(r, arm.require)
        if ok:
            kept.append(r)
        elif why:
            _count(detail["not_measured"], name, why)
        else:
            dropped += 1
    detail["dropped_by_require"][name] = dropped
    return kept


# ---- the values the test sees -------------------------------------------------------------------------------------
def _metrics(claim: Claim) -> list:
    return ([claim.success.metric] if claim.success is not None
            else claim.metric if isinstance(claim.metric, list) else [claim.metric])


def _unit_values(claim: Claim, names: list[str], arm_runs: list[list[SweepRecord]], detail: dict) -> list[dict]:
    """Per arm, {unit: the mean of the arm's runs in the unit} (a pooled metric list: each metric its own unit);
    every unit's value also goes to ``detail["values"]`` for the claim's figure and the JSON."""
    metrics = _metrics(claim)
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
    detail["values"] = {name: [[list(u), v] for u, v in sorted(values.items(), key=lambda kv: repr(kv[0]))]
                        for name, values in zip(names, per_arm)}
    detail["unit_keys"] = list(claim.unit) + (["metric"] if len(metrics) > 1 else [])
    return per_arm


def _grouped(claim: Claim, values: dict) -> list[list[float]]:
    """The values grouped by configuration (the ``cluster`` keys; default: the unit's keys without the seed)."""
    keys = claim.cluster if claim.cluster is not None else [k for k in claim.unit if k != "train.seed"]
    pooled = len(_metrics(claim)) > 1
    cl: dict[tuple, list[float]] = {}
    for u in sorted(values, key=repr):
        cl.setdefault(tuple(u[claim.unit.index(c)] for c in keys) + ((u[-1],) if pooled else ()), []).append(values[u])
    return [cl[k] for k in sorted(cl, key=repr)]


def _sample(claim: Claim, per_arm: list[dict], detail: dict) -> _Sample:
    """The values of the claim's design: a − b per common unit (paired), a's values (one-sample), or both arms'
    (unpaired; a fisher claim's as successes 0 / 1)."""
    def ordered(values: dict) -> list:
        return [values[u] for u in sorted(values, key=repr)]

    if claim.design == "paired":
        common = sorted(set(per_arm[0]) & set(per_arm[1]), key=repr)
        values = {u: per_arm[0][u] - per_arm[1][u] for u in common}
        detail["unpaired_units"] = len(set(per_arm[0]) ^ set(per_arm[1]))
        xs = [values[u] for u in common]
        return _Sample(xs, None, len(xs), None, None, _grouped(claim, values), None)
    if claim.design == "one-sample":
        xs = ordered(per_arm[0])
        return _Sample(xs, None, len(xs), None, None, _grouped(claim, per_arm[0]), None)
    va, vb = per_arm
    if claim.test == "fisher":
        thr = claim.success.at_least
        va = {u: float(v >= thr) for u, v in va.items()}
        vb = {u: float(v >= thr) for u, v in vb.items()}
    xs, ys = ordered(va), ordered(vb)
    return _Sample(xs, ys, len(xs) + len(ys), len(xs), len(ys), _grouped(claim, va), _grouped(claim, vb))


def _effect_size(claim: Claim, s: _Sample) -> float:
    if claim.test == "fisher":
        return 100.0 * (location(s.xs, "mean") - location(s.ys, "mean"))
    if claim.design == "unpaired":
        return location(s.xs, claim.effect) - location(s.ys, claim.effect)
    return location(s.xs, claim.effect)


# ---- the decision ---------------------------------------------------------------------------------------------
def _by_interval(claim: Claim, ci: Optional[tuple], alpha: float) -> tuple[str, str]:
    """A bootstrap claim's verdict: its interval against the null."""
    side = "above" if claim.direction == "greater" else "below"
    against = f" {claim.null:g}" if claim.design != "unpaired" or claim.null else " 0"
    level = f"{1 - 2 * alpha:.0%} CI"
    if ci is None:
        return "inconclusive", "no bootstrap interval (fewer than 2 values)"
    if (ci[0] > claim.null) if claim.direction == "greater" else (ci[1] < claim.null):
        return "supported", f"{level} entirely {side}{against}"
    if (ci[1] < claim.null) if claim.direction == "greater" else (ci[0] > claim.null):
        return "contradicted", f"{level} entirely on the other side of{against}"
    return "inconclusive", f"{level} contains{against}"


def _by_test(claim: Claim, s: _Sample, alpha: float, detail: dict, base: dict) -> tuple[str, str, str]:
    """A tested claim's verdict, its reason and the counts it rests on; the p-values go to ``base``."""
    p, p_opp, p_two, extra = p_values(claim, s.xs, s.ys)
    if not all(math.isfinite(v) for v in (p, p_opp, p_two)):  # an undefined test is no evidence
        extra["p_undefined"] = True
        p, p_opp, p_two = (v if math.isfinite(v) else 1.0 for v in (p, p_opp, p_two))
    detail.update(extra)
    base.update(p=p, p_opposite=p_opp, p_two_sided=p_two)
    counts = _counts_text(claim, extra, s)
    if p < alpha:
        return "supported", f"p < α = {alpha:g} ({claim.direction})", counts
    if p_opp < alpha:
        return "contradicted", f"significant in the opposite direction (p = {format_p(p_opp)})", counts
    return "inconclusive", "not significant", counts


def _counts_text(claim: Claim, extra: dict, s: _Sample) -> str:
    """The counts a test rests on, in words: signs against the null, or a fisher claim's successes."""
    if "above" in extra:
        k, m, t = extra["above"], extra["below"], extra["tied"]
        if claim.design == "paired" and claim.null == 0:
            return f"a ahead in {k}, behind in {m}, tied in {t}; "
        if claim.design == "paired":
            return f"a − b above {claim.null:g} in {k}, below in {m}, at it in {t}; "
        return f"above {claim.null:g} in {k}, below in {m}, at it in {t}; "
    if "table" in extra:
        t = extra["table"]
        return f"a {t[0][0]}/{s.n_a}, b {t[1][0]}/{s.n_b} with {claim.success.metric} ≥ {claim.success.at_least:g}; "
    return ""


def _untrained_note(claim: Claim, detail: dict) -> str:
    flagged = {k: v for k, v in detail["untrained"].items() if v[0]}
    if not flagged:
        return ""
    what = "excluded" if claim.untrained == "exclude" else "included"
    return "; never trained (" + what + "): " + ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in flagged.items())


def _selected_note(detail: dict) -> str:
    if "selected" not in detail:
        return ""
    chosen = ", ".join(f"{k.split('.')[-1]} {v:g}" if isinstance(v, float) else f"{k.split('.')[-1]} {v}"
                       for k, v in detail["selected"].items())
    scores = ", ".join(f"{m} {v:.3g}" for m, v in detail["selected_by"].items())
    return f"selected {chosen} ({scores}); "


# ---- one claim, every claim -----------------------------------------------------------------------------------
def evaluate_claim(claim: Claim, spec: ClaimsFile, records: list) -> Result:
    """The verdict of one claim on ``records`` (typed records or their JSON) by the rule of the claims file (the
    package's docstring)."""
    try:
        return _evaluate(claim, spec, [typed(r) for r in records])
    except _Decided as done:
        return done.result
    except _Undecidable as exc:
        return Result(claim.id, "inconclusive", f"not testable on these records: {exc}", null=claim.null,
                      unit=_unit(claim))


def _evaluate(claim: Claim, spec: ClaimsFile, records: list[SweepRecord]) -> Result:
    task = claim.task or spec.task
    recs = [r for r in records if run_keys(r)["task.name"] == task]
    if not recs:
        raise _Undecidable(f"no records of task {task}")
    lrs = resolve_lrs(recs, task)
    arms = [claim.a] + ([claim.b] if claim.b is not None else [])
    names = ["a", "b"][: len(arms)]
    detail: dict = {"lrs": lrs, "untrained": {}, "not_measured": {}, "dropped_by_require": {}}
    arm_runs = [_arm_runs(claim, spec, name, arm, recs, lrs, detail) for name, arm in zip(names, arms)]
    if claim.select is not None:
        arm_runs[0], chosen = select_runs(arm_runs[0], claim.select)
        detail.update(chosen)
    s = _sample(claim, _unit_values(claim, names, arm_runs, detail), detail)
    base = dict(id=claim.id, n=s.n, n_a=s.n_a, n_b=s.n_b, unit=_unit(claim), null=claim.null, detail=detail)
    missing = sorted({w for ws in detail["not_measured"].values() for w in ws})
    if s.smallest == 0:
        why = f"not measured: {missing[0]}" if missing else "no unit has a value in every arm"
        return Result(verdict="inconclusive", reason=why + _untrained_note(claim, detail), **base)
    # the numbers are computed whatever n is (they are reported); the verdict needs n >= min_n
    ci, how = bootstrap_ci(claim, s.clusters_a, s.clusters_b, 1.0 - 2.0 * spec.alpha, spec.bootstrap.resamples,
                           spec.bootstrap.seed)
    base.update(effect=_effect_size(claim, s), ci=ci, ci_resampling=how)
    if claim.test == "bootstrap":
        (verdict, why), counts = _by_interval(claim, ci, spec.alpha), ""
    else:
        verdict, why, counts = _by_test(claim, s, spec.alpha, detail, base)
    if s.smallest < claim.min_n:
        verdict, why = "inconclusive", f"n too small ({s.smallest} < {claim.min_n}; the test alone: {why})"
    if missing:
        why += f"; not measured in some runs: {missing[0]}"
    reason = _selected_note(detail) + counts + why + _untrained_note(claim, detail)
    return Result(verdict=verdict, reason=reason, **base)


def evaluate(spec: ClaimsFile, records: list) -> list[Result]:
    """Every claim's verdict, in the file's order (the records read typed once)."""
    records = [typed(r) for r in records]
    return [evaluate_claim(c, spec, records) for c in spec.claim]
