"""Every GPU check of the project in one call, each under its own time cap, written to one JSON file.

Checks, in the order they run (paper sizes on a GPU; ``--dry-run``: tiny sizes on the CPU, to test this script):

* ``batched_rho`` — ρ(J*) for 500 sudoku-size states (81 × 256) in one batch, float32 products certified in
  float64 (``stability.numerics.spectral_radius``); goal ≤ 3 s (issue 35);
* ``solvers`` — the fixed-point solvers (picard, anderson, broyden, auto) on the sudoku-size map, recall ×1.0:
  evaluations, statuses and time per evaluation relative to Picard's;
* ``full_analysis`` — the whole analysis as ``stability analyze`` runs it (every stage, geometry included) on 500
  samples of each of the paper's three task shapes at width 256: sudoku (9 × 9), chess (8 × 8) and prefix sums
  (32-bit and 512-bit strings), the models of ``benchmarks/analysis_scaling.py`` (the paper's architecture,
  untrained, W_x scaled by 0.5 so that plain iteration converges); seconds per stage, every stage batched over
  the samples (``batch="all"``); goal: sudoku ≤ 15 s (issue 35);
* ``train_throughput`` — samples/s of the paper's training configuration (width 256, 8 heads, MLP 1024,
  external recall, post-norm, batch 500, progressive loss T = 30 on 32-bit prefix sums) with fp32, bf16
  autocast, bf16 + torch.compile (``benchmarks/train_throughput.py``'s measurement), and an ensemble of 8 members
  in the fixed-shape step, bf16, compiled (CUDA graphs; ``--ensemble-step fixed --compile``), its samples/s all
  members' samples; every variant's achieved TFLOP/s (the matrix FLOPs of one sample's step through all T
  iterations, counted) against the device's bf16 matrix rate (a timed square product);
* ``prefix_sums_cell`` — the paper's prefix-sums cell (external recall, post-norm, lr 1e-4) trained for a few
  epochs: loss, val / hard accuracy, seconds per epoch (the full cell is 100 epochs: RESULTS.md).

The suite fits a lease of ``--budget`` seconds (480): everything it imports is imported, and the device warmed up
(its linear-algebra libraries loaded), before the first cap starts, and the checks run in :data:`SHARES`' order,
each capped at its share of what is left of the budget (time one check does not use goes to the later ones).
Inside its cap a check sizes its work: the full analysis and the training variants forecast each next part from
the parts done and skip (recorded, with the forecast) what would not fit. A check that runs past its cap is
stopped (SIGALRM; never inside an import: the cap waits for the import to finish) and recorded as ``timeout``
with what it had measured; an exception is recorded as ``error`` with its message; the other checks still run.
The JSON is written after every check. Every analysis it runs gives its seconds per stage (``stages_s``).
Usage:

    python benchmarks/gpu_suite.py [--budget 480] [--out gpu-suite.json] [--device auto] [--dry-run] [--only CHECK]
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import pkgutil
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

from analysis_benchmarks import sudoku_inputs, sudoku_model  # noqa: E402  (benchmarks/, on the path above)
from analysis_scaling import build  # noqa: E402
from train_throughput import flops_per_sample, measure, measure_ensemble  # noqa: E402

import stability  # noqa: E402
from stability import AnalysisOptions  # noqa: E402
from stability.analysis.options import STAGES  # noqa: E402
from stability.atomic import write_text  # noqa: E402
from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig  # noqa: E402
from stability.numerics import Linearisation, spectral_radius  # noqa: E402
from stability.solvers import AUTO, solve  # noqa: E402
from stability.train.loop import resolve_device, train  # noqa: E402

#: the checks in the order they run, with their shares of the budget: a check's cap is what is left of the budget
#: (less :data:`RESERVE_S`) times its share over the shares of the selected checks still to run
SHARES = {"batched_rho": 1.0, "solvers": 0.5, "full_analysis": 4.0, "train_throughput": 1.5,
          "prefix_sums_cell": 1.5}
#: seconds of the budget kept for the JSON writes between checks and the last one
RESERVE_S = 2.0
#: the budget by default: one lease of 8 minutes
BUDGET_S = 480.0


class CheckTimeout(Exception):
    pass


def importing() -> bool:
    """Whether a module is being imported now: importlib marks its spec ``_initializing`` while its body runs."""
    for mod in list(sys.modules.values()):
        spec = getattr(mod, "__dict__", {}).get("__spec__")
        if spec is not None and getattr(spec, "_initializing", False):
            return True
    return False


@contextmanager
def time_cap(seconds: float):
    """Raise CheckTimeout in the main thread after ``seconds`` (SIGALRM; where it is unavailable, no cap). Never
    inside an import (a half-imported module, e.g. ``torch._dynamo``, would break every later check): while one
    runs, the cap looks again every 50 ms."""
    if not hasattr(signal, "SIGALRM") or seconds <= 0:
        yield
        return

    def fire(signum, frame):
        if importing():
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            return
        raise CheckTimeout(f"time cap of {seconds:g} s reached")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Lease:
    """The check's clock: ``left()`` seconds of its cap, and what the checks before it measured (``done``)."""

    def __init__(self, cap: float, done: dict):
        self.cap, self.done, self.start = cap, done, time.perf_counter()

    def left(self) -> float:
        return self.cap - (time.perf_counter() - self.start)


