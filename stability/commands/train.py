"""``stability train``: train a looped transformer (or the fixed-depth baseline) and write a checkpoint."""

from __future__ import annotations

import argparse
import typing

from stability.commands._types import device_name, nonneg_float, positive_float, unit_float
from stability.config import NORMS, RECALLS, ImplicitBackward, InitialState, Method

HELP = ("train a looped transformer (progressive loss, deep supervision or equilibrium training) and write a "
        "self-describing checkpoint")

# CLI flag -> (section, config field)
_FLAGS = {
    "task": ("task", "name"),
    "train_size": ("task", "train_size"),
    "val_size": ("task", "val_size"),
    "hard_size": ("task", "hard_size"),
    "train_length": ("task", "train_length"),
    "hard_length": ("task", "hard_length"),
    "data_seed": ("task", "seed"),
    "data_path": ("task", "data_path"),
    "cache_dir": ("task", "cache_dir"),
    "engine": ("task", "engine"),
    "recall": ("model", "recall"),
    "norm": ("model", "norm"),
    "width": ("model", "width"),
    "heads": ("model", "heads"),
    "depth": ("model", "depth"),
    "initial_state": ("model", "initial_state"),
    "share_norms": ("model", "share_norms"),
    "damping": ("model", "damping"),
    "residual_scale": ("model", "residual_scale"),
    "conv": ("model", "conv"),
    "method": ("train", "method"),
    "lr": ("train", "lr"),
    "epochs": ("train", "epochs"),
    "batch_size": ("train", "batch_size"),
    "iterations": ("train", "iterations"),
    "alpha": ("train", "alpha"),
    "weight_decay": ("train", "weight_decay"),
    "warmup_epochs": ("train", "warmup_epochs"),
    "cooldown_at": ("train", "cooldown_at"),
    "cooldown_factor": ("train", "cooldown_factor"),
    "seed": ("train", "seed"),
    "device": ("train", "device"),
    "compile": ("train", "compile"),
    "bf16": ("train", "bf16"),
    "eval_every": ("train", "eval_every"),
    "eval_iterations": ("train", "eval_iterations"),
    "test_iterations": ("train", "test_iterations"),
    "eval_batch_size": ("train", "eval_batch_size"),
    "monitor_every": ("train", "monitor_every"),
    "monitor_samples": ("train", "monitor_samples"),
    "bptt_steps": ("train", "bptt_steps"),
    "supervision_interval": ("train", "supervision_interval"),
    "halt_tol": ("train", "halt_tol"),
    "solver_tol": ("train", "solver_tol"),
    "anderson_memory": ("train", "anderson_memory"),
    "implicit_backward": ("train", "implicit_backward"),
    "backward_tol": ("train", "backward_tol"),
    "backward_iterations": ("train", "backward_iterations"),
    "backward_max_iterations": ("train", "backward_max_iterations"),
    "jac_reg": ("train", "jac_reg"),
    "jac_reg_probes": ("train", "jac_reg_probes"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from stability.tasks import TASKS

    g = p.add_argument_group("task")
    g.add_argument("--task", choices=list(TASKS), help="the task (default prefix-sums)")
    g.add_argument("--train-size", type=int, metavar="N", help="training samples (prefix sums: 8000)")
    g.add_argument("--val-size", type=int, metavar="N", help="validation samples (prefix sums: 2000)")
    g.add_argument("--hard-size", type=int, metavar="N", help="hard samples (prefix sums: 10000)")
    g.add_argument("--train-length", type=int, metavar="BITS", help="prefix sums: train/val length (32)")
    g.add_argument("--hard-length", type=int, metavar="BITS", help="prefix sums: hard length (512)")
    g.add_argument("--data-seed", type=int, metavar="S", help="seed of the generated data (0)")
    g.add_argument("--data-path", metavar="PATH", help="a real dataset file (sudoku-extreme CSVs, Lichess CSV)")
    g.add_argument("--cache-dir", metavar="DIR", help="where datasets are cached")
    g.add_argument("--engine", metavar="PATH", help="UCI chess engine for the chess generator")
    m = p.add_argument_group("model")
    m.add_argument("--recall", choices=RECALLS, help="none | external | internal | fixed (baseline); default external")
    m.add_argument("--norm", choices=NORMS, help="outer/inner normalisation variant; default post")
    m.add_argument("--width", type=int, metavar="D", help="model width d (256)")
    m.add_argument("--heads", type=int, metavar="H", help="attention heads (8)")
    m.add_argument("--depth", type=int, metavar="N", help="blocks of the fixed-depth baseline (15)")
    m.add_argument("--initial-state", choices=typing.get_args(InitialState), help="first iterate e (x0)")
    m.add_argument("--share-norms", action=argparse.BooleanOptionalAction, default=None,
                   help="one Pre/Peri/Post instance for both sublayers, as the release (default on)")
    m.add_argument("--damping", type=positive_float, metavar="ETA",
                   help="damped loop map (1 − η)·x + η·f(x, x0), used in training and at inference (1: off)")
    m.add_argument("--residual-scale", type=positive_float, metavar="BETA",
                   help="sublayer residual (1 − β)·u + β·v, FPRM's pre-norm with residual scaling (off)")
    m.add_argument("--conv", type=int, metavar="K",
                   help="depth-wise convolution of odd kernel K on the latent at the start of each loop (off)")
    t = p.add_argument_group("training")
    t.add_argument("--method", choices=typing.get_args(Method),
                   help="progressive loss, deep supervision with truncated BPTT (FPRM), or implicit "
                        "(equilibrium, Anderson forward, implicit-function-theorem backward); default progressive")
    t.add_argument("--lr", type=positive_float, help="peak learning rate (1e-4)")
    t.add_argument("--epochs", type=int, metavar="N", help="epochs (100)")
    t.add_argument("--batch-size", type=int, metavar="N", help="batch size (500)")
    t.add_argument("--iterations", type=int, metavar="T",
                   help="maximum training iterations T of every method (30)")
    t.add_argument("--alpha", type=unit_float, help="progressive-loss weight α (1.0; progressive only)")
    t.add_argument("--weight-decay", type=nonneg_float, help="AdamW weight decay (0.01)")
    t.add_argument("--warmup-epochs", type=int, metavar="N",
                   help="epochs of LR warm-up, factor 1 − exp(−(e+1)/10) in epoch e < N (9; 0: none)")
    t.add_argument("--cooldown-at", type=unit_float, metavar="F",
                   help="the LR is multiplied by the cooldown factor from epoch ⌊F · epochs⌋ on (0.6; 1: never)")
    t.add_argument("--cooldown-factor", type=unit_float, metavar="C", help="LR factor of the cooldown (0.1)")
    t.add_argument("--seed", type=int, metavar="S", help="seed of initialisation and data order (0)")
    t.add_argument("--device", type=device_name, metavar="DEV",
                   help="auto (cuda when available), cpu, cuda or cuda:N (auto)")
    t.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="torch.compile the loop map")
    t.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 autocast on CUDA (default on; the CPU always trains in float32)")
    t.add_argument("--eval-every", type=int, metavar="N", help="evaluate every N epochs (0: only at the end)")
    t.add_argument("--eval-iterations", type=int, metavar="T", help="iterations of the periodic evaluations (60)")
    t.add_argument("--test-iterations", type=int, metavar="T",
                   help="iterations of the final evaluation (500; it is announced with an estimate when long)")
    t.add_argument("--eval-batch-size", type=int, metavar="N", help="evaluation batch size (1000)")
    t.add_argument("--monitor-every", type=int, metavar="N",
                   help="log ρ(W_x), median ρ(J*), converged fraction, ‖dx*/dx0‖ every N epochs (0: off)")
    t.add_argument("--monitor-samples", type=int, metavar="N", help="probe size of the stability monitor (16)")
    d = p.add_argument_group("deep supervision (--method deep-supervision)")
    d.add_argument("--bptt-steps", type=int, metavar="K", help="iterations back-propagated per segment (5)")
    d.add_argument("--supervision-interval", type=int, metavar="T",
                   help="iterations per supervised segment, at least K (default K)")
    d.add_argument("--halt-tol", type=positive_float, metavar="TAU",
                   help="a sample stops once its relative L∞ residual is below TAU (0.1)")
    i = p.add_argument_group("implicit (--method implicit)")
    i.add_argument("--solver-tol", type=positive_float, metavar="TOL", help="Anderson forward-solve tolerance (1e-3)")
    i.add_argument("--anderson-memory", type=int, metavar="M", help="Anderson history length (5)")
    i.add_argument("--implicit-backward", choices=typing.get_args(ImplicitBackward),
                   help="adjoint solve (I − Jᵀ) u = ∂L/∂x*: GMRES, Neumann series, or one-step (krylov)")
    i.add_argument("--backward-tol", type=positive_float, metavar="TOL", help="adjoint-solve relative tolerance (1e-4)")
    i.add_argument("--backward-iterations", type=int, metavar="N",
                   help="adjoint-solve products with Jᵀ when --backward-max-iterations is 0 (30)")
    i.add_argument("--backward-max-iterations", type=int, metavar="N",
                   help="adaptive adjoint budget: iterate until --backward-tol or max(N, --backward-iterations) "
                        "products; 0: the fixed --backward-iterations (150)")
    i.add_argument("--jac-reg", type=nonneg_float, metavar="W", help="weight of the ‖J‖_F²/n regulariser at x* (0: off)")
    i.add_argument("--jac-reg-probes", type=int, metavar="N", help="Hutchinson probes of the regulariser (1)")
    p.add_argument("--out", required=True, metavar="PATH",
                   help="checkpoint file to write (metrics go beside it: PATH's stem + .metrics.jsonl, .metrics.csv, "
                        ".accuracy.csv)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out if it exists (its stored options; with a larger --epochs: "
                        "extend a finished run)")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="also log the per-epoch scalars to TensorBoard in DIR (needs the tensorboard package)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def config_from_args(args: argparse.Namespace, base=None):
    """RunConfig from the flags that were given; the others keep their defaults, or ``base``'s values."""
    from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig, from_dict, to_dict

    sections: dict[str, dict] = {"model": {}, "task": {}, "train": {}}
    if base is not None:
        sections = {k: dict(v) for k, v in to_dict(base).items()}
    for flag, (section, key) in _FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            sections[section][key] = value
    return RunConfig(model=from_dict(ModelConfig, sections["model"]),
                     task=from_dict(TaskConfig, sections["task"]),
                     train=from_dict(TrainConfig, sections["train"]))


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from stability.atomic import check_writable

    config = config_from_args(args)  # validated before anything heavy is imported
    out = check_writable(args.out, "file", "--out")
    tensorboard = check_writable(args.tensorboard, "dir", "--tensorboard") if args.tensorboard else None
    if tensorboard is not None:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            from stability.errors import ConfigError

            raise ConfigError("--tensorboard: the tensorboard package is not installed (pip install tensorboard), "
                              "or leave --tensorboard out")

    from stability.train.loop import check_resumable, schedule_warning, train
    from stability.train.report import accuracy_table

    if args.resume and out.exists():
        from stability import checkpoint as ckpt

        # the stored options, with the flags given now on top (only a larger --epochs may differ: extension)
        obj = ckpt.read(out)
        stored = ckpt.run_config(obj, out)
        config = config_from_args(args, base=stored)
        check_resumable(stored, config, int(obj["epoch"]), out)
    warning = schedule_warning(config.train)
    if warning:
        print(f"stability train: warning: {warning}", file=sys.stderr, flush=True)
    result = train(config, out, resume=args.resume, progress=not args.quiet, tensorboard=tensorboard)
    print(f"checkpoint: {result.path}")
    if result.final:
        print(accuracy_table(result.final))
    return 0
