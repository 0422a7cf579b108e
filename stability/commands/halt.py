"""``stability halt CKPT``: residual-based halting at inference, accuracy against compute for tolerances τ
(:func:`stability.analysis.halting.halting_report`); ``stability halt HF_DIR --inputs ids.pt`` (or ``--text``): a
looped language model's exit rules audited per token, compute against agreement with the last pass, one curve per
rule (:mod:`stability.lm.halt`)."""

from __future__ import annotations

import argparse
import os
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
    p.add_argument("checkpoint", metavar="CKPT", help="a checkpoint written by stability train, or a Hugging Face "
                   "save_pretrained directory of a looped language model (its exit rules, per token)")
    p.add_argument("--tol", type=positive_float, nargs="+", metavar="TAU",
                   help="halting tolerances τ (default: 0.1 0.01 0.001, plus the run's halt_tol; for a language "
                        "model: the residual rule's thresholds)")
    p.add_argument("--split", choices=["train", "val", "hard"], default=None, help="data split (val)")
    p.add_argument("--max-iterations", type=int, metavar="T", help="budget per sample (the run's test_iterations; "
                   "for a language model: the passes audited, default 4 × its depth, at least 32)")
    lm = p.add_argument_group("a looped language model (CKPT a Hugging Face directory)")
    lm.add_argument("--inputs", metavar="FILE.pt", help="token ids (B, T), or a dict with input_ids, "
                    "attention_mask, labels")
    lm.add_argument("--text", metavar="FILE", help="one sequence a line, encoded by the directory's tokenizer")
    lm.add_argument("--plots", metavar="DIR", help="write exit_rules.png: compute against agreement, a curve a rule")
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
    if os.path.isfile(os.path.join(args.checkpoint, "config.json")):
        return _run_lm(args)
    if args.inputs or args.text or args.plots:
        raise StabilityError("--inputs, --text and --plots go with a language model's directory (CKPT)")
    args.split = args.split or "val"
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


def _run_lm(args: argparse.Namespace) -> int:
    """``stability halt HF_DIR``: the exit-rule audit on ``--inputs`` or ``--text`` (module docstring)."""
    # lazy: torch and transformers; `stability --help` imports this module without them
    from stability.lm.analyze import read_lm_inputs
    from stability.lm.exits import DEFAULT_RULES
    from stability.lm.halt import format_audit, halt_lm, plot_exits

    if args.split is not None:
        raise StabilityError("--split applies to checkpoints; a language model's samples are --inputs or --text")
    if args.plots:
        check_writable(args.plots, "dir", "--plots")
    packed, targets = read_lm_inputs(args.checkpoint, args.inputs, args.text)
    if args.samples is not None:
        packed, targets = packed[:args.samples], None if targets is None else targets[:args.samples]
    rules = dict(DEFAULT_RULES) if args.tol is None else {**DEFAULT_RULES, "residual": tuple(args.tol)}
    audit = halt_lm(args.checkpoint, packed, targets, passes=args.max_iterations, rules=rules, device=args.device)
    audit["checkpoint"] = str(args.checkpoint)
    print(format_audit(audit))
    if args.json:
        write_json(args.json, audit)
    if args.plots:
        print(f"plot: {plot_exits(audit, os.path.join(args.plots, 'exit_rules.png'))}")
    return 0
