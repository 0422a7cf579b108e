"""``stability tables RESULTS``: Tables 4, 5 and 6 of the paper from a sweep's records (Markdown, CSV, LaTeX)."""

from __future__ import annotations

import argparse

from stability.atomic import check_writable
from stability.errors import StabilityError
from stability.sweep.runner import load_records
from stability.sweep.tables import filter_records, write_tables

HELP = "write the paper's Tables 4-6 (accuracy by norm x recall x LR, mean over seeds) from sweep records"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", metavar="RESULTS", help="a results directory written by `stability sweep`")
    p.add_argument("--out", metavar="DIR", help="where to write table{4,5,6}.{md,csv,tex} (default RESULTS/tables)")
    p.add_argument("--where", action="append", default=[], metavar="SECTION.OPTION=V[,V...]",
                   help="use only the records whose option has one of these values (repeatable)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    results = Path(args.results)
    out = check_writable(args.out if args.out else results / "tables", "dir", "--out")
    records = filter_records(load_records(results), args.where)
    if not records:
        raise StabilityError(f"{results}: no record matches {' and '.join(args.where)}")
    paths = write_tables(records, out)
    for path in paths:
        if path.suffix == ".md":
            print(path.read_text())
    print(f"{len(records)} records → " + ", ".join(str(p) for p in paths))
    return 0
