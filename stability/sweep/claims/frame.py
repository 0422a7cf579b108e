"""Version-2 claims (issue 38): one statistical frame for every claim of the file (docs/replication.md, "The
statistical frame of the third edition").

* **Unit of analysis: the configuration** (the claim's ``cluster`` keys; default the unit's keys without the
  seed). A configuration's value is the mean of its runs' values (a paired claim: of its paired differences; a
  claim with a ``success`` block: the share of its runs that succeed, in points). Seeds replicate a
  configuration; they are not independent evidence about the claim.
* ``test = "t"``: one-sample t over the configurations' values against ``null`` (one-sample and paired designs),
  Welch's t between the arms' configuration values (unpaired); the (1 − α) two-sided t-interval of the estimate.
* ``test = "universal"`` (a claim worded "only", "all", "0 %"): every configuration's value should lie ``holds``
  (below / above) the noise ``floor`` fixed in the file; each configuration's one-sided t-test over its runs that it
  lies on the other side, Bonferroni over the configurations; the claim's p is the smallest adjusted one.
* ``test = "spearman"`` (the headline): Spearman's ρ across configurations between the prediction score (the
  mean of the predictors' signed ranks) and the metric, Fisher-z test of ρ = ``null`` (the floor; Bonett–Wright
  standard error) and its (1 − α) interval.
* **One p convention**: every p is two-sided (a universal claim's: that of its strongest counterexample), and the
  verdict is read from its **Holm-adjusted** value over the whole file (m = the number of claims; a claim with no p
  counts as p = 1): adjusted p < α with the estimate on the predicted side of the null → supported, on the other
  side → contradicted; a universal claim: adjusted p < α → contradicted (a counterexample), else supported when
  every configuration's mean is on the claim's side of the floor (and there are ``min_n`` configurations: a
  counterexample contradicts at any n), inconclusive when some mean is beyond it within
  noise (a configuration of one run is a counterexample when its value is beyond the floor: the floor is then the
  whole noise allowance). Fewer configurations than ``min_n``:
  inconclusive (n too small), the numbers still shown.
* ``seeds``: the claim is judged on those seeds' runs only (``confirmatory``: seeds the second edition did not run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from stability.sweep.claims import evaluation as E
from stability.sweep.claims.records import metric_value, run_keys
from stability.sweep.claims.schema import VERDICTS_FORMAT, Claim, ClaimsFile
from stability.sweep.claims.statistics import (_scipy_stats, counterexamples, format_p, holm, spearman_fisher,
                                               t_over_configurations, welch_over_configurations)
from stability.sweep.record import typed


@dataclass
class FrameResult:
    """One version-2 claim's verdict and the numbers it rests on."""

    id: str
    verdict: str
    reason: str
    test: str = ""
    n_configurations: Optional[int] = None
    n_runs: Optional[int] = None
    effect: Optional[float] = None
    unit: str = ""
    ci: Optional[tuple] = None
    p: Optional[float] = None
    p_holm: Optional[float] = None
    null: float = 0.0
    seeds: Optional[list] = None
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("id", "verdict", "reason", "test", "n_configurations", "n_runs",
                                              "effect", "unit", "p", "p_holm", "null", "seeds", "detail")}
        out["ci"] = list(self.ci) if self.ci is not None else None
        return out


# ---- the values a claim's test sees -------------------------------------------------------------------------
def _groups(claim: Claim, values: dict) -> dict:
    """{configuration: [its units' values]} (the ``cluster`` keys; default the unit's keys without the seed)."""
    keys = claim.cluster if claim.cluster is not None else [k for k in claim.unit if k != "train.seed"]
    out: dict[tuple, list] = {}
    for u in sorted(values, key=repr):
        out.setdefault(tuple(u[claim.unit.index(c)] for c in keys), []).append(values[u])
    return out


