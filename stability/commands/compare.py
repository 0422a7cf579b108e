"""``stability compare A B``: two analysis JSONs (``stability analyze --json``) or two checkpoints side by side."""

from __future__ import annotations

import argparse

from stability import atomic
from stability.compare import compare_files, format_comparison

HELP = ("compare two analyses (JSON of `stability analyze --json`) or two checkpoints side by side: what changed in "
        "convergence, ρ, Prop. 5 and accuracy")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="an analysis JSON or a checkpoint")
    p.add_argument("b", metavar="B", help="another of the same kind")
    p.add_argument("--changed", action="store_true", help="show only the quantities that changed")
    p.add_argument("--json", metavar="PATH", help="also write the comparison as JSON")


def run(args: argparse.Namespace) -> int:
    if args.json:
        atomic.check_writable(args.json, "file", "--json")
    cmp = compare_files(args.a, args.b)
    print(format_comparison(cmp, only_changed=args.changed), end="")
    if args.json:
        atomic.write_json(args.json, cmp.to_dict())
    return 0
