"""How long `stability analyze` of the demo checkpoint takes (issue 12), and where its dense route pays.

    python benchmarks/analyze_speed.py [--checkpoint runs/demo/prefix-sums.pt] [--repeats 2] [--json OUT]
    python benchmarks/analyze_speed.py --crossover [--checkpoint ...] [--json OUT]

Default: ``python -m stability analyze CKPT --json F --quiet`` timed as a whole process, as a user runs it (wall,
and CPU seconds of the process and its spawned split processes), with ``--workers 1`` on 2 threads and on 1
thread and with the default (the splits side by side), alternated ``--repeats`` times so that the machine's load
falls on each alike; every run's numbers are compared with the first's. ``--before-tree DIR`` alternates another
checkout's code with this tree's (to measure a change side by side).

``--crossover``: the dense ρ/σ_max route against the Krylov one at n = 128 … 2048 on the demo model (the
measurement behind ``DENSE_MAX``).

The checkpoint is the demo's, trained here first when absent. benchmarks/RESULTS.md, "Analysis speed", states
what these measured; `python benchmarks/run.py --only analyze-speed` runs it as part of the suite. Read the ratios:
the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the per-sample scipy references

HERE = Path(__file__).resolve().parent


CPU_TIMES: dict = {}


def _timed(fn, name=None):
    """(result, wall seconds); the process CPU seconds go to CPU_TIMES[name] (on a loaded machine, with one
    thread, the CPU time is the better estimate of the wall time on a free core)."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    if name is not None:
        CPU_TIMES[name] = time.process_time() - c
    return out, time.perf_counter() - t


def ensure_checkpoint(path: Path) -> Path:
    """The demo checkpoint: trained here with ``stability demo``'s configuration when absent."""
    if path.exists():
        return path
    from stability.demo import demo_config
    from stability.train.loop import train

    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"training the demo checkpoint into {path} …", flush=True)
    train(demo_config(), path, progress=False)
    return path


def bench_dense_crossover(model, lengths=(4, 8, 16, 32, 64), samples=(8, 8, 8, 4, 2), seed: int = 0,
                          tol: float = 1e-6) -> list:
    """ρ(J*) and σ_max per sample, the batched dense route (:func:`batched_dense_jacobian` + LAPACK) against the
    Krylov route the pipeline used before (mixed-precision Krylov–Schur for ρ, Lanczos on JᵀJ for σ_max), on the
    demo model at bit lengths giving n = 32 · L; the crossover sets ``DENSE_MAX`` in spectra.py."""
    import copy

    from stability.numerics import Linearisation, sigma_max, spectral_radius
    from stability.solvers import solve

    fast = copy.deepcopy(model).float()
    rows = []
    with torch.no_grad():  # pay vmap's and LAPACK's one-time set-up before any timing
        w0 = model.embed(torch.zeros(2, 2, 1, dtype=torch.float64))
    spectral_radius(Linearisation(model.step, w0, w0).dense(), route="dense")
    for L, B in zip(lengths, samples):
        gen = torch.Generator().manual_seed(seed)
        bits = (torch.randint(0, 2, (B, L, 1), generator=gen).double() - 0.5)
        with torch.no_grad():
            x0 = model.embed(bits)
            e = model.initial_state(x0, generator=torch.Generator().manual_seed(seed))
        x = solve(model.step, e, x0, tol=1e-5, max_iter=500).x_best
        n = int(np.prod(x.shape[1:]))

        def dense():
            J = Linearisation(model.step, x, x0).dense()
            return J, (spectral_radius(J, route="dense"), sigma_max(J, route="dense"))

        def krylov():
            spec = []
            sig = []
            for b in range(B):  # the pipeline's CPU default: one sample per batch
                xs, xb = x[b:b + 1], x0[b:b + 1]
                lin = Linearisation(model.step, xs, xb)
                spec.append(spectral_radius(lin, route="krylov", fast=Linearisation(fast.step, xs.float(), xb.float()),
                                            k=3, tol=tol, seed=seed).rho)
                sig.append(sigma_max(lin, route="krylov", tol=tol, seed=seed))
            return torch.cat(spec), torch.cat(sig)

        (J, (d_spec, d_sig)), t_d = _timed(dense, f"dense_{n}")
        (k_rho, k_sig), t_k = _timed(krylov, f"krylov_{n}")
        rows.append({"n": n, "L": L, "samples": B, "dense_s_per_sample": t_d / B, "krylov_s_per_sample": t_k / B,
                     "dense_cpu_s_per_sample": CPU_TIMES[f"dense_{n}"] / B,
                     "krylov_cpu_s_per_sample": CPU_TIMES[f"krylov_{n}"] / B,
                     "rho_max_abs_diff": float((d_spec.rho - k_rho).abs().max()),
                     "sigma_max_abs_diff": float((d_sig - k_sig).abs().max())})
        print(rows[-1], flush=True)
    return rows


def crossover_markdown(rows: list) -> str:
    lines = ["| n (L) | samples | dense: s/sample (CPU s) | Krylov: s/sample (CPU s) | |Δρ| max | |Δσ_max| max |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['n']} ({r['L']}) | {r['samples']} | {r['dense_s_per_sample']:.3f} "
                     f"({r['dense_cpu_s_per_sample']:.3f}) | {r['krylov_s_per_sample']:.3f} "
                     f"({r['krylov_cpu_s_per_sample']:.3f}) | {r['rho_max_abs_diff']:.1e} | "
                     f"{r['sigma_max_abs_diff']:.1e} |")
    return "\n".join(lines)