def _per_arm_values(claim: Claim, per_arm: list) -> list:
    """Each arm's unit values, a success block's outcome as 0 / 1; a paired claim: the one list of a − b."""
    if claim.success is not None:
        per_arm = [{u: 100.0 * (v >= claim.success.at_least) for u, v in arm.items()} for arm in per_arm]
    if claim.design == "paired":
        common = sorted(set(per_arm[0]) & set(per_arm[1]), key=repr)
        return [{u: per_arm[0][u] - per_arm[1][u] for u in common}]
    return per_arm


def _means(groups: dict) -> list:
    return [sum(v) / len(v) for _, v in sorted(groups.items(), key=lambda kv: repr(kv[0]))]


def _scores(claim: Claim, runs: list, groups_of: dict) -> tuple[list, list, list]:
    """Per configuration of arm a (those with the metric and every predictor): the prediction score (the mean
    of the predictors' signed ranks among the configurations) and the metric's mean."""
    rankdata = _scipy_stats().rankdata
    cfg: dict[tuple, dict] = {}
    keys = claim.cluster if claim.cluster is not None else [k for k in claim.unit if k != "train.seed"]
    for r in runs:
        k = tuple(run_keys(r)[c] for c in keys)
        for m in [claim.metric] + [p.metric for p in claim.predictors]:
            v, _ = metric_value(r, m)
            if v is not None:
                cfg.setdefault(k, {}).setdefault(m, []).append(v)
    wanted = [claim.metric] + [p.metric for p in claim.predictors]
    full = sorted((k for k, d in cfg.items() if all(m in d for m in wanted)), key=repr)
    mean = {m: [sum(cfg[k][m]) / len(cfg[k][m]) for k in full] for m in wanted}
    ranks = [[p.sign * x for x in rankdata(mean[p.metric])] for p in claim.predictors]
    score = [sum(col) / len(col) for col in zip(*ranks)] if full else []
    groups_of.update({repr(k): cfg[k][claim.metric] for k in full})
    return score, mean[claim.metric], full


# ---- one claim -----------------------------------------------------------------------------------------------
def _raw(claim: Claim, spec: ClaimsFile, records: list) -> FrameResult:
    """The claim's numbers before the family's adjustment: its test's two-sided p, estimate and interval."""
    task = claim.task or spec.task
    recs = [r for r in records if run_keys(r)["task.name"] == task
            and (claim.seeds is None or run_keys(r)["train.seed"] in claim.seeds)]
    unit = "ρ (Spearman)" if claim.test == "spearman" else E._unit(claim)
    base = FrameResult(claim.id, "inconclusive", "", test=claim.test, unit=unit, null=claim.null,
                       seeds=claim.seeds)
    if not recs:
        base.reason = f"not testable on these records: no records of task {task}" + (
            f" on seeds {_seeds(claim.seeds)}" if claim.seeds else "")
        return base
    lrs = E.resolve_lrs(recs, task)
    arms = [claim.a] + ([claim.b] if claim.b is not None else [])
    names = ["a", "b"][: len(arms)]
    detail: dict = {"lrs": lrs, "untrained": {}, "not_measured": {}, "dropped_by_require": {}}
    base.detail = detail
    try:
        arm_runs = [E._arm_runs(claim, spec, n, arm, recs, lrs, detail) for n, arm in zip(names, arms)]
        if claim.select is not None:
            arm_runs[0], chosen = E.select_runs(arm_runs[0], claim.select)
            detail.update(chosen)
    except E._Decided as done:
        base.reason = done.result.reason
        return base
    except E._Undecidable as exc:
        base.reason = f"not testable on these records: {exc}"
        return base
    base.n_runs = sum(len(r) for r in arm_runs)
    if claim.test == "spearman":
        return _raw_spearman(claim, spec, arm_runs[0], base)
    values = _per_arm_values(claim, E._unit_values(claim, names, arm_runs, detail))
    groups = [_groups(claim, v) for v in values]
    detail["configurations"] = [{repr(k): v for k, v in g.items()} for g in groups]
    if claim.test == "universal":
        return _raw_universal(claim, spec, groups[0], base)
    return _raw_t(claim, spec, groups, base)


