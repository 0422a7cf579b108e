"""``stability halt CKPT``: residual-based halting at inference, accuracy against compute for tolerances τ
(:func:`stability.analysis.halting.halting_report`)."""

from __future__ import annotations

import argparse
import sys

import stability
from stability.analysis import halting
from stability.atomic import check_writable, write_json
from stability.commands._types import device_name, positive_float
from stability.config import resolve_device
from stability.errors import ConfigError, StabilityError
from stability.protocols import is_looped

#: the largest --max-iterations: the solver keeps a residual per sample and iteration (as `analyze --max-iter`)
MAX_ITERATIONS = 10**6

HELP = "residual-based halting at inference: accuracy against compute for halting tolerances τ"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", metavar="CKPT", help="a checkpoint written by stability train")
    p.add_argument("--tol", type=positive_float, nargs="+", metavar="TAU",
                   help="halting tolerances τ (default: 0.1 0.01 0.001, plus the run's halt_tol)")
    p.add_argument("--split", choices=["train", "val", "hard"], default="val", help="data split (val)")
    p.add_argument("--max-iterations", type=int, metavar="T", help="budget per sample (the run's test_iterations)")
    p.add_argument("--samples", type=int, metavar="N", help="use the first N samples of the split (all)")
    p.add_argument("--batch-size", type=int, default=500, metavar="N", help="samples per batch (500)")
    p.add_argument("--device", type=device_name, default="cpu", metavar="DEV",
                   help="where to run: cpu, auto (cuda when available), cuda or cuda:N (cpu)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")


def run(args: argparse.Namespace) -> int:
    taus = args.tol or [0.1, 0.01, 0.001]
    bad = [t for t in taus if not t > 0]
    if bad:
        raise ConfigError(f"--tol: τ must be positive, got {bad[0]}")
    for name in ("max_iterations", "samples", "batch_size"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be at least 1, got {v}")
    if args.max_iterations is not None and args.max_iterations > MAX_ITERATIONS:
        raise ConfigError(f"--max-iterations {args.max_iterations}: at most {MAX_ITERATIONS} (the solver keeps a "
                          "residual per sample and iteration)")
    args.device = str(resolve_device(args.device))
    if args.json:
        check_writable(args.json, "file", "--json")
    run_ = stability.load(args.checkpoint, device=args.device)
    if not is_looped(run_.model):
        raise StabilityError("a fixed-depth baseline has no loop map: there is nothing to halt")
    train = run_.config.train
    if args.tol is None and train.method.name == "deep-supervision" and train.method.halt_tol not in taus:
        taus = sorted([*taus, train.method.halt_tol], reverse=True)
    T = args.max_iterations or train.test_iterations
    rows = run_.task.dataset(args.split)[0].shape[0]
    if args.samples is not None and args.samples > rows:
        print(f"stability halt: note: --samples {args.samples}: the {args.split} split has {rows} samples; "
              f"using all {rows}", file=sys.stderr)
    from tqdm.auto import tqdm

    n = min(rows, args.samples or rows)
    with tqdm(total=n * (len(taus) + 1), desc=f"halt {args.split}", unit="sample", file=sys.stderr,
              disable=args.quiet, leave=False, dynamic_ncols=True) as bar:  # the fixed budget, then each τ
        report = halting.halting_report(run_.model, run_.task, args.split, taus, max_iter=T, limit=args.samples,
                                batch_size=args.batch_size, device=args.device, on_batch=bar.update)
    report["checkpoint"] = str(run_.path)
    print(halting.format_report(report))
    if args.json:
        write_json(args.json, report)  # non-finite numbers as null; a failed write is one OutputError line
    return 0