# ---- the whole command, as a user runs it ---------------------------------------------------------------

def _numbers(report: dict) -> dict:
    """An analysis JSON without what may differ between two runs of the same numbers (timings, workers)."""
    out = json.loads(json.dumps(report))
    out["options"].pop("workers", None)
    out.pop("checkpoint", None)
    for split in out["splits"]:
        out[split].pop("timings", None)
    return out


def bench_processes(ckpt: Path, trees: dict, repeats: int = 2) -> dict:
    """``python -m stability analyze CKPT --json F --quiet`` as a whole process, for every (label → (source tree,
    extra flags, OMP threads)) of ``trees``, the labels alternated ``repeats`` times so that the machine's load
    falls on each alike. Wall and CPU seconds of each process (CPU: its children's rusage, spawned split processes
    included), the stage times its JSON reports, and whether every label printed the same numbers as the first."""
    import resource
    import subprocess
    import tempfile

    rows: dict = {label: [] for label in trees}
    reports: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            for label, (tree, flags, threads) in trees.items():
                js = Path(tmp) / f"{label.replace(' ', '_')}-{rep}.json"
                env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=str(threads),
                           MKL_NUM_THREADS=str(threads))
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "stability", "analyze", str(ckpt), "--json", str(js),
                                       "--quiet", *flags], env=env, capture_output=True, text=True,
                                      cwd=tree)  # `python -m` puts the working directory first on the path
                wall = time.perf_counter() - t
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                if proc.returncode != 0:
                    raise SystemExit(f"{label}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
                report = json.loads(js.read_text())
                reports.setdefault(label, report)
                stages = {sp: report[sp]["timings"] for sp in report["splits"]}
                rows[label].append({"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime)
                                    + (after.ru_stime - before.ru_stime), "stages_s": stages,
                                    "load_avg": os.getloadavg()[0]})
                print(f"  {label}: {wall:.1f} s wall, {rows[label][-1]['cpu_s']:.1f} CPU s; stages "
                      + "; ".join(f"{sp} {sum(v.values()):.1f}" for sp, v in stages.items()), flush=True)
    first = next(iter(reports))
    same = {label: _numbers(r) == _numbers(reports[first]) for label, r in reports.items()}
    return {"runs": rows, "same_numbers_as_" + first.replace(" ", "_"): same,
            "differences_from_" + first.replace(" ", "_"): {
                label: _differences(_numbers(reports[first]), _numbers(r)) for label, r in reports.items()},
            "best_wall_s": {label: min(r["wall_s"] for r in v) for label, v in rows.items()}}


def _differences(a, b) -> dict:
    """Where two analysis JSONs differ: the largest relative difference of a float (and its path), the paths of
    other values that differ, and keys that only one of them has."""
    worst, other, only = [0.0, None], [], []

    def walk(x, y, path):
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                if (k in x) != (k in y):
                    only.append(f"{path}/{k}")
                else:
                    walk(x[k], y[k], f"{path}/{k}")
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for u, v in zip(x, y):
                walk(u, v, path + "[]")
        elif isinstance(x, float) and isinstance(y, float):
            if x != y:
                r = abs(x - y) / max(abs(x), abs(y), 1e-300)
                if r > worst[0]:
                    worst[:] = [r, path]
        elif x != y:
            other.append(path)

    walk(a, b, "")
    return {"max_rel_diff": worst[0], "at": worst[1], "other_values": sorted(set(other)),
            "keys_in_one_only": sorted(set(only))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default="runs/demo/prefix-sums.pt")
    p.add_argument("--crossover", action="store_true",
                   help="only time the dense ρ/σ_max route against Krylov at n = 128 … 2048 (sets DENSE_MAX)")
    p.add_argument("--before-tree", metavar="DIR", help="another checkout, alternated with this tree's code")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=str(HERE / "out" / "analyze-speed.json"))
    args = p.parse_args(argv)
    ckpt = ensure_checkpoint(Path(args.checkpoint)).resolve()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    from stability.atomic import write_text

    if args.crossover:
        import stability
        from stability.analysis.fixed_point import analysis_model

        model = analysis_model(stability.load(ckpt).model)
        torch.func.vjp(lambda a: a * 2, torch.ones(1, dtype=torch.float64))  # torch.func's one-time imports
        rows = bench_dense_crossover(model)
        out = {"checkpoint": str(ckpt), "torch": torch.__version__, "threads": torch.get_num_threads(),
               "load_avg": os.getloadavg(), "crossover": rows}
        write_text(args.json, json.dumps(out, indent=1))
        print(crossover_markdown(rows))
        print(f"\nload average at end: {out['load_avg']}")
        return 0
    here = HERE.parent
    trees = {}
    if args.before_tree:
        trees["before, 2 threads"] = (Path(args.before_tree).resolve(), [], 2)
    trees.update({"--workers 1, 2 threads": (here, ["--workers", "1"], 2),
                  "--workers 1, 1 thread": (here, ["--workers", "1"], 1),
                  "default (splits side by side)": (here, [], 2)})
    out = {"checkpoint": str(ckpt), "torch": torch.__version__, "cpu_count": os.cpu_count(),
           "load_avg_start": os.getloadavg(), **bench_processes(ckpt, trees, args.repeats),
           "load_avg_end": os.getloadavg()}
    write_text(args.json, json.dumps(out, indent=1))
    print("best wall: " + "; ".join(f"{k} {v:.1f} s" for k, v in out["best_wall_s"].items()))
    print(f"load average at start / end: {out['load_avg_start']} / {out['load_avg_end']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