def _raw_t(claim: Claim, spec: ClaimsFile, groups: list, base: FrameResult) -> FrameResult:
    level = 1.0 - spec.alpha
    means = [_means(g) for g in groups]
    base.n_configurations = min(len(m) for m in means)
    res = (t_over_configurations(means[0], claim.null, level) if len(means) == 1
           else welch_over_configurations(means[0], means[1], claim.null, level))
    if res is None:
        base.reason = "fewer than 2 configurations" + _dropped(base.detail) + _missing(base.detail)
        return base
    base.effect, base.p, base.ci = res["estimate"], res["p"], res["ci"]
    base.detail["df"] = res["df"]
    base.detail["p_one_sided"] = {"greater": res["greater"], "less": res["less"]}
    return base


def _raw_universal(claim: Claim, spec: ClaimsFile, groups: dict, base: FrameResult) -> FrameResult:
    base.n_configurations = len(groups)
    if not groups:
        base.reason = "no configuration measured" + _dropped(base.detail) + _missing(base.detail)
        return base
    res = counterexamples(groups, claim.floor, claim.holds, spec.alpha)
    base.p = res["p"]
    rows = res["configurations"]
    worst = max(rows, key=lambda r: r["mean"] if claim.holds == "below" else -r["mean"])
    base.effect = worst["mean"]
    base.detail["universal"] = res
    return base


def _raw_spearman(claim: Claim, spec: ClaimsFile, runs: list, base: FrameResult) -> FrameResult:
    score, target, configs = _scores(claim, runs, base.detail.setdefault("configurations", {}))
    base.n_configurations = len(configs)
    base.detail["score"] = {repr(k): [s, t] for k, s, t in zip(configs, score, target)}
    res = spearman_fisher(score, target, claim.null, 1.0 - spec.alpha)
    if res is None:
        base.reason = f"{len(configs)} configurations with every predictor: fewer than 4"
        return base
    base.effect, base.p, base.ci = res["estimate"], res["p"], res["ci"]
    return base


def _missing(detail: dict) -> str:
    missing = sorted({w for ws in detail.get("not_measured", {}).values() for w in ws})
    return f" (not measured: {missing[0]})" if missing else ""


def _dropped(detail: dict) -> str:
    gone = {k: v for k, v in detail.get("dropped_by_require", {}).items() if v}
    return (" (runs failing the arm's require: " + ", ".join(f"{k} {v}" for k, v in gone.items()) + ")") if gone else ""


def _seeds(seeds: list) -> str:
    s = sorted(seeds)
    return f"{s[0]}–{s[-1]}" if s == list(range(s[0], s[-1] + 1)) and len(s) > 2 else ", ".join(map(str, s))


# ---- the decision --------------------------------------------------------------------------------------------
def _decide(r: FrameResult, claim: Claim, alpha: float) -> FrameResult:
    """The verdict from the Holm-adjusted p (the module's docstring); ``r.reason`` set in words."""
    if r.p is None:
        r.reason = r.reason or "no test"
        return r
    holm_p = f"Holm p = {format_p(r.p_holm)} (raw {format_p(r.p)})"
    if claim.test == "universal":
        verdict, why = _decide_universal(r, claim, alpha, holm_p)
    elif r.p_holm < alpha:
        ahead = r.effect > claim.null
        verdict = "supported" if ahead == (claim.direction == "greater") else "contradicted"
        side = "predicted" if verdict == "supported" else "opposite"
        why = f"{holm_p} < α = {alpha:g}, estimate on the {side} side of {claim.null:g}"
    else:
        verdict, why = "inconclusive", f"not significant: {holm_p} ≥ α = {alpha:g}"
    decisive = claim.test == "universal" and verdict == "contradicted"  # one counterexample suffices at any n
    if (r.n_configurations or 0) < claim.min_n and not decisive:
        verdict, why = "inconclusive", f"n too small ({r.n_configurations} configurations < {claim.min_n}; the test " \
                                       f"alone: {why})"
    r.verdict, r.reason = verdict, why + _missing(r.detail)
    return r


