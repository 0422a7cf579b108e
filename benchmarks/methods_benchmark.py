"""The training methods side by side on a small prefix-sums model trained on the CPU.

Each method trains the same architecture on the same data with the same budget of epochs, and the checkpoint
is then measured the same way:

* accuracy: whole-answer accuracy on val (``train_length`` bits) and hard (``hard_length`` bits) after
  ``test_iterations`` iterations of the loop map (the trainer's final evaluation), and the best over 1…T;
* ρ(J*): median over ``probes`` val samples of the spectral radius of J = ∂f/∂x at the fixed point (Anderson
  to 1e-6, then ARPACK on the matrix-free Jacobian: ``stability.analysis``);
* function evaluations to the fixed point (relative L∞ residual < ``tol``) with Picard and with Anderson
  iteration (``stability.solvers.solve``) on the val split: median evaluations and converged fraction;
* training time per epoch (wall seconds, mean over the epochs).

    python benchmarks/methods_benchmark.py [--epochs 6] [--width 32] [--out benchmarks/results-methods.md]

Runs single-threaded by default so that the times compare on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import stability
from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from stability.solvers import solve
from stability.train.loop import train

#: name -> (model options, train options): the rows of the table
FPRM_BLOCK = {"norm": "pre", "residual_scale": 0.5, "conv": 3}
VARIANTS = {
    "progressive": ({}, {"method": "progressive"}),
    "progressive + FPRM block": (FPRM_BLOCK, {"method": "progressive"}),
    "deep supervision (k = T_sup = 5)": ({}, {"method": "deep-supervision", "bptt_steps": 5}),
    "deep supervision + FPRM block": (FPRM_BLOCK, {"method": "deep-supervision", "bptt_steps": 5}),
    "implicit, GMRES": ({}, {"method": "implicit", "implicit_backward": "krylov"}),
    "implicit, Neumann": ({}, {"method": "implicit", "implicit_backward": "neumann"}),
    "implicit, one-step (JFB)": ({}, {"method": "implicit", "implicit_backward": "one-step"}),
    "implicit, GMRES + Jacobian reg. 0.1": ({}, {"method": "implicit", "implicit_backward": "krylov", "jac_reg": 0.1}),
    "implicit, GMRES + FPRM block": (FPRM_BLOCK, {"method": "implicit", "implicit_backward": "krylov"}),
}


def measure(path: Path, probes: int, tol: float, max_iter: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the per-sample scipy references
    from reference_numerics import JacobianOperator
    from reference_numerics import arpack_rho as spectral_radius

    run = stability.load(path)
    model = run.model
    inputs, _ = run.task.dataset("val")
    out = {}
    with torch.no_grad():
        x0 = model.embed(inputs)
        e = model.initial_state(x0)
        for method in ("picard", "anderson"):
            sol = solve(model.step, e, x0, method=method, tol=tol, max_iter=max_iter, max_period=0,
                        certify_rho=False)
            conv = sol.converged
            out[f"nfe_{method}"] = float(sol.nfe[conv].double().median()) if conv.any() else float("nan")
            out[f"converged_{method}"] = float(conv.double().mean())
        fine = solve(model.step, e[:probes], x0[:probes], method="anderson",
                     tol=1e-6, max_iter=max_iter, max_period=0, certify_rho=False)
    rhos = [spectral_radius(JacobianOperator(model.step, fine.x_best[b], x0[b]), k=3, tol=1e-6).rho
            for b in range(probes)]
    out["rho"] = statistics.median(rhos)
    final = run.final
    for split in ("val", "hard"):
        acc = final[split]["accuracy"]
        out[f"acc_{split}"] = acc[-1]
        out[f"best_{split}"] = max(acc)
    secs = [h["seconds"] for h in run.history]
    out["epoch_s"] = sum(secs) / len(secs)
    out["steps"] = run.history[-1]["step"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--train-size", type=int, default=2000)
    p.add_argument("--train-length", type=int, default=12)  # 2,000 + 200 distinct strings need >= 12 bits
    p.add_argument("--hard-length", type=int, default=16)
    p.add_argument("--iterations", type=int, default=20, help="T: every method's cap on the loop in training")
    p.add_argument("--test-iterations", type=int, default=60)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--probes", type=int, default=6, help="val samples for ρ(J*)")
    p.add_argument("--tol", type=float, default=1e-4, help="fixed-point tolerance for the evaluation counts")
    p.add_argument("--max-iter", type=int, default=500)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", nargs="*", help="names (substrings) of the variants to run")
    p.add_argument("--out", default=str(Path(__file__).with_name("results-methods.md")))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    task = TaskConfig(train_size=args.train_size, val_size=200, hard_size=200, train_length=args.train_length,
                      hard_length=args.hard_length)
    base_model = dict(recall="external", norm="post", width=args.width, heads=4)
    base_train = dict(lr=args.lr, epochs=args.epochs, batch_size=100, iterations=args.iterations, warmup_epochs=2,
                      cooldown_at=0.75, device="cpu", test_iterations=args.test_iterations, eval_batch_size=200)
    rows = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name, (m_opts, t_opts) in VARIANTS.items():
            if args.only and not any(s in name for s in args.only):
                continue
            cfg = RunConfig(model=ModelConfig(**{**base_model, **m_opts}), task=task,
                            train=TrainConfig(**base_train, method={"name": t_opts["method"], **{k: v for k, v in t_opts.items() if k != "method"}}))
            path = Path(tmp) / f"{len(rows)}.pt"
            t0 = time.perf_counter()
            train(cfg, path, progress=False)
            res = measure(path, args.probes, args.tol, args.max_iter)
            res["name"] = name
            rows.append(res)
            print(f"{name}: {res} ({time.perf_counter() - t0:.0f} s)", flush=True)

    head = ("| method | val acc (T={T}) | hard acc (T={T}) | best val / hard | ρ(J*) median | Picard nfe "
            "(conv.) | Anderson nfe (conv.) | s / epoch | optimizer steps |")
    lines = [
        "# Training methods side by side (CPU)",
        "",
        f"`python benchmarks/methods_benchmark.py --epochs {args.epochs} --width {args.width}` on "
        f"{torch.get_num_threads()} CPU thread(s), torch {torch.__version__}; total {time.perf_counter() - t_all:.0f} s.",
        "",
        f"Prefix sums: train {args.train_size} × {args.train_length} bits, val 200 × {args.train_length} bits, hard "
        f"200 × {args.hard_length} bits. Model: width {args.width}, 4 heads, external recall, post-norm (the \"FPRM block\" rows: "
        f"pre-norm, residual scale β = 0.5, depth-wise conv k = 3). AdamW lr {args.lr}, batch 100, "
        f"{args.epochs} epochs (warm-up 2, ×0.1 after 75 %), every method capped at T = {args.iterations} iterations in training "
        "(progressive: n + k ≤ T; deep supervision: until r < 0.1 or T; implicit: Anderson to 1e-3 within T "
        "evaluations). Accuracy: whole answer after T_test iterations of the loop map. ρ(J*): median over "
        f"{args.probes} val samples at x* (Anderson to 1e-6, ARPACK). nfe: median evaluations of f to relative "
        f"residual < {args.tol:g} over the converged val samples (max {args.max_iter}), converged fraction in "
        "brackets.",
        "",
        head.format(T=args.test_iterations),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {r['acc_val']:.3f} | {r['acc_hard']:.3f} | {r['best_val']:.3f} / "
                     f"{r['best_hard']:.3f} | {r['rho']:.3f} | {r['nfe_picard']:.0f} ({r['converged_picard']:.2f}) | "
                     f"{r['nfe_anderson']:.0f} ({r['converged_anderson']:.2f}) | {r['epoch_s']:.1f} | {r['steps']} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
