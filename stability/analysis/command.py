"""``stability analyze CKPT``: are the checkpoint's fixed points reachable, input-dependent, well-conditioned?

Finds x* per sample (Picard by default: reachability is about plain iteration), then reports ρ(J*), σ_max,
Prop. 4's ρ(M) checked against autograd, ρ(W_x), the Prop. 5 check, ‖dx*/dx0‖_F, the A.8 independence of e, and
accuracy against iteration (Sections 4–5, App. A). See docs/analysis.md.
"""

from __future__ import annotations

import argparse
import sys

from stability.cli import positive_float, positive_int

HELP = "analyse a checkpoint's fixed points: reachability, spectra (Props. 3-4), input-gradients (Prop. 5), accuracy"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", metavar="CKPT", help="a checkpoint written by `stability train`, or one of the "
                   "paper's release checkpoints (RUN_DIR/model_best.pth)")
    p.add_argument("--release-config", metavar="PATH", help="a release checkpoint's Hydra config, where it is not "
                   "RUN_DIR/.hydra/config.yaml (README: Release checkpoints and semantics)")
    p.add_argument("--split", choices=["val", "hard", "both"], default="both", help="which split(s) (both)")
    p.add_argument("--samples", type=positive_int, default=32, metavar="N",
                   help="analyse the first N samples of each split, in the task's order (32)")
    p.add_argument("--solver", choices=["picard", "anderson"], default="picard",
                   help="fixed-point solver (picard: plain iteration, the reachability the paper means)")
    p.add_argument("--tol", type=positive_float, default=1e-5, metavar="F",
                   help="relative L∞ residual τ for convergence (1e-5)")
    p.add_argument("--max-iter", type=positive_int, default=500, metavar="N", help="solver iterations (500)")
    p.add_argument("--iterations", type=positive_int, default=500, metavar="T",
                   help="accuracy is measured at iterations 1..T (500)")
    p.add_argument("--probes", type=positive_int, default=4, metavar="K",
                   help="random probes of the ‖dx*/dx0‖_F estimate (4)")
    p.add_argument("--eig-route", choices=["arnoldi", "arpack"], default="arnoldi",
                   help="ρ(J*) and σ_max by the torch Krylov–Schur iteration (arnoldi: batched, GPU-capable) or "
                        "by scipy's ARPACK per sample (arpack) (arnoldi)")
    p.add_argument("--eig-precision", choices=["mixed", "float64"], default="mixed",
                   help="products of the ρ(J*) eigensolver: mixed (float32, every result certified by a float64 "
                        "residual and re-solved in float64 where it misses) or float64 (mixed)")
    p.add_argument("--json", metavar="PATH", help="write the full results as JSON")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots (residuals, eigenvalues, accuracy, Prop. 5)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to compute (cpu)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from stability.analysis.pipeline import AnalysisOptions, analyze_checkpoint
    from stability.analysis.report import text_report, write_json, write_plots

    splits = ("val", "hard") if args.split == "both" else (args.split,)
    options = AnalysisOptions(samples=args.samples, solver=args.solver, tol=args.tol, max_iter=args.max_iter,
                              iterations=args.iterations, device=args.device, probes=args.probes,
                              eig_route=args.eig_route, eig_precision=args.eig_precision)
    log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    report = analyze_checkpoint(Path(args.checkpoint), splits=splits, options=options, log=log,
                                release_config=args.release_config)
    print(text_report(report), end="")
    if args.json:
        write_json(report, Path(args.json))
        print(f"json: {args.json}")
    if args.plots:
        for path in write_plots(report, Path(args.plots)):
            print(f"plot: {path}")
    return 0