def _decide_universal(r: FrameResult, claim: Claim, alpha: float, holm_p: str) -> tuple[str, str]:
    rows = r.detail["universal"]["configurations"]
    name = lambda row: "/".join(f"{v:g}" if isinstance(v, float) else str(v) for v in row["configuration"])
    if r.p_holm < alpha:
        hits = [row for row in rows if row.get("counterexample")]
        shown = ", ".join(f"{name(x)} (mean {x['mean']:.3g}, bound {x['bound']:.3g})" for x in hits[:3])
        return "contradicted", (f"{len(hits)} counterexample configuration(s) to 'every value {claim.holds} "
                                f"{claim.floor:g}': {shown}; {holm_p} < α = {alpha:g}")
    worst = max(rows, key=lambda x: x["mean"] if claim.holds == "below" else -x["mean"])
    beyond = [x for x in rows if (x["mean"] > claim.floor if claim.holds == "below" else x["mean"] < claim.floor)]
    if beyond:
        return "inconclusive", (f"no counterexample beyond noise, but {len(beyond)} configuration(s) with a mean "
                                f"beyond the floor {claim.floor:g} (extreme {name(worst)}: mean {worst['mean']:.3g}); "
                                f"{holm_p}")
    return "supported", (f"no counterexample among {len(rows)} configurations (every mean {claim.holds} "
                         f"{claim.floor:g}; extreme {name(worst)}: mean {worst['mean']:.3g}); {holm_p}")


def evaluate_v2(spec: ClaimsFile, records: list) -> list:
    """Every claim's verdict under the version-2 frame, Holm-adjusted across the whole file, in the file's order
    (the records, typed or their JSON, read typed once)."""
    records = [typed(r) for r in records]
    raw = [_raw(c, spec, records) for c in spec.claim]
    for r, adj in zip(raw, holm([r.p for r in raw])):
        r.p_holm = adj if r.p is not None else None
    return [_decide(r, c, spec.alpha) for r, c in zip(raw, spec.claim)]


# ---- in words ------------------------------------------------------------------------------------------------
def _num(v: Optional[float]) -> str:
    return "–" if v is None else (f"{v:.3g}" if abs(v) < 1e4 else f"{v:.3e}")


def _rule(claim: Claim) -> str:
    """The rule in a few words: the test, the values it sees, the null or floor, the direction."""
    if claim.test == "universal":
        what = "A − B" if claim.design == "paired" else "value"
        return (f"universal: every configuration's {what} {claim.holds} {claim.floor:g} (counterexample: one-sided t, "
                "Bonferroni)")
    sym = ">" if claim.direction == "greater" else "<"
    if claim.test == "spearman":
        terms = ", ".join(f"{'+' if p.sign > 0 else '−'}{p.metric}" for p in claim.predictors)
        return f"spearman across configurations: score ({terms}) vs {claim.metric}, ρ {sym} {claim.null:g}"
    what = claim.success.metric + f" ≥ {claim.success.at_least:g} (share)" if claim.success else claim.metric
    how = {"paired": "A − B", "one-sample": "A", "unpaired": "A − B (Welch)"}[claim.design]
    return f"t over configurations: {how} {sym} {claim.null:g}, {what}"


def _seed_text(r: FrameResult, claim: Claim) -> str:
    if r.seeds is None:
        return "all"
    return f"{_seeds(r.seeds)}" + (" (confirmatory)" if claim.confirmatory else "")


def frame_lines(results: list, claims: list) -> list:
    """One line per claim: id, verdict, configurations (runs), effect, CI, raw and Holm p, the reason."""
    out = []
    for r, c in zip(results, claims):
        ci = "–" if r.ci is None else f"[{_num(r.ci[0])}, {_num(r.ci[1])}]"
        out.append(f"{r.id}: {r.verdict} (configurations {_num(r.n_configurations)}, runs {_num(r.n_runs)}; "
                   f"effect {_num(r.effect)} {r.unit}, CI {ci}, p {format_p(r.p)}, Holm p {format_p(r.p_holm)}) "
                   f"— {r.reason}")
    return out


