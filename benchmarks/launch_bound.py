"""Launch-boundness of every analysis stage, without a GPU (issue 35): the torch ops each stage dispatches and the
host syncs it makes, at N and 8·N samples.

A stage batched over samples dispatches about the same ops whatever the batch (each op just works on more rows),
so its count ratio (8·N over N) stays near 1; a stage that walks its samples in Python grows like the batch. On a
GPU each op is a kernel launch and each host sync a stall of the whole queue, so these ratios predict which stages
a GPU leaves launch-bound. Counted on the CPU with a ``TorchDispatchMode`` (every aten op that reaches a kernel)
and a ``TorchFunctionMode`` (the calls that wait for the device on a GPU: ``item``, ``tolist``, ``cpu``,
``numpy``, and ``bool``/``float``/``int`` of a tensor). Goal (issue 35): ratio ≤ 1.3 for every stage.

The model is the paper's architecture at the sudoku shape (81 positions) and a small width, untrained with W_x
scaled by 0.5 so that plain iteration converges (benchmarks/analysis_scaling.py's builder).

    python benchmarks/launch_bound.py [--samples 8] [--width 16] [--out benchmarks/results-launch-bound.json]
    python benchmarks/launch_bound.py --solvers --samples 64   # the solvers' syncs per evaluation, per row, batched
    python benchmarks/launch_bound.py --forecast --samples 8   # each stage's forecast against its time (no counting)
    python benchmarks/launch_bound.py --batch all --stages reachability,rho,input,repelling   # some stages only

``--seed`` picks another model and inputs (``analysis_scaling.build``'s seed): the ratios are the slowest
sample's, so they vary with it. ``--stages`` counts those stages only (a stage's counts are the same as in the
whole analysis where the stages it reads of are among them). ``--forecast`` (issue 35's forecasts per device):
one analysis of the same model on ``--samples``, uncounted, each stage's predicted seconds (the split's
prediction rescaled to this machine by its measured J-products, :func:`stability.analysis.pipeline.predicted`)
against its measured seconds, on ``--task``'s shape (benchmarks/forecast_fit.py refits the stages' costs from
such runs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: the calls that make the host wait for the device (on a GPU; on the CPU they are counted all the same)
SYNCS = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"}


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


class _Syncs(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.count = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in SYNCS:
            self.count[name] += 1
        return func(*args, **(kwargs or {}))


def count_stages(model, inputs, options) -> dict:
    """{stage: {"ops": n, "syncs": n, "seconds": s}} of one analysis of ``inputs``, each stage counted alone."""
    import dataclasses

    from stability.analysis import pipeline

    counts = {}
    original = pipeline.stage  # the registry's lookup: each stage's run is wrapped by a counting one

    def counted(name, fn):
        def run(at):
            ops, syncs = _Ops(), _Syncs()
            t = time.perf_counter()
            with syncs, ops:
                out = fn(at)
            counts[name] = {"ops": ops.count, "syncs": sum(syncs.count.values()), "sync_calls": dict(syncs.count),
                            "seconds": time.perf_counter() - t}
            return out
        return run

    def stage(name):
        found = original(name)
        return dataclasses.replace(found, run=counted(name, found.run))

    try:
        pipeline.stage = stage
        pipeline.run_stages(model, inputs, None, options, split="inputs")
    finally:
        pipeline.stage = original
    return counts


def measure(samples: int, width: int, factor: int = 8, batch: str | None = None, seed: int = 0,
            only: tuple | None = None) -> dict:
    from analysis_scaling import build

    from stability import AnalysisOptions
    from stability.analysis.options import STAGES

    stages = tuple(s for s in STAGES if s != "accuracy" and (only is None or s in only))  # accuracy: targets
    out = {"samples": samples, "factor": factor, "width": width, "positions": 81, "batch": batch or "auto",
           "seed": seed, "stages": {}}
    runs = {}
    for N in (samples, factor * samples):
        model, inputs = build("sudoku", width, (9, 9), 0.5, N, seed=seed)
        kw = {"batch": batch} if batch else {}
        options = AnalysisOptions(samples=N, stages=stages, few_samples=0, **kw)
        runs[N] = count_stages(model, inputs, options)
    small, large = runs[samples], runs[factor * samples]
    for name in small:
        a, b = small[name], large[name]
        out["stages"][name] = {"ops": [a["ops"], b["ops"]], "syncs": [a["syncs"], b["syncs"]],
                               "ops_ratio": b["ops"] / max(a["ops"], 1), "syncs_ratio": b["syncs"] / max(a["syncs"], 1),
                               "seconds": [a["seconds"], b["seconds"]], "sync_calls": [a["sync_calls"], b["sync_calls"]]}
    return out


#: the shapes ``--forecast`` analyses (``--task``): analysis_scaling's task and its positions
TASKS = {"sudoku": (9, 9), "prefix-sums": (40,), "chess": (8, 8)}


def forecast_vs_actual(samples: int, width: int, batch: str | None = None, seed: int = 0,
                       task: str = "sudoku") -> dict:
    """{"stages": {stage: {"forecast_s", "actual_s", "ratio"}}, ...} of one analysis (``stability.analyze``, every
    stage but accuracy) of ``samples`` states of ``task``'s shape: the forecast is the one the analysis itself
    makes before its first stage (:func:`stability.analysis.pipeline.predicted`, rescaled by this machine's
    J-products, recorded as ``products_s``: one sample's, then the whole batch's), with what a refit needs (the
    state size n, the geometry stage's samples, the solver's mean evaluations)."""
    import stability
    from analysis_scaling import build
    from stability import AnalysisOptions
    from stability.analysis import pipeline
    from stability.analysis.options import STAGES

    stages = tuple(s for s in STAGES if s != "accuracy")
    model, inputs = build(task, width, TASKS[task], 0.5, samples, seed=seed)
    said, products = {}, []
    original, timed = pipeline.predicted, pipeline.product_seconds  # the split's own forecast, as the analysis made it

    def predicted(at, options):
        said.update(original(at, options))
        return said

    def product_seconds(*args, **kwargs):
        products.append(timed(*args, **kwargs))
        return products[-1]

    kw = {"batch": batch} if batch else {}
    t = time.perf_counter()
    try:
        pipeline.predicted, pipeline.product_seconds = predicted, product_seconds
        report = stability.analyze(model, inputs, options=AnalysisOptions(samples=samples, stages=stages,
                                                                           **kw)).to_json()["inputs"]
    finally:
        pipeline.predicted, pipeline.product_seconds = original, timed
    wall = time.perf_counter() - t
    rows = {name: {"forecast_s": said[name], "actual_s": sec, "ratio": sec / said[name] if said[name] else None}
            for name, sec in report["timings"].items()}
    total_f, total_a = sum(said[n] for n in rows), sum(r["actual_s"] for r in rows.values())
    nfe = report["fixed_point"]["nfe"]
    return {"samples": samples, "width": width, "task": task, "positions": list(TASKS[task]),
            "n": width * math.prod(TASKS[task]), "batch": batch or "auto", "seed": seed, "products_s": products,
            "geometry_samples": len((report.get("geometry") or {}).get("samples") or []),
            "converged": report["fixed_point"]["status"].count("converged"), "nfe_mean": sum(nfe) / len(nfe),
            "stages": rows, "total": {"forecast_s": total_f, "actual_s": total_a, "ratio": total_a / total_f},
            "wall_s": wall, "load": list(os.getloadavg())}


def solver_syncs(samples: int, width: int) -> dict:
    """{method: {path: {"evaluations", "syncs_per_eval", "ops_per_eval"}}} of one solve (τ = 1e-8) of ``samples``
    sudoku-shape states, per row (the CPU's path) and batched (``Solve.batched``, the GPU's), evaluations the
    slowest sample's."""
    from analysis_scaling import build

    from stability.analysis.fixed_point import analysis_model
    from stability.solvers import solve

    model, inputs = build("sudoku", width, (9, 9), 0.5, samples)
    model = analysis_model(model)
    x0 = model.embed(inputs.double())
    e = model.initial_state(x0)
    out = {}
    for method in ("picard", "anderson", "broyden"):
        for path, batched in (("per-row", False), ("batched", True)):
            ops, syncs = _Ops(), _Syncs()
            with syncs, ops:
                r = solve(model.step, e, x0, method=method, tol=1e-8, max_iter=300, certify_rho=False,
                          batched=batched)
            its = int(r.nfe.max())
            out.setdefault(method, {})[path] = {"evaluations": its, "ops_per_eval": ops.count / its,
                                                "syncs_per_eval": sum(syncs.count.values()) / its}
    return out


