"""The stages' cost models refitted across model shapes (issue 35: the forecast within 2× on the device it runs on).

Each configuration is one analysis (``launch_bound.py --forecast``: every stage but accuracy, the CPU default, one
thread) in its own process, which records each stage's seconds and the J-products the forecast measured (of the
split's batch and of one sample). Per stage, the seconds over its units (:class:`stability.analysis.stages.base.Cost`:
samples, once, or the geometry stage's samples plus one) times its product (the batch's per sample, or one
sample's) is the stage's cost in J-products, k; a least-squares fit of log k against log(n / 1000) gives
k = k0 · (n / 1000)^c, and the Cost in the fit's units is a = k0 · PRODUCT's a, b = c + PRODUCT's b (a product on
the fit's machine costs ``cost.PRODUCT``). Configurations where no sample converged are left out (their stages
after the solve do next to nothing).

    python benchmarks/forecast_fit.py                       # run the configurations, fit, print (JSON to --out)
    python benchmarks/forecast_fit.py --batch all --out benchmarks/results-forecast-fit-batched.json
                                                            # the batched path's costs (Cost.batched; a GPU's path)
    python benchmarks/forecast_fit.py --refit results.json  # fit the runs of an earlier --out again
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

#: (task, width, samples, seed): the launch-bound model and its seeds, other samples, widths and shapes
CONFIGS = (("sudoku", 16, 8, 0), ("sudoku", 16, 8, 1), ("sudoku", 16, 2, 0), ("sudoku", 32, 8, 0),
           ("sudoku", 64, 4, 0), ("prefix-sums", 32, 8, 0), ("prefix-sums", 16, 8, 0))


def run(task: str, width: int, samples: int, seed: int, batch: str = "auto") -> dict:
    """One ``launch_bound.py --forecast`` in a child process (one thread); ``batch``: ``AnalysisOptions.batch``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "forecast.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, str(HERE / "launch_bound.py"), "--forecast", "--task", task, "--width",
                        str(width), "--samples", str(samples), "--seed", str(seed), "--out", str(out),
                        "--batch", batch], check=True, env=env, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def costs(r: dict) -> dict:
    """{stage: k}: each stage's seconds in J-products of its kind per unit, on the run ``r``."""
    from stability.analysis.cost import COSTS

    N = r["samples"]
    one = r["products_s"][0]
    batch = (r["products_s"][-1] + one) / N  # a step of the batch: its product and a fixed part (cost.predict)
    out = {}
    for s, row in r["stages"].items():
        _, _, unit, product = COSTS[s]
        units = {"sample": N, "one": 1, "geometry sample": r["geometry_samples"] + 1}[unit]
        eig = "batch" if r.get("batch") == "all" else "one"  # the CPU's default: the eigensolver a sample at a time
        per = batch if (eig if product == "eig" else product) == "batch" else one
        out[s] = row["actual_s"] / (units * per)
    return out


def fit(runs: list) -> dict:
    """{stage: {"a", "b", "k0", "c", "spread"}}: the least-squares power law k = k0 · (n / 1000)^c over ``runs``
    (those with a converged sample), in the fit's units (module docstring); spread: the largest over the smallest
    of k / fit."""
    from stability.analysis.cost import COSTS, PRODUCT

    runs = [r for r in runs if r["converged"]]
    out = {}
    for s in runs[0]["stages"]:
        pts = [(math.log(r["n"] / 1000.0), math.log(costs(r)[s])) for r in runs if costs(r)[s] > 0]
        mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
        sxx = sum((x - mx) ** 2 for x, _ in pts)
        c = sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx > 0 else 0.0
        k0 = math.exp(my - c * mx)
        res = [math.exp(y - math.log(k0) - c * x) for x, y in pts]
        out[s] = {"a": k0 * PRODUCT[0], "b": c + PRODUCT[1], "k0": k0, "c": c, "unit": COSTS[s][2],
                  "product": COSTS[s][3], "spread": max(res) / min(res)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "results-forecast-fit.json")
    ap.add_argument("--refit", type=Path, help="fit the runs of an earlier --out instead of running them")
    ap.add_argument("--batch", default="auto", help="AnalysisOptions.batch of every run (all: the GPU's path)")
    args = ap.parse_args(argv)
    if args.refit:
        runs = json.loads(args.refit.read_text())["runs"]
    else:
        runs = []
        for cfg in CONFIGS:
            runs.append(run(*cfg, batch=args.batch))
            print(f"{cfg}: {runs[-1]['wall_s']:.0f} s, load {runs[-1]['load'][0]:.2f}", flush=True)
    fitted = fit(runs)
    args.out.write_text(json.dumps({"configs": CONFIGS, "runs": runs, "fit": fitted}, indent=1) + "\n")
    print("| stage | k0 (products per unit at n = 1,000) | c | spread | Cost(a, b) |\n|---|---|---|---|---|")
    for s, f in fitted.items():
        print(f"| {s} | {f['k0']:.3g} | {f['c']:.2f} | {f['spread']:.2f} | Cost({f['a']:.3g}, {f['b']:.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
