"""Residual-based halting at inference (Fixed-Point Reasoners, App. C and App. E), and ``stability halt``.

Each sample is iterated x_{t+1} = step(x_t, x0) from e and stops, on its own, at the first iteration t at which
its relative L∞ residual

    r_t = ‖x_t − x_{t−1}‖∞ / (‖x_t‖∞ + ε)

falls below τ (the FPRM criterion, ``stability.solvers.residual``); the others go on until the budget T. A
stopped sample costs no further evaluations of f, so the compute used is Σ_b t_b against N·T for the fixed
budget. The answer is read out at the iterate where the sample stopped. :func:`halting_report` sets accuracy
against compute for several τ beside the fixed budget (App. E: accuracy stops improving where the residual
plateaus). With damping η < 1 the iterates are those of the damped map, as in training.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from stability.atomic import check_writable, write_text
from stability.cli import positive_float
from stability.errors import StabilityError
from stability.protocols import is_looped

if TYPE_CHECKING:  # torch is imported where it is used, so that the command line starts fast
    import torch

HELP = "residual-based halting at inference: accuracy against compute for halting tolerances τ"


@dataclass
class HaltResult:
    """Per sample (B,): ``iterations`` t_b spent, ``halted`` (r < τ reached within the budget), ``residual`` the
    last r; ``x`` (B, *S) the state each sample stopped at and ``logits`` its readout."""

    x: torch.Tensor
    logits: torch.Tensor
    iterations: torch.Tensor
    halted: torch.Tensor
    residual: torch.Tensor
    tol: float
    max_iter: int


def halt(model, inputs: torch.Tensor, *, tol: float = 0.1, max_iter: int = 100, eps: float = 1e-8) -> HaltResult:
    """Iterate each sample until r_t < ``tol`` (it halts) or ``max_iter`` iterations; only the samples still
    running are passed to ``step``."""
    import torch

    if not hasattr(model, "step"):
        raise StabilityError("a fixed-depth baseline has no loop map: there is nothing to halt")
    with torch.no_grad():
        return _halt(model, inputs, tol, max_iter, eps)


def _halt(model, inputs, tol, max_iter, eps) -> HaltResult:
    import torch

    from stability.solvers import residual

    x0 = model.embed(inputs)
    x = model.initial_state(x0).clone()
    B = x.shape[0]
    iterations = torch.zeros(B, dtype=torch.long, device=x.device)
    halted = torch.zeros(B, dtype=torch.bool, device=x.device)
    last_r = torch.full((B,), math.inf, dtype=x.dtype, device=x.device)
    active = torch.arange(B, device=x.device)
    for _ in range(max_iter):
        if active.numel() == 0:
            break
        prev = x[active]
        nxt = model.step(prev, x0[active])
        r = residual(nxt, prev, eps)
        x[active] = nxt
        iterations[active] += 1
        last_r[active] = r
        stop = r < tol
        halted[active[stop]] = True
        active = active[~stop]
    return HaltResult(x=x, logits=model.readout(x), iterations=iterations.cpu(), halted=halted.cpu(),
                      residual=last_r.cpu(), tol=tol, max_iter=max_iter)


def halting_report(model, task, split: str = "val", taus: Sequence[float] = (0.1, 0.01, 0.001), *,
                   max_iter: int = 100, limit: Optional[int] = None, batch_size: int = 500,
                   device: str | torch.device = "cpu") -> dict:
    """Accuracy against compute on ``split``: one row for the fixed budget (every sample runs ``max_iter``
    iterations) and one per τ. Each row: halted fraction, mean / median / max iterations, compute (the share
    of the fixed budget's evaluations of f), whole-answer and per-position accuracy, and the accuracy of the
    halted and of the unhalted samples. JSON-ready."""
    import torch

    inputs, targets = task.dataset(split)
    if limit is not None:
        inputs, targets = inputs[:limit], targets[:limit]
    was_training = model.training
    model.eval()
    rows = []
    try:
        for tau in [None, *taus]:
            its, hal, cor, pos = [], [], [], []
            for i in range(0, inputs.shape[0], batch_size):
                xb, yb = inputs[i:i + batch_size].to(device), targets[i:i + batch_size].to(device)
                if tau is None:  # the fixed budget: never halt
                    res = halt(model, xb, tol=0.0, max_iter=max_iter)
                else:
                    res = halt(model, xb, tol=tau, max_iter=max_iter)
                c, p = task.score(res.logits.float(), yb)
                its.append(res.iterations)
                hal.append(res.halted)
                cor.append(c.cpu())
                pos.append(p.cpu())
            its_t, hal_t, cor_t = torch.cat(its).double(), torch.cat(hal), torch.cat(cor).double()
            rows.append({
                "tau": tau,
                "halted_fraction": float(hal_t.double().mean()),
                "iterations_mean": float(its_t.mean()),
                "iterations_median": float(its_t.median()),
                "iterations_max": int(its_t.max()),
                "compute": float(its_t.sum() / (max_iter * its_t.numel())),
                "accuracy": float(cor_t.mean()),
                "position_accuracy": float(torch.cat(pos).double().mean()),
                "accuracy_halted": float(cor_t[hal_t].mean()) if hal_t.any() else None,
                "accuracy_unhalted": float(cor_t[~hal_t].mean()) if (~hal_t).any() else None,
            })
    finally:
        model.train(was_training)
    return {"split": split, "samples": int(inputs.shape[0]), "budget": max_iter, "rows": rows}


def format_report(report: dict) -> str:
    """The report as a text table."""
    lines = [f"halting on {report['split']} ({report['samples']} samples), budget T = {report['budget']} "
             "iterations; r = ‖x_t − x_(t−1)‖∞ / ‖x_t‖∞",
             f"{'τ':>8} {'halted':>8} {'mean it':>8} {'median':>7} {'max':>5} {'compute':>8} {'accuracy':>9} "
             f"{'acc halted':>11} {'acc unhalted':>13}   (shares and accuracies in %)"]

    def pct(v):
        return "–" if v is None else f"{100 * v:.1f}%"

    for r in report["rows"]:
        tau = "fixed T" if r["tau"] is None else f"{r['tau']:g}"
        lines.append(f"{tau:>8} {pct(r['halted_fraction']):>8} {r['iterations_mean']:>8.1f} "
                     f"{r['iterations_median']:>7.0f} {r['iterations_max']:>5d} {pct(r['compute']):>8} "
                     f"{pct(r['accuracy']):>9} {pct(r['accuracy_halted']):>11} {pct(r['accuracy_unhalted']):>13}")
    return "\n".join(lines)


# ---- the command ---------------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", metavar="CKPT", help="a checkpoint written by stability train")
    p.add_argument("--tol", type=positive_float, nargs="+", metavar="TAU",
                   help="halting tolerances τ (default: 0.1 0.01 0.001, plus the run's halt_tol)")
    p.add_argument("--split", choices=["train", "val", "hard"], default="val", help="data split (val)")
    p.add_argument("--max-iterations", type=int, metavar="T", help="budget per sample (the run's test_iterations)")
    p.add_argument("--samples", type=int, metavar="N", help="use the first N samples of the split (all)")
    p.add_argument("--batch-size", type=int, default=500, metavar="N", help="samples per batch (500)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to run (cpu)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    import stability
    from stability.errors import ConfigError

    taus = args.tol or [0.1, 0.01, 0.001]
    bad = [t for t in taus if not t > 0]
    if bad:
        raise ConfigError(f"--tol: τ must be positive, got {bad[0]}")
    for name in ("max_iterations", "samples", "batch_size"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be at least 1, got {v}")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available here; use --device cpu")
    if args.json:
        check_writable(args.json, "file", "--json")
    run_ = stability.load(args.checkpoint, device=args.device)
    if not is_looped(run_.model):
        raise StabilityError("a fixed-depth baseline has no loop map: there is nothing to halt")
    train = run_.config.train
    if args.tol is None and train.method == "deep-supervision" and train.halt_tol not in taus:
        taus = sorted([*taus, train.halt_tol], reverse=True)
    T = args.max_iterations or train.test_iterations
    rows = run_.task.dataset(args.split)[0].shape[0]
    if args.samples is not None and args.samples > rows:
        print(f"stability halt: note: --samples {args.samples}: the {args.split} split has {rows} samples; "
              f"using all {rows}", file=sys.stderr)
    report = halting_report(run_.model, run_.task, args.split, taus, max_iter=T, limit=args.samples,
                            batch_size=args.batch_size, device=args.device)
    report["checkpoint"] = str(run_.path)
    print(format_report(report))
    if args.json:
        write_text(args.json, json.dumps(report, indent=1))  # a failed write is one OutputError line
    return 0


def main(argv: Optional[list] = None) -> int:
    """``python -m stability.halting CKPT ...``: the command on its own (``stability halt`` once registered)."""
    import sys

    from stability.cli import _Parser

    parser = _Parser(prog="stability halt", description=HELP)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except StabilityError as exc:
        print(f"stability halt: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