def table(result: dict) -> str:
    n, f = result["samples"], result["factor"]
    lines = [f"| stage | ops at {n} | ops at {f * n} | ratio | syncs at {n} | syncs at {f * n} | ratio |",
             "|---|---|---|---|---|---|---|"]
    for name, s in result["stages"].items():
        lines.append(f"| {name} | {s['ops'][0]:,} | {s['ops'][1]:,} | {s['ops_ratio']:.2f} | {s['syncs'][0]:,} | "
                     f"{s['syncs'][1]:,} | {s['syncs_ratio']:.2f} |")
    return "\n".join(lines)


def forecast_table(result: dict) -> str:
    lines = ["| stage | forecast s | actual s | actual / forecast |", "|---|---|---|---|"]
    for name, r in [*result["stages"].items(), ("total", result["total"])]:
        ratio = "—" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(f"| {name} | {r['forecast_s']:.2f} | {r['actual_s']:.2f} | {ratio} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--factor", type=int, default=8)
    ap.add_argument("--batch", default=None, help="AnalysisOptions.batch, where the toolkit has it")
    ap.add_argument("--out", type=Path, default=HERE / "results-launch-bound.json")
    ap.add_argument("--solvers", action="store_true", help="the solvers' syncs per evaluation instead (printed)")
    ap.add_argument("--seed", type=int, default=0, help="the model's and inputs' seed (analysis_scaling.build)")
    ap.add_argument("--stages", default=None, help="count these stages only (comma-separated; those a stage reads "
                                                   "of another must be among them: repelling reuses rho's ρ)")
    ap.add_argument("--task", default="sudoku", choices=sorted(TASKS), help="--forecast's shape")
    ap.add_argument("--forecast", action="store_true",
                    help="each stage's forecast against its measured seconds instead (JSON to --out)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.forecast:
        result = forecast_vs_actual(args.samples, args.width, args.batch, args.seed, args.task)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(forecast_table(result))
        print(f"wall {result['wall_s']:.1f} s, load {result['load'][0]:.2f}")
        return 0
    if args.solvers:
        for method, paths in solver_syncs(args.samples, args.width).items():
            for path, row in paths.items():
                print(f"{method:9s} {path:8s} evaluations {row['evaluations']:4d}  syncs/eval "
                      f"{row['syncs_per_eval']:.2f}  ops/eval {row['ops_per_eval']:.0f}")
        return 0
    only = tuple(args.stages.split(",")) if args.stages else None
    result = measure(args.samples, args.width, args.factor, args.batch, args.seed, only)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    worst = max(max(s["ops_ratio"], s["syncs_ratio"]) for s in result["stages"].values())
    print(f"largest ratio {worst:.2f} (goal ≤ 1.3)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
