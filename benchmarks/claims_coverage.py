"""Coverage of the claims' intervals for 3-6 configurations (issue 38, "CIs that cover at the stated level"), by
simulation, and the false-counterexample rate of the universal rule.

The model is the one the version-2 frame assumes (stability/sweep/claims/frame.py): a claim's configurations are
draws from a population of configurations (effect μ + u_c, u_c with spread τ), each run of a configuration adds
seed noise (spread σ); the estimand is μ. Per scenario, ``--reps`` simulated grids of k configurations × r seeds;
for each, the second edition's interval (the percentile bootstrap resampling configurations,
``stability.sweep.claims.statistics.bootstrap_ci``'s method, at 90 %) and the third edition's t-interval over the
configurations' means (``t_over_configurations``, at 90 % and 95 %); coverage = the share of grids whose interval
contains μ (Monte-Carlo standard error √(c(1−c)/reps), about 0.007 at 2,000 reps). Scenarios: normal configuration
effects; skewed (log-normal) ones; bimodal runs (a run extrapolates, 60 points, with a configuration's own
probability drawn from Beta(0.5, 0.5), else 0 — the shape of hard accuracy across seeds).

The universal rule: k = 12 configurations × 4 seeds all exactly at the floor (the null's worst case), normal seed
noise; the share of grids in which some configuration is declared a counterexample (``counterexamples``) must be
≤ α = 0.05.

    OMP_NUM_THREADS=1 python benchmarks/claims_coverage.py [--reps 2000] [--json OUT.json]

Not in the suite (a minute of numpy); the numbers are in docs/replication.md and benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stability.sweep.claims.statistics import counterexamples, t_over_configurations  # noqa: E402

RESAMPLES = 999
SEEDS = 4


def _grid(rng, scenario: str, k: int, r: int) -> tuple[np.ndarray, float]:
    """One simulated grid: (k configurations × r runs of values, the population mean μ)."""
    if scenario == "normal":
        u = rng.normal(10.0, 10.0, size=k)
        return u[:, None] + rng.normal(0.0, 10.0, size=(k, r)), 10.0
    if scenario == "skewed":
        z = rng.standard_normal(k)
        u = 10.0 + 10.0 * (np.exp(z) - math.exp(0.5)) / math.sqrt((math.e - 1.0) * math.e)
        return u[:, None] + rng.normal(0.0, 10.0, size=(k, r)), 10.0
    p = rng.beta(0.5, 0.5, size=k)
    return 60.0 * (rng.random((k, r)) < p[:, None]), 30.0


def _percentile_covers(rng, means: np.ndarray, mu: float, level: float) -> bool:
    """The second edition's interval: percentile bootstrap of the mean, resampling whole configurations."""
    k = means.size
    boot = means[rng.integers(0, k, size=(RESAMPLES, k))].mean(axis=1)
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return lo <= mu <= hi


def coverage(scenario: str, k: int, reps: int, seed: int) -> dict:
    """Coverage of μ by the percentile bootstrap (90 %) and the t-interval over configurations (90 %, 95 %)."""
    rng = np.random.default_rng([seed, k, len(scenario)])
    hits = {"bootstrap90": 0, "t90": 0, "t95": 0}
    for _ in range(reps):
        values, mu = _grid(rng, scenario, k, SEEDS)
        means = values.mean(axis=1)
        hits["bootstrap90"] += _percentile_covers(rng, means, mu, 0.90)
        for name, level in (("t90", 0.90), ("t95", 0.95)):
            res = t_over_configurations(means, 0.0, level)
            hits[name] += res["ci"][0] <= mu <= res["ci"][1]
    return {k_: v / reps for k_, v in hits.items()}


def false_counterexamples(reps: int, seed: int, k: int = 12, alpha: float = 0.05) -> float:
    """The universal rule's rate of declaring a counterexample when every configuration sits at the floor."""
    rng = np.random.default_rng([seed, 99])
    wrong = 0
    for _ in range(reps):
        groups = {(i,): list(rng.normal(1.0, 0.5, size=SEEDS)) for i in range(k)}
        wrong += any(row["counterexample"] for row in counterexamples(groups, 1.0, "below", alpha)["configurations"])
    return wrong / reps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    print("| scenario | k | percentile bootstrap 90 % | t 90 % | t 95 % |\n|---|---:|---:|---:|---:|")
    for scenario in ("normal", "skewed", "bimodal"):
        for k in (3, 4, 5, 6):
            c = coverage(scenario, k, args.reps, args.seed)
            rows.append({"scenario": scenario, "k": k, **c})
            print(f"| {scenario} | {k} | {c['bootstrap90']:.3f} | {c['t90']:.3f} | {c['t95']:.3f} |")
    fc = false_counterexamples(args.reps, args.seed)
    se = math.sqrt(0.9 * 0.1 / args.reps)
    print(f"\nuniversal rule, 12 configurations x {SEEDS} seeds at the floor: false counterexample rate {fc:.4f} "
          f"(alpha 0.05); Monte-Carlo SE of a 0.90 coverage: {se:.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"reps": args.reps, "seed": args.seed, "seeds_per_configuration": SEEDS,
                                               "resamples": RESAMPLES, "coverage": rows,
                                               "false_counterexample_rate": fc}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