def preload(device) -> float:
    """Import everything the checks import and warm the device up (its BLAS, solver and eigen libraries load on
    first use), before any cap starts; the seconds it took."""
    t = time.perf_counter()
    import scipy.linalg  # noqa: F401  (the lazy imports of the checks' code, here, before any cap)
    import torch._dynamo  # noqa: F401  (torch.compile's front end)

    for pkg in ("stability.analysis", "stability.numerics", "stability.model", "stability.tasks", "stability.train"):
        for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
            importlib.import_module(info.name)
    if device.type == "cuda":
        import torch._inductor.compile_fx  # noqa: F401  (torch.compile's back end)
    a = torch.randn(8, 6, 6, dtype=torch.float64, device=device)
    torch.linalg.eig(a), torch.linalg.qr(a), torch.linalg.solve(a + 6 * torch.eye(6, device=device), a[..., :1])
    (a.float() @ a.float()).sum().item()
    return time.perf_counter() - t


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def check_train_throughput(device, dry: bool, partial: dict, lease: Lease) -> dict:
    width, batch, steps, T, warm = (16, 4, 1, 3, 1) if dry else (256, 500, 10, 30, 3)
    variants = [("fp32", "sdpa", False, False), ("bf16", "sdpa", True, False), ("bf16+compile", "sdpa", True, True)]
    partial.update({"width": width, "batch": batch, "steps": steps, "iterations": T, "samples_per_s": {},
                    "skipped": {}})
    first = None
    for label, impl, bf16, comp in variants:
        if dry and comp:
            partial["samples_per_s"][label] = None
            partial["skipped"][label] = ("dry run: compilation takes ~30 s on the CPU "
                                         "(tests/train/test_gpu_paths_on_cpu.py)")
            continue
        # the next variant's forecast: the first one's time (compiling: 60 s more)
        need = None if first is None else first + (60.0 if comp else 0.0)
        if need is not None and need > lease.left():
            partial["samples_per_s"][label] = None
            partial["skipped"][label] = f"budget: about {need:.0f} s, {lease.left():.0f} s left"
            continue
        t = time.perf_counter()
        partial["samples_per_s"][label] = measure(device, impl=impl, bf16=bf16, compile_=comp, steps=steps,
                                                  batch=batch, width=width, iterations=T, warmup=warm)
        first = time.perf_counter() - t if first is None else first
    _ensemble_variant(device, dry, partial, lease, first)
    base = partial["samples_per_s"]["fp32"]
    partial["ratio_vs_fp32"] = {k: (v / base if v else None) for k, v in partial["samples_per_s"].items()}
    _tflops(device, dry, partial)
    return partial


#: the ensemble variant of ``train_throughput``: members of the fixed-shape step, compiled (CUDA graphs on CUDA)
ENSEMBLE_MEMBERS = 8
ENSEMBLE_LABEL = f"ensemble{ENSEMBLE_MEMBERS} bf16+fixed+compile"


def _ensemble_variant(device, dry: bool, partial: dict, lease: Lease, first) -> None:
    """samples/s (all members' samples) of an ensemble of :data:`ENSEMBLE_MEMBERS` in the fixed step, bf16,
    compiled (``train_throughput.measure_ensemble``); a dry run: 2 members, uncompiled (the same code path but
    torch.compile, whose CPU compilation tests/train/test_fixed_step.py covers)."""
    label, members = ENSEMBLE_LABEL, 2 if dry else ENSEMBLE_MEMBERS
    need = None if first is None else members * first + (120.0 if not dry else 0.0)
    if need is not None and need > lease.left():
        partial["samples_per_s"][label] = None
        partial["skipped"][label] = f"budget: about {need:.0f} s, {lease.left():.0f} s left"
        return
    partial["ensemble"] = {"members": members, "step": "fixed", "compiled": not dry, "bf16": not dry}
    partial["samples_per_s"][label] = measure_ensemble(
        device, members=members, bf16=not dry, compile_=not dry, steps=partial["steps"], batch=partial["batch"],
        width=partial["width"], iterations=partial["iterations"], warmup=1 if dry else 3)


