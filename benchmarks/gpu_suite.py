"""Every GPU check of the project in one call, each under its own time cap, written to one JSON file.

Checks (paper sizes on a GPU; ``--dry-run``: tiny sizes on the CPU, to test this script):

* ``train_throughput`` — samples/s of the paper's training configuration (width 256, 8 heads, MLP 1024,
  external recall, post-norm, batch 500, progressive loss T = 30 on 32-bit prefix sums) with fp32, bf16
  autocast, and bf16 + torch.compile (``benchmarks/train_throughput.py``'s measurement);
* ``prefix_sums_cell`` — the paper's prefix-sums cell (external recall, post-norm, lr 1e-4) trained for a few
  epochs: loss, val / hard accuracy, seconds per epoch (the full cell is 100 epochs: RESULTS.md);
* ``batched_rho`` — ρ(J*) for 500 sudoku-size states (81 × 256) in one batch, float32 products certified in
  float64 (``stability.numerics.spectral_radius``); goal ≤ 10 s;
* ``solvers`` — the fixed-point solvers (picard, anderson, broyden, auto) on the sudoku-size map, recall ×1.0:
  evaluations, statuses and time per evaluation relative to Picard's;
* ``full_analysis`` — the whole analysis as ``stability analyze`` runs it (every stage, geometry included) on 500
  samples of each of the paper's three task shapes at width 256: sudoku (9 × 9), chess (8 × 8) and prefix sums
  (32-bit and 512-bit strings), the models of ``benchmarks/analysis_scaling.py`` (the paper's architecture,
  untrained, W_x scaled by 0.5 so that plain iteration converges); seconds per stage; goal: sudoku ≤ 30 s.

A check that runs past its cap is stopped (SIGALRM) and recorded as ``timeout`` with what it had measured; an
exception is recorded as ``error`` with its message; the other checks still run. Usage:

    python benchmarks/gpu_suite.py [--out gpu-suite.json] [--device auto] [--dry-run] [--only CHECK]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# check -> (cap in seconds on the GPU, cap in a dry run)
CAPS = {"train_throughput": (240, 120), "prefix_sums_cell": (240, 120), "batched_rho": (120, 60),
        "solvers": (150, 90), "full_analysis": (300, 240)}


class CheckTimeout(Exception):
    pass


@contextmanager
def time_cap(seconds: float):
    """Raise CheckTimeout in the main thread after ``seconds`` (SIGALRM; where it is unavailable, no cap)."""
    if not hasattr(signal, "SIGALRM") or seconds <= 0:
        yield
        return

    def fire(signum, frame):
        raise CheckTimeout(f"time cap of {seconds:g} s reached")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def check_train_throughput(device, dry: bool, partial: dict) -> dict:
    from train_throughput import measure

    width, batch, steps, T, warm = (16, 4, 1, 3, 1) if dry else (256, 500, 10, 30, 3)
    variants = [("fp32", "sdpa", False, False), ("bf16", "sdpa", True, False), ("bf16+compile", "sdpa", True, True)]
    partial.update({"width": width, "batch": batch, "steps": steps, "iterations": T, "samples_per_s": {}})
    for label, impl, bf16, comp in variants:
        if dry and comp:
            partial["samples_per_s"][label] = None
            partial["skipped"] = {label: "dry run: compilation takes ~30 s on the CPU "
                                         "(tests/train/test_gpu_paths_on_cpu.py)"}
            continue
        partial["samples_per_s"][label] = measure(device, impl=impl, bf16=bf16, compile_=comp, steps=steps,
                                                  batch=batch, width=width, iterations=T, warmup=warm)
    base = partial["samples_per_s"]["fp32"]
    partial["ratio_vs_fp32"] = {k: (v / base if v else None) for k, v in partial["samples_per_s"].items()}
    return partial


def check_prefix_sums_cell(device, dry: bool, partial: dict) -> dict:
    from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
    from stability.train.loop import train

    if dry:
        task = TaskConfig(train_size=64, val_size=16, hard_size=8, train_length=8, hard_length=16)
        model = ModelConfig(recall="external", norm="post", width=16, heads=2)
        tr = TrainConfig(lr=1e-4, epochs=2, batch_size=32, iterations=4, eval_iterations=4, test_iterations=6,
                         warmup_epochs=1, device=device.type, bf16=False)
    else:
        task = TaskConfig()
        model = ModelConfig(recall="external", norm="post")
        tr = TrainConfig(lr=1e-4, epochs=3, device=str(device), test_iterations=100)
    cfg = RunConfig(model=model, task=task, train=tr)
    out = Path(tempfile.mkdtemp(prefix="gpu-suite-")) / "cell.pt"
    t = time.perf_counter()
    res = train(cfg, out, progress=False)
    partial.update({"epochs": res.epochs, "seconds": time.perf_counter() - t,
                    "loss": [h["loss"] for h in res.history],
                    "seconds_per_epoch": [h["seconds"] for h in res.history],
                    "val_accuracy_last": res.final["val"]["accuracy"][-1],
                    "hard_accuracy_last": res.final["hard"]["accuracy"][-1],
                    "test_iterations": tr.test_iterations})
    return partial


def _sudoku(width: int, scale: float, device, n: int):
    from analysis_benchmarks import sudoku_inputs, sudoku_model

    m = sudoku_model(width, recall_scale=scale).to(device)
    fast = sudoku_model(width, recall_scale=scale).float().to(device)
    x0 = m.embed(sudoku_inputs(n).to(device))
    return m, fast, x0


def check_batched_rho(device, dry: bool, partial: dict) -> dict:
    from stability.numerics import Linearisation, spectral_radius
    from stability.solvers import solve

    width, n = (16, 2) if dry else (256, 500)
    m, fast, x0 = _sudoku(width, 0.5, device, n)
    sol = solve(m.step, x0, x0, method="anderson", tol=1e-8, max_iter=400, certify_rho=False)
    partial.update({"width": width, "samples": n, "fixed_points_converged": int(sol.converged.sum())})
    _sync(device)
    t = time.perf_counter()
    spec = spectral_radius(Linearisation(m.step, sol.x_best, x0), tol=1e-6, k=3,
                           fast=Linearisation(fast.step, sol.x_best.float(), x0.float()))
    _sync(device)
    secs = time.perf_counter() - t
    rho = spec.rho.double().cpu()
    partial.update({"seconds": secs, "goal_s": 10.0, "met": secs <= 10.0, "products": int(spec.matvecs),
                    "rho_median": float(rho.median()), "rho_max": float(rho.max()),
                    "ritz_residual_max": float(spec.ritz_residual.double().max())})
    return partial


def check_solvers(device, dry: bool, partial: dict) -> dict:
    from stability.solvers import AUTO, solve

    width, n, max_iter = (16, 2, 60) if dry else (256, 8, 300)
    m, _, x0 = _sudoku(width, 1.0, device, n)
    partial.update({"width": width, "samples": n, "tol": 1e-6, "max_iter": max_iter, "auto": AUTO, "solvers": {}})
    for method in ("picard", "anderson", "broyden", "auto"):
        _sync(device)
        t = time.perf_counter()
        r = solve(m.step, x0, x0, method=method, tol=1e-6, max_iter=max_iter, certify_rho=False)
        _sync(device)
        secs = time.perf_counter() - t
        partial["solvers"][method] = {"nfe_median": float(r.nfe.double().median()), "seconds": secs,
                                      "s_per_eval": secs / max(int(r.nfe.sum()), 1),
                                      "status_counts": r.status_counts()}
    pic = partial["solvers"]["picard"]["s_per_eval"]
    for row in partial["solvers"].values():
        row["time_per_eval_vs_picard"] = row["s_per_eval"] / pic
    return partial


#: the full analysis' task shapes: name -> (task, width, positions); a dry run takes width 16 and 2 samples
FULL_ANALYSIS = {"sudoku": ("sudoku", 256, (9, 9)), "chess": ("chess", 256, (8, 8)),
                 "prefix-sums-32": ("prefix-sums", 256, (32,)), "prefix-sums-512": ("prefix-sums", 256, (512,))}


def check_full_analysis(device, dry: bool, partial: dict) -> dict:
    import stability
    from analysis_scaling import build

    from stability import AnalysisOptions
    from stability.analysis.options import STAGES

    samples = 2 if dry else 500
    partial.update({"samples": samples, "goal_s": 30.0, "tasks": {}})
    for name, (task, width, positions) in FULL_ANALYSIS.items():
        if dry:
            width, positions = 16, tuple(min(p, 4) for p in positions)
        model, inputs = build(task, width, positions, 0.5, samples)
        # every sample in every stage (few_samples 0): the large-state mode is for the CPU's cost; here the batch
        # of 500 is the point
        options = AnalysisOptions(samples=samples, device=device.type, stages=STAGES, few_samples=0)
        _sync(device)
        t = time.perf_counter()
        report = stability.analyze(model.to(device), inputs.to(device), options=options).to_json()["inputs"]
        _sync(device)
        row = {"width": width, "positions": list(positions), "seconds": time.perf_counter() - t,
               "stages_s": report["timings"], "converged_fraction": report["fixed_point"]["converged_fraction"],
               "nfe_median": report["fixed_point"]["nfe_median"],
               "rho_median": (report.get("jacobian") or {}).get("spectral_radius_median")}
        partial["tasks"][name] = row
        print(f"  full_analysis {name}: {row['seconds']:.1f} s", flush=True)
    partial["met"] = partial["tasks"]["sudoku"]["seconds"] <= partial["goal_s"]
    return partial


CHECKS = {"train_throughput": check_train_throughput, "prefix_sums_cell": check_prefix_sums_cell,
          "batched_rho": check_batched_rho, "solvers": check_solvers, "full_analysis": check_full_analysis}


def _clean(v):
    """JSON-safe: non-finite floats become None."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def run_suite(*, device: str = "auto", dry_run: bool = False, only=None, caps=None) -> dict:
    from stability.train.loop import resolve_device

    dev = torch.device("cpu") if dry_run else resolve_device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    out = {"device": name, "dry_run": dry_run, "torch": torch.__version__,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "checks": {}}
    for check, fn in CHECKS.items():
        if only and check not in only:
            continue
        cap = (caps or {}).get(check) or CAPS[check][1 if dry_run else 0]
        partial: dict = {}
        t = time.perf_counter()
        status, err = "ok", None
        try:
            with time_cap(cap):
                fn(dev, dry_run, partial)
        except CheckTimeout as exc:
            status, err = "timeout", str(exc)
        except Exception as exc:  # recorded, and the next check runs
            status, err = "error", f"{type(exc).__name__}: {exc}"
            partial["traceback"] = traceback.format_exc(limit=4)
        out["checks"][check] = {"status": status, "cap_s": cap, "seconds": time.perf_counter() - t,
                                "error": err, "result": _clean(partial)}
        print(f"{check}: {status} in {out['checks'][check]['seconds']:.1f} s (cap {cap} s)"
              + (f": {err}" if err else ""), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu-suite.json", help="the JSON file to write (gpu-suite.json)")
    ap.add_argument("--device", default="auto", help="auto, cuda or cuda:N (ignored with --dry-run)")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (tests the script)")
    ap.add_argument("--only", action="append", choices=list(CHECKS), help="run only this check (repeatable)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    result = run_suite(device=args.device, dry_run=args.dry_run, only=args.only)
    from stability.atomic import write_text

    write_text(out, json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
