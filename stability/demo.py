"""``stability demo``: the main job on the embedded default, no download.

Trains a small prefix-sums looped transformer on the CPU (one to two minutes on 2 cores), prints its accuracy
against iteration count on the easy (val) and hard (longer) splits, then analyses its fixed points.
"""

from __future__ import annotations

import argparse

HELP = "train a small prefix-sums model on the CPU, print accuracy against iterations, and analyse it"

DEMO_ARGS = ["--task", "prefix-sums", "--recall", "external", "--norm", "pre", "--width", "32", "--heads", "4",
             "--lr", "3e-3", "--epochs", "45", "--warmup-epochs", "0", "--cooldown-at", "0.8", "--train-size", "1000",
             "--val-size", "200", "--hard-size", "200", "--train-length", "8", "--hard-length", "16",
             "--iterations", "8", "--batch-size", "50", "--test-iterations", "60", "--device", "cpu"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/demo", metavar="DIR", help="folder for the checkpoint and reports")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from stability.cli import build_parser

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "prefix-sums.pt"
    parser = build_parser()
    train_args = ["train", *DEMO_ARGS, "--out", str(ckpt)] + (["--resume"] if ckpt.exists() else [])
    if args.quiet:
        train_args.append("--quiet")
    ns = parser.parse_args(train_args)
    code = ns._run(ns)
    if code:
        return code
    analyze = parser._subparsers._group_actions[0].choices.get("analyze")
    if analyze is not None:
        ns = parser.parse_args(["analyze", str(ckpt), "--split", "both", "--samples", "32",
                                "--json", str(out / "analysis.json"), "--plots", str(out / "plots")])
        code = ns._run(ns)
    return code
