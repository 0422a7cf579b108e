"""Which measured quantity predicts hard accuracy best: rank correlations across a grid's looped runs.

For each predictor — ρ(W_x) (the paper's, App. B.3–B.4), the median fixed-point ρ(J*) (Props. 3–4), the
converged share of the analysed samples (reachability) and the median ‖dx*/dx0‖_F (Prop. 5) — the Spearman rank
correlation (``scipy.stats.spearmanr``) with the hard whole-answer accuracy, over

* all looped runs together (``pooled``), and
* the runs of each seed separately (``by_seed``), whose mean and sample standard deviation are the spread over
  seeds: a predictor whose correlation changes sign between seeds predicts nothing.

The predictors are measured on the hard split where it was analysed (else on the record's summary split).
Undefined values are handled per predictor and said in the output: ρ(J*) of a run in which no analysed sample
converged is ranked above every measured value (``+inf``: no attracting fixed point was reached, the unstable
end of the scale); a run without ‖dx*/dx0‖ (nothing converged) is left out of that predictor; ρ(W_x) exists only
for recall models, so autonomous runs are left out of it. Diverged runs (no model to measure) are left out of all.
See docs/replication.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Union

from stability import atomic
from stability.sweep.quantities import accuracy as _acc, is_looped as _looped, split_quantity
from stability.sweep.record import SweepRecord, typed

#: predictor -> (its field in the headline block, label, what an undefined value becomes)
PREDICTORS = {
    "rho_Wx": ("rho_Wx", "ρ(W_x)", None),
    "rho_J": ("rho_J_median", "median ρ(J*)", math.inf),
    "converged_share": ("converged_fraction", "converged share", None),
    "input_grad_norm": ("input_grad_norm_median", "median ‖dx*/dx0‖_F", None),
}


def predictor_table(records: list[Union[SweepRecord, dict]], split: str = "hard") -> list[dict]:
    """One row per analysed looped run (the records typed, or their JSON read typed): cell id, seed, hard accuracy
    (percent) and each predictor (None where undefined and left out, ``inf`` for ρ(J*) with no converged
    sample)."""
    rows = []
    for r in map(typed, records):
        if not _looped(r) or r.status == "diverged" or not r.final:
            continue
        if split_quantity(r, "converged_fraction", split) is None:  # not analysed
            continue
        row = {"cell_id": r.cell_id or r.id, "seed": r.config.train.seed, "hard": _acc(r, "hard")}
        for name, (key, _, undefined) in PREDICTORS.items():
            v = split_quantity(r, key, split)
            row[name] = v if v is not None else undefined
        if r.config.model.recall == "none":
            row["rho_Wx"] = None
        rows.append(row)
    return rows


def _spearman(xs: list, ys: list) -> dict:
    """Spearman's ρ and its two-sided p-value (scipy); None when fewer than 3 pairs or a constant variable."""
    from scipy.stats import spearmanr

    pairs = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
    n = len(pairs)
    if n < 3 or len({p[0] for p in pairs}) < 2 or len({p[1] for p in pairs}) < 2:
        return {"rho": None, "p": None, "n": n}
    res = spearmanr([p[0] for p in pairs], [p[1] for p in pairs])
    rho, p = float(res.statistic), float(res.pvalue)
    return {"rho": rho if math.isfinite(rho) else None, "p": p if math.isfinite(p) else None, "n": n}


def rank_correlations(records: list[Union[SweepRecord, dict]], split: str = "hard") -> dict:
    """Spearman correlation of each predictor with hard accuracy, pooled and per seed (mean ± sample std over the
    seeds), and the predictors ranked by |mean over seeds| (pooled where there is one seed)."""
    rows = predictor_table(records, split)
    seeds = sorted({r["seed"] for r in rows})
    out: dict = {"split": split, "runs": len(rows), "seeds": seeds, "predictors": {}}
    for name, (_, label, undefined) in PREDICTORS.items():
        pooled = _spearman([r[name] for r in rows], [r["hard"] for r in rows])
        by_seed = {}
        for s in seeds:
            sub = [r for r in rows if r["seed"] == s]
            by_seed[str(s)] = _spearman([r[name] for r in sub], [r["hard"] for r in sub])
        vals = [v["rho"] for v in by_seed.values() if v["rho"] is not None]
        mean = sum(vals) / len(vals) if vals else None
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else None
        out["predictors"][name] = {
            "label": label, "pooled": pooled, "by_seed": by_seed, "seed_mean": mean, "seed_std": std,
            "seed_min": min(vals) if vals else None, "seed_max": max(vals) if vals else None,
            "undefined": ("ranked above every measured value (+inf)" if undefined == math.inf
                          else "left out"),
            "undefined_runs": sum(1 for r in rows if r[name] is None or r[name] == math.inf),
        }

    def strength(name: str) -> float:
        p = out["predictors"][name]
        v = p["seed_mean"] if p["seed_mean"] is not None else p["pooled"]["rho"]
        return -1.0 if v is None else abs(v)

    out["ranking"] = sorted(PREDICTORS, key=strength, reverse=True)
    return out


def _fmt(v: Optional[float], digits: int = 2) -> str:
    return "–" if v is None else f"{v:+.{digits}f}"


def markdown(result: dict) -> str:
    """The correlation summary as a Markdown table, strongest predictor first."""
    seeds = result["seeds"]
    head = ["predictor", "pooled ρ_s (n)", "p"] + [f"seed {s}" for s in seeds] + ["mean ± std over seeds",
                                                                                    "undefined values"]
    lines = [f"**Spearman rank correlation with hard whole-answer accuracy, {result['runs']} analysed looped runs "
             f"(predictors measured on the {result['split']} split)**", "",
             "| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 2) + ["---"]) + "|"]
    for name in result["ranking"]:
        p = result["predictors"][name]
        pooled = p["pooled"]
        spread = ("–" if p["seed_mean"] is None else
                  f"{p['seed_mean']:+.2f}" + (f" ± {p['seed_std']:.2f}" if p["seed_std"] is not None else ""))
        row = [p["label"], f"{_fmt(pooled['rho'])} ({pooled['n']})",
               "–" if pooled["p"] is None else f"{pooled['p']:.2g}"]
        row += [f"{_fmt(p['by_seed'][str(s)]['rho'])} ({p['by_seed'][str(s)]['n']})" for s in seeds]
        row += [spread, f"{p['undefined_runs']} {p['undefined']}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def write_correlations(records: list[Union[SweepRecord, dict]], out_dir: Path) -> list[Path]:
    """``correlations.json`` and ``correlations.md`` in ``out_dir`` (atomically); [] when no run was analysed."""
    result = rank_correlations(records)
    if not result["runs"]:
        return []
    out_dir = Path(out_dir)
    return [atomic.write_json(out_dir / "correlations.json", result, indent=2, sort_keys=True),
            atomic.write_text(out_dir / "correlations.md", markdown(result))]