def _tflops(device, dry: bool, partial: dict) -> None:
    """Achieved TFLOP/s of every variant: samples/s × the matrix FLOPs of one sample's step through all T
    iterations (``train_throughput.flops_per_sample``: the fixed step's executed work, the issue's convention for
    the solo ones), and the device's bf16 matrix rate (a square bf16 product, timed) they are a fraction of."""
    flops = flops_per_sample(device, width=partial["width"], iterations=partial["iterations"])
    n = 256 if dry else 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    (a @ a).sum().item()
    _sync(device)
    reps, t = 3 if dry else 20, time.perf_counter()
    for _ in range(reps):
        a @ a
    _sync(device)
    peak = reps * 2 * n ** 3 / (time.perf_counter() - t) / 1e12
    partial["flops_per_sample"] = flops
    partial["bf16_matrix_tflops"] = peak
    partial["tflops"] = {k: (v * flops / 1e12 if v else None) for k, v in partial["samples_per_s"].items()}
    partial["fraction_of_bf16_matrix_rate"] = {k: (v / peak if v else None) for k, v in partial["tflops"].items()}


def check_prefix_sums_cell(device, dry: bool, partial: dict, lease: Lease) -> dict:
    if dry:
        task = TaskConfig(train_size=64, val_size=16, hard_size=8, train_length=8, hard_length=16)
        model = ModelConfig(recall="external", norm="post", width=16, heads=2)
        epochs = 2
    else:
        task, model = TaskConfig(), ModelConfig(recall="external", norm="post")
        # an epoch's forecast from the measured throughput (half as much again for the evaluation): as many of 3
        # epochs as fit in 80 % of the cap
        sps = ((lease.done.get("train_throughput") or {}).get("samples_per_s") or {}).get("fp32")
        per_epoch = 1.5 * task.train_size / sps if sps else None
        epochs = max(1, min(3, int(0.8 * lease.left() / per_epoch))) if per_epoch else 1
        partial["epoch_forecast_s"] = per_epoch
    tr = (TrainConfig(lr=1e-4, epochs=epochs, batch_size=32, iterations=4, eval_iterations=4, test_iterations=6,
                      warmup_epochs=1, device=device.type, bf16=False) if dry
          else TrainConfig(lr=1e-4, epochs=epochs, device=str(device), test_iterations=100))
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
    m = sudoku_model(width, recall_scale=scale).to(device)
    fast = sudoku_model(width, recall_scale=scale).float().to(device)
    x0 = m.embed(sudoku_inputs(n).to(device))
    return m, fast, x0


def check_batched_rho(device, dry: bool, partial: dict, lease: Lease) -> dict:
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
    partial.update({"seconds": secs, "stages_s": {"rho": secs}, "goal_s": 3.0, "met": secs <= 3.0,
                    "products": int(spec.matvecs),
                    "rho_median": float(rho.median()), "rho_max": float(rho.max()),
                    "ritz_residual_max": float(spec.ritz_residual.double().max())})
    return partial


def check_solvers(device, dry: bool, partial: dict, lease: Lease) -> dict:
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


