"""The measured references behind the geometry verdict's thresholds (benchmarks/RESULTS.md, "Geometry stage").

1. The toy model of Figure 5 (stability/analysis/geometry.py: Figure5Model, figure5_radius): points of
   N(0, σ²I₂) (regions.draw, σ = 1, as Table 3) that lie inside each region; at each, the radii along the stage's
   K = 8 directions (both signs, censored at T_MAX as the stage does) in closed form, and their anisotropy; the
   stage itself on the first points, to show it returns the closed form.
2. Trained checkpoints (paths given on the command line): the default geometry stage on the val and hard splits.

    python benchmarks/geometry_references.py [CKPT ...] [--out benchmarks/results-geometry.json]
"""

import argparse
import json
import time

import numpy as np
import torch


def toy(points: int = 200, K: int = 8, seed: int = 0) -> dict:
    from stability.analysis.closed_form_regions import Figure5Model, figure5_radius
    from stability.analysis.geometry import anisotropy
    from stability.analysis.options import AnalysisOptions
    from stability.analysis.perturbation import random_directions
    from stability.analysis.pipeline import analyze
    from stability.analysis.radii import T_MAX
    from stability.theory import regions

    out = {}
    x, y = regions.draw(1.0, 10_000, seed)
    for placement, inside in (("external", regions.stable_external), ("internal", regions.stable_internal)):
        keep = np.nonzero(inside(x, y))[0][:points]
        rows, checks = [], []
        for n, i in enumerate(keep):
            th = (float(x[i]), float(y[i]))
            D = random_directions({"theta": torch.tensor(th, dtype=torch.float64)}, K, 0)["theta"].numpy()
            radii = [min(figure5_radius(placement, th, s * D[j]), T_MAX) for j in range(K) for s in (1, -1)]
            rows.append(anisotropy(radii))
            if n < 3:  # the stage on the same point: its radii against the closed form
                m = Figure5Model(placement, *th)
                o = AnalysisOptions(samples=1, stages=("geometry",), geometry_directions=K,
                                    geometry_group_directions=0)
                got = analyze(m, torch.zeros(1, 1, dtype=torch.float64), options=o).to_json()["inputs"]["geometry"]
                rel = [abs(a - b) / b for a, b in zip(got["radii"][0], radii) if b > 0]
                checks.append(max(rel))
        out[placement] = {k: float(np.median([r[k] for r in rows])) for k in ("median_radius", "log_iqr",
                                                                               "log_range", "balance")}
        out[placement]["points"] = len(rows)
        out[placement]["stage_vs_closed_form_max_rel"] = max(checks)
    return out


def trained(paths: list) -> dict:
    from stability.analysis.options import AnalysisOptions
    from stability.analysis.pipeline import analyze_checkpoint

    out = {}
    for path in paths:
        t = time.perf_counter()
        rep = analyze_checkpoint(path, splits=("val", "hard"), options=AnalysisOptions(
            samples=1, stages=("geometry",))).to_json()
        cfg = rep["config"]["model"]
        out[path] = {"recall": cfg["recall"], "norm": cfg["norm"], "seconds": time.perf_counter() - t}
        for split in ("val", "hard"):
            g = rep[split]["geometry"]
            out[path][split] = {**g["summary"], "rho_at_theta": g["rho_at_theta"][0],
                                "groups": {x["name"]: x["median_radius"] for x in g["groups"]},
                                "verdict": rep[split]["verdict"]["geometry"]}
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("checkpoints", nargs="*")
    p.add_argument("--out", default="benchmarks/results-geometry.json")
    a = p.parse_args()
    torch.set_num_threads(1)
    res = {"toy": toy(), "trained": trained(a.checkpoints)}
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