def _header(spec: ClaimsFile, records: int, source: str, sha256: str, claims_path: str) -> str:
    level = f"{1 - spec.alpha:.0%}"
    return (f"**Claims of the paper and their verdicts (version-2 frame)**, computed by `stability claims {source}` "
            f"from {records} records against `{claims_path}` (sha256 {sha256[:12]}). Unit of analysis: the "
            f"configuration (the mean of its runs). Every p is two-sided (a universal claim's: that of its strongest "
            f"counterexample, Bonferroni over its configurations) and is shown raw and Holm-adjusted over the "
            f"{len(spec.claim)} claims; the verdict is read from the Holm p at α = {spec.alpha:g} and the side of "
            f"the estimate. CI: the {level} t-interval over configurations (Welch for two arms; Fisher z for ρ). "
            f"Effect of a universal claim: its most extreme configuration's mean. Generated, never edited by hand.")


def frame_markdown(spec: ClaimsFile, results: list, *, records: int, source: str, sha256: str,
                   claims_path: str) -> str:
    """The verdict table of a version-2 file (Markdown)."""
    rows = ["| claim | the paper (where) | rule | seeds | verdict | configurations (runs) | effect | CI | p | "
            "p (Holm) | reason |", "|---|---|---|---|---|---:|---:|---|---:|---:|---|"]
    for r, c in zip(results, spec.claim):
        ci = "–" if r.ci is None else f"[{_num(r.ci[0])}, {_num(r.ci[1])}]"
        eff = "–" if r.effect is None else f"{r.effect:+.3g} {r.unit}"
        rows.append(f"| `{c.id}` | “{c.paper}” ({c.where}) | {_rule(c)} | {_seed_text(r, c)} | **{r.verdict}** | "
                    f"{_num(r.n_configurations)} ({_num(r.n_runs)}) | {eff} | {ci} | {format_p(r.p)} | "
                    f"{format_p(r.p_holm)} | {r.reason.replace('|', '/')} |")
    counts = {v: sum(r.verdict == v for r in results) for v in ("supported", "contradicted", "inconclusive")}
    tail = f"{len(results)} claims: " + ", ".join(f"{n} {v}" for v, n in counts.items()) + "."
    return "\n\n".join([_header(spec, records, source, sha256, claims_path), "\n".join(rows), tail]) + "\n"


def frame_json(spec: ClaimsFile, results: list, *, records: int, source: str, sha256: str, claims_path: str) -> dict:
    """Every number of every verdict, with what it was computed from."""
    return {"format": VERDICTS_FORMAT, "version": 2, "claims": claims_path, "claims_sha256": sha256,
            "source": source, "records": records, "alpha": spec.alpha, "p_convention": "two-sided; Holm over the file",
            "verdicts": [r.to_dict() for r in results]}


def frame_compact(results: list, *, records: int, source: str, sha256: str) -> str:
    """The short table (README): verdict, configurations, effect, CI, raw and Holm p — the p the verdict was read
    from is the Holm one, and every p is two-sided."""
    rows = ["| claim | verdict | configurations | effect | CI | p | p (Holm) |", "|---|---|---:|---:|---|---:|---:|"]
    for r in results:
        ci = "–" if r.ci is None else f"[{_num(r.ci[0])}, {_num(r.ci[1])}]"
        eff = "–" if r.effect is None else f"{r.effect:+.3g} {r.unit}"
        rows.append(f"| `{r.id}` | **{r.verdict}** | {_num(r.n_configurations)} | {eff} | {ci} | {format_p(r.p)} | "
                    f"{format_p(r.p_holm)} |")
    head = (f"Computed by `stability claims {source}` from {records} records (claims sha256 {sha256[:12]}); every "
            "p two-sided, the verdict read from the Holm-adjusted one.")
    return head + "\n\n" + "\n".join(rows) + "\n"