def check_full_analysis(device, dry: bool, partial: dict, lease: Lease) -> dict:
    samples = 2 if dry else 500
    partial.update({"samples": samples, "goal_s": 15.0, "batch": "all", "tasks": {}, "skipped": {}})
    first = None  # (seconds, n) of the first task: the next ones' forecast is linear in the state size n
    for name, (task, width, positions) in FULL_ANALYSIS.items():
        if dry:
            width, positions = 16, tuple(min(p, 4) for p in positions)
        n = width * math.prod(positions)
        need = None if first is None else first[0] * n / first[1]
        if need is not None and need > lease.left():
            partial["skipped"][name] = f"budget: about {need:.0f} s, {lease.left():.0f} s left"
            continue
        model, inputs = build(task, width, positions, 0.5, samples)
        # every sample in every stage (few_samples 0): the large-state mode is for the CPU's cost; here the batch
        # of 500 is the point, with every stage batched over the samples (batch "all": the GPU's path)
        options = AnalysisOptions(samples=samples, device=device.type, stages=STAGES, few_samples=0, batch="all")
        _sync(device)
        t = time.perf_counter()
        report = stability.analyze(model.to(device), inputs.to(device), options=options).to_json()["inputs"]
        _sync(device)
        row = {"width": width, "positions": list(positions), "seconds": time.perf_counter() - t,
               "forecast_s": need, "stages_s": report["timings"],
               "converged_fraction": report["fixed_point"]["converged_fraction"],
               "nfe_median": report["fixed_point"]["nfe_median"],
               "rho_median": (report.get("jacobian") or {}).get("spectral_radius_median")}
        first = first or (row["seconds"], n)
        partial["tasks"][name] = row
        print(f"  full_analysis {name}: {row['seconds']:.1f} s", flush=True)
    partial["met"] = partial["tasks"]["sudoku"]["seconds"] <= partial["goal_s"]
    return partial


CHECKS = {"batched_rho": check_batched_rho, "solvers": check_solvers, "full_analysis": check_full_analysis,
          "train_throughput": check_train_throughput, "prefix_sums_cell": check_prefix_sums_cell}


def _clean(v):
    """JSON-safe: non-finite floats become None."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def plan_cap(left: float, check: str, todo: list, caps=None) -> float:
    """The cap of ``check``: ``caps[check]`` where given, else its share of ``left`` seconds among the ``todo``
    checks (itself included) by :data:`SHARES`."""
    if caps and caps.get(check):
        return min(caps[check], left)
    shares = {c: SHARES.get(c, 1.0) for c in todo}
    return max(0.0, left) * shares[check] / sum(shares.values())


def run_suite(*, device: str = "auto", dry_run: bool = False, only=None, caps=None, budget: float = BUDGET_S,
              out: Path | None = None) -> dict:
    """Every check of :data:`CHECKS` (or ``only``) inside ``budget`` seconds, the JSON written to ``out`` (when
    given) after each."""
    start = time.perf_counter()
    dev = torch.device("cpu") if dry_run else resolve_device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    res = {"device": name, "dry_run": dry_run, "torch": torch.__version__, "budget_s": budget,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "preload_s": preload(dev), "checks": {}}
    todo = [c for c in CHECKS if not only or c in only]
    for i, check in enumerate(todo):
        t = time.perf_counter()
        cap = plan_cap(budget - (t - start) - RESERVE_S, check, todo[i:], caps)
        partial: dict = {}
        status, err = "ok", None
        try:
            if cap <= 0:
                raise CheckTimeout("no budget left")
            with time_cap(cap):
                CHECKS[check](dev, dry_run, partial, Lease(cap, {c: r["result"] for c, r in res["checks"].items()}))
        except CheckTimeout as exc:
            status, err = "timeout", str(exc)
        except Exception as exc:  # recorded, and the next check runs
            status, err = "error", f"{type(exc).__name__}: {exc}"
            partial["traceback"] = traceback.format_exc(limit=4)
        res["checks"][check] = {"status": status, "cap_s": cap, "at_s": t - start, "seconds": time.perf_counter() - t,
                                "error": err, "result": _clean(partial)}
        res["seconds"] = time.perf_counter() - start
        if out is not None:
            write_text(out, json.dumps(res, indent=1) + "\n")
        print(f"{check}: {status} in {res['checks'][check]['seconds']:.1f} s (cap {cap:.0f} s)"
              + (f": {err}" if err else ""), flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu-suite.json", help="the JSON file to write (gpu-suite.json)")
    ap.add_argument("--device", default="auto", help="auto, cuda or cuda:N (ignored with --dry-run)")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (tests the script)")
    ap.add_argument("--only", action="append", choices=list(CHECKS), help="run only this check (repeatable)")
    ap.add_argument("--budget", type=float, default=BUDGET_S,
                    help=f"seconds the whole suite may take, imports included ({BUDGET_S:g})")
    args = ap.parse_args(argv)
    if args.budget <= RESERVE_S:
        ap.error(f"--budget: {args.budget:g} s leaves no time for a check (more than {RESERVE_S:g} s)")
    out = Path(args.out)
    run_suite(device=args.device, dry_run=args.dry_run, only=args.only, budget=args.budget, out=out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
