"""``stability migrate PATH...``: rewrite, once, what earlier versions wrote into the current shapes (schema-1
checkpoints, flat config blocks, and the cell ids of a sweep results directory; :mod:`stability.migrate`)."""

from __future__ import annotations

import argparse

from stability.migrate import plan

HELP = ("rewrite, once, checkpoints of schema 1, old analysis JSONs and sweep results directories (config blocks, "
        "cell ids) in the current shapes")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="a checkpoint, an analysis JSON, a records .jsonl file or a sweep results directory")
    p.add_argument("--dry-run", action="store_true", help="say what would be rewritten, write nothing")
    p.epilog = ("every path is checked before anything is written; each file is written atomically; running it "
                "again changes nothing. exit status: 0 done (or nothing to do); 2 a path it does not convert, or a "
                "results directory a sweep is still writing (one line on stderr, nothing written)")


def run(args: argparse.Namespace) -> int:
    migrations = [plan(p) for p in args.paths]  # all checked before any write
    for m in migrations:
        lines = m.report() if args.dry_run else m.apply()
        print("\n".join(("would rewrite " + line if args.dry_run and m.steps and i == 0 else line)
                        for i, line in enumerate(lines)))
    return 0
